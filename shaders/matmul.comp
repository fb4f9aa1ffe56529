// variants: q8_0=-DWTYPE_Q8_0 q4_0=-DWTYPE_Q4_0 q4_1=-DWTYPE_Q4_1 f16=-DWTYPE_F16 f32=-DWTYPE_F32
#version 450
// Y = W · X for a batch of tokens (decode: one token), W read in place from GGUF blocks.
// CPU twins: reference::kernels::matvec / matmul, composed with rmsnorm (IN_RMSNORM),
// add (OUT_ADD), rope + KV-cache write (OUT_QKV) and swiglu (OUT_GLU).
//
// Each invocation computes PAIRS pairs of rows for TB (1..4) tokens. Lanes of a workgroup
// take neighbouring pairs; every weight word fetched is used for TB tokens and every input
// quad fetched for both rows of the pair; block scales are applied per block. A pair is:
//   OUT_STORE/OUT_ADD: rows (2p, 2p+1) of one view;
//   OUT_QKV: the two rows rope rotates together (normal: 2i, 2i+1; neox: i, i+head_dim/2);
//   OUT_GLU: row p of gate (binding 0) and row p of up (binding 1); only view 0 (gate)
//   owns workgroups, each reading up at the same rows.
//
// rmsnorm is folded without a pass of its own: W·(x/rms(x)∘g) = (W·(x∘g)) / rms(x). The
// dispatch that writes the residual x (OUT_ADD, or the embedding) also writes xg = x∘g for
// the next norm weight g; an IN_RMSNORM dispatch reads xg as X, takes rms from the raw x
// (XR) once per token, and scales its sums at the end.
#extension GL_GOOGLE_include_directive : require

#include "quant.glsl"
#include "step.glsl"
#include "rope.glsl"
#include "act.glsl"
#include "matmul_push.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint PAIRS = 4u;    // row pairs per invocation
layout(constant_id = 2) const uint TB = 1u;       // tokens per invocation, 1..4
layout(constant_id = 3) const uint IN_MODE = 0u;  // 0 plain, 1 X = x∘g with 1/rms from XR
layout(constant_id = 4) const uint OUT_MODE = 0u; // 0 store, 1 add, 2 qkv, 3 glu
layout(constant_id = 5) const uint ROPE_NEOX = 0u;
layout(constant_id = 6) const uint N_VIEWS = 1u;

const uint IN_RMSNORM = 1u;
const uint OUT_STORE = 0u;
const uint OUT_ADD = 1u;
const uint OUT_QKV = 2u;
const uint OUT_GLU = 3u;

// Weights (R32UI) and input (RGBA32F) are texel buffers: see quant.glsl.
layout(set = 0, binding = 0) uniform usamplerBuffer w0;
layout(set = 0, binding = 1) uniform usamplerBuffer w1;
layout(set = 0, binding = 2) uniform usamplerBuffer w2;
layout(set = 0, binding = 3) uniform samplerBuffer x4;
layout(std430, set = 0, binding = 4) readonly buffer Aux { float aux[]; };  // next norm weight
layout(std430, set = 0, binding = 5) buffer Out0 { float out0[]; };
layout(std430, set = 0, binding = 6) buffer Out1 { float out1[]; };
layout(std430, set = 0, binding = 7) buffer Out2 { float out2[]; };
STEP_BUFFER(8)
layout(set = 0, binding = 9) uniform samplerBuffer xr4;  // raw residual (IN_RMSNORM)

float dot4(vec4 a, vec4 b, float acc) {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// Token row of X read for the workgroup's token t (clamped past the batch's end).
uint x_row(uint t) {
    return pc.x_tok0 + min(gl_WorkGroupID.y * TB + t, pc.n_tok - 1u);
}

// 1 / sqrt(mean(x^2) + eps) of token row `row` of XR.
float rms_scale(uint row) {
    uint base = row * (pc.x_ld / 4u);
    float ss = 0.0;
    for (uint i = 0u; i < pc.ncols / 4u; i++) {
        vec4 v = texelFetch(xr4, int(base + i));
        ss = dot4(v, v, ss);
    }
    return inversesqrt(ss / float(pc.ncols) + pc.eps);
}

// Elements 4q..4q+3 of X for the workgroup's token t.
vec4 xq(uint t, uint q) {
    return texelFetch(x4, int(x_row(t) * (pc.x_ld / 4u) + q));
}

// Adds token t's input quad to the block sums (one component per token).
#define QUAD_TOKEN(t, C)                                                                  \
    {                                                                                     \
        vec4 x_ = xq(t, q0_ + qi);                                                        \
        sa_.C = dot4(wqa, x_, sa_.C);                                                     \
        sb_.C = dot4(wqb, x_, sb_.C);                                                     \
        if (QUANT_HAS_MIN) { sx_.C += (x_.x + x_.y) + (x_.z + x_.w); }                    \
    }

// acc_a, acc_b (one component per token) += rows at words base_a of BA and base_b of BB · X,
// each input quad fetched once for both rows, the block scale applied per block
#define PAIR_DOT(BA, base_a, BB, base_b)                                                  \
    for (uint c = 0u; c < nchunks; c++) {                                                 \
        uint ca0_ = (base_a) + c * CHUNK_WORDS;                                           \
        uint cb0_ = (base_b) + c * CHUNK_WORDS;                                           \
        uint q0_ = c * 16u;                                                               \
        vec4 sa_ = vec4(0.0);                                                             \
        vec4 sb_ = vec4(0.0);                                                             \
        vec4 sx_ = vec4(0.0);                                                             \
        FOR_EACH_QUAD2(BA, ca0_, BB, cb0_,                                                \
            QUAD_TOKEN(0u, x)                                                             \
            if (TB > 1u) QUAD_TOKEN(1u, y)                                                \
            if (TB > 2u) QUAD_TOKEN(2u, z)                                                \
            if (TB > 3u) QUAD_TOKEN(3u, w)                                                \
        ,                                                                                 \
            acc_a = fma(vec4(da), sa_, acc_a);                                            \
            acc_b = fma(vec4(db), sb_, acc_b);                                            \
            if (QUANT_HAS_MIN) {                                                          \
                acc_a = fma(vec4(ma), sx_, acc_a);                                        \
                acc_b = fma(vec4(mb), sx_, acc_b);                                        \
                sx_ = vec4(0.0);                                                          \
            }                                                                             \
            sa_ = vec4(0.0);                                                              \
            sb_ = vec4(0.0);                                                              \
        )                                                                                 \
    }

void main() {
    uint wg = gl_WorkGroupID.x;
    uint view = wg < pc.tiles.x ? 0u : (wg < pc.tiles.y ? 1u : 2u);
    uint tile = wg - (view == 0u ? 0u : (view == 1u ? pc.tiles.x : pc.tiles.y));
    uint nrows = pc.nrows[view];
    uint orow = pc.orow[view];
    uint wofs = pc.wofs[view];
    uint t0 = gl_WorkGroupID.y * TB;
    uint nchunks = pc.ncols / 64u;
    uint row_words = nchunks * CHUNK_WORDS;
    uint pos0 = step_pos0;

    // 1/rms of each token's residual (1 without the norm)
    vec4 scale = vec4(1.0);
    if (IN_MODE == IN_RMSNORM) {
        scale.x = rms_scale(x_row(0u));
        if (TB > 1u) { scale.y = rms_scale(x_row(1u)); }
        if (TB > 2u) { scale.z = rms_scale(x_row(2u)); }
        if (TB > 3u) { scale.w = rms_scale(x_row(3u)); }
    }

    for (uint i = 0u; i < PAIRS; i++) {
        uint p = (tile * PAIRS + i) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
        uint ra;
        uint rb;
        if (OUT_MODE == OUT_GLU) {
            ra = p;
            rb = p;
        } else if (OUT_MODE == OUT_QKV && ROPE_NEOX != 0u) {
            uint half_dim = pc.head_dim / 2u;
            ra = (p / half_dim) * pc.head_dim + p % half_dim;
            rb = ra + half_dim;
        } else {
            ra = 2u * p;
            rb = ra + 1u;
        }
        if (ra >= nrows) {
            continue;
        }
        bool b_ok = rb < nrows;
        uint base_a = wofs + ra * row_words;
        // Glu: row rb of up lies at up's own word offset (slot 1)
        uint base_b = (OUT_MODE == OUT_GLU ? pc.wofs[1] : wofs) + (b_ok ? rb : ra) * row_words;

        vec4 acc_a = vec4(0.0);
        vec4 acc_b = vec4(0.0);
        if (OUT_MODE == OUT_GLU) {
            PAIR_DOT(w0, base_a, w1, base_b)
        } else if (N_VIEWS == 1u || view == 0u) {
            PAIR_DOT(w0, base_a, w0, base_b)
        } else if (N_VIEWS == 2u || view == 1u) {
            PAIR_DOT(w1, base_a, w1, base_b)
        } else {
            PAIR_DOT(w2, base_a, w2, base_b)
        }

        uint ga = orow + ra;  // global rows
        uint gb = orow + rb;
        for (uint t = 0u; t < TB; t++) {
            uint tt = t0 + t;
            if (tt >= pc.n_tok) {
                break;
            }
            float a = acc_a[t] * scale[t];
            float b = acc_b[t] * scale[t];
            uint o = tt * pc.out_ld;
            if (OUT_MODE == OUT_STORE) {
                out0[o + ga] = a;
                if (b_ok) out0[o + gb] = b;
            } else if (OUT_MODE == OUT_ADD) {
                float xa = out0[o + ga] + a;
                out0[o + ga] = xa;
                if (pc.write_xg != 0u) out1[o + ga] = xa * aux[pc.aux_ofs + ga];
                if (b_ok) {
                    float xb = out0[o + gb] + b;
                    out0[o + gb] = xb;
                    if (pc.write_xg != 0u) out1[o + gb] = xb * aux[pc.aux_ofs + gb];
                }
            } else if (OUT_MODE == OUT_GLU) {
                out0[o + ga] = swiglu(a, b);
            } else { // OUT_QKV: rope q and k, k and v go to the caches at pos0 + tt
                uint hd = ga % pc.head_dim;
                uint fi = ROPE_NEOX != 0u ? hd : hd / 2u;
                if (view != 2u) {
                    vec2 r = rope_pair(a, b, float(pos0 + tt), step_freqs[fi]);
                    a = r.x;
                    b = r.y;
                }
                if (view == 0u) {
                    out0[o + ga] = a;
                    out0[o + gb] = b;
                } else {
                    uint c = (pos0 + tt) * pc.kv_ld;
                    if (view == 1u) {
                        out1[c + ga] = a;
                        out1[c + gb] = b;
                    } else {
                        out2[c + ga] = a;
                        out2[c + gb] = b;
                    }
                }
            }
        }
    }
}

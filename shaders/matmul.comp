// variants: q8_0=-DWTYPE_Q8_0 q4_0=-DWTYPE_Q4_0 q4_1=-DWTYPE_Q4_1 f16=-DWTYPE_F16 f32=-DWTYPE_F32 q8_0_split=-DWTYPE_Q8_0,-DCOLUMN_SPLIT q4_0_split=-DWTYPE_Q4_0,-DCOLUMN_SPLIT q4_1_split=-DWTYPE_Q4_1,-DCOLUMN_SPLIT f16_split=-DWTYPE_F16,-DCOLUMN_SPLIT f32_split=-DWTYPE_F32,-DCOLUMN_SPLIT
#version 450
// Y = W · X for a batch of tokens (decode: one token), W read in place from GGUF blocks.
// CPU twins: reference::kernels::matvec / matmul, composed with rmsnorm (IN_RMSNORM),
// add (OUT_ADD), rope + KV-cache write (OUT_QKV) and swiglu (OUT_GLU).
//
// Each invocation computes PAIRS pairs of rows for TB (1..4) tokens, GROUP pairs at a time
// in lockstep. Lanes of a workgroup take neighbouring pairs; every weight word fetched is
// used for TB tokens and every input quad fetched for the 2*GROUP rows of the group; block
// scales are applied per block. A pair is:
//   OUT_STORE/OUT_ADD: rows (2p, 2p+1) of one view;
//   OUT_QKV: the two rows rope rotates together (normal: 2i, 2i+1; neox: i, i+head_dim/2);
//   OUT_GLU: row p of gate (binding 0) and row p of up (binding 1); only view 0 (gate)
//   owns workgroups, each reading up at the same rows.
//
// Column split (the `_split` variants, COLUMN_SPLIT: one token per workgroup, the workgroup
// one subgroup, SPLIT_CHUNKS the chunks per row): lanes share each row instead of owning
// rows. Lane l takes chunks l, l + WG, ... of every row: the chunks WG lanes fetch
// together are contiguous, so the weights stream through memory in order, which the
// CPU's prefetchers need under lavapipe (about twice the GB/s of row-per-lane, where WG
// rows 600+ bytes apart are read side by side). Each lane keeps the input of its own
// chunks for the whole dispatch, and a row's sum is one subgroupAdd. The chunks past the
// last multiple of WG (SPLIT_CHUNKS % WG) are read row-per-lane afterwards: a workgroup
// takes WG pairs at a time, and lane j finishes and stores pair j. It is a variant of its
// own, not a branch on a specialization constant: lavapipe compiled the dead branch
// anyway (+34 MiB of RssAnon, 1-2 s more load).
//
// rmsnorm is folded without a pass of its own: W·(x/rms(x)∘g) = (W·(x∘g)) / rms(x). The
// dispatch that writes the residual x (OUT_ADD, or the embedding) also writes xg = x∘g for
// the next norm weight g; an IN_RMSNORM dispatch reads xg as X, takes rms from the raw x
// (XR) once per token, and scales its sums at the end.
#extension GL_GOOGLE_include_directive : require
#if defined(COLUMN_SPLIT)
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

#include "quant.glsl"
#include "step.glsl"
#include "rope.glsl"
#include "act.glsl"
#include "matmul_push.glsl"

layout(local_size_x_id = 0) in;
const uint WG = gl_WorkGroupSize.x;
layout(constant_id = 1) const uint PAIRS = 4u;    // row pairs per invocation
layout(constant_id = 2) const uint TB = 1u;       // tokens per invocation, 1..4
layout(constant_id = 3) const uint IN_MODE = 0u;  // 0 plain, 1 X = x∘g with 1/rms from XR
layout(constant_id = 4) const uint OUT_MODE = 0u; // 0 store, 1 add, 2 qkv, 3 glu
layout(constant_id = 5) const uint ROPE_NEOX = 0u;
layout(constant_id = 6) const uint N_VIEWS = 1u;
// All views are read through w0 at their own word offsets. lavapipe runs both sides of
// every branch (masked), so the per-view branch below would fetch each view's weights in
// every workgroup; with one binding there is no branch.
layout(constant_id = 7) const bool W_SHARED = false;

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

// Input quads of one chunk for token t, fetched once and shared by every row pair of
// the group (lavapipe turns each texel fetch into a call with a bounds check and eight
// lane loads, so the input must not be fetched once per row pair). Indexed only with
// constants after the macros below expand, so they stay in registers.
#define LOAD_XS(XS, t, q0)                                                                \
    vec4 XS[16];                                                                          \
    for (uint k_ = 0u; k_ < 16u; k_++) {                                                  \
        XS[k_] = (TB > (t)) ? xq((t), (q0) + k_) : vec4(0.0);                             \
    }

// Adds token t's input quad (XS[qi]) to the block sums (one component per token).
#define QUAD_TOKEN(XS, C)                                                                 \
    {                                                                                     \
        vec4 x_ = XS[qi];                                                                 \
        sa_.C = dot4(wqa, x_, sa_.C);                                                     \
        sb_.C = dot4(wqb, x_, sb_.C);                                                     \
        if (QUANT_HAS_MIN) { sx_.C += (x_.x + x_.y) + (x_.z + x_.w); }                    \
    }

// ACC_A, ACC_B (one component per token) += chunk C of the rows at words BASE_A of BA
// and BASE_B of BB · X (input quads X0..X3, one array per token), the block scale applied
// per block.
#define CHUNK_DOT(BA, BASE_A, BB, BASE_B, C, X0, X1, X2, X3, ACC_A, ACC_B)                \
    {                                                                                     \
        uint ca0_ = (BASE_A) + (C) * CHUNK_WORDS;                                         \
        uint cb0_ = (BASE_B) + (C) * CHUNK_WORDS;                                         \
        vec4 sa_ = vec4(0.0);                                                             \
        vec4 sb_ = vec4(0.0);                                                             \
        vec4 sx_ = vec4(0.0);                                                             \
        FOR_EACH_QUAD2(BA, ca0_, BB, cb0_,                                                \
            QUAD_TOKEN(X0, x)                                                             \
            if (TB > 1u) QUAD_TOKEN(X1, y)                                                \
            if (TB > 2u) QUAD_TOKEN(X2, z)                                                \
            if (TB > 3u) QUAD_TOKEN(X3, w)                                                \
        ,                                                                                 \
            ACC_A = fma(vec4(da), sa_, ACC_A);                                            \
            ACC_B = fma(vec4(db), sb_, ACC_B);                                            \
            if (QUANT_HAS_MIN) {                                                          \
                ACC_A = fma(vec4(ma), sx_, ACC_A);                                        \
                ACC_B = fma(vec4(mb), sx_, ACC_B);                                        \
                sx_ = vec4(0.0);                                                          \
            }                                                                             \
            sa_ = vec4(0.0);                                                              \
            sb_ = vec4(0.0);                                                              \
        )                                                                                 \
    }

// Chunk C of pair P into its accumulators, through the binding(s) of the view.
#define PAIR_CHUNK(P, C, X0, X1, X2, X3, ACC_A, ACC_B)                                    \
    if (OUT_MODE == OUT_GLU) {                                                            \
        CHUNK_DOT(w0, P.base_a, w1, P.base_b, C, X0, X1, X2, X3, ACC_A, ACC_B)            \
    } else if (N_VIEWS == 1u || W_SHARED || view == 0u) {                                 \
        CHUNK_DOT(w0, P.base_a, w0, P.base_b, C, X0, X1, X2, X3, ACC_A, ACC_B)            \
    } else if (N_VIEWS == 2u || view == 1u) {                                             \
        CHUNK_DOT(w1, P.base_a, w1, P.base_b, C, X0, X1, X2, X3, ACC_A, ACC_B)            \
    } else {                                                                              \
        CHUNK_DOT(w2, P.base_a, w2, P.base_b, C, X0, X1, X2, X3, ACC_A, ACC_B)            \
    }

// Row pairs an invocation computes in lockstep (1..4), sharing each chunk's input quads.
layout(constant_id = 8) const uint GROUP = 2u;
// Chunks (64 columns) per row when lanes split the columns (see the top); 0: lanes own rows.
layout(constant_id = 9) const uint SPLIT_CHUNKS = 0u;
const uint SPLIT_K = SPLIT_CHUNKS / WG;  // chunks per lane per row, 1..4 (unrolled below)
const uint SPLIT_R = SPLIT_CHUNKS % WG;  // chunks left over, read row-per-lane

// The two rows of pair p of a view: global rows, whether each exists, and where they
// start in the weight binding (a missing row reads row 0 and is not stored).
struct Pair {
    uint ra;
    uint rb;
    bool a_ok;
    bool b_ok;
    uint base_a;
    uint base_b;
};

Pair pair_rows(uint p, uint nrows, uint wofs, bool exists) {
    Pair r;
    if (OUT_MODE == OUT_GLU) {
        r.ra = p;
        r.rb = p;
    } else if (OUT_MODE == OUT_QKV && ROPE_NEOX != 0u) {
        uint half_dim = pc.head_dim / 2u;
        r.ra = (p / half_dim) * pc.head_dim + p % half_dim;
        r.rb = r.ra + half_dim;
    } else {
        r.ra = 2u * p;
        r.rb = r.ra + 1u;
    }
    r.a_ok = exists && r.ra < nrows;
    r.b_ok = r.a_ok && r.rb < nrows;
    uint row_words = (pc.ncols / 64u) * CHUNK_WORDS;
    r.base_a = wofs + (r.a_ok ? r.ra : 0u) * row_words;
    // Glu: row rb of up lies at up's own word offset (slot 1)
    r.base_b = (OUT_MODE == OUT_GLU ? pc.wofs[1] : wofs) + (r.b_ok ? r.rb : 0u) * row_words;
    return r;
}

// Scales pair P's sums by each token's 1/rms and writes them as OUT_MODE says.
void store_pair(Pair P, vec4 acc_a, vec4 acc_b, vec4 scale, uint view, uint orow, uint t0) {
    if (!P.a_ok) {
        return;
    }
    uint ga = orow + P.ra;  // global rows
    uint gb = orow + P.rb;
    bool b_ok = P.b_ok;
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
            uint pos0 = step_pos0;
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

#if defined(COLUMN_SPLIT)
// rms_scale with the sum of squares shared by the lanes (column split).
float rms_scale_split(uint row) {
    uint base = row * (pc.x_ld / 4u);
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.ncols / 4u; i += WG) {
        vec4 v = texelFetch(xr4, int(base + i));
        ss = dot4(v, v, ss);
    }
    return inversesqrt(subgroupAdd(ss) / float(pc.ncols) + pc.eps);
}

// The column-split path (one token): see the top of the file.
void split_main(uint view, uint tile, uint nrows, uint orow, uint wofs, uint t0) {
    uint lane = gl_LocalInvocationID.x;
    vec4 scale = vec4(1.0);  // 1/rms of the token's residual (1 without the norm)
    if (IN_MODE == IN_RMSNORM) {
        scale.x = rms_scale_split(x_row(0u));
    }
    // the input quads of the lane's chunks, fetched once for every row of the dispatch
    LOAD_XS(xk0_, 0u, lane * 16u)
    LOAD_XS(xk1_, (SPLIT_K > 1u ? 0u : 4u), (lane + WG) * 16u)
    LOAD_XS(xk2_, (SPLIT_K > 2u ? 0u : 4u), (lane + 2u * WG) * 16u)
    LOAD_XS(xk3_, (SPLIT_K > 3u ? 0u : 4u), (lane + 3u * WG) * 16u)
    for (uint i = 0u; i < PAIRS; i++) {
        uint pair0 = (tile * PAIRS + i) * WG;
        // pair j's sums, kept by lane j
        float own_a = 0.0;
        float own_b = 0.0;
        for (uint j = 0u; j < WG; j++) {
            Pair P = pair_rows(pair0 + j, nrows, wofs, true);
            vec4 acc_a = vec4(0.0);
            vec4 acc_b = vec4(0.0);
            PAIR_CHUNK(P, lane, xk0_, xk0_, xk0_, xk0_, acc_a, acc_b)
            if (SPLIT_K > 1u) PAIR_CHUNK(P, lane + WG, xk1_, xk1_, xk1_, xk1_, acc_a, acc_b)
            if (SPLIT_K > 2u) PAIR_CHUNK(P, lane + 2u * WG, xk2_, xk2_, xk2_, xk2_, acc_a, acc_b)
            if (SPLIT_K > 3u) PAIR_CHUNK(P, lane + 3u * WG, xk3_, xk3_, xk3_, xk3_, acc_a, acc_b)
            float sa = subgroupAdd(acc_a.x);
            float sb = subgroupAdd(acc_b.x);
            if (lane == j) {
                own_a = sa;
                own_b = sb;
            }
        }
        // the left-over chunks of lane's own pair, row-per-lane
        Pair P = pair_rows(pair0 + lane, nrows, wofs, true);
        vec4 acc_a = vec4(own_a, 0.0, 0.0, 0.0);
        vec4 acc_b = vec4(own_b, 0.0, 0.0, 0.0);
        for (uint r = 0u; r < SPLIT_R; r++) {
            uint c = SPLIT_K * WG + r;
            LOAD_XS(xr_, 0u, c * 16u)
            PAIR_CHUNK(P, c, xr_, xr_, xr_, xr_, acc_a, acc_b)
        }
        store_pair(P, acc_a, acc_b, scale, view, orow, t0);
    }
}

#else
// The row-per-lane path: see the top of the file.
void rows_main(uint view, uint tile, uint nrows, uint orow, uint wofs, uint t0) {
    uint nchunks = pc.ncols / 64u;
    // 1/rms of each token's residual (1 without the norm)
    vec4 scale = vec4(1.0);
    if (IN_MODE == IN_RMSNORM) {
        scale.x = rms_scale(x_row(0u));
        if (TB > 1u) { scale.y = rms_scale(x_row(1u)); }
        if (TB > 2u) { scale.z = rms_scale(x_row(2u)); }
        if (TB > 3u) { scale.w = rms_scale(x_row(3u)); }
    }

    for (uint i = 0u; i < PAIRS; i += GROUP) {
        uint p = (tile * PAIRS + i) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
        uint step = gl_WorkGroupSize.x;
        Pair p0 = pair_rows(p, nrows, wofs, true);
        Pair p1 = pair_rows(p + step, nrows, wofs, GROUP > 1u && i + 1u < PAIRS);
        Pair p2 = pair_rows(p + 2u * step, nrows, wofs, GROUP > 2u && i + 2u < PAIRS);
        Pair p3 = pair_rows(p + 3u * step, nrows, wofs, GROUP > 3u && i + 3u < PAIRS);
        vec4 acc_a0 = vec4(0.0);
        vec4 acc_b0 = vec4(0.0);
        vec4 acc_a1 = vec4(0.0);
        vec4 acc_b1 = vec4(0.0);
        vec4 acc_a2 = vec4(0.0);
        vec4 acc_b2 = vec4(0.0);
        vec4 acc_a3 = vec4(0.0);
        vec4 acc_b3 = vec4(0.0);
        for (uint c = 0u; c < nchunks; c++) {
            LOAD_XS(xs0_, 0u, c * 16u)
            LOAD_XS(xs1_, 1u, c * 16u)
            LOAD_XS(xs2_, 2u, c * 16u)
            LOAD_XS(xs3_, 3u, c * 16u)
            PAIR_CHUNK(p0, c, xs0_, xs1_, xs2_, xs3_, acc_a0, acc_b0)
            if (GROUP > 1u) PAIR_CHUNK(p1, c, xs0_, xs1_, xs2_, xs3_, acc_a1, acc_b1)
            if (GROUP > 2u) PAIR_CHUNK(p2, c, xs0_, xs1_, xs2_, xs3_, acc_a2, acc_b2)
            if (GROUP > 3u) PAIR_CHUNK(p3, c, xs0_, xs1_, xs2_, xs3_, acc_a3, acc_b3)
        }
        store_pair(p0, acc_a0, acc_b0, scale, view, orow, t0);
        if (GROUP > 1u) store_pair(p1, acc_a1, acc_b1, scale, view, orow, t0);
        if (GROUP > 2u) store_pair(p2, acc_a2, acc_b2, scale, view, orow, t0);
        if (GROUP > 3u) store_pair(p3, acc_a3, acc_b3, scale, view, orow, t0);
    }
}
#endif

void main() {
    uint wg = gl_WorkGroupID.x;
    uint view = wg < pc.tiles.x ? 0u : (wg < pc.tiles.y ? 1u : 2u);
    uint tile = wg - (view == 0u ? 0u : (view == 1u ? pc.tiles.x : pc.tiles.y));
    uint nrows = pc.nrows[view];
    uint orow = pc.orow[view];
    uint wofs = pc.wofs[view];
    uint t0 = gl_WorkGroupID.y * TB;
#if defined(COLUMN_SPLIT)
    split_main(view, tile, nrows, orow, wofs, t0);
#else
    rows_main(view, tile, nrows, orow, wofs, t0);
#endif
}

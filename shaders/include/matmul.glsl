// What the two matmul kernels share: Y = W · X for a batch of tokens, W read in place
// from GGUF blocks (quant.glsl), with the fusions of docs/design.md as build-time variants.
// CPU twins: reference::kernels::matvec / matmul, composed with rmsnorm (IN_RMSNORM),
// add (OUT_ADD), rope + KV-cache write (OUT_QKV) and swiglu (OUT_GLU).
// Kernels: matmul.comp (lanes own rows), matmul_split.comp (lanes split each row).
//
// Every mode is a define (variants listed in crates/vk/build.rs), not a specialization
// constant: lavapipe 22.3 compiles a spec constant's dead branches too (docs/facts.md,
// "Decode kernels on lavapipe").
//   WTYPE_*      the weight type (quant.glsl)
//   TB           tokens per invocation (1 or 4; the column split takes 1)
//   IN_RMSNORM   X = x∘g; the sums are scaled by 1/rms of the raw residual XR
//   OUT_MODE     OUT_STORE, OUT_ADD, OUT_QKV or OUT_GLU (below)
//   ACT_GELU     OUT_GLU gates with gelu_tanh (gemma3) instead of silu (act.glsl)
// Every view is read through w0 at its own word offset (gate/up: w0 and w1): lavapipe
// runs both sides of every branch, masked, so a per-view branch would fetch every view's
// weights in every workgroup; q, k and v come in one texel view spanning them, or a
// dispatch each.
// Left as specialization constants, as loop bounds only (no branch depends on them):
// the workgroup size (id 0) and PAIRS (id 1).
//
// A pair is two output rows computed together:
//   OUT_STORE/OUT_ADD: rows (2p, 2p+1) of one view (OUT_STORE of several views, e.g. a
//   plain q/k/v: each view's orow places its rows after the previous view's in out0);
//   OUT_QKV: the two rows rope rotates together, (2i, 2i+1) (llama's pairing; a neox
//   model's q/k/v goes through heads.comp), which are also the two f16 halves of one
//   word of the KV cache;
//   OUT_GLU: row p of gate (binding 0) and row p of up (binding 1); only view 0 (gate)
//   owns workgroups, each reading up at the same rows.
//
// rmsnorm is folded without a pass of its own: W·(x/rms(x)∘g) = (W·(x∘g)) / rms(x). The
// dispatch that writes the residual x (OUT_ADD, or the embedding) also writes xg = x∘g for
// the next norm weight g; an IN_RMSNORM dispatch reads xg as X, takes rms from the raw x
// (XR) once per token, and scales its sums at the end.
#extension GL_GOOGLE_include_directive : require

#define OUT_STORE 0
#define OUT_ADD 1
#define OUT_QKV 2
#define OUT_GLU 3
#if !defined(TB) || !defined(OUT_MODE)
#error "a matmul variant defines TB and OUT_MODE (see crates/vk/build.rs)"
#endif

#include "quant.glsl"
#include "step.glsl"
#include "rope.glsl"
#include "act.glsl"
#include "matmul_push.glsl"

layout(local_size_x_id = 0) in;
const uint WG = gl_WorkGroupSize.x;
layout(constant_id = 1) const uint PAIRS = 4u;  // row pairs per invocation (per lane: split)

// Weights and input (RGBA32F) are texel buffers: see quant.glsl.
// Rust twin: engine::kernels::MATMUL_BINDINGS. A variant's compiler drops the bindings
// it never reads; the layout is the union over the variants (crates/vk/build.rs).
layout(set = 0, binding = 0) uniform utextureBuffer w0;
layout(set = 0, binding = 1) uniform utextureBuffer w1;  // up (OUT_GLU)
layout(set = 0, binding = 2) uniform textureBuffer x4;
layout(std430, set = 0, binding = 3) readonly buffer Aux { float aux[]; };  // next norm weight
layout(std430, set = 0, binding = 4) buffer Out0 { float out0[]; };
#if OUT_MODE == OUT_QKV
// the key and value caches: f16 pairs, one word per pair of a position's row
layout(std430, set = 0, binding = 5) writeonly buffer Out1 { uint out1[]; };
layout(std430, set = 0, binding = 6) writeonly buffer Out2 { uint out2[]; };
#else
layout(std430, set = 0, binding = 5) buffer Out1 { float out1[]; };
layout(std430, set = 0, binding = 6) buffer Out2 { float out2[]; };
#endif
STEP_BUFFER(7)
layout(set = 0, binding = 8) uniform textureBuffer xr4;  // raw residual (IN_RMSNORM)

float dot4(vec4 a, vec4 b, float acc) {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// Token row of X read for the workgroup's token t (clamped past the batch's end).
uint x_row(uint t) {
    return pc.x_tok0 + min(gl_WorkGroupID.y * TB + t, pc.n_tok - 1u);
}

// Elements 4q..4q+3 of X for the workgroup's token t.
vec4 xq(uint t, uint q) {
    return texelFetch(x4, int(x_row(t) * (pc.x_ld / 4u) + q));
}

// Input quads of one chunk for token t, fetched once and shared by every row of the
// group (lavapipe turns each texel fetch into a call with a bounds check and eight lane
// loads, so the input must not be fetched once per row). Indexed only with constants
// after the macros below expand, so they stay in registers.
#define LOAD_XS(XS, t, q0)                                                                \
    vec4 XS[16];                                                                          \
    for (uint k_ = 0u; k_ < 16u; k_++) {                                                  \
        XS[k_] = (TB > (t)) ? xq((t), (q0) + k_) : vec4(0.0);                             \
    }

// Adds token t's input quad (XS[qi]) to the block sum s_ (one component per token).
#define QUAD_TOKEN(XS, C)                                                                 \
    {                                                                                     \
        vec4 x_ = XS[qi];                                                                 \
        s_.C = dot4(wq, x_, s_.C);                                                        \
        if (QUANT_HAS_MIN) { sx_.C += (x_.x + x_.y) + (x_.z + x_.w); }                    \
    }

// BLOCK_END of a row's chunk: the block's sums s_ (and sx_) into ACC with its scale qd (and
// min qm), and reset.
#define BLOCK_INTO(ACC)                                                                   \
    ACC = fma(vec4(qd), s_, ACC);                                                         \
    if (QUANT_HAS_MIN) { ACC = fma(vec4(qm), sx_, ACC); }                                 \
    s_ = vec4(0.0);                                                                       \
    sx_ = vec4(0.0);

// ACC (one component per token) += chunk C of row ROW of the view at word WOFS of binding
// B · X (input quads X0..X3, one array per token), the block scale applied per block.
#define ROW_CHUNK(B, WOFS, ROW, C, X0, X1, X2, X3, ACC)                                   \
    {                                                                                     \
        vec4 s_ = vec4(0.0);                                                              \
        vec4 sx_ = vec4(0.0);                                                             \
        QUANT_ROW_CHUNK(B, (WOFS), (ROW), pc.ncols / 64u, (C),                            \
            QUAD_TOKEN(X0, x)                                                             \
            if (TB > 1u) QUAD_TOKEN(X1, y)                                                \
            if (TB > 2u) QUAD_TOKEN(X2, z)                                                \
            if (TB > 3u) QUAD_TOKEN(X3, w)                                                \
        , BLOCK_INTO(ACC))                                                                \
    }

// The binding of a pair's row b: up's (OUT_GLU), else the view's own.
#if OUT_MODE == OUT_GLU
#define PAIR_W_B w1
#else
#define PAIR_W_B w0
#endif
// Chunk C of pair P (both rows) into its accumulators, through the view's binding(s).
#define PAIR_CHUNK(P, C, X0, X1, X2, X3, ACC_A, ACC_B)                                    \
    ROW_CHUNK(w0, P.wofs_a, P.row_a, C, X0, X1, X2, X3, ACC_A)                            \
    ROW_CHUNK(PAIR_W_B, P.wofs_b, P.row_b, C, X0, X1, X2, X3, ACC_B)

// The two rows of pair p of a view: rows in the view, whether each exists, and what is
// read for each (QUANT_ROW_CHUNK's view word offset and row: a missing row reads row 0
// and is not stored).
struct Pair {
    uint ra;
    uint rb;
    bool a_ok;
    bool b_ok;
    uint wofs_a;
    uint wofs_b;
    uint row_a;
    uint row_b;
};

Pair pair_rows(uint p, uint nrows, uint wofs, bool exists) {
    Pair r;
#if OUT_MODE == OUT_GLU
    r.ra = p;
    r.rb = p;
#else
    r.ra = 2u * p;
    r.rb = r.ra + 1u;
#endif
    r.a_ok = exists && r.ra < nrows;
    r.b_ok = r.a_ok && r.rb < nrows;
    r.wofs_a = wofs;
    r.row_a = r.a_ok ? r.ra : 0u;
#if OUT_MODE == OUT_GLU
    // row rb of up lies in up's own view (slot 1)
    r.wofs_b = pc.wofs[1];
#else
    r.wofs_b = wofs;
#endif
    r.row_b = r.b_ok ? r.rb : 0u;
    return r;
}

// 1 / sqrt(mean(x^2) + eps) from a sum of squares.
float rms_of(float ss) {
    return inversesqrt(ss / float(pc.ncols) + pc.eps);
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
#if OUT_MODE == OUT_STORE
        out0[o + ga] = a;
        if (b_ok) out0[o + gb] = b;
#elif OUT_MODE == OUT_ADD
        float xa = out0[o + ga] + a;
        out0[o + ga] = xa;
        if (pc.write_xg != 0u) out1[o + ga] = xa * aux[pc.aux_ofs + ga];
        if (b_ok) {
            float xb = out0[o + gb] + b;
            out0[o + gb] = xb;
            if (pc.write_xg != 0u) out1[o + gb] = xb * aux[pc.aux_ofs + gb];
        }
#elif OUT_MODE == OUT_GLU
#if defined(ACT_GELU)
        out0[o + ga] = geglu(a, b);
#else
        out0[o + ga] = swiglu(a, b);
#endif
#else  // OUT_QKV: rope q and k at each token's position, k and v go to its cache row
        if (view != 2u) {
            uint fi = (ga % pc.head_dim) / 2u;
            vec2 r = rope_pair(a, b, float(STEP_POS(tt)), step_freqs[fi]);
            a = r.x;
            b = r.y;
        }
        if (view == 0u) {
            out0[o + ga] = a;
            out0[o + gb] = b;
        } else {
            // ga is even (the engine binds k and v at even rows): the pair is one word
            uint w = (STEP_ROW(tt) * pc.kv_ld + ga) / 2u;
            if (view == 1u) {
                out1[w] = packHalf2x16(vec2(a, b));
            } else {
                out2[w] = packHalf2x16(vec2(a, b));
            }
        }
#endif
    }
}

// The workgroup's view (of up to three laid end to end in workgroup x) and its tile in it.
void view_of_workgroup(out uint view, out uint tile) {
    uint wg = gl_WorkGroupID.x;
    view = wg < pc.tiles.x ? 0u : (wg < pc.tiles.y ? 1u : 2u);
    tile = wg - (view == 0u ? 0u : (view == 1u ? pc.tiles.x : pc.tiles.y));
}

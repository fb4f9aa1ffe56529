#version 450
// The per-head steps between a plain q/k/v matmul and attention, for the families whose
// graph does more than llama's fused epilogue (matmul.glsl OUT_QKV): the q/k/v biases
// (qwen2), the RMS norm of every head of Q and of K (qwen3, gemma3), RoPE with the
// layer's own frequency table (gemma3's sliding-window layers), then q written for
// attention and k, v into the caches (f16 pairs, one word each) at each token's row
// (STEP_POS, STEP_ROW: step.glsl).
// CPU twin: reference::kernels::{add, rmsnorm_heads, rope_ext}, in that order (as
// reference::forward applies them).
//
// One invocation per (head, token): heads 0..n_heads are q, then n_kv_heads of k, then of
// v, as the matmul laid them end to end in a row of QKV. Every load is uniform (cheap on
// lavapipe) and a head is at most 256 elements: the whole step costs about a dispatch.
#extension GL_GOOGLE_include_directive : require

#include "step.glsl"
#include "rope.glsl"

layout(local_size_x = 1) in;

// Rust twin: engine::kernels::HEADS_BINDINGS / HeadsBindings.
layout(std430, set = 0, binding = 0) readonly buffer Qkv { float qkv[]; };  // [n_tok][qkv_ld]
layout(std430, set = 0, binding = 1) readonly buffer Bq { float bq[]; };    // q bias
layout(std430, set = 0, binding = 2) readonly buffer Bk { float bk[]; };    // k bias
layout(std430, set = 0, binding = 3) readonly buffer Bv { float bv[]; };    // v bias
layout(std430, set = 0, binding = 4) readonly buffer Qn { float qn[]; };    // q head norm
layout(std430, set = 0, binding = 5) readonly buffer Kn { float kn[]; };    // k head norm
layout(std430, set = 0, binding = 6) buffer Q { float q[]; };               // [n_tok][q_ld]
layout(std430, set = 0, binding = 7) writeonly buffer Kc { uint kc[]; };   // [ctx][kv_ld / 2]
layout(std430, set = 0, binding = 8) writeonly buffer Vc { uint vc[]; };   // [ctx][kv_ld / 2]
STEP_BUFFER(9)
layout(std430, set = 0, binding = 10) readonly buffer Rope { float rope_tab[]; };

// Rust twin: engine::kernels::HeadsPush (64 bytes).
layout(push_constant) uniform Push {
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint qkv_ld;    // floats between token rows of QKV (n_heads + 2 n_kv_heads heads)
    uint q_ld;      // floats between token rows of Q
    uint kv_ld;     // elements between positions of the caches (even)
    float eps;      // the head norms' epsilon
    uint flags;     // HEADS_BIAS | HEADS_NORM | HEADS_NEOX
    uint freq_ofs;  // this layer's frequency table inside ROPE (theta_i = pos * rope_tab[freq_ofs + i])
    uint bq_ofs;    // float offsets of the biases and norm weights in their bindings
    uint bk_ofs;
    uint bv_ofs;
    uint qn_ofs;
    uint kn_ofs;
    uint pad0;
    uint pad1;
} pc;

#define HEADS_BIAS 1u
#define HEADS_NORM 2u
#define HEADS_NEOX 4u

// One head: DST[d..d+hd] = SRC head (+ BIAS), RMS-normed by NORM (when NORMED), rotated
// (when ROPED).
#define HEAD_STEPS(DST, d, BIAS, bofs, NORM, nofs, NORMED, ROPED)                          \
    {                                                                                     \
        bool bias_ = (pc.flags & HEADS_BIAS) != 0u;                                       \
        float ss_ = 0.0;                                                                  \
        for (uint i = 0u; i < hd; i++) {                                                  \
            float v_ = qkv[src + i];                                                      \
            if (bias_) {                                                                  \
                v_ += BIAS[(bofs) + i];                                                   \
            }                                                                             \
            ss_ = fma(v_, v_, ss_);                                                       \
            DST[(d) + i] = v_;                                                            \
        }                                                                                 \
        if (NORMED) {                                                                     \
            float r_ = inversesqrt(ss_ / float(hd) + pc.eps);                             \
            for (uint i = 0u; i < hd; i++) {                                              \
                DST[(d) + i] = DST[(d) + i] * r_ * NORM[(nofs) + i];                      \
            }                                                                             \
        }                                                                                 \
        if (ROPED) {                                                                      \
            bool neox_ = (pc.flags & HEADS_NEOX) != 0u;                                   \
            uint half_ = hd / 2u;                                                         \
            for (uint i = 0u; i < half_; i++) {                                           \
                uint ia_ = (d) + (neox_ ? i : 2u * i);                                    \
                uint ib_ = (d) + (neox_ ? i + half_ : 2u * i + 1u);                       \
                vec2 r_ = rope_pair(DST[ia_], DST[ib_], pos, rope_tab[pc.freq_ofs + i]);  \
                DST[ia_] = r_.x;                                                          \
                DST[ib_] = r_.y;                                                          \
            }                                                                             \
        }                                                                                 \
    }

// A k or v head on its way to the cache: normed and rotated in f32, then stored as f16.
shared float head_f32[2u * STEP_FREQS_MAX];

// The head in head_f32 into the cache from element d (even) on, two elements a word.
#define STORE_F16(CACHE, d)                                                               \
    for (uint i = 0u; i < hd / 2u; i++) {                                                 \
        CACHE[(d) / 2u + i] = packHalf2x16(vec2(head_f32[2u * i], head_f32[2u * i + 1u])); \
    }

void main() {
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint hd = pc.head_dim;
    uint nq = pc.n_heads;
    uint nk = pc.n_kv_heads;
    uint src = t * pc.qkv_ld + h * hd;
    float pos = float(STEP_POS(t));
    bool normed = (pc.flags & HEADS_NORM) != 0u;
    uint c = STEP_ROW(t) * pc.kv_ld;  // the token's cache row (its slot's rows + pos)
    if (h < nq) {
        HEAD_STEPS(q, t * pc.q_ld + h * hd, bq, pc.bq_ofs + h * hd, qn, pc.qn_ofs, normed, true)
    } else if (h < nq + nk) {
        uint kh = h - nq;
        HEAD_STEPS(head_f32, 0u, bk, pc.bk_ofs + kh * hd, kn, pc.kn_ofs, normed, true)
        STORE_F16(kc, c + kh * hd)
    } else {
        uint vh = h - nq - nk;
        HEAD_STEPS(head_f32, 0u, bv, pc.bv_ofs + vh * hd, kn, pc.kn_ofs, false, false)
        STORE_F16(vc, c + vh * hd)
    }
}

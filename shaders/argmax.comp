#version 450
// Index of the largest logit (the first one on ties), in one workgroup per row of n
// logits, and whether any logit is NaN or infinite, in one word: result[row] = index |
// (non-finite << 31) (the host then refuses the token instead of taking index 0 of a NaN
// row; vocabularies are far below 2^31, and a token still reads back 4 bytes). Row r is
// workgroup r (a batched decode step's head: one row per slot's token).
// CPU twin: reference::kernels::argmax.
layout(local_size_x_id = 0) in;
const uint MAX_WG = 256u;

layout(std430, set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Result { uint result[]; };

// Rust twin: engine::kernels::ArgmaxPush.
layout(push_constant) uniform Push {
    uint n;
} pc;

shared float best_v[MAX_WG];
shared uint best_i[MAX_WG];
shared uint bad_any[MAX_WG];

void main() {
    uint l = gl_LocalInvocationID.x;
    uint row = gl_WorkGroupID.x;
    uint base = row * pc.n;
    float bv = -1.0 / 0.0;
    uint bi = 0xFFFFFFFFu;
    uint bad = 0u;
    for (uint i = l; i < pc.n; i += gl_WorkGroupSize.x) {
        float v = logits[base + i];
        bad |= uint(isnan(v) || isinf(v));
        if (v > bv || bi == 0xFFFFFFFFu) {
            bv = v;
            bi = i;
        }
    }
    best_v[l] = bv;
    best_i[l] = bi;
    bad_any[l] = bad;
    barrier();
    if (l == 0u) {
        for (uint j = 1u; j < gl_WorkGroupSize.x; j++) {
            float v = best_v[j];
            uint i = best_i[j];
            bad |= bad_any[j];
            if (i != 0xFFFFFFFFu && (v > bv || (v == bv && i < bi) || bi == 0xFFFFFFFFu)) {
                bv = v;
                bi = i;
            }
        }
        result[row] = bi | (bad << 31);
    }
}

#version 450
// Index of the largest logit (the first one on ties), in one workgroup.
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

void main() {
    uint l = gl_LocalInvocationID.x;
    float bv = -1.0 / 0.0;
    uint bi = 0xFFFFFFFFu;
    for (uint i = l; i < pc.n; i += gl_WorkGroupSize.x) {
        float v = logits[i];
        if (v > bv || bi == 0xFFFFFFFFu) {
            bv = v;
            bi = i;
        }
    }
    best_v[l] = bv;
    best_i[l] = bi;
    barrier();
    if (l == 0u) {
        for (uint j = 1u; j < gl_WorkGroupSize.x; j++) {
            float v = best_v[j];
            uint i = best_i[j];
            if (i != 0xFFFFFFFFu && (v > bv || (v == bv && i < bi) || bi == 0xFFFFFFFFu)) {
                bv = v;
                bi = i;
            }
        }
        result[0] = bi;
    }
}

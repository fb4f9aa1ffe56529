#version 450
// Causal attention of a batch of tokens over the KV cache, with grouped-query heads.
// CPU twin: reference::kernels::attention (softmax(q·K^T / sqrt(head_dim)) · V).
// One workgroup per (head, token); token t sits at position pos0 + t and attends to
// positions 0..=pos0+t, whose keys and values are already in the caches.
#extension GL_GOOGLE_include_directive : require

#include "step.glsl"

layout(local_size_x_id = 0) in;
const uint MAX_WG = 256u;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };       // [n_tok][n_heads*head_dim]
layout(std430, set = 0, binding = 1) readonly buffer KC { float kc[]; };     // [ctx][kv_dim]
layout(std430, set = 0, binding = 2) readonly buffer VC { float vc[]; };     // [ctx][kv_dim]
layout(std430, set = 0, binding = 3) buffer Att { float att[]; };            // [n_tok][n_heads][ctx] scratch
layout(std430, set = 0, binding = 4) writeonly buffer Out { float outv[]; }; // [n_tok][n_heads*head_dim]
STEP_BUFFER(5)

// Rust twin: engine::kernels::AttentionPush (24 bytes).
layout(push_constant) uniform Push {
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint ctx;      // positions the cache holds (stride of the att scratch)
    float scale;   // 1 / sqrt(head_dim)
    uint pad;
} pc;

shared float red[MAX_WG];

float reduce_max(float v) {
    uint l = gl_LocalInvocationID.x;
    red[l] = v;
    barrier();
    if (l == 0u) {
        float m = red[0];
        for (uint i = 1u; i < gl_WorkGroupSize.x; i++) {
            m = max(m, red[i]);
        }
        red[0] = m;
    }
    barrier();
    float r = red[0];
    barrier();
    return r;
}

float reduce_sum(float v) {
    uint l = gl_LocalInvocationID.x;
    red[l] = v;
    barrier();
    if (l == 0u) {
        float s = 0.0;
        for (uint i = 0u; i < gl_WorkGroupSize.x; i++) {
            s += red[i];
        }
        red[0] = s;
    }
    barrier();
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint l = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupSize.x;
    uint hd = pc.head_dim;
    uint kv_dim = pc.n_kv_heads * hd;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint n_pos = step_pos0 + t + 1u;
    uint qo = (t * pc.n_heads + h) * hd;
    uint ao = (t * pc.n_heads + h) * pc.ctx;

    // scores, and their maximum
    float m = -3.402823466e38;
    for (uint p = l; p < n_pos; p += wg) {
        uint ko = p * kv_dim + kvh * hd;
        float s = 0.0;
        for (uint d = 0u; d < hd; d++) {
            s = fma(q[qo + d], kc[ko + d], s);
        }
        s *= pc.scale;
        att[ao + p] = s;
        m = max(m, s);
    }
    m = reduce_max(m);

    // softmax weights (unnormalised) and their sum
    float sum = 0.0;
    for (uint p = l; p < n_pos; p += wg) {
        float e = exp(att[ao + p] - m);
        att[ao + p] = e;
        sum += e;
    }
    sum = reduce_sum(sum);
    memoryBarrierBuffer();
    barrier();

    // weighted sum of values, one output dimension per lane
    float inv = 1.0 / sum;
    for (uint d = l; d < hd; d += wg) {
        float o = 0.0;
        uint vo = kvh * hd + d;
        for (uint p = 0u; p < n_pos; p++) {
            o = fma(att[ao + p], vc[p * kv_dim + vo], o);
        }
        outv[qo + d] = o * inv;
    }
}

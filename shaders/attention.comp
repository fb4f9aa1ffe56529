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
// The caches are RGBA32F texel buffers: on lavapipe a per-lane texelFetch is a plain
// 16-byte load, where a per-lane storage-buffer load is a loop with a bounds check.
layout(set = 0, binding = 1) uniform samplerBuffer kc4;                       // [ctx][kv_dim/4]
layout(set = 0, binding = 2) uniform samplerBuffer vc4;                       // [ctx][kv_dim/4]
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
    uint hd = pc.head_dim;  // a multiple of 4 (the host checks)
    uint hq = hd / 4u;
    uint kv_q = pc.n_kv_heads * hq;  // quads per cache position
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint n_pos = step_pos0 + t + 1u;
    uint qo = (t * pc.n_heads + h) * hd;
    uint ao = (t * pc.n_heads + h) * pc.ctx;

    // scores (one position per lane; q is read at uniform offsets), and their maximum
    float m = -3.402823466e38;
    for (uint p = l; p < n_pos; p += wg) {
        int ko = int(p * kv_q + kvh * hq);
        float s = 0.0;
        for (uint j = 0u; j < hq; j++) {
            vec4 k = texelFetch(kc4, ko + int(j));
            uint d = qo + 4u * j;
            s = fma(q[d + 3u], k.w, fma(q[d + 2u], k.z, fma(q[d + 1u], k.y, fma(q[d], k.x, s))));
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

    // weighted sum of values, one quad of output dimensions per lane
    float inv = 1.0 / sum;
    for (uint j = l; j < hq; j += wg) {
        vec4 o = vec4(0.0);
        int vo = int(kvh * hq + j);
        for (uint p = 0u; p < n_pos; p++) {
            o = fma(vec4(att[ao + p]), texelFetch(vc4, int(p * kv_q) + vo), o);
        }
        o *= inv;
        uint d = qo + 4u * j;
        outv[d] = o.x;
        outv[d + 1u] = o.y;
        outv[d + 2u] = o.z;
        outv[d + 3u] = o.w;
    }
}

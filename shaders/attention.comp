#version 450
// Causal attention of a batch of tokens over the KV cache, with grouped-query heads.
// CPU twin: reference::kernels::attention_ext (softmax(q·K^T · scale) · V).
// One workgroup per (head, token) for the batch's tokens from t0 on: workgroup row y is
// token t = t0 + y and writes row y of out (t0 > 0 when a prompt's last token alone goes
// on past the keys and values: model/layer.rs). Token t sits at position STEP_POS(t) and
// attends to positions first..=STEP_POS(t) of its own slot, whose keys and values are
// already in the caches (rows STEP_ROW(t) - STEP_POS(t) onwards: a batch may mix slots);
// first is 0, or STEP_POS(t) - window + 1 for a sliding-window layer (gemma3's local
// layers).
//
// Each lane takes every gl_WorkGroupSize.x-th position and keeps a running softmax of its
// own (maximum, sum of weights, weighted sum of values), rescaled whenever its maximum
// grows; the lanes' partial results are merged once at the end. So scores never go to
// memory, and every load in the position loop is a per-lane texel fetch: on lavapipe
// storage-buffer and shared-memory loads are loops over the lanes.
//
// Tried and dropped (branch `attn`, 86c8610): a tile of queries per workgroup (the query
// heads of one KV head x 1-2 tokens, 1-4 positions per lane per block), so each key and
// value fetched serves several queries. Slower on lavapipe at every tile shape: attention
// took 29-50% of the last 64-token prefill chunk against 21-27% for this kernel, and
// 17-28% of a decode token at context ~520 against 15-19% (`vkdecode bench -p 512 -n 8
// --profile`, alternating, load 6.5-12). The more queries a lane holds, the slower each
// texel fetch (an out-of-line call, around which the live vector registers are saved).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require

#include "step.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HQ = 16u;  // head_dim / 4: quads per head

// q is an RGBA32F texel buffer, the caches RGBA16F ones (f16 keys and values, read as
// f32), so the head dimension is a multiple of 4.
layout(set = 0, binding = 0) uniform textureBuffer q4;                        // [n_tok][n_heads*HQ]
layout(set = 0, binding = 1) uniform textureBuffer kc4;                       // [ctx][n_kv_heads*HQ]
layout(set = 0, binding = 2) uniform textureBuffer vc4;                       // [ctx][n_kv_heads*HQ]
layout(std430, set = 0, binding = 3) writeonly buffer Out { float outv[]; }; // [n_tok][n_heads*head_dim]
STEP_BUFFER(4)

// Rust twin: engine::kernels::AttentionPush (24 bytes).
layout(push_constant) uniform Push {
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;  // 4 * HQ
    float scale;    // the score scale (1 / sqrt(head_dim) unless the model says otherwise)
    uint window;    // positions a query sees, itself included (0: all)
    uint t0;        // the batch's first token that runs (workgroup row 0)
} pc;

// Each lane's running maximum, sum of weights and weighted sum of values.
shared float part_m[gl_WorkGroupSize.x];
shared float part_s[gl_WorkGroupSize.x];
shared vec4 part_o[gl_WorkGroupSize.x * HQ];

void main() {
    uint h = gl_WorkGroupID.x;
    uint t = pc.t0 + gl_WorkGroupID.y;
    uint l = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupSize.x;
    uint kv_q = pc.n_kv_heads * HQ;  // quads per cache position
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint n_pos = STEP_POS(t) + 1u;
    uint first = (pc.window != 0u && n_pos > pc.window) ? n_pos - pc.window : 0u;
    uint row0 = STEP_ROW(t) - STEP_POS(t);  // the slot's first cache row
    uint qo = (t * pc.n_heads + h) * HQ;
    uint oo = (gl_WorkGroupID.y * pc.n_heads + h) * HQ;  // its quads in out

    // q, pre-scaled (the loops below have constant trip counts, so these stay registers)
    vec4 qv[HQ];
    for (uint j = 0u; j < HQ; j++) {
        qv[j] = texelFetch(q4, int(qo + j)) * pc.scale;
    }

    float m = -3.402823466e38;
    float sum = 0.0;
    vec4 o[HQ];
    for (uint j = 0u; j < HQ; j++) {
        o[j] = vec4(0.0);
    }
    for (uint p = first + l; p < n_pos; p += wg) {
        int ko = int((row0 + p) * kv_q + kvh * HQ);
        float s = 0.0;
        for (uint j = 0u; j < HQ; j++) {
            vec4 k = texelFetch(kc4, ko + int(j));
            s = fma(qv[j].w, k.w, fma(qv[j].z, k.z, fma(qv[j].y, k.y, fma(qv[j].x, k.x, s))));
        }
        float m_new = max(m, s);
        float corr = exp(m - m_new);  // rescales what was summed under the old maximum
        float e = exp(s - m_new);
        sum = fma(sum, corr, e);
        for (uint j = 0u; j < HQ; j++) {
            o[j] = fma(o[j], vec4(corr), e * texelFetch(vc4, ko + int(j)));
        }
        m = m_new;
    }

    // merge the lanes: weights relative to the largest maximum (a lane without positions
    // has m = -FLT_MAX and weight 0)
    part_m[l] = m;
    part_s[l] = sum;
    for (uint j = 0u; j < HQ; j++) {
        part_o[l * HQ + j] = o[j];
    }
    barrier();
    float big = part_m[0];
    for (uint i = 1u; i < wg; i++) {
        big = max(big, part_m[i]);
    }
    float total = 0.0;
    for (uint i = 0u; i < wg; i++) {
        total = fma(part_s[i], exp(part_m[i] - big), total);
    }
    float inv = 1.0 / total;
    for (uint j = l; j < HQ; j += wg) {
        vec4 acc = vec4(0.0);
        for (uint i = 0u; i < wg; i++) {
            acc = fma(part_o[i * HQ + j], vec4(exp(part_m[i] - big)), acc);
        }
        acc *= inv;
        uint d = 4u * (oo + j);
        outv[d] = acc.x;
        outv[d + 1u] = acc.y;
        outv[d + 2u] = acc.z;
        outv[d + 3u] = acc.w;
    }
}

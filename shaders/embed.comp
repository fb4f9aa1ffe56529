// variants: q8_0=-DWTYPE_Q8_0 q4_0=-DWTYPE_Q4_0 q4_1=-DWTYPE_Q4_1 f16=-DWTYPE_F16 f32=-DWTYPE_F32
#version 450
// X[t] = row step_tokens[t] of the embedding table, dequantised in registers.
// CPU twin: reference::kernels::embedding_row. One invocation per 64-element chunk.
// A table larger than one binding comes as up to three row-range parts (bindings 0..2).
#extension GL_GOOGLE_include_directive : require

#include "quant.glsl"
#include "step.glsl"

layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer W0 { uint w0[]; };
layout(std430, set = 0, binding = 1) readonly buffer W1 { uint w1[]; };
layout(std430, set = 0, binding = 2) readonly buffer W2 { uint w2[]; };
layout(std430, set = 0, binding = 3) writeonly buffer X { vec4 x4[]; };
STEP_BUFFER(4)

// Rust twin: engine::kernels::EmbedPush (48 bytes).
layout(push_constant) uniform Push {
    uint ncols;       // row length, a multiple of 64
    uint out_ld;      // floats between token rows of X
    uint n_tok;
    uint pad;
    uvec4 part_end;   // rows [part_end[v-1], part_end[v]) live in binding v
    uvec4 wofs;       // word offset of part v's first row inside binding v
} pc;

void main() {
    uint c = gl_GlobalInvocationID.x;
    uint t = gl_WorkGroupID.y;
    uint nchunks = pc.ncols / 64u;
    if (c >= nchunks || t >= pc.n_tok) {
        return;
    }
    uint row = step_tokens[t];
    uint part = row < pc.part_end.x ? 0u : (row < pc.part_end.y ? 1u : 2u);
    uint first = part == 0u ? 0u : (part == 1u ? pc.part_end.x : pc.part_end.y);
    uint base = pc.wofs[part] + (row - first) * nchunks * CHUNK_WORDS + c * CHUNK_WORDS;
    uint o = t * (pc.out_ld / 4u) + c * 16u;
    if (part == 0u) {
        FOR_EACH_QUAD(w0, base, x4[o + qi] = wq;)
    } else if (part == 1u) {
        FOR_EACH_QUAD(w1, base, x4[o + qi] = wq;)
    } else {
        FOR_EACH_QUAD(w2, base, x4[o + qi] = wq;)
    }
}

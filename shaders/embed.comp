#version 450
// X[t] = row step_tokens[t] of the embedding table, dequantised in registers and scaled
// (gemma3: by sqrt(dim); 1 otherwise), and
// XG[t] = X[t] ∘ g, the first layer's rmsnorm input (see matmul.comp).
// CPU twin: reference::kernels::embedding_row. One invocation per 64-element chunk.
// A table larger than one binding comes as up to three row-range parts (bindings 0..2).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require

#include "quant.glsl"
#include "step.glsl"

layout(local_size_x_id = 0) in;

// The table's parts as texel buffers (see quant.glsl).
// Variants (crates/vk/build.rs): one per weight type, WTYPE_*.
layout(set = 0, binding = 0) uniform utextureBuffer w0;
layout(set = 0, binding = 1) uniform utextureBuffer w1;
layout(set = 0, binding = 2) uniform utextureBuffer w2;
layout(std430, set = 0, binding = 3) writeonly buffer X { vec4 x4[]; };
STEP_BUFFER(4)
layout(std430, set = 0, binding = 5) writeonly buffer XG { vec4 xg4[]; };
layout(std430, set = 0, binding = 6) readonly buffer G { float g[]; };

// Rust twin: engine::kernels::EmbedPush (52 bytes).
layout(push_constant) uniform Push {
    uint ncols;       // row length, a multiple of 64
    uint out_ld;      // floats between token rows of X
    uint n_tok;
    uint g_ofs;       // float offset of g inside its binding
    uvec4 part_end;   // rows [part_end[v-1], part_end[v]) live in binding v
    uvec4 wofs;       // word offset of part v's first row inside binding v
    float scale;      // the embedding scale (Config::embd_scale)
} pc;

// Writes the dequantised quad qi of the chunk to X and XG.
#define EMIT(v, qi)                                                                       \
    {                                                                                     \
        vec4 s_ = (v) * pc.scale;                                                         \
        x4[o + qi] = s_;                                                                  \
        uint e_ = pc.g_ofs + 64u * c + 4u * qi;                                           \
        xg4[o + qi] = s_ * vec4(g[e_], g[e_ + 1u], g[e_ + 2u], g[e_ + 3u]);                \
    }

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
    uint wofs = pc.wofs[part];
    uint r = row - first;
    uint o = t * (pc.out_ld / 4u) + c * 16u;
    if (part == 0u) {
        QUANT_ROW_CHUNK(w0, wofs, r, nchunks, c, EMIT(fma(vec4(qd), wq, vec4(qm)), qi), )
    } else if (part == 1u) {
        QUANT_ROW_CHUNK(w1, wofs, r, nchunks, c, EMIT(fma(vec4(qd), wq, vec4(qm)), qi), )
    } else {
        QUANT_ROW_CHUNK(w2, wofs, r, nchunks, c, EMIT(fma(vec4(qd), wq, vec4(qm)), qi), )
    }
}

#version 450
// The residual add of a block whose output is RMS-normed first (gemma3's
// post_attention_norm and post_ffw_norm): X += rmsnorm(Y)∘w, and XG = X∘g, the next
// norm's input (see matmul.glsl: the next matmul folds the rms of X in).
// CPU twin: reference::kernels::{rmsnorm, add}, then the product with g.
// One workgroup per token; the sum of squares is reduced in shared memory.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
const uint WG = gl_WorkGroupSize.x;  // a power of two

// Rust twin: engine::kernels::POST_NORM_BINDINGS / PostNormBindings.
layout(std430, set = 0, binding = 0) readonly buffer Y { float y[]; };   // [n_tok][dim]
layout(std430, set = 0, binding = 1) readonly buffer W { float w[]; };   // post norm weight
layout(std430, set = 0, binding = 2) readonly buffer G { float g[]; };   // next norm weight
layout(std430, set = 0, binding = 3) buffer X { float x[]; };            // [n_tok][dim]
layout(std430, set = 0, binding = 4) writeonly buffer XG { float xg[]; }; // [n_tok][dim]

// Rust twin: engine::kernels::PostNormPush (16 bytes).
layout(push_constant) uniform Push {
    uint dim;
    float eps;
    uint w_ofs;  // float offsets of w and g inside their bindings
    uint g_ofs;
} pc;

shared float part[WG];

void main() {
    uint l = gl_LocalInvocationID.x;
    uint o = gl_WorkGroupID.x * pc.dim;
    float ss = 0.0;
    for (uint i = l; i < pc.dim; i += WG) {
        float v = y[o + i];
        ss = fma(v, v, ss);
    }
    part[l] = ss;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) {
            part[l] += part[l + s];
        }
        barrier();
    }
    float r = inversesqrt(part[0] / float(pc.dim) + pc.eps);
    for (uint i = l; i < pc.dim; i += WG) {
        float xi = x[o + i] + y[o + i] * r * w[pc.w_ofs + i];
        x[o + i] = xi;
        xg[o + i] = xi * g[pc.g_ofs + i];
    }
}

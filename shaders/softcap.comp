#version 450
// Final logit softcapping, in place: x = cap * tanh(x / cap) (gemma's
// final_logit_softcapping). Monotonic, so the argmax is unchanged, but sampled and
// returned logits must carry it.
// CPU twin: reference::kernels::softcap.

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) buffer Logits { float logits[]; };

// Rust twin: engine::kernels::SoftcapPush (8 bytes).
layout(push_constant) uniform Push {
    uint n;
    float cap;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) {
        return;
    }
    // tanh is 1 to f32 precision past 10; the clamp keeps exp-based tanh lowerings finite
    float v = clamp(logits[i] / pc.cap, -10.0, 10.0);
    logits[i] = pc.cap * tanh(v);
}

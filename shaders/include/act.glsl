// SiLU-gated linear unit: silu(g) * u = g / (1 + e^-g) * u.
// CPU twin: reference::kernels::swiglu.
float swiglu(float g, float u) {
    return g / (1.0 + exp(-g)) * u;
}

// GELU with the tanh approximation (ggml_gelu; PyTorch gelu(approximate="tanh")):
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), the argument clamped where tanh is
// already 1 in f32 (so an exp-based tanh stays finite). CPU twin: reference::kernels::gelu_tanh.
float gelu_tanh(float g) {
    float z = 0.7978845608028654 * fma(0.044715 * g * g, g, g);
    return 0.5 * g * (1.0 + tanh(clamp(z, -10.0, 10.0)));
}

// GELU-gated linear unit (gemma3): gelu_tanh(g) * u. CPU twin: reference::kernels::geglu.
float geglu(float g, float u) {
    return gelu_tanh(g) * u;
}

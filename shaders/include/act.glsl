// SiLU-gated linear unit: silu(g) * u = g / (1 + e^-g) * u.
// CPU twin: reference::kernels::swiglu.
float swiglu(float g, float u) {
    return g / (1.0 + exp(-g)) * u;
}

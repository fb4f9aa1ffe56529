// Rotary position embedding of one pair (a, b) by the angle pos * freq.
// CPU twin: reference::kernels::rope (Normal: pairs (2i, 2i+1); Neox: (i, i + head_dim/2)).
vec2 rope_pair(float a, float b, float pos, float freq) {
    float theta = pos * freq;
    float c = cos(theta);
    float s = sin(theta);
    return vec2(a * c - b * s, a * s + b * c);
}

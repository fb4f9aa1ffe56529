// Weight blocks as they lie in a GGUF file, read as little-endian u32 words from a
// storage buffer, and decoded in registers ("dequant in registers": the weights are never
// widened in memory). Exactly one WTYPE_* define selects the type.
//
// A "chunk" is 64 consecutive elements of one row (two 32-element blocks for the quantised
// types), CHUNK_WORDS u32 words long, so a chunk always starts on a 4-byte boundary when
// the row length is a multiple of 64 (the host checks that). `quad(w, k)` returns elements
// 4k..4k+3 of the chunk (k in 0..16), already scaled.
//
// Rust twins (crates/gguf/src/quant.rs):
//   Q8_0  BlockQ8_0 { d: f16, qs: [i8; 32] }        34 bytes: x = d * q
//   Q4_0  BlockQ4_0 { d: f16, qs: [u8; 16] }        18 bytes: x = d * (n - 8)
//   Q4_1  BlockQ4_1 { d: f16, m: f16, qs: [u8; 16] } 20 bytes: x = d * n + m
//         (Q4_*: byte j's low nibble is element j, its high nibble element j + 16)
//   F16   half                                      2 bytes
//   F32   float                                     4 bytes

#if defined(WTYPE_Q8_0)
// Two blocks = 68 bytes = 17 words. Block 0: d0 = low half of w0, qs0 = bytes 2..33
// (realigned from words 0..8); block 1: d1 = high half of w8, qs1 = words 9..16.
#define CHUNK_WORDS 17u

// int8 lanes of a word, each placed in the top byte so the conversion is exact and
// signed; the 2^-24 is folded into the block scale.
vec4 i8x4_shifted(uint q) {
    return vec4(float(int(q << 24)), float(int((q << 16) & 0xFF000000u)),
                float(int((q << 8) & 0xFF000000u)), float(int(q & 0xFF000000u)));
}

vec4 quad(uint w[CHUNK_WORDS], uint k) {
    if (k < 8u) {
        float d = unpackHalf2x16(w[0]).x * (1.0 / 16777216.0);
        uint q = (w[k] >> 16) | (w[k + 1u] << 16);
        return d * i8x4_shifted(q);
    }
    float d = unpackHalf2x16(w[8]).y * (1.0 / 16777216.0);
    return d * i8x4_shifted(w[k + 1u]);
}

#elif defined(WTYPE_Q4_0)
// Two blocks = 36 bytes = 9 words. Block 0: d0 = low half of w0, qs0 = bytes 2..17
// (realigned from words 0..4); block 1: d1 = high half of w4, qs1 = words 5..8.
#define CHUNK_WORDS 9u

vec4 nibbles(uint q, uint shift) {
    return vec4(float((q >> shift) & 0xFu), float((q >> (shift + 8u)) & 0xFu),
                float((q >> (shift + 16u)) & 0xFu), float((q >> (shift + 24u)) & 0xFu));
}

vec4 quad(uint w[CHUNK_WORDS], uint k) {
    uint j = k & 7u;              // quad inside the block: 0..3 low nibbles, 4..7 high
    uint shift = (j & 4u);        // 0 or 4
    if (k < 8u) {
        float d = unpackHalf2x16(w[0]).x;
        uint i = j & 3u;
        uint q = (w[i] >> 16) | (w[i + 1u] << 16);
        return d * (nibbles(q, shift) - 8.0);
    }
    float d = unpackHalf2x16(w[4]).y;
    return d * (nibbles(w[5u + (j & 3u)], shift) - 8.0);
}

#elif defined(WTYPE_Q4_1)
// Two blocks = 40 bytes = 10 words: w0 = (d0, m0), w1..4 = qs0, w5 = (d1, m1), w6..9 = qs1.
#define CHUNK_WORDS 10u

vec4 nibbles(uint q, uint shift) {
    return vec4(float((q >> shift) & 0xFu), float((q >> (shift + 8u)) & 0xFu),
                float((q >> (shift + 16u)) & 0xFu), float((q >> (shift + 24u)) & 0xFu));
}

vec4 quad(uint w[CHUNK_WORDS], uint k) {
    uint b = (k >> 3) * 5u;       // first word of the block
    uint j = k & 7u;
    vec2 dm = unpackHalf2x16(w[b]);
    return fma(vec4(dm.x), nibbles(w[b + 1u + (j & 3u)], j & 4u), vec4(dm.y));
}

#elif defined(WTYPE_F16)
#define CHUNK_WORDS 32u
vec4 quad(uint w[CHUNK_WORDS], uint k) {
    return vec4(unpackHalf2x16(w[2u * k]), unpackHalf2x16(w[2u * k + 1u]));
}

#elif defined(WTYPE_F32)
#define CHUNK_WORDS 64u
vec4 quad(uint w[CHUNK_WORDS], uint k) {
    return uintBitsToFloat(uvec4(w[4u * k], w[4u * k + 1u], w[4u * k + 2u], w[4u * k + 3u]));
}

#else
#error "define one of WTYPE_Q8_0, WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_F16, WTYPE_F32"
#endif

// Words of one chunk from a weight binding. A macro because GLSL cannot pass a buffer.
#define LOAD_CHUNK(BUF, base, w)                                                          \
    for (uint i_ = 0u; i_ < CHUNK_WORDS; i_++) {                                          \
        w[i_] = BUF[(base) + i_];                                                         \
    }

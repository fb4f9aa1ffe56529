// Weight blocks as they lie in a GGUF file, read as little-endian u32 words from a
// storage buffer, and decoded in registers ("dequant in registers": the weights are never
// widened in memory). Exactly one WTYPE_* define selects the type.
//
// A "chunk" is 64 consecutive elements of one row (two 32-element blocks for the quantised
// types), CHUNK_WORDS u32 words long, so a chunk always starts on a 4-byte boundary when
// the row length is a multiple of 64 (the host checks that).
//
// FOR_EACH_QUAD(BUF, base, BODY) streams the chunk starting at word `base` of the weight
// binding BUF (a `usamplerBuffer` of R32UI texels read with texelFetch: on lavapipe a plain
// gather, where a storage-buffer load inside control flow becomes a per-lane loop with a
// bounds check) and runs BODY once per group of four consecutive elements ("quad"), with
//   vec4 wq  -- the four elements, dequantised (scale applied)
//   uint qi  -- the quad's index in the chunk (elements 4qi..4qi+3), 0..15
// It is a macro so one body serves every binding, and it keeps no arrays:
// lavapipe turns dynamically indexed private arrays into slow per-lane code.
//
// Rust twins (crates/gguf/src/quant.rs):
//   Q8_0  BlockQ8_0 { d: f16, qs: [i8; 32] }        34 bytes: x = d * q
//   Q4_0  BlockQ4_0 { d: f16, qs: [u8; 16] }        18 bytes: x = d * (n - 8)
//   Q4_1  BlockQ4_1 { d: f16, m: f16, qs: [u8; 16] } 20 bytes: x = d * n + m
//         (Q4_*: byte j's low nibble is element j, its high nibble element j + 16)
//   F16   half                                      2 bytes
//   F32   float                                     4 bytes

#if defined(WTYPE_Q8_0) || defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1)
// Q8_0, Q4_0 and Q4_1 weights are bound as RGBA32UI texels (W_TEXEL_WORDS = 4): on lavapipe one per-lane
// 16-byte texel fetch costs about what one 4-byte fetch does, so a chunk's 17 (9, 10)
// words are read as 5 (3, 4) texels and realigned in registers (`load17`, `load9`,
// `load10`). WORD is the single-word access.
#define W_TEXEL_WORDS 4u
#define WORD(BUF, i) texelFetch(BUF, int((i) >> 2u))[(i) & 3u]
#else
#define W_TEXEL_WORDS 1u
#define WORD(BUF, i) texelFetch(BUF, int(i)).x
#endif

// Words sh..sh+7 of the twelve words of texels t0, t1, t2 (sh = 0..3, per lane), as two
// quads: two select stages (by 1 word, then by 2), no indexing.
void window8(uvec4 t0, uvec4 t1, uvec4 t2, uint sh, out uvec4 r0, out uvec4 r1) {
    bool s1 = (sh & 1u) != 0u;
    uvec4 u0 = s1 ? uvec4(t0.yzw, t1.x) : t0;
    uvec4 u1 = s1 ? uvec4(t1.yzw, t2.x) : t1;
    uvec2 u2 = s1 ? t2.yz : t2.xy;
    bool s2 = (sh & 2u) != 0u;
    r0 = s2 ? uvec4(u0.zw, u1.xy) : u0;
    r1 = s2 ? uvec4(u1.zw, u2) : u1;
}

// int8 lanes of a word, each placed in the top byte so the conversion is exact and
// signed; the 2^-24 is folded into the block scale.
vec4 i8x4_shifted(uint q) {
    return vec4(float(int(q << 24)), float(int((q << 16) & 0xFF000000u)),
                float(int((q << 8) & 0xFF000000u)), float(int(q & 0xFF000000u)));
}

// The four low (shift 0) or high (shift 4) nibbles of a word.
vec4 nibbles(uint q, uint shift) {
    return vec4(float((q >> shift) & 0xFu), float((q >> (shift + 8u)) & 0xFu),
                float((q >> (shift + 16u)) & 0xFu), float((q >> (shift + 24u)) & 0xFu));
}

#if defined(WTYPE_Q8_0)
// Two blocks = 68 bytes = 17 words. Block 0: d0 = low half of w0, qs0 = bytes 2..33
// (realigned from words 0..8); block 1: d1 = high half of w8, qs1 = words 9..16.
#define CHUNK_WORDS 17u
#define FOR_EACH_QUAD(BUF, base, BODY)                                                    \
    {                                                                                     \
        uint prev_ = WORD(BUF, (base));                                                         \
        float d_ = unpackHalf2x16(prev_).x * (1.0 / 16777216.0);                          \
        for (uint k_ = 0u; k_ < 8u; k_++) {                                               \
            uint cur_ = WORD(BUF, (base) + 1u + k_);                                            \
            vec4 wq = d_ * i8x4_shifted((prev_ >> 16) | (cur_ << 16));                    \
            uint qi = k_;                                                                 \
            BODY                                                                          \
            prev_ = cur_;                                                                 \
        }                                                                                 \
        d_ = unpackHalf2x16(prev_).y * (1.0 / 16777216.0);                                \
        for (uint k_ = 0u; k_ < 8u; k_++) {                                               \
            vec4 wq = d_ * i8x4_shifted(WORD(BUF, (base) + 9u + k_));                           \
            uint qi = 8u + k_;                                                            \
            BODY                                                                          \
        }                                                                                 \
    }

#elif defined(WTYPE_Q4_0)
// Two blocks = 36 bytes = 9 words. Block 0: d0 = low half of w0, qs0 = bytes 2..17
// (realigned from words 0..4); block 1: d1 = high half of w4, qs1 = words 5..8.
#define CHUNK_WORDS 9u
#define FOR_EACH_QUAD(BUF, base, BODY)                                                    \
    {                                                                                     \
        uint prev_ = WORD(BUF, (base));                                                         \
        float d_ = unpackHalf2x16(prev_).x;                                               \
        for (uint k_ = 0u; k_ < 4u; k_++) {                                               \
            uint cur_ = WORD(BUF, (base) + 1u + k_);                                            \
            uint q_ = (prev_ >> 16) | (cur_ << 16);                                       \
            {                                                                             \
                vec4 wq = d_ * (nibbles(q_, 0u) - 8.0);                                   \
                uint qi = k_;                                                             \
                BODY                                                                      \
            }                                                                             \
            {                                                                             \
                vec4 wq = d_ * (nibbles(q_, 4u) - 8.0);                                   \
                uint qi = 4u + k_;                                                        \
                BODY                                                                      \
            }                                                                             \
            prev_ = cur_;                                                                 \
        }                                                                                 \
        d_ = unpackHalf2x16(prev_).y;                                                     \
        for (uint k_ = 0u; k_ < 4u; k_++) {                                               \
            uint q_ = WORD(BUF, (base) + 5u + k_);                                              \
            {                                                                             \
                vec4 wq = d_ * (nibbles(q_, 0u) - 8.0);                                   \
                uint qi = 8u + k_;                                                        \
                BODY                                                                      \
            }                                                                             \
            {                                                                             \
                vec4 wq = d_ * (nibbles(q_, 4u) - 8.0);                                   \
                uint qi = 12u + k_;                                                       \
                BODY                                                                      \
            }                                                                             \
        }                                                                                 \
    }

#elif defined(WTYPE_Q4_1)
// Two blocks = 40 bytes = 10 words: w0 = (d0, m0), w1..4 = qs0, w5 = (d1, m1), w6..9 = qs1.
#define CHUNK_WORDS 10u
#define FOR_EACH_QUAD(BUF, base, BODY)                                                    \
    for (uint b_ = 0u; b_ < 2u; b_++) {                                                   \
        vec2 dm_ = unpackHalf2x16(WORD(BUF, (base) + 5u * b_));                                 \
        for (uint k_ = 0u; k_ < 4u; k_++) {                                               \
            uint q_ = WORD(BUF, (base) + 5u * b_ + 1u + k_);                                    \
            {                                                                             \
                vec4 wq = fma(vec4(dm_.x), nibbles(q_, 0u), vec4(dm_.y));                 \
                uint qi = 8u * b_ + k_;                                                   \
                BODY                                                                      \
            }                                                                             \
            {                                                                             \
                vec4 wq = fma(vec4(dm_.x), nibbles(q_, 4u), vec4(dm_.y));                 \
                uint qi = 8u * b_ + 4u + k_;                                              \
                BODY                                                                      \
            }                                                                             \
        }                                                                                 \
    }

#elif defined(WTYPE_F16)
#define CHUNK_WORDS 32u
#define FOR_EACH_QUAD(BUF, base, BODY)                                                    \
    for (uint qi = 0u; qi < 16u; qi++) {                                                  \
        vec4 wq = vec4(unpackHalf2x16(WORD(BUF, (base) + 2u * qi)),                             \
                       unpackHalf2x16(WORD(BUF, (base) + 2u * qi + 1u)));                       \
        BODY                                                                              \
    }

#elif defined(WTYPE_F32)
#define CHUNK_WORDS 64u
#define FOR_EACH_QUAD(BUF, base, BODY)                                                    \
    for (uint qi = 0u; qi < 16u; qi++) {                                                  \
        uint o_ = (base) + 4u * qi;                                                       \
        vec4 wq = uintBitsToFloat(uvec4(WORD(BUF, o_), WORD(BUF, o_ + 1u), WORD(BUF, o_ + 2u), WORD(BUF, o_ + 3u))); \
        BODY                                                                              \
    }

#else
#error "define one of WTYPE_Q8_0, WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_F16, WTYPE_F32"
#endif

// FOR_EACH_QUAD2(BA, base_a, BB, base_b, BODY, BLOCK_END): two rows in lockstep, so the
// caller fetches each input quad once for both. BODY sees `wqa`, `wqb` (the quads of both
// rows at index `qi`) as raw block values q (int8, nibble, or the element itself: exact in
// f32); after each block BLOCK_END sees the block's affine map, element = d*q + m, as
// `da`, `ma` (row a) and `db`, `mb` (row b). Applying the scale once per block instead of
// per element saves a multiply per weight; QUANT_HAS_MIN says whether m can be non-zero
// (then the caller also sums the inputs of the block).
#if defined(WTYPE_Q8_0)
// The 17 words of the chunk at word `base` of an RGBA32UI binding: 5 texel fetches.
void load17(usamplerBuffer b, uint base, out uvec4 w0, out uvec4 w1, out uvec4 w2,
            out uvec4 w3, out uint w4) {
    int t = int(base >> 2u);
    uint sh = base & 3u;
    uvec4 t0 = texelFetch(b, t);
    uvec4 t1 = texelFetch(b, t + 1);
    uvec4 t2 = texelFetch(b, t + 2);
    uvec4 t3 = texelFetch(b, t + 3);
    uvec4 t4 = texelFetch(b, t + 4);
    window8(t0, t1, t2, sh, w0, w1);
    window8(t2, t3, t4, sh, w2, w3);
    w4 = sh == 0u ? t4.x : (sh == 1u ? t4.y : (sh == 2u ? t4.z : t4.w));
}

#define Q8_STEP_(QA, QB, QI, BODY)                                                        \
    {                                                                                     \
        vec4 wqa = i8x4_shifted(QA);                                                      \
        vec4 wqb = i8x4_shifted(QB);                                                      \
        uint qi = QI;                                                                     \
        BODY                                                                              \
    }
#define QUANT_HAS_MIN false
#define FOR_EACH_QUAD2(BA, base_a, BB, base_b, BODY, BLOCK_END)                           \
    {                                                                                     \
        uvec4 a0_, a1_, a2_, a3_, b0_, b1_, b2_, b3_;                                     \
        uint a4_, b4_;                                                                    \
        load17(BA, (base_a), a0_, a1_, a2_, a3_, a4_);                                    \
        load17(BB, (base_b), b0_, b1_, b2_, b3_, b4_);                                    \
        float da = unpackHalf2x16(a0_.x).x * (1.0 / 16777216.0);                          \
        float db = unpackHalf2x16(b0_.x).x * (1.0 / 16777216.0);                          \
        float ma = 0.0;                                                                   \
        float mb = 0.0;                                                                   \
        Q8_STEP_((a0_.x >> 16) | (a0_.y << 16), (b0_.x >> 16) | (b0_.y << 16), 0u, BODY)  \
        Q8_STEP_((a0_.y >> 16) | (a0_.z << 16), (b0_.y >> 16) | (b0_.z << 16), 1u, BODY)  \
        Q8_STEP_((a0_.z >> 16) | (a0_.w << 16), (b0_.z >> 16) | (b0_.w << 16), 2u, BODY)  \
        Q8_STEP_((a0_.w >> 16) | (a1_.x << 16), (b0_.w >> 16) | (b1_.x << 16), 3u, BODY)  \
        Q8_STEP_((a1_.x >> 16) | (a1_.y << 16), (b1_.x >> 16) | (b1_.y << 16), 4u, BODY)  \
        Q8_STEP_((a1_.y >> 16) | (a1_.z << 16), (b1_.y >> 16) | (b1_.z << 16), 5u, BODY)  \
        Q8_STEP_((a1_.z >> 16) | (a1_.w << 16), (b1_.z >> 16) | (b1_.w << 16), 6u, BODY)  \
        Q8_STEP_((a1_.w >> 16) | (a2_.x << 16), (b1_.w >> 16) | (b2_.x << 16), 7u, BODY)  \
        BLOCK_END                                                                         \
        da = unpackHalf2x16(a2_.x).y * (1.0 / 16777216.0);                                \
        db = unpackHalf2x16(b2_.x).y * (1.0 / 16777216.0);                                \
        Q8_STEP_(a2_.y, b2_.y, 8u, BODY)                                                  \
        Q8_STEP_(a2_.z, b2_.z, 9u, BODY)                                                  \
        Q8_STEP_(a2_.w, b2_.w, 10u, BODY)                                                 \
        Q8_STEP_(a3_.x, b3_.x, 11u, BODY)                                                 \
        Q8_STEP_(a3_.y, b3_.y, 12u, BODY)                                                 \
        Q8_STEP_(a3_.z, b3_.z, 13u, BODY)                                                 \
        Q8_STEP_(a3_.w, b3_.w, 14u, BODY)                                                 \
        Q8_STEP_(a4_, b4_, 15u, BODY)                                                     \
        BLOCK_END                                                                         \
    }
#elif defined(WTYPE_Q4_0)
// The 9 words of the chunk at word `base` of an RGBA32UI binding: 3 texel fetches.
void load9(usamplerBuffer b, uint base, out uvec4 w0, out uvec4 w1, out uint w2) {
    int t = int(base >> 2u);
    uint sh = base & 3u;
    uvec4 t0 = texelFetch(b, t);
    uvec4 t1 = texelFetch(b, t + 1);
    uvec4 t2 = texelFetch(b, t + 2);
    window8(t0, t1, t2, sh, w0, w1);
    w2 = sh == 0u ? t2.x : (sh == 1u ? t2.y : (sh == 2u ? t2.z : t2.w));
}

#define Q4_STEP_(QA, QB, SHIFT, QI, BODY)                                                 \
    {                                                                                     \
        vec4 wqa = nibbles(QA, SHIFT);                                                    \
        vec4 wqb = nibbles(QB, SHIFT);                                                    \
        uint qi = QI;                                                                     \
        BODY                                                                              \
    }
#define QUANT_HAS_MIN true
#define FOR_EACH_QUAD2(BA, base_a, BB, base_b, BODY, BLOCK_END)                               \
    {                                                                                         \
        uvec4 a0_, a1_, b0_, b1_;                                                             \
        uint a2_, b2_;                                                                        \
        load9(BA, (base_a), a0_, a1_, a2_);                                                   \
        load9(BB, (base_b), b0_, b1_, b2_);                                                   \
        Q4_STEP_((a0_.x >> 16) | (a0_.y << 16), (b0_.x >> 16) | (b0_.y << 16), 0u, 0u, BODY)  \
        Q4_STEP_((a0_.x >> 16) | (a0_.y << 16), (b0_.x >> 16) | (b0_.y << 16), 4u, 4u, BODY)  \
        Q4_STEP_((a0_.y >> 16) | (a0_.z << 16), (b0_.y >> 16) | (b0_.z << 16), 0u, 1u, BODY)  \
        Q4_STEP_((a0_.y >> 16) | (a0_.z << 16), (b0_.y >> 16) | (b0_.z << 16), 4u, 5u, BODY)  \
        Q4_STEP_((a0_.z >> 16) | (a0_.w << 16), (b0_.z >> 16) | (b0_.w << 16), 0u, 2u, BODY)  \
        Q4_STEP_((a0_.z >> 16) | (a0_.w << 16), (b0_.z >> 16) | (b0_.w << 16), 4u, 6u, BODY)  \
        Q4_STEP_((a0_.w >> 16) | (a1_.x << 16), (b0_.w >> 16) | (b1_.x << 16), 0u, 3u, BODY)  \
        Q4_STEP_((a0_.w >> 16) | (a1_.x << 16), (b0_.w >> 16) | (b1_.x << 16), 4u, 7u, BODY)  \
        {                                                                                     \
            float da = unpackHalf2x16(a0_.x).x;                                               \
            float db = unpackHalf2x16(b0_.x).x;                                               \
            float ma = -8.0 * da;                                                             \
            float mb = -8.0 * db;                                                             \
            BLOCK_END                                                                         \
        }                                                                                     \
        Q4_STEP_(a1_.y, b1_.y, 0u, 8u, BODY)                                                  \
        Q4_STEP_(a1_.y, b1_.y, 4u, 12u, BODY)                                                 \
        Q4_STEP_(a1_.z, b1_.z, 0u, 9u, BODY)                                                  \
        Q4_STEP_(a1_.z, b1_.z, 4u, 13u, BODY)                                                 \
        Q4_STEP_(a1_.w, b1_.w, 0u, 10u, BODY)                                                 \
        Q4_STEP_(a1_.w, b1_.w, 4u, 14u, BODY)                                                 \
        Q4_STEP_(a2_, b2_, 0u, 11u, BODY)                                                     \
        Q4_STEP_(a2_, b2_, 4u, 15u, BODY)                                                     \
        {                                                                                     \
            float da = unpackHalf2x16(a1_.x).y;                                               \
            float db = unpackHalf2x16(b1_.x).y;                                               \
            float ma = -8.0 * da;                                                             \
            float mb = -8.0 * db;                                                             \
            BLOCK_END                                                                         \
        }                                                                                     \
    }
#elif defined(WTYPE_Q4_1)
// The 10 words of the chunk at word `base` of an RGBA32UI binding: 4 texel fetches.
void load10(usamplerBuffer b, uint base, out uvec4 w0, out uvec4 w1, out uvec2 w2) {
    int t = int(base >> 2u);
    uint sh = base & 3u;
    uvec4 t0 = texelFetch(b, t);
    uvec4 t1 = texelFetch(b, t + 1);
    uvec4 t2 = texelFetch(b, t + 2);
    uvec4 t3 = texelFetch(b, t + 3);
    window8(t0, t1, t2, sh, w0, w1);
    uvec4 r0;
    uvec4 r1;
    window8(t2, t3, t3, sh, r0, r1);
    w2 = r0.xy;
}

#define Q4_STEP_(QA, QB, SHIFT, QI, BODY)                                                 \
    {                                                                                     \
        vec4 wqa = nibbles(QA, SHIFT);                                                    \
        vec4 wqb = nibbles(QB, SHIFT);                                                    \
        uint qi = QI;                                                                     \
        BODY                                                                              \
    }
#define QUANT_HAS_MIN true
#define FOR_EACH_QUAD2(BA, base_a, BB, base_b, BODY, BLOCK_END)  \
    {                                                            \
        uvec4 a0_, a1_, b0_, b1_;                                \
        uvec2 a2_, b2_;                                          \
        load10(BA, (base_a), a0_, a1_, a2_);                     \
        load10(BB, (base_b), b0_, b1_, b2_);                     \
        Q4_STEP_(a0_.y, b0_.y, 0u, 0u, BODY)                     \
        Q4_STEP_(a0_.y, b0_.y, 4u, 4u, BODY)                     \
        Q4_STEP_(a0_.z, b0_.z, 0u, 1u, BODY)                     \
        Q4_STEP_(a0_.z, b0_.z, 4u, 5u, BODY)                     \
        Q4_STEP_(a0_.w, b0_.w, 0u, 2u, BODY)                     \
        Q4_STEP_(a0_.w, b0_.w, 4u, 6u, BODY)                     \
        Q4_STEP_(a1_.x, b1_.x, 0u, 3u, BODY)                     \
        Q4_STEP_(a1_.x, b1_.x, 4u, 7u, BODY)                     \
        {                                                        \
            vec2 dma_ = unpackHalf2x16(a0_.x);                   \
            vec2 dmb_ = unpackHalf2x16(b0_.x);                   \
            float da = dma_.x;                                   \
            float ma = dma_.y;                                   \
            float db = dmb_.x;                                   \
            float mb = dmb_.y;                                   \
            BLOCK_END                                            \
        }                                                        \
        Q4_STEP_(a1_.z, b1_.z, 0u, 8u, BODY)                     \
        Q4_STEP_(a1_.z, b1_.z, 4u, 12u, BODY)                    \
        Q4_STEP_(a1_.w, b1_.w, 0u, 9u, BODY)                     \
        Q4_STEP_(a1_.w, b1_.w, 4u, 13u, BODY)                    \
        Q4_STEP_(a2_.x, b2_.x, 0u, 10u, BODY)                    \
        Q4_STEP_(a2_.x, b2_.x, 4u, 14u, BODY)                    \
        Q4_STEP_(a2_.y, b2_.y, 0u, 11u, BODY)                    \
        Q4_STEP_(a2_.y, b2_.y, 4u, 15u, BODY)                    \
        {                                                        \
            vec2 dma_ = unpackHalf2x16(a1_.y);                   \
            vec2 dmb_ = unpackHalf2x16(b1_.y);                   \
            float da = dma_.x;                                   \
            float ma = dma_.y;                                   \
            float db = dmb_.x;                                   \
            float mb = dmb_.y;                                   \
            BLOCK_END                                            \
        }                                                        \
    }
#elif defined(WTYPE_F16)
#define QUANT_HAS_MIN false
#define FOR_EACH_QUAD2(BA, base_a, BB, base_b, BODY, BLOCK_END)                           \
    {                                                                                     \
        for (uint qi = 0u; qi < 16u; qi++) {                                              \
            vec4 wqa = vec4(unpackHalf2x16(WORD(BA, (base_a) + 2u * qi)),                 \
                            unpackHalf2x16(WORD(BA, (base_a) + 2u * qi + 1u)));           \
            vec4 wqb = vec4(unpackHalf2x16(WORD(BB, (base_b) + 2u * qi)),                 \
                            unpackHalf2x16(WORD(BB, (base_b) + 2u * qi + 1u)));           \
            BODY                                                                          \
        }                                                                                 \
        float da = 1.0;                                                                   \
        float ma = 0.0;                                                                   \
        float db = 1.0;                                                                   \
        float mb = 0.0;                                                                   \
        BLOCK_END                                                                         \
    }
#elif defined(WTYPE_F32)
#define QUANT_HAS_MIN false
#define FOR_EACH_QUAD2(BA, base_a, BB, base_b, BODY, BLOCK_END)                           \
    {                                                                                     \
        for (uint qi = 0u; qi < 16u; qi++) {                                              \
            uint oa_ = (base_a) + 4u * qi;                                                \
            uint ob_ = (base_b) + 4u * qi;                                                \
            vec4 wqa = uintBitsToFloat(uvec4(WORD(BA, oa_), WORD(BA, oa_ + 1u),           \
                                             WORD(BA, oa_ + 2u), WORD(BA, oa_ + 3u)));    \
            vec4 wqb = uintBitsToFloat(uvec4(WORD(BB, ob_), WORD(BB, ob_ + 1u),           \
                                             WORD(BB, ob_ + 2u), WORD(BB, ob_ + 3u)));    \
            BODY                                                                          \
        }                                                                                 \
        float da = 1.0;                                                                   \
        float ma = 0.0;                                                                   \
        float db = 1.0;                                                                   \
        float mb = 0.0;                                                                   \
        BLOCK_END                                                                         \
    }
#endif

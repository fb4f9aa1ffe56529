// Weight blocks as they lie in a GGUF file, decoded in registers ("dequant in registers":
// the weights are never widened in memory). Exactly one WTYPE_* define selects the type;
// this is the only decoder of each type, shared by embed.comp and the matmul kernels.
//
// A "chunk" is 64 consecutive elements of one row (two 32-element blocks for the quantised
// types), CHUNK_WORDS u32 words long, so a chunk always starts on a 4-byte boundary when
// the row length is a multiple of 64 (the host checks that).
//
// QUANT_CHUNK(BUF, base, BODY, BLOCK_END) decodes the chunk starting at word `base` of the
// weight binding BUF (a `utextureBuffer`: on lavapipe a texel fetch is a plain gather,
// where a storage-buffer load inside control flow becomes a per-lane loop with a bounds
// check). BODY runs once per group of four consecutive elements ("quad") with
//   vec4 wq  -- the quad's raw block values q (int8 placed in the top byte, nibble, or the
//               element itself: all exact in f32)
//   uint qi  -- the quad's index in the chunk (elements 4qi..4qi+3), 0..15
//   float qd, qm -- the affine map of the quad's block: element = qd * q + qm
// and BLOCK_END once after each block's quads, seeing qd and qm. Kernels address weights
// only through QUANT_ROW_CHUNK (end of file): chunk c of row r of a view. A caller that wants the
// elements writes fma(vec4(qd), wq, vec4(qm)); a dot product applies qd and qm once per
// block instead (QUANT_HAS_MIN: whether qm can be non-zero). It is a macro, not a function,
// so one body serves every binding; it keeps no arrays (lavapipe turns dynamically
// indexed private arrays into slow per-lane code).
//
// Rust twins (crates/gguf/src/quant.rs):
//   Q8_0  BlockQ8_0 { d: f16, qs: [i8; 32] }        34 bytes: x = d * q
//   Q4_0  BlockQ4_0 { d: f16, qs: [u8; 16] }        18 bytes: x = d * (n - 8)
//   Q4_1  BlockQ4_1 { d: f16, m: f16, qs: [u8; 16] } 20 bytes: x = d * n + m
//         (Q4_*: byte j's low nibble is element j, its high nibble element j + 16)
//   F16   half                                      2 bytes
//   F32   float                                     4 bytes
//
// Q8_0, Q4_0 and Q4_1 weights are bound as RGBA32UI texels (the host's
// engine::kernels::weight_texel_format): one 16-byte texel fetch costs about what a
// 4-byte one does on lavapipe, so a chunk's 17 (9, 10) words are read as 5 (3, 4) texels
// and realigned in registers. F16 and F32 are bound as R32UI and read word by word.

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

// Word sh (0..3) of a texel.
uint word_of(uvec4 t, uint sh) {
    return sh == 0u ? t.x : (sh == 1u ? t.y : (sh == 2u ? t.z : t.w));
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

// The two quads of nibbles of word Q: elements 4k..4k+3 (low) and 16+4k.. (high) of a
// block, quads QI and QI + 4 of the chunk (Q4_0 and Q4_1 alike).
#define Q4_WORD_(Q, QI, BODY)                                                             \
    {                                                                                     \
        uint w_ = (Q);                                                                    \
        {                                                                                 \
            vec4 wq = nibbles(w_, 0u);                                                    \
            uint qi = (QI);                                                               \
            BODY                                                                          \
        }                                                                                 \
        {                                                                                 \
            vec4 wq = nibbles(w_, 4u);                                                    \
            uint qi = (QI) + 4u;                                                          \
            BODY                                                                          \
        }                                                                                 \
    }

#if defined(WTYPE_Q8_0)
// Two blocks = 68 bytes = 17 words. Block 0: d0 = low half of w0, qs0 = bytes 2..33
// (realigned from words 0..8); block 1: d1 = high half of w8, qs1 = words 9..16.
#define CHUNK_WORDS 17u
#define QUANT_HAS_MIN false

// The 17 words of the chunk at word `base` of an RGBA32UI binding: 5 texel fetches.
void load17(utextureBuffer b, uint base, out uvec4 w0, out uvec4 w1, out uvec4 w2,
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
    w4 = word_of(t4, sh);
}

#define Q8_QUAD_(Q, QI, BODY)                                                             \
    {                                                                                     \
        vec4 wq = i8x4_shifted(Q);                                                        \
        uint qi = (QI);                                                                   \
        BODY                                                                              \
    }
#define Q8_REALIGNED_(LO, HI, QI, BODY) Q8_QUAD_(((LO) >> 16) | ((HI) << 16), QI, BODY)

#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        uvec4 c0_, c1_, c2_, c3_;                                                         \
        uint c4_;                                                                         \
        load17(BUF, (base), c0_, c1_, c2_, c3_, c4_);                                     \
        float qm = 0.0;                                                                   \
        float qd = unpackHalf2x16(c0_.x).x * (1.0 / 16777216.0);                          \
        Q8_REALIGNED_(c0_.x, c0_.y, 0u, BODY)                                             \
        Q8_REALIGNED_(c0_.y, c0_.z, 1u, BODY)                                             \
        Q8_REALIGNED_(c0_.z, c0_.w, 2u, BODY)                                             \
        Q8_REALIGNED_(c0_.w, c1_.x, 3u, BODY)                                             \
        Q8_REALIGNED_(c1_.x, c1_.y, 4u, BODY)                                             \
        Q8_REALIGNED_(c1_.y, c1_.z, 5u, BODY)                                             \
        Q8_REALIGNED_(c1_.z, c1_.w, 6u, BODY)                                             \
        Q8_REALIGNED_(c1_.w, c2_.x, 7u, BODY)                                             \
        BLOCK_END                                                                         \
        qd = unpackHalf2x16(c2_.x).y * (1.0 / 16777216.0);                                \
        Q8_QUAD_(c2_.y, 8u, BODY)                                                         \
        Q8_QUAD_(c2_.z, 9u, BODY)                                                         \
        Q8_QUAD_(c2_.w, 10u, BODY)                                                        \
        Q8_QUAD_(c3_.x, 11u, BODY)                                                        \
        Q8_QUAD_(c3_.y, 12u, BODY)                                                        \
        Q8_QUAD_(c3_.z, 13u, BODY)                                                        \
        Q8_QUAD_(c3_.w, 14u, BODY)                                                        \
        Q8_QUAD_(c4_, 15u, BODY)                                                          \
        BLOCK_END                                                                         \
    }

#elif defined(WTYPE_Q4_0)
// Two blocks = 36 bytes = 9 words. Block 0: d0 = low half of w0, qs0 = bytes 2..17
// (realigned from words 0..4); block 1: d1 = high half of w4, qs1 = words 5..8.
// x = d * (n - 8): qd = d, qm = -8d.
#define CHUNK_WORDS 9u
#define QUANT_HAS_MIN true

// The 9 words of the chunk at word `base` of an RGBA32UI binding: 3 texel fetches.
void load9(utextureBuffer b, uint base, out uvec4 w0, out uvec4 w1, out uint w2) {
    int t = int(base >> 2u);
    uint sh = base & 3u;
    uvec4 t0 = texelFetch(b, t);
    uvec4 t1 = texelFetch(b, t + 1);
    uvec4 t2 = texelFetch(b, t + 2);
    window8(t0, t1, t2, sh, w0, w1);
    w2 = word_of(t2, sh);
}

#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        uvec4 c0_, c1_;                                                                   \
        uint c2_;                                                                         \
        load9(BUF, (base), c0_, c1_, c2_);                                                \
        float qd = unpackHalf2x16(c0_.x).x;                                               \
        float qm = -8.0 * qd;                                                             \
        Q4_WORD_((c0_.x >> 16) | (c0_.y << 16), 0u, BODY)                                 \
        Q4_WORD_((c0_.y >> 16) | (c0_.z << 16), 1u, BODY)                                 \
        Q4_WORD_((c0_.z >> 16) | (c0_.w << 16), 2u, BODY)                                 \
        Q4_WORD_((c0_.w >> 16) | (c1_.x << 16), 3u, BODY)                                 \
        BLOCK_END                                                                         \
        qd = unpackHalf2x16(c1_.x).y;                                                     \
        qm = -8.0 * qd;                                                                   \
        Q4_WORD_(c1_.y, 8u, BODY)                                                         \
        Q4_WORD_(c1_.z, 9u, BODY)                                                         \
        Q4_WORD_(c1_.w, 10u, BODY)                                                        \
        Q4_WORD_(c2_, 11u, BODY)                                                          \
        BLOCK_END                                                                         \
    }

#elif defined(WTYPE_Q4_1)
// Two blocks = 40 bytes = 10 words: w0 = (d0, m0), w1..4 = qs0, w5 = (d1, m1), w6..9 = qs1.
#define CHUNK_WORDS 10u
#define QUANT_HAS_MIN true

// The 10 words of the chunk at word `base` of an RGBA32UI binding: 4 texel fetches.
void load10(utextureBuffer b, uint base, out uvec4 w0, out uvec4 w1, out uvec2 w2) {
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

#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        uvec4 c0_, c1_;                                                                   \
        uvec2 c2_;                                                                        \
        load10(BUF, (base), c0_, c1_, c2_);                                               \
        vec2 dm_ = unpackHalf2x16(c0_.x);                                                 \
        float qd = dm_.x;                                                                 \
        float qm = dm_.y;                                                                 \
        Q4_WORD_(c0_.y, 0u, BODY)                                                         \
        Q4_WORD_(c0_.z, 1u, BODY)                                                         \
        Q4_WORD_(c0_.w, 2u, BODY)                                                         \
        Q4_WORD_(c1_.x, 3u, BODY)                                                         \
        BLOCK_END                                                                         \
        dm_ = unpackHalf2x16(c1_.y);                                                      \
        qd = dm_.x;                                                                       \
        qm = dm_.y;                                                                       \
        Q4_WORD_(c1_.z, 8u, BODY)                                                         \
        Q4_WORD_(c1_.w, 9u, BODY)                                                         \
        Q4_WORD_(c2_.x, 10u, BODY)                                                        \
        Q4_WORD_(c2_.y, 11u, BODY)                                                        \
        BLOCK_END                                                                         \
    }

#elif defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1) || defined(WTYPE_BF16)
// 32-element blocks with a fifth bit, and bfloat16.
#include "quant_5.glsl"

#elif defined(WTYPE_F16)
// 64 halves = 32 words, one "block" per chunk.
#define CHUNK_WORDS 32u
#define QUANT_HAS_MIN false
#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        float qd = 1.0;                                                                   \
        float qm = 0.0;                                                                   \
        for (uint qi = 0u; qi < 16u; qi++) {                                              \
            uint o_ = (base) + 2u * qi;                                                   \
            vec4 wq = vec4(unpackHalf2x16(texelFetch(BUF, int(o_)).x),                    \
                           unpackHalf2x16(texelFetch(BUF, int(o_ + 1u)).x));              \
            BODY                                                                          \
        }                                                                                 \
        BLOCK_END                                                                         \
    }

#elif defined(WTYPE_F32)
// 64 floats = 64 words, one "block" per chunk.
#define CHUNK_WORDS 64u
#define QUANT_HAS_MIN false
#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        float qd = 1.0;                                                                   \
        float qm = 0.0;                                                                   \
        for (uint qi = 0u; qi < 16u; qi++) {                                              \
            int o_ = int((base) + 4u * qi);                                               \
            vec4 wq = uintBitsToFloat(uvec4(texelFetch(BUF, o_).x, texelFetch(BUF, o_ + 1).x, \
                                            texelFetch(BUF, o_ + 2).x, texelFetch(BUF, o_ + 3).x)); \
            BODY                                                                          \
        }                                                                                 \
        BLOCK_END                                                                         \
    }

#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K) || defined(WTYPE_Q6_K) || defined(WTYPE_Q3_K) \
    || defined(WTYPE_Q2_K)
// 256-element super-blocks, each type with its own QUANT_ROW_CHUNK.
#include "quant_k.glsl"

#else
#error "define one of WTYPE_Q8_0, WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_F16, WTYPE_F32"
#endif

// QUANT_ROW_CHUNK(BUF, wofs, row, nchunks, c, BODY, BLOCK_END): chunk c of row `row` of a
// view whose first row starts at word `wofs` of BUF, rows of `nchunks` chunks; BODY and
// BLOCK_END as QUANT_CHUNK's. The only way the kernels read weights: a type whose rows
// are not whole words (the K-quants' super-blocks) defines its own addressing above.
#ifndef QUANT_ROW_CHUNK
#define QUANT_ROW_CHUNK(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                      \
    QUANT_CHUNK(BUF, (wofs) + ((row) * (nchunks) + (c)) * CHUNK_WORDS, BODY, BLOCK_END)
#endif

// The Q5_0, Q5_1 and BF16 sections of quant.glsl (included from there when one of
// WTYPE_Q5_0, WTYPE_Q5_1, WTYPE_BF16 is defined): each defines CHUNK_WORDS,
// QUANT_HAS_MIN and QUANT_CHUNK as quant.glsl's contract says, with quant.glsl's helpers
// (window8, word_of). Split out only to keep each include short.

#if defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
// Q5_0: two blocks = 44 bytes = 11 words. Block 0: d0 = low half of w0, qh0 = bytes 2..5
// and qs0 = bytes 6..21 (realigned from words 0..5); block 1: d1 = high half of w5,
// qh1 = w6, qs1 = words 7..10. x = d * (q5 - 16): qd = d, qm = -16d.
// Q5_1: two blocks = 48 bytes = 12 words: w0 = (d0, m0), w1 = qh0, w2..5 = qs0, w6 =
// (d1, m1), w7 = qh1, w8..11 = qs1. x = d * q5 + m.
// Both are bound as RGBA32UI and read as 4 texels.
#if defined(WTYPE_Q5_0)
#define CHUNK_WORDS 11u
#else
#define CHUNK_WORDS 12u
#endif
#define QUANT_HAS_MIN true

// The 12 words at word `base` of an RGBA32UI binding (Q5_0 uses the first 11): 4 texel
// fetches.
void load12(utextureBuffer b, uint base, out uvec4 w0, out uvec4 w1, out uvec4 w2) {
    int t = int(base >> 2u);
    uint sh = base & 3u;
    uvec4 t0 = texelFetch(b, t);
    uvec4 t1 = texelFetch(b, t + 1);
    uvec4 t2 = texelFetch(b, t + 2);
    uvec4 t3 = texelFetch(b, t + 3);
    window8(t0, t1, t2, sh, w0, w1);
    uvec4 r1;
    window8(t2, t3, t3, sh, w2, r1);
}

// Four 5-bit values: the nibbles of Q at `shift` (0: low, 4: high), with bit 4 of byte i
// from bit i of H4 (the block's qh bits for these four elements). The multiply spreads
// the four bits to bits 0, 8, 16, 24.
vec4 q5_quad(uint q, uint shift, uint h4) {
    uint v = ((q >> shift) & 0x0F0F0F0Fu) | (((h4 * 0x00204081u) & 0x01010101u) << 4);
    return vec4(float(v & 0xFFu), float((v >> 8) & 0xFFu), float((v >> 16) & 0xFFu),
                float(v >> 24));
}

// qs word K (0..3) of a block with high bits QH: elements 4K..4K+3 (quad QI) and
// 16+4K.. (quad QI + 4).
#define Q5_WORD_(Q, QH, K, QI, BODY)                                                      \
    {                                                                                     \
        uint w_ = (Q);                                                                    \
        {                                                                                 \
            vec4 wq = q5_quad(w_, 0u, ((QH) >> (4u * (K))) & 0xFu);                       \
            uint qi = (QI);                                                               \
            BODY                                                                          \
        }                                                                                 \
        {                                                                                 \
            vec4 wq = q5_quad(w_, 4u, ((QH) >> (16u + 4u * (K))) & 0xFu);                 \
            uint qi = (QI) + 4u;                                                          \
            BODY                                                                          \
        }                                                                                 \
    }

#if defined(WTYPE_Q5_0)
#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        uvec4 c0_, c1_, c2_;                                                              \
        load12(BUF, (base), c0_, c1_, c2_);                                               \
        float qd = unpackHalf2x16(c0_.x).x;                                               \
        float qm = -16.0 * qd;                                                            \
        uint h_ = (c0_.x >> 16) | (c0_.y << 16);                                          \
        Q5_WORD_((c0_.y >> 16) | (c0_.z << 16), h_, 0u, 0u, BODY)                         \
        Q5_WORD_((c0_.z >> 16) | (c0_.w << 16), h_, 1u, 1u, BODY)                         \
        Q5_WORD_((c0_.w >> 16) | (c1_.x << 16), h_, 2u, 2u, BODY)                         \
        Q5_WORD_((c1_.x >> 16) | (c1_.y << 16), h_, 3u, 3u, BODY)                         \
        BLOCK_END                                                                         \
        qd = unpackHalf2x16(c1_.y).y;                                                     \
        qm = -16.0 * qd;                                                                  \
        h_ = c1_.z;                                                                       \
        Q5_WORD_(c1_.w, h_, 0u, 8u, BODY)                                                 \
        Q5_WORD_(c2_.x, h_, 1u, 9u, BODY)                                                 \
        Q5_WORD_(c2_.y, h_, 2u, 10u, BODY)                                                \
        Q5_WORD_(c2_.z, h_, 3u, 11u, BODY)                                                \
        BLOCK_END                                                                         \
    }
#else
#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        uvec4 c0_, c1_, c2_;                                                              \
        load12(BUF, (base), c0_, c1_, c2_);                                               \
        vec2 dm_ = unpackHalf2x16(c0_.x);                                                 \
        float qd = dm_.x;                                                                 \
        float qm = dm_.y;                                                                 \
        uint h_ = c0_.y;                                                                  \
        Q5_WORD_(c0_.z, h_, 0u, 0u, BODY)                                                 \
        Q5_WORD_(c0_.w, h_, 1u, 1u, BODY)                                                 \
        Q5_WORD_(c1_.x, h_, 2u, 2u, BODY)                                                 \
        Q5_WORD_(c1_.y, h_, 3u, 3u, BODY)                                                 \
        BLOCK_END                                                                         \
        dm_ = unpackHalf2x16(c1_.z);                                                      \
        qd = dm_.x;                                                                       \
        qm = dm_.y;                                                                       \
        h_ = c1_.w;                                                                       \
        Q5_WORD_(c2_.x, h_, 0u, 8u, BODY)                                                 \
        Q5_WORD_(c2_.y, h_, 1u, 9u, BODY)                                                 \
        Q5_WORD_(c2_.z, h_, 2u, 10u, BODY)                                                \
        Q5_WORD_(c2_.w, h_, 3u, 11u, BODY)                                                \
        BLOCK_END                                                                         \
    }
#endif

#elif defined(WTYPE_BF16)
// 64 bfloat16 = 32 words, one "block" per chunk; element 2i is the low half of word i,
// 2i+1 the high half, each the top 16 bits of an f32. Bound as RGBA32UI: 9 texel fetches
// (one more than an aligned chunk needs: no branch), realigned 8 words at a time.
#define CHUNK_WORDS 32u
#define QUANT_HAS_MIN false

// The quad of bf16 pairs in words A and B.
vec4 bf16_quad(uint a, uint b) {
    return uintBitsToFloat(uvec4(a << 16, a & 0xFFFF0000u, b << 16, b & 0xFFFF0000u));
}

// Quad QI of the chunk from words A and B.
#define BF16_QUAD_(A, B, QI, BODY)                                                        \
    {                                                                                     \
        vec4 wq = bf16_quad((A), (B));                                                    \
        uint qi = (QI);                                                                   \
        BODY                                                                              \
    }

// Words 8G..8G+7 of the chunk (quads 4G..4G+3): texels t_+2G+1 and t_+2G+2 fetched,
// t_+2G kept from the group before in a_. Written out per group (no loop), so the
// caller's quad index stays a constant.
#define BF16_GROUP_(BUF, G, BODY)                                                         \
    {                                                                                     \
        uvec4 b_ = texelFetch(BUF, t_ + (2 * (G) + 1));                                   \
        uvec4 e_ = texelFetch(BUF, t_ + (2 * (G) + 2));                                   \
        uvec4 r0_, r1_;                                                                   \
        window8(a_, b_, e_, sh_, r0_, r1_);                                               \
        a_ = e_;                                                                          \
        BF16_QUAD_(r0_.x, r0_.y, 4u * (G), BODY)                                          \
        BF16_QUAD_(r0_.z, r0_.w, 4u * (G) + 1u, BODY)                                     \
        BF16_QUAD_(r1_.x, r1_.y, 4u * (G) + 2u, BODY)                                     \
        BF16_QUAD_(r1_.z, r1_.w, 4u * (G) + 3u, BODY)                                     \
    }

#define QUANT_CHUNK(BUF, base, BODY, BLOCK_END)                                           \
    {                                                                                     \
        float qd = 1.0;                                                                   \
        float qm = 0.0;                                                                   \
        int t_ = int((base) >> 2u);                                                       \
        uint sh_ = (base) & 3u;                                                           \
        uvec4 a_ = texelFetch(BUF, t_);                                                   \
        BF16_GROUP_(BUF, 0, BODY)                                                         \
        BF16_GROUP_(BUF, 1, BODY)                                                         \
        BF16_GROUP_(BUF, 2, BODY)                                                         \
        BF16_GROUP_(BUF, 3, BODY)                                                         \
        BLOCK_END                                                                         \
    }
#endif

// The K-quant sections of quant.glsl (included from there when a WTYPE_Q*_K is defined):
// 256-element super-blocks read in place, decoded in registers. Each type defines
// QUANT_ROW_CHUNK itself (see quant.glsl for the contract: BODY sees quads wq with qi, qd,
// qm; BLOCK_END closes each sub-block): chunk c of a row is sub-chunk c % 4 of the row's
// super-block c / 4, and the sub-block scales and mins are decoded from the super-block's
// header for that chunk alone. Rows must be a multiple of 256 elements (the host checks).
// Each type also defines QUANT_ROW_2CHUNKS(BUF, wofs, row, nchunks, c, BODY, BLOCK_END):
// chunks c and c + 1 (c even, so both lie in one super-block) from one set of fetches,
// BODY seeing qi 0..15 for chunk c and 16..31 for chunk c + 1. Two chunks of a super-block
// share its header and, for Q6_K, Q3_K and Q2_K, every byte of their quants, so the pair
// costs far fewer texel fetches than two chunks apart (matmul_split.comp uses it).
// Super-blocks of 144 (Q4_K), 176 (Q5_K) and 84 (Q2_K) bytes are addressed in words; those
// of 210 (Q6_K) and 110 (Q3_K) bytes are only 2-byte aligned after an odd one, so they are
// addressed in half-words: whole texels are fetched and the words funnel-shifted by 16
// bits in registers. Every weight type here is bound as RGBA32UI texels, and no fetch
// touches a texel that holds none of the bytes read (the view ends at the last one).
//
// Rust twins (crates/gguf/src/quant.rs, dequantised in quant/k_dequant.rs):
//   Q4_K { d, dmin: f16, scales: [u8; 12], qs: [u8; 128] }       144 bytes
//   Q5_K { d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }  176 bytes
//   Q6_K { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }  210 bytes
//   Q3_K { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }  110 bytes
//   Q2_K { scales: [u8; 16], qs: [u8; 64], d, dmin: f16 }         84 bytes

#include "quant_k_common.glsl"

#if defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
// Scale and min (6 bits each) of sub-block j (0..7) from the header's three scale words
// (ggml's get_scale_min_k4; Rust twin gguf::quant::scale_min_k4).
uvec2 k4_scale_min(uvec3 sc, uint j) {
    uint s = 8u * (j & 3u);
    uint a = sc.x >> s;
    uint b = sc.y >> s;
    uint c = sc.z >> s;
    uvec2 lo = uvec2(a & 63u, b & 63u);
    uvec2 hi = uvec2((c & 15u) | (((a >> 6u) & 3u) << 4u), ((c >> 4u) & 15u) | (((b >> 6u) & 3u) << 4u));
    return j < 4u ? lo : hi;
}

// qd, qm of sub-block j: element = d * scale * q - dmin * min.
#define K4_SCALES_(HD, J)                                                                 \
    {                                                                                     \
        uvec2 ksm_ = k4_scale_min(HD.yzw, (J));                                           \
        vec2 kdm_ = unpackHalf2x16(HD.x);                                                 \
        qd = kdm_.x * float(ksm_.x);                                                      \
        qm = -(kdm_.y * float(ksm_.y));                                                   \
    }

// Sub-blocks J, J + 1 of one 32-byte group: quads QI0.. from F_LO of (Q0, Q1; H0, H1),
// QI0 + 8.. from F_HI.
#define K45_GROUP_(F_LO, F_HI, Q0, Q1, H0, H1, J, QI0, BODY, BLOCK_END)                   \
    K4_SCALES_(khd_, (J))                                                                 \
    K_8QUADS_(F_LO, Q0, Q1, H0, H1, (QI0), BODY)                                          \
    BLOCK_END                                                                             \
    K4_SCALES_(khd_, (J) + 1u)                                                            \
    K_8QUADS_(F_HI, Q0, Q1, H0, H1, (QI0) + 8u, BODY)                                     \
    BLOCK_END
#endif

#if defined(WTYPE_Q4_K)
// Chunk s of a super-block is group s: 32 bytes of qs (words 4 + 8s ..), whose low nibbles
// are sub-block 2s (quads 0..7) and high nibbles sub-block 2s + 1 (quads 8..15).
// 5 texel fetches per chunk (3 under K_TEXEL_ALIGNED).
#define QUANT_HAS_MIN true
#define K4_LO_(Q, U) nibbles(Q, 0u)
#define K4_HI_(Q, U) nibbles(Q, 4u)
#define QUANT_ROW_CHUNK(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                      \
    {                                                                                     \
        uint ks_ = (c) & 3u;                                                              \
        uint kw_ = (wofs) + K_SUPER_(row, nchunks, c) * 36u;                              \
        uvec4 khd_ = k_load4w(BUF, kw_);                                                  \
        uvec4 kq0_, kq1_;                                                                 \
        k_load8w(BUF, kw_ + 4u + 8u * ks_, kq0_, kq1_);                                   \
        float qd, qm;                                                                     \
        K45_GROUP_(K4_LO_, K4_HI_, kq0_, kq1_, kq0_, kq1_, 2u * ks_, 0u, BODY, BLOCK_END) \
    }

// Groups s, s + 1 (s = c % 4: 0 or 2), one header load and 16 words of qs: 7 texel
// fetches for the two chunks (5 under K_TEXEL_ALIGNED).
#define QUANT_ROW_2CHUNKS(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                    \
    {                                                                                     \
        uint ks_ = (c) & 3u;                                                              \
        uint kw_ = (wofs) + K_SUPER_(row, nchunks, c) * 36u;                              \
        uvec4 khd_ = k_load4w(BUF, kw_);                                                  \
        uvec4 kq0_, kq1_, kq2_, kq3_;                                                     \
        k_load16w(BUF, kw_ + 4u + 8u * ks_, kq0_, kq1_, kq2_, kq3_);                      \
        float qd, qm;                                                                     \
        K45_GROUP_(K4_LO_, K4_HI_, kq0_, kq1_, kq0_, kq1_, 2u * ks_, 0u, BODY, BLOCK_END) \
        K45_GROUP_(K4_LO_, K4_HI_, kq2_, kq3_, kq2_, kq3_, 2u * ks_ + 2u, 16u, BODY,      \
                   BLOCK_END)                                                             \
    }

#elif defined(WTYPE_Q5_K)
// As Q4_K (qs at words 12 + 8s ..), the fifth bits in qh (words 4..11): bit 2s of byte l
// for element l of the chunk, bit 2s + 1 for element 32 + l. 7 texel fetches per chunk
// (5 under K_TEXEL_ALIGNED).
#define QUANT_HAS_MIN true
#define K5_LO_(Q, H) k_bytes((Q & 0x0F0F0F0Fu) | (((H >> khs_) & 0x01010101u) << 4u))
#define K5_HI_(Q, H) k_bytes(((Q >> 4u) & 0x0F0F0F0Fu) | (((H >> (khs_ + 1u)) & 0x01010101u) << 4u))
#define QUANT_ROW_CHUNK(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                      \
    {                                                                                     \
        uint ks_ = (c) & 3u;                                                              \
        uint khs_ = 2u * ks_;                                                             \
        uint kw_ = (wofs) + K_SUPER_(row, nchunks, c) * 44u;                              \
        uvec4 khd_, kh0_, kh1_, kq0_, kq1_;                                               \
        k_load12w(BUF, kw_, khd_, kh0_, kh1_);                                            \
        k_load8w(BUF, kw_ + 12u + 8u * ks_, kq0_, kq1_);                                  \
        float qd, qm;                                                                     \
        K45_GROUP_(K5_LO_, K5_HI_, kq0_, kq1_, kh0_, kh1_, khs_, 0u, BODY, BLOCK_END)     \
    }

// Header and qh once (4 fetches), 16 words of qs (5): 9 texel fetches for the two chunks
// (7 under K_TEXEL_ALIGNED).
#define QUANT_ROW_2CHUNKS(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                    \
    {                                                                                     \
        uint ks_ = (c) & 3u;                                                              \
        uint khs_ = 2u * ks_;                                                             \
        uint kw_ = (wofs) + K_SUPER_(row, nchunks, c) * 44u;                              \
        uvec4 khd_, kh0_, kh1_, kq0_, kq1_, kq2_, kq3_;                                   \
        k_load12w(BUF, kw_, khd_, kh0_, kh1_);                                            \
        k_load16w(BUF, kw_ + 12u + 8u * ks_, kq0_, kq1_, kq2_, kq3_);                     \
        float qd, qm;                                                                     \
        K45_GROUP_(K5_LO_, K5_HI_, kq0_, kq1_, kh0_, kh1_, khs_, 0u, BODY, BLOCK_END)     \
        khs_ += 2u;                                                                       \
        K45_GROUP_(K5_LO_, K5_HI_, kq2_, kq3_, kh0_, kh1_, khs_, 16u, BODY, BLOCK_END)    \
    }

#elif defined(WTYPE_Q6_K)
// Chunk s lies in half n = s / 2: ql bytes 64n.. (16 words) give the low (s even) or high
// nibbles, qh bytes 128 + 32n.. (8 words) bits 4(s & 1) + 0..1 (quads 0..7) and + 2..3
// (quads 8..15); q - 32 is the 6-bit signed value of q ^ 32. Sub-block i (quads 4i..4i+3)
// has scale byte i of scale word s (bytes 192 + 4s). 10 texel fetches per chunk.
#define QUANT_HAS_MIN false
#define K6_Q_(L, H, HSH) k_signed_top((((L >> kns_) & 0x0F0F0F0Fu) | (((H >> (HSH)) & 0x03030303u) << 4u)) ^ 0x20202020u, 6u)
#define K6_A_(L, H) K6_Q_(L, H, kns_)
#define K6_B_(L, H) K6_Q_(L, H, kns_ + 2u)
// qd of sub-block I: d * scale (2^-26 undoes k_signed_top's placement).
#define K6_SCALE_(I) qd = kd_ * float(int(ksc_ << (24u - 8u * (I))) >> 24) * (1.0 / 67108864.0);
// The loads of chunk c's half (both of its chunks), its scale word and d.
#define K_LOAD_(BUF, wofs, row, nchunks, c)                                               \
        uint ks_ = (c) & 3u;                                                              \
        uint kns_ = 4u * (ks_ & 1u);                                                      \
        uint kh_ = 2u * (wofs) + K_SUPER_(row, nchunks, c) * 105u;                        \
        uvec4 kl0_, kl1_, kl2_, kl3_, kh0_, kh1_, ksw_;                                   \
        uint kdh_;                                                                        \
        k_load16h(BUF, kh_ + 32u * (ks_ >> 1u), kl0_, kl1_, kl2_, kl3_);                  \
        k_load8h(BUF, kh_ + 64u + 16u * (ks_ >> 1u), kh0_, kh1_);                         \
        k_load4h_tail(BUF, kh_ + 96u, 9u, ksw_, kdh_);                                    \
        float kd_ = unpackHalf2x16(kdh_).x;                                               \
        uint ksc_ = word_of(ksw_, ks_);                                                   \
        float qd;                                                                         \
        float qm = 0.0;
// The four sub-blocks of the chunk that kns_ and ksc_ select, as quads QI0 + 0..15.
#define K_BLOCKS_(QI0, BODY, BLOCK_END)                                                   \
    K_4BLOCKS_(K6_SCALE_, K6_A_, K6_B_, kl0_, kh0_, kl1_, kh1_, kl2_, kh0_, kl3_, kh1_,   \
               (QI0), BODY, BLOCK_END)
// Chunks 2n and 2n + 1 are the low and high nibbles of the same ql and qh bytes: the
// 10 texel fetches of one chunk serve both.
// Then chunk c + 1: the high nibbles, scale word s + 1.
#define K_NEXT_(BUF)                                                                      \
        kns_ = 4u;                                                                        \
        ksc_ = word_of(ksw_, ks_ + 1u);

#elif defined(WTYPE_Q3_K)
// Chunk s lies in half n = s / 2: qs bytes 32 + 32n.. (8 words) shifted by 2j (j = 2(s & 1)
// for quads 0..7, j + 1 for quads 8..15), the high bit in hmask (words 0..7) bit 2s (quads
// 0..7) or 2s + 1; q - 4 + 4h is the 3-bit signed value of (q | h << 2) ^ 4. Scale j
// (0..15) is 6 bits: low 4 from byte j % 8 of the first 8 bytes (high nibble for j >= 8),
// high 2 from byte 8 + j % 4, shifted by 2(j / 4); minus 32. 8 texel fetches per chunk.
#define QUANT_HAS_MIN false
#define K3_Q_(Q, H, QSH, HSH) k_signed_top((((Q >> (QSH)) & 0x03030303u) | (((H >> (HSH)) & 0x01010101u) << 2u)) ^ 0x04040404u, 3u)
#define K3_A_(Q, H) K3_Q_(Q, H, kqs_, 2u * ks_)
#define K3_B_(Q, H) K3_Q_(Q, H, kqs_ + 2u, 2u * ks_ + 1u)
// The four 6-bit scales of chunk S (one per byte) from the scale words W.
#define K3_SC_(W, S) ((((((S) & 1u) != 0u ? W.y : W.x) >> (4u * ((S) >> 1u))) & 0x0F0F0F0Fu) | (((W.z >> (2u * (S))) & 0x03030303u) << 4u))
// qd of sub-block I: d * (scale - 32) (2^-29 undoes k_signed_top's placement).
#define K3_SCALE_(I) qd = kd_ * float(int((ksc_ >> (8u * (I))) & 63u) - 32) * (1.0 / 536870912.0);
// The loads of chunk c's half (both of its chunks) and its scales.
#define K_LOAD_(BUF, wofs, row, nchunks, c)                                               \
        uint ks_ = (c) & 3u;                                                              \
        uint kqs_ = 4u * (ks_ & 1u);                                                      \
        uint kh_ = 2u * (wofs) + K_SUPER_(row, nchunks, c) * 55u;                         \
        uvec4 km0_, km1_, kq0_, kq1_, ksw_;                                               \
        uint kdh_;                                                                        \
        k_load8h(BUF, kh_, km0_, km1_);                                                   \
        k_load8h(BUF, kh_ + 16u + 16u * (ks_ >> 1u), kq0_, kq1_);                         \
        k_load4h_tail(BUF, kh_ + 48u, 7u, ksw_, kdh_);                                    \
        float kd_ = unpackHalf2x16(ksw_.w).x;                                             \
        uint ksc_ = K3_SC_(ksw_, ks_);                                                    \
        float qd;                                                                         \
        float qm = 0.0;
// The four sub-blocks of the chunk that ks_, kqs_ and ksc_ select, as quads QI0 + 0..15.
#define K_BLOCKS_(QI0, BODY, BLOCK_END)                                                   \
    K_4BLOCKS_(K3_SCALE_, K3_A_, K3_B_, kq0_, km0_, kq1_, km1_, kq0_, km0_, kq1_, km1_,   \
               (QI0), BODY, BLOCK_END)
// Chunks 2n and 2n + 1 read the same hmask, qs and scale bytes (other bits): 8 texel
// fetches for the two chunks.
// Then chunk c + 1: the next bit pairs of qs and bit of hmask, and its scales.
#define K_NEXT_(BUF)                                                                      \
        ks_ += 1u;                                                                        \
        kqs_ = 4u;                                                                        \
        ksc_ = K3_SC_(ksw_, ks_);

#elif defined(WTYPE_Q2_K)
// Chunk s lies in half n = s / 2: qs bytes 16 + 32n.. (words 4 + 8n, 8 words) shifted by
// 2j (j = 2(s & 1) for quads 0..7, j + 1 for quads 8..15). Sub-block i (quads 4i..4i+3)
// has scale byte i of word s: d * (b & 15) * q - dmin * (b >> 4). 5 texel fetches.
#define QUANT_HAS_MIN true
#define K2_Q_(Q, SH) vec4(float((Q >> (SH)) & 3u), float((Q >> ((SH) + 8u)) & 3u), float((Q >> ((SH) + 16u)) & 3u), float((Q >> ((SH) + 24u)) & 3u))
#define K2_A_(Q, U) K2_Q_(Q, kqs_)
#define K2_B_(Q, U) K2_Q_(Q, kqs_ + 2u)
#define K2_SCALE_(I)                                                                      \
    {                                                                                     \
        uint kb_ = ksc_ >> (8u * (I));                                                    \
        qd = kdm_.x * float(kb_ & 15u);                                                   \
        qm = -(kdm_.y * float((kb_ >> 4u) & 15u));                                        \
    }
// The loads of chunk c's half (both of its chunks), its scale word and d, dmin.
#define K_LOAD_(BUF, wofs, row, nchunks, c)                                               \
        uint ks_ = (c) & 3u;                                                              \
        uint kqs_ = 4u * (ks_ & 1u);                                                      \
        uint kw_ = (wofs) + K_SUPER_(row, nchunks, c) * 21u;                              \
        uvec4 kq0_, kq1_;                                                                 \
        k_load8w(BUF, kw_ + 4u + 8u * (ks_ >> 1u), kq0_, kq1_);                           \
        uint ksc_ = k_word(BUF, kw_ + ks_);                                               \
        vec2 kdm_ = unpackHalf2x16(k_word(BUF, kw_ + 20u));                               \
        float qd, qm;
// The four sub-blocks of the chunk that kqs_ and ksc_ select, as quads QI0 + 0..15.
#define K_BLOCKS_(QI0, BODY, BLOCK_END)                                                   \
    K_4BLOCKS_(K2_SCALE_, K2_A_, K2_B_, kq0_, kq0_, kq1_, kq1_, kq0_, kq0_, kq1_, kq1_,   \
               (QI0), BODY, BLOCK_END)
// Chunks 2n and 2n + 1 read the same qs bytes (other bits): 6 texel fetches for the two.
// Then chunk c + 1: the next bit pairs of qs, and its scale word.
#define K_NEXT_(BUF)                                                                      \
        kqs_ = 4u;                                                                        \
        ksc_ = k_word(BUF, kw_ + ks_ + 1u);
#endif

#if defined(WTYPE_Q6_K) || defined(WTYPE_Q3_K) || defined(WTYPE_Q2_K)
// The two chunks of a half of these types are other bits of the same bytes: K_LOAD_ reads
// the half, K_BLOCKS_ decodes the chunk its state selects, K_NEXT_ moves that state on.
#define QUANT_ROW_CHUNK(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                      \
    {                                                                                     \
        K_LOAD_(BUF, wofs, row, nchunks, c)                                               \
        K_BLOCKS_(0u, BODY, BLOCK_END)                                                    \
    }
#define QUANT_ROW_2CHUNKS(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                    \
    {                                                                                     \
        K_LOAD_(BUF, wofs, row, nchunks, c)                                               \
        K_BLOCKS_(0u, BODY, BLOCK_END)                                                    \
        K_NEXT_(BUF)                                                                      \
        K_BLOCKS_(16u, BODY, BLOCK_END)                                                   \
    }
#endif

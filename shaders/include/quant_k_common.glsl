// What the K-quant decoders of quant_k.glsl share: texel runs fetched at word or
// half-word addresses and realigned in registers (never a texel that holds none of the
// bytes read), bit-field unpacking, and the macros that hand quads to BODY.

// The host's promise that every word-addressed run below starts on a texel: set (per
// pipeline) only for Q4_K and Q5_K, whose super-blocks are whole texels (144 and 176
// bytes), over views whose word offsets are all multiples of 4 (as GGUF's 32-byte tensor
// alignment makes them). The realignment then folds away when the pipeline is built, and
// so do the fetches of texels past the run's own (a Q4_K pair of chunks: 5 fetches, not
// 7). Rust twin: kernels::matmul::k_texel_aligned.
layout(constant_id = 2) const bool K_TEXEL_ALIGNED = false;

// The word within its texel of word w (0 where the host promises K_TEXEL_ALIGNED).
uint k_sub(uint w) {
    return K_TEXEL_ALIGNED ? 0u : (w & 3u);
}

// Words sh..sh+3 (sh = 0..3) of the eight words of texels a, b.
uvec4 k_window4(uvec4 a, uvec4 b, uint sh) {
    bool s1 = (sh & 1u) != 0u;
    uvec4 u = s1 ? uvec4(a.yzw, b.x) : a;
    uvec2 v = s1 ? b.yz : b.xy;
    return (sh & 2u) != 0u ? uvec4(u.zw, v) : u;
}

// The words of a starting 16 bits in when `odd` (`next` follows a).
uvec4 k_funnel(uvec4 a, uint next, bool odd) {
    return odd ? ((a >> 16u) | (uvec4(a.yzw, next) << 16u)) : a;
}

// The word at word w: one texel fetch.
uint k_word(utextureBuffer b, uint w) {
    return word_of(texelFetch(b, int(w >> 2u)), w & 3u);
}

// The 4 words at word w: 2 fetches (1 under K_TEXEL_ALIGNED).
uvec4 k_load4w(utextureBuffer b, uint w) {
    int t = int(w >> 2u);
    int last = int((w + 3u) >> 2u);
    return k_window4(texelFetch(b, t), texelFetch(b, min(t + 1, last)), k_sub(w));
}

// The 8 words at word w: 3 fetches (2 under K_TEXEL_ALIGNED).
void k_load8w(utextureBuffer b, uint w, out uvec4 r0, out uvec4 r1) {
    int t = int(w >> 2u);
    int last = int((w + 7u) >> 2u);
    window8(texelFetch(b, t), texelFetch(b, t + 1), texelFetch(b, min(t + 2, last)), k_sub(w),
            r0, r1);
}

// The 16 words at word w: 5 fetches (4 under K_TEXEL_ALIGNED).
void k_load16w(utextureBuffer b, uint w, out uvec4 r0, out uvec4 r1, out uvec4 r2,
               out uvec4 r3) {
    int t = int(w >> 2u);
    int last = int((w + 15u) >> 2u);
    uvec4 t2 = texelFetch(b, t + 2);
    window8(texelFetch(b, t), texelFetch(b, t + 1), t2, k_sub(w), r0, r1);
    window8(t2, texelFetch(b, t + 3), texelFetch(b, min(t + 4, last)), k_sub(w), r2, r3);
}

// The 12 words at word w: 4 fetches (3 under K_TEXEL_ALIGNED).
void k_load12w(utextureBuffer b, uint w, out uvec4 r0, out uvec4 r1, out uvec4 r2) {
    int t = int(w >> 2u);
    int last = int((w + 11u) >> 2u);
    uvec4 t2 = texelFetch(b, t + 2);
    uvec4 t3 = texelFetch(b, min(t + 3, last));
    window8(texelFetch(b, t), texelFetch(b, t + 1), t2, k_sub(w), r0, r1);
    r2 = k_window4(t2, t3, k_sub(w));
}

// The 8 words starting at half-word h: 3 fetches.
void k_load8h(utextureBuffer b, uint h, out uvec4 r0, out uvec4 r1) {
    int t = int(h >> 3u);
    int last = int((h + 15u) >> 3u);
    uint sh = (h >> 1u) & 3u;
    bool odd = (h & 1u) != 0u;
    uvec4 t2 = texelFetch(b, min(t + 2, last));
    uvec4 u0;
    uvec4 u1;
    window8(texelFetch(b, t), texelFetch(b, t + 1), t2, sh, u0, u1);
    r0 = k_funnel(u0, u1.x, odd);
    r1 = k_funnel(u1, word_of(t2, sh), odd);
}

// The 16 words starting at half-word h: 5 fetches.
void k_load16h(utextureBuffer b, uint h, out uvec4 r0, out uvec4 r1, out uvec4 r2,
               out uvec4 r3) {
    int t = int(h >> 3u);
    int last = int((h + 31u) >> 3u);
    uint sh = (h >> 1u) & 3u;
    bool odd = (h & 1u) != 0u;
    uvec4 t2 = texelFetch(b, t + 2);
    uvec4 t4 = texelFetch(b, min(t + 4, last));
    uvec4 u0, u1, u2, u3;
    window8(texelFetch(b, t), texelFetch(b, t + 1), t2, sh, u0, u1);
    window8(t2, texelFetch(b, t + 3), t4, sh, u2, u3);
    r0 = k_funnel(u0, u1.x, odd);
    r1 = k_funnel(u1, u2.x, odd);
    r2 = k_funnel(u2, u3.x, odd);
    r3 = k_funnel(u3, word_of(t4, sh), odd);
}

// The 4 words and the half-word after them (the low 16 bits of .y) starting at half-word
// h, when h's texel and the next hold all of them: 2 fetches.
void k_load4h_tail(utextureBuffer b, uint h, uint nhalf, out uvec4 r, out uint tail) {
    int t = int(h >> 3u);
    int last = int((h + nhalf - 1u) >> 3u);
    uint sh = (h >> 1u) & 3u;
    bool odd = (h & 1u) != 0u;
    uvec4 t1 = texelFetch(b, min(t + 1, last));
    uvec4 u = k_window4(texelFetch(b, t), t1, sh);
    uint next = word_of(t1, sh);
    r = k_funnel(u, next, odd);
    tail = odd ? (next >> 16u) : (next & 0xFFFFu);
}

// The four bytes of a word as floats.
vec4 k_bytes(uint q) {
    return vec4(float(q & 0xFFu), float((q >> 8u) & 0xFFu), float((q >> 16u) & 0xFFu),
                float(q >> 24u));
}

// The four signed `bits`-bit fields at the bottom of each byte of q, each placed in the top
// bits of an int (value * 2^(32 - bits), exact in f32; the factor is folded into qd).
vec4 k_signed_top(uint q, uint bits) {
    uint m = ~0u << (32u - bits);
    return vec4(float(int(q << (32u - bits))), float(int((q << (24u - bits)) & m)),
                float(int((q << (16u - bits)) & m)), float(int((q << (8u - bits)) & m)));
}

// One quad of BODY: wq = EXPR, qi = QI.
#define K_QUAD_(EXPR, QI, BODY)                                                           \
    {                                                                                     \
        vec4 wq = (EXPR);                                                                 \
        uint qi = (QI);                                                                   \
        BODY                                                                              \
    }

// Eight quads QI0..QI0+7 of BODY, quad k from F(word k of A0/A1, word k of B0/B1).
#define K_8QUADS_(F, A0, A1, B0, B1, QI0, BODY)                                           \
    K_QUAD_(F(A0.x, B0.x), (QI0), BODY)                                                   \
    K_QUAD_(F(A0.y, B0.y), (QI0) + 1u, BODY)                                              \
    K_QUAD_(F(A0.z, B0.z), (QI0) + 2u, BODY)                                              \
    K_QUAD_(F(A0.w, B0.w), (QI0) + 3u, BODY)                                              \
    K_QUAD_(F(A1.x, B1.x), (QI0) + 4u, BODY)                                              \
    K_QUAD_(F(A1.y, B1.y), (QI0) + 5u, BODY)                                              \
    K_QUAD_(F(A1.z, B1.z), (QI0) + 6u, BODY)                                              \
    K_QUAD_(F(A1.w, B1.w), (QI0) + 7u, BODY)

// Four quads QI0..QI0+3 of BODY, quad k from F(word k of A, word k of B).
#define K_4QUADS_(F, A, B, QI0, BODY)                                                     \
    K_QUAD_(F(A.x, B.x), (QI0), BODY)                                                     \
    K_QUAD_(F(A.y, B.y), (QI0) + 1u, BODY)                                                \
    K_QUAD_(F(A.z, B.z), (QI0) + 2u, BODY)                                                \
    K_QUAD_(F(A.w, B.w), (QI0) + 3u, BODY)

// Four sub-blocks of four quads each, QI0 + 0..15: SCALE(i) sets sub-block i's qd (and qm),
// quads from FA of (L0, H0), (L1, H1), then FB of (L2, H2), (L3, H3).
#define K_4BLOCKS_(SCALE, FA, FB, L0, H0, L1, H1, L2, H2, L3, H3, QI0, BODY, BLOCK_END)   \
    SCALE(0u)                                                                             \
    K_4QUADS_(FA, L0, H0, (QI0), BODY)                                                    \
    BLOCK_END                                                                             \
    SCALE(1u)                                                                             \
    K_4QUADS_(FA, L1, H1, (QI0) + 4u, BODY)                                               \
    BLOCK_END                                                                             \
    SCALE(2u)                                                                             \
    K_4QUADS_(FB, L2, H2, (QI0) + 8u, BODY)                                               \
    BLOCK_END                                                                             \
    SCALE(3u)                                                                             \
    K_4QUADS_(FB, L3, H3, (QI0) + 12u, BODY)                                              \
    BLOCK_END

// Super-block index of chunk c of row `row`, rows of nchunks chunks.
#define K_SUPER_(row, nchunks, c) ((row) * ((nchunks) >> 2u) + ((c) >> 2u))

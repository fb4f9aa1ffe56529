#version 450
// Y = W · X for a tile of TT = 8 prompt tokens: the prefill GEMM (shared parts, variants
// and the fused epilogues: include/matmul.glsl, whose store_pair this kernel calls).
// CPU twin: reference::kernels::matmul composed as matmul.glsl says.
//
// Lanes own row pairs, as in matmul.comp, two pairs (four rows) in lockstep; per chunk
// (64 columns) a lane decodes its four rows once into registers (dequantised: block scale
// and minimum applied per element) and uses them for all 8 tokens of the workgroup's
// tile, so a weight is decoded once per 8 tokens instead of once per 4, and each input
// quad fetched serves four rows. On lavapipe the input fetch is the costly part (a texel
// fetch is a call with a bounds check and a load per lane, uniform address or not), and
// nothing cheaper reaches every lane inside a loop: a subgroupBroadcast is a loop over
// the lanes with a branch each, 5-7x slower here than fetching (measured: 0.27 against
// 1.33 Kelem/s, Q8_0 576x1536, 64 tokens), and storage or shared loads in control flow
// are per-lane loops. Only the 1/rms of IN_RMSNORM is spread over the lanes (a token per
// lane, 8 broadcasts per workgroup); the host requires subgroups of at least 4 with
// ballot (kernels::gemm_supported).
// Measured on lavapipe (benches/gemm.rs, Q8_0 576x1536, 64 tokens, a busy machine:
// medians in prompt tokens/s of that matrix): matmul.comp tb4 1.12k; this kernel with 2,
// 4, 8 pairs per lane 2.04k, 2.15k, 2.67k (engine: 8, kernels::GEMM_PAIRS). On a quieter
// machine (load ~6) the two are at parity: tb4 / GEMM p8 23.7k / 21.7k (576x576),
// 7.2k / 8.1k (576x1536), 9.6k / 8.2k (1536x576): the input fetches, not the weight
// decode, bound both on lavapipe. Tried and
// dropped: 16 tokens per tile with every lane fetching every token (4x slower than tb4
// in a whole prefill: the fully unrolled body, ~5 s of JIT for 15 pipelines).
// Also tried (a standalone copy of this loop, f32 weights, 576x1536, 64 tokens; median
// CPU ms per dispatch over 3 alternating rounds, load ~9): X through a uniform buffer
// instead of texelFetch is slower in every form: 11.2 with the offset from the
// workgroup and chunk counter (gallivm 22.3 takes its scalar-load-and-broadcast path
// only where nir_src_is_always_uniform holds: constants and push constants through ALU
// ops, never a loop counter or the workgroup id; otherwise 8 scalar loads per
// component), 11.4 with the counter laundered through a push-constant table, 11.2 and
// 11.6 with push-constant or literal offsets, against 8.1 for texelFetch (4.4 with no X
// load at all). Eight rows per lane in lockstep instead of four: 8.4 (the X fetches stop
// mattering, doubling them costs +1.5 against +2 to +5 at four rows, but the spilled
// decoded rows take their place); quad-major order (a quad of the four rows, then the
// tokens): no change. Where the time goes (perf of the JIT code, Q8_0 576x1536): 42% in the
// texel fetch routine (31% the input fetch, 12% the weights'), most of the rest in the
// multiply-adds, which arrive as separate vmulps and vaddps with the sums kept on the stack
// across each fetch call. Fetching a token's 16 quads before the arithmetic, with or
// without eight rows per lane, and a 4-row x 4-token block of sums: no arm faster on all
// three shapes; X through an R32_SFLOAT view, four one-float fetches a quad: 0.3-0.7x
// (benches/results/gemm-fetch-first-ab.txt). X as a storage texel buffer (imageBuffer,
// imageLoad): 1.03x a whole prefill, within the noise; 16 lanes a workgroup on 16-lane
// subgroups (LP_NATIVE_VECTOR_WIDTH=512, AVX-512): 0.93x
// (benches/results/imageload-avx512-chunk-stop-ab.txt).
//
// Defines (crates/vk/build.rs "matmul_mm"): WTYPE_*, IN_RMSNORM, OUT_MODE as matmul.comp,
// TT (tokens per workgroup: 8, or 2 for a step of one or two tokens: a lone serving
// slot's decode, a one-token prompt chunk) and TB = min(TT, 4) (store_pair's token group).
// A token's sums are the same operations in the same order at either TT (per chunk, the
// 16 quads from zero, then added to its accumulator), so its outputs are bit-identical
// whatever the tile: the serving slots' batch invariance does not depend on it.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_KHR_shader_subgroup_ballot : require

#include "matmul.glsl"

#if !defined(TT) || (TT != 8 && TT != 2)
#error "matmul_mm is written for TT=8 and TT=2 (crates/vk/build.rs)"
#endif
// A tile's zeroed accumulators (one per token).
#if TT == 8
#define ZEROS float[TT](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
#else
#define ZEROS float[TT](0.0, 0.0)
#endif

// Every weight read goes through QUANT_ROW_CHUNK (include/quant.glsl); this fallback is
// its definition for the types whose rows are whole chunks of CHUNK_WORDS words.
#ifndef QUANT_ROW_CHUNK
#define QUANT_ROW_CHUNK(BUF, wofs, row, nchunks, c, BODY, BLOCK_END)                      \
    QUANT_CHUNK(BUF, (wofs) + ((row) * (nchunks) + (c)) * CHUNK_WORDS, BODY, BLOCK_END)
#endif

// The weight binding and word offset of row b of a pair (gate/up: up, in binding 1).
#if OUT_MODE == OUT_GLU
#define WB w1
#define WOFS_B pc.wofs[1]
#else
#define WB w0
#define WOFS_B wofs
#endif

// Token row of X read for token t of the tile starting at t0 (clamped past the batch).
uint mm_x_row(uint t0, uint t) {
    return pc.x_tok0 + min(t0 + t, pc.n_tok - 1u);
}

// 1 / sqrt(mean(x^2) + eps) of token row `row` of XR.
float mm_rms_scale(uint row) {
    uint base = row * (pc.x_ld / 4u);
    float ss = 0.0;
    for (uint i = 0u; i < pc.ncols / 4u; i++) {
        vec4 v = texelFetch(xr4, int(base + i));
        ss = dot4(v, v, ss);
    }
    return rms_of(ss);
}

// Token J's quad K of the chunk: the same address in every lane (J, K literals: the
// arrays' indices are constants; no loop is left to unroll, as a dynamically indexed
// private array is a compare ladder per access on lavapipe).
#define TOKQ(J, K) texelFetch(x4, int(xo[J] + cq + uint(K)))

// Quad K of token J against both decoded rows.
#define TQ(J, K)                                                                          \
    {                                                                                     \
        vec4 x_ = TOKQ(J, K);                                                             \
        sa_ = dot4(wa[K], x_, sa_);                                                       \
        sb_ = dot4(wb[K], x_, sb_);                                                       \
        sc_ = dot4(wc[K], x_, sc_);                                                       \
        sd_ = dot4(wd[K], x_, sd_);                                                       \
    }

// M(A, k) for the 16 quads of a chunk.
#define Q16(M, A)                                                                         \
    M(A, 0) M(A, 1) M(A, 2) M(A, 3) M(A, 4) M(A, 5) M(A, 6) M(A, 7)                       \
    M(A, 8) M(A, 9) M(A, 10) M(A, 11) M(A, 12) M(A, 13) M(A, 14) M(A, 15)

// Token J's dot products with both decoded rows, added to its sums.
#define TOKEN(J)                                                                          \
    {                                                                                     \
        float sa_ = 0.0;                                                                  \
        float sb_ = 0.0;                                                                  \
        float sc_ = 0.0;                                                                  \
        float sd_ = 0.0;                                                                  \
        Q16(TQ, J)                                                                        \
        acc_a[J] += sa_;                                                                  \
        acc_b[J] += sb_;                                                                  \
        acc_c[J] += sc_;                                                                  \
        acc_d[J] += sd_;                                                                  \
    }

// The same for a scalar: token J's value of v (one token per lane, as the quads).
#define TOKS(J, V0, V1)                                                                   \
    (gl_SubgroupSize >= 8u ? subgroupBroadcast(V0, J)                                     \
                           : ((J) < 4u ? subgroupBroadcast(V0, (J) & 3u)                  \
                                       : subgroupBroadcast(V1, (J) & 3u)))

void main() {
    uint view;
    uint tile;
    view_of_workgroup(view, tile);
    uint nrows = pc.nrows[view];
    uint orow = pc.orow[view];
    uint wofs = pc.wofs[view];
    uint t0 = gl_WorkGroupID.y * TT;
    uint nchunks = pc.ncols / 64u;
    uint x_ld4 = pc.x_ld / 4u;
    // the tokens this lane fetches for the subgroup
    uint sid = gl_SubgroupInvocationID;
    // 1/rms of each token of the tile (1 without the norm)
    vec4 sc_lo = vec4(1.0);
    vec4 sc_hi = vec4(1.0);
#if defined(IN_RMSNORM)
    float r0 = mm_rms_scale(mm_x_row(t0, sid));
    float r1 = gl_SubgroupSize >= 8u ? r0 : mm_rms_scale(mm_x_row(t0, sid + 4u));
#if TT == 8
    sc_lo = vec4(TOKS(0u, r0, r1), TOKS(1u, r0, r1), TOKS(2u, r0, r1), TOKS(3u, r0, r1));
    sc_hi = vec4(TOKS(4u, r0, r1), TOKS(5u, r0, r1), TOKS(6u, r0, r1), TOKS(7u, r0, r1));
#else
    sc_lo = vec4(TOKS(0u, r0, r1), TOKS(1u, r0, r1), 1.0, 1.0);
#endif
#endif
    uint xo[TT];
    for (uint t = 0u; t < TT; t++) {
        xo[t] = mm_x_row(t0, t) * x_ld4;
    }
    // two pairs in lockstep (p and p + WG), sharing every input fetch
    for (uint i = 0u; i < PAIRS; i += 2u) {
        uint p = (tile * PAIRS + i) * WG + gl_LocalInvocationID.x;
        Pair P = pair_rows(p, nrows, wofs, true);
        Pair Q = pair_rows(p + WG, nrows, wofs, i + 1u < PAIRS);
        uint ra = P.a_ok ? P.ra : 0u;
        uint rb = P.b_ok ? P.rb : 0u;
        uint rc = Q.a_ok ? Q.ra : 0u;
        uint rd = Q.b_ok ? Q.rb : 0u;
        float acc_a[TT] = ZEROS;
        float acc_b[TT] = ZEROS;
        float acc_c[TT] = ZEROS;
        float acc_d[TT] = ZEROS;
        for (uint c = 0u; c < nchunks; c++) {
            uint cq = c * 16u;
            vec4 wa[16];
            vec4 wb[16];
            vec4 wc[16];
            vec4 wd[16];
            QUANT_ROW_CHUNK(w0, wofs, ra, nchunks, c, wa[qi] = fma(vec4(qd), wq, vec4(qm));, )
            QUANT_ROW_CHUNK(WB, WOFS_B, rb, nchunks, c, wb[qi] = fma(vec4(qd), wq, vec4(qm));, )
            QUANT_ROW_CHUNK(w0, wofs, rc, nchunks, c, wc[qi] = fma(vec4(qd), wq, vec4(qm));, )
            QUANT_ROW_CHUNK(WB, WOFS_B, rd, nchunks, c, wd[qi] = fma(vec4(qd), wq, vec4(qm));, )
            TOKEN(0)
            TOKEN(1)
#if TT == 8
            TOKEN(2)
            TOKEN(3)
            TOKEN(4)
            TOKEN(5)
            TOKEN(6)
            TOKEN(7)
#endif
        }
#if TT == 8
        store_pair(P, vec4(acc_a[0], acc_a[1], acc_a[2], acc_a[3]),
                   vec4(acc_b[0], acc_b[1], acc_b[2], acc_b[3]), sc_lo, view, orow, t0);
        store_pair(P, vec4(acc_a[4], acc_a[5], acc_a[6], acc_a[7]),
                   vec4(acc_b[4], acc_b[5], acc_b[6], acc_b[7]), sc_hi, view, orow, t0 + 4u);
        store_pair(Q, vec4(acc_c[0], acc_c[1], acc_c[2], acc_c[3]),
                   vec4(acc_d[0], acc_d[1], acc_d[2], acc_d[3]), sc_lo, view, orow, t0);
        store_pair(Q, vec4(acc_c[4], acc_c[5], acc_c[6], acc_c[7]),
                   vec4(acc_d[4], acc_d[5], acc_d[6], acc_d[7]), sc_hi, view, orow, t0 + 4u);
#else
        // TB = 2: store_pair writes tokens t0 and t0 + 1 (.x, .y)
        store_pair(P, vec4(acc_a[0], acc_a[1], 0.0, 0.0), vec4(acc_b[0], acc_b[1], 0.0, 0.0),
                   sc_lo, view, orow, t0);
        store_pair(Q, vec4(acc_c[0], acc_c[1], 0.0, 0.0), vec4(acc_d[0], acc_d[1], 0.0, 0.0),
                   sc_lo, view, orow, t0);
#endif
    }
}

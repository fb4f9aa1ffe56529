#version 450
// Y = W · x for one token with lanes splitting each row's columns (shared parts, variants
// and fusions: include/matmul.glsl). The workgroup is one subgroup; SPLIT_K (a define,
// 1..4) is the number of whole rounds of WG chunks in a row.
//
// Lane l takes chunks l, l + WG, ... of every row: the chunks WG lanes fetch together are
// contiguous, so the weights stream through memory in order, which the CPU's prefetchers
// need under lavapipe (about twice the GB/s of row-per-lane, where WG rows 600+ bytes
// apart are read side by side). Each lane keeps the input of its own chunks for the whole
// dispatch, and a row's sum is one subgroupAdd. The chunks past the last multiple of WG
// are read row-per-lane afterwards: a workgroup takes WG pairs at a time, and lane j
// finishes and stores pair j.
//
// Where the weight type pairs chunks (QUANT_ROW_2CHUNKS: the K-quants, whose two chunks
// of a super-block share its header and often its quant bytes), lane l takes chunks 2l and
// 2l + 1 of each two rounds instead of l and l + WG, and decodes them from one set of
// texel fetches; the 2 WG chunks of two rounds are still contiguous across the lanes. An
// odd last round (SPLIT_K 3) is taken a chunk per lane as before.
//
// Tried and dropped: touching the rows of the pair two or four ahead (a texel per row per
// lane, so the group's lines are fetched before they are decoded): 0.89-0.92x decode
// (benches/results/split-touch-ahead-ab.txt); the fetch calls, not memory, set the pace.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#if TB != 1 || !defined(SPLIT_K) || SPLIT_K < 1 || SPLIT_K > 4
#error "the column split takes one token (TB 1) and SPLIT_K 1..4"
#endif

#include "matmul.glsl"

#if defined(QUANT_ROW_2CHUNKS) && SPLIT_K > 1
#define SPLIT_PAIRED
// The sums of the input quads XS (what QUAD_TOKEN adds for a block's min, per quad), for
// every row at once.
#define LOAD_XSUMS(SS, XS)                                                                \
    float SS[16];                                                                         \
    for (uint k_ = 0u; k_ < 16u; k_++) {                                                  \
        SS[k_] = (XS[k_].x + XS[k_].y) + (XS[k_].z + XS[k_].w);                           \
    }

// ACC.x += chunks C, C + 1 (C even) of row ROW of the view at word WOFS of binding B · X,
// their input quads in XA and XB and the quads' sums in SA and SB (one token).
#define ROW_2CHUNKS(B, WOFS, ROW, C, XA, XB, SA, SB, ACC)                                 \
    {                                                                                     \
        vec4 s_ = vec4(0.0);                                                              \
        vec4 sx_ = vec4(0.0);                                                             \
        QUANT_ROW_2CHUNKS(B, (WOFS), (ROW), pc.ncols / 64u, (C),                          \
            {                                                                             \
                vec4 x_ = qi < 16u ? XA[qi & 15u] : XB[qi & 15u];                         \
                s_.x = dot4(wq, x_, s_.x);                                                \
                if (QUANT_HAS_MIN) { sx_.x += qi < 16u ? SA[qi & 15u] : SB[qi & 15u]; }   \
            }                                                                             \
        , BLOCK_INTO(ACC))                                                                \
    }
#define PAIR_2CHUNKS(P, C, XA, XB, SA, SB, ACC_A, ACC_B)                                  \
    ROW_2CHUNKS(w0, P.wofs_a, P.row_a, C, XA, XB, SA, SB, ACC_A)                          \
    ROW_2CHUNKS(PAIR_W_B, P.wofs_b, P.row_b, C, XA, XB, SA, SB, ACC_B)
#endif

// 1 / sqrt(mean(x^2) + eps) of token row `row` of XR, the sum shared by the lanes.
float rms_scale_split(uint row) {
    uint base = row * (pc.x_ld / 4u);
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.ncols / 4u; i += WG) {
        vec4 v = texelFetch(xr4, int(base + i));
        ss = dot4(v, v, ss);
    }
    return rms_of(subgroupAdd(ss));
}

void main() {
    uint view;
    uint tile;
    view_of_workgroup(view, tile);
    uint nrows = pc.nrows[view];
    uint orow = pc.orow[view];
    uint wofs = pc.wofs[view];
    uint lane = gl_LocalInvocationID.x;
    uint left = pc.ncols / 64u - SPLIT_K * WG;  // chunks read row-per-lane
    vec4 scale = vec4(1.0);  // 1/rms of the token's residual (1 without the norm)
#if defined(IN_RMSNORM)
    scale.x = rms_scale_split(x_row(0u));
#endif
    // the input quads of the lane's chunks, fetched once for every row of the dispatch
#if defined(SPLIT_PAIRED)
    LOAD_XS(xk0_, 0u, 2u * lane * 16u)
    LOAD_XS(xk1_, 0u, (2u * lane + 1u) * 16u)
    LOAD_XSUMS(xs0_, xk0_)
    LOAD_XSUMS(xs1_, xk1_)
#if SPLIT_K == 3
    LOAD_XS(xk2_, 0u, (lane + 2u * WG) * 16u)
#elif SPLIT_K == 4
    LOAD_XS(xk2_, 0u, (2u * (lane + WG)) * 16u)
    LOAD_XS(xk3_, 0u, (2u * (lane + WG) + 1u) * 16u)
    LOAD_XSUMS(xs2_, xk2_)
    LOAD_XSUMS(xs3_, xk3_)
#endif
#else
    LOAD_XS(xk0_, 0u, lane * 16u)
#if SPLIT_K > 1
    LOAD_XS(xk1_, 0u, (lane + WG) * 16u)
#endif
#if SPLIT_K > 2
    LOAD_XS(xk2_, 0u, (lane + 2u * WG) * 16u)
#endif
#if SPLIT_K > 3
    LOAD_XS(xk3_, 0u, (lane + 3u * WG) * 16u)
#endif
#endif
    for (uint i = 0u; i < PAIRS; i++) {
        uint pair0 = (tile * PAIRS + i) * WG;
        // pair j's sums, kept by lane j
        float own_a = 0.0;
        float own_b = 0.0;
        for (uint j = 0u; j < WG; j++) {
            Pair P = pair_rows(pair0 + j, nrows, wofs, true);
            vec4 acc_a = vec4(0.0);
            vec4 acc_b = vec4(0.0);
#if defined(SPLIT_PAIRED)
            PAIR_2CHUNKS(P, 2u * lane, xk0_, xk1_, xs0_, xs1_, acc_a, acc_b)
#if SPLIT_K == 3
            PAIR_CHUNK(P, lane + 2u * WG, xk2_, xk2_, xk2_, xk2_, acc_a, acc_b)
#elif SPLIT_K == 4
            PAIR_2CHUNKS(P, 2u * (lane + WG), xk2_, xk3_, xs2_, xs3_, acc_a, acc_b)
#endif
#else
            PAIR_CHUNK(P, lane, xk0_, xk0_, xk0_, xk0_, acc_a, acc_b)
#if SPLIT_K > 1
            PAIR_CHUNK(P, lane + WG, xk1_, xk1_, xk1_, xk1_, acc_a, acc_b)
#endif
#if SPLIT_K > 2
            PAIR_CHUNK(P, lane + 2u * WG, xk2_, xk2_, xk2_, xk2_, acc_a, acc_b)
#endif
#if SPLIT_K > 3
            PAIR_CHUNK(P, lane + 3u * WG, xk3_, xk3_, xk3_, xk3_, acc_a, acc_b)
#endif
#endif
            float sa = subgroupAdd(acc_a.x);
            float sb = subgroupAdd(acc_b.x);
            if (lane == j) {
                own_a = sa;
                own_b = sb;
            }
        }
        // the left-over chunks of the lane's own pair, row-per-lane
        Pair P = pair_rows(pair0 + lane, nrows, wofs, true);
        vec4 acc_a = vec4(own_a, 0.0, 0.0, 0.0);
        vec4 acc_b = vec4(own_b, 0.0, 0.0, 0.0);
        for (uint r = 0u; r < left; r++) {
            uint c = SPLIT_K * WG + r;
            LOAD_XS(xr_, 0u, c * 16u)
            PAIR_CHUNK(P, c, xr_, xr_, xr_, xr_, acc_a, acc_b)
        }
        store_pair(P, acc_a, acc_b, scale, view, orow, gl_WorkGroupID.y);
    }
}

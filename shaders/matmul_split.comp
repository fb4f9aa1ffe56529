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
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#if TB != 1 || !defined(SPLIT_K) || SPLIT_K < 1 || SPLIT_K > 4
#error "the column split takes one token (TB 1) and SPLIT_K 1..4"
#endif

#include "matmul.glsl"

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
    for (uint i = 0u; i < PAIRS; i++) {
        uint pair0 = (tile * PAIRS + i) * WG;
        // pair j's sums, kept by lane j
        float own_a = 0.0;
        float own_b = 0.0;
        for (uint j = 0u; j < WG; j++) {
            Pair P = pair_rows(pair0 + j, nrows, wofs, true);
            vec4 acc_a = vec4(0.0);
            vec4 acc_b = vec4(0.0);
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

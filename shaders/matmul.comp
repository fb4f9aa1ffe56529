#version 450
// Y = W · X with lanes owning rows (shared parts, variants and fusions: include/matmul.glsl).
//
// Each invocation computes PAIRS pairs of rows for TB (1 or 4) tokens, GROUP pairs at a
// time in lockstep. Lanes of a workgroup take neighbouring pairs; every weight word
// fetched is used for TB tokens and every input quad fetched for the 2*GROUP rows of the
// group; block scales are applied per block. The prefill kernel, and decode's where the
// column split (matmul_split.comp) does not fit the row length.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require

#include "matmul.glsl"

// Row pairs computed in lockstep, sharing each chunk's input quads (four measured no
// faster than two and doubled the compile time).
const uint GROUP = 2u;

// 1 / sqrt(mean(x^2) + eps) of token row `row` of XR.
float rms_scale(uint row) {
    uint base = row * (pc.x_ld / 4u);
    float ss = 0.0;
    for (uint i = 0u; i < pc.ncols / 4u; i++) {
        vec4 v = texelFetch(xr4, int(base + i));
        ss = dot4(v, v, ss);
    }
    return rms_of(ss);
}

void main() {
    uint view;
    uint tile;
    view_of_workgroup(view, tile);
    uint nrows = pc.nrows[view];
    uint orow = pc.orow[view];
    uint wofs = pc.wofs[view];
    uint t0 = gl_WorkGroupID.y * TB;
    uint nchunks = pc.ncols / 64u;
    // 1/rms of each token's residual (1 without the norm)
    vec4 scale = vec4(1.0);
#if defined(IN_RMSNORM)
    scale.x = rms_scale(x_row(0u));
    if (TB > 1u) { scale.y = rms_scale(x_row(1u)); }
    if (TB > 2u) { scale.z = rms_scale(x_row(2u)); }
    if (TB > 3u) { scale.w = rms_scale(x_row(3u)); }
#endif
    for (uint i = 0u; i < PAIRS; i += GROUP) {
        uint p = (tile * PAIRS + i) * WG + gl_LocalInvocationID.x;
        Pair p0 = pair_rows(p, nrows, wofs, true);
        Pair p1 = pair_rows(p + WG, nrows, wofs, i + 1u < PAIRS);
        vec4 acc_a0 = vec4(0.0);
        vec4 acc_b0 = vec4(0.0);
        vec4 acc_a1 = vec4(0.0);
        vec4 acc_b1 = vec4(0.0);
        for (uint c = 0u; c < nchunks; c++) {
            LOAD_XS(xs0_, 0u, c * 16u)
            LOAD_XS(xs1_, 1u, c * 16u)
            LOAD_XS(xs2_, 2u, c * 16u)
            LOAD_XS(xs3_, 3u, c * 16u)
            PAIR_CHUNK(p0, c, xs0_, xs1_, xs2_, xs3_, acc_a0, acc_b0)
            PAIR_CHUNK(p1, c, xs0_, xs1_, xs2_, xs3_, acc_a1, acc_b1)
        }
        store_pair(p0, acc_a0, acc_b0, scale, view, orow, t0);
        store_pair(p1, acc_a1, acc_b1, scale, view, orow, t0);
    }
}

//! ggml's reference K quantisers (`quantize_row_q{2,3,4,5,6}_K_ref`, what
//! `llama-quantize` uses without an importance matrix), written anew in Rust with the
//! same f32 operations in the same order so the output bytes match.

use half::f16;

use super::k_search::{
    make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, Qkx2, GROUP_MAX_EPS,
};
use super::{blocks_of, scale_min_k4, QK_K};
use crate::error::GgufError;

fn h(x: f32) -> f16 {
    f16::from_f32(x)
}

/// Packs eight 6-bit scales and mins into 12 bytes (the layout [`scale_min_k4`] reads).
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0x0F) | ((lm[j] & 0x0F) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
    q
}

/// Four 2-bit values per byte: byte `32k + l` of a 128-element half holds elements
/// `l`, `l + 32`, `l + 64`, `l + 96` from its low bits up.
fn pack_2bit(l: &[u8; QK_K], out: &mut Vec<u8>) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            let b = l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
            out.push(b);
        }
    }
}

/// The shared first half of Q4_K and Q5_K: per 32-element group a weighted
/// scale-and-min search, then the 6-bit scales and mins and the super-block `d`, `dmin`.
/// Returns the 12 packed scale bytes, `d`, `dmin`, and the final quants.
fn qkx_super_block(x: &[f32], search: &Qkx2) -> ([u8; 12], f16, f16, [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut weights = [0.0f32; 32];
    for j in 0..8 {
        let g = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in g {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(g) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(search, g, &weights, &mut l[32 * j..32 * j + 32]);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = h(max_scale / 63.0);
    let dmin = h(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for i in 0..32 {
            let q = nearest_int((x[32 * j + i] + dm) / dj).clamp(0, search.nmax);
            l[32 * j + i] = q as u8;
        }
    }
    (packed, d, dmin, l)
}

/// Quantises to Q4_K as ggml's `quantize_row_q4_K_ref`. `x.len()` must be a multiple
/// of 256.
pub fn quantize_q4_k(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let search = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let mut out = Vec::with_capacity(x.len() / QK_K * 144);
    for blk in blocks_of(x, QK_K)? {
        let (scales, d, dmin, l) = qkx_super_block(blk, &search);
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
        out.extend_from_slice(&scales);
        for j in (0..QK_K).step_by(64) {
            out.extend((0..32).map(|i| l[j + i] | (l[j + i + 32] << 4)));
        }
    }
    Ok(out)
}

/// Quantises to Q5_K as ggml's `quantize_row_q5_K_ref`. `x.len()` must be a multiple
/// of 256.
pub fn quantize_q5_k(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let search = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let mut out = Vec::with_capacity(x.len() / QK_K * 176);
    for blk in blocks_of(x, QK_K)? {
        let (scales, d, dmin, l) = qkx_super_block(blk, &search);
        let mut qh = [0u8; 32];
        let mut ql = [0u8; 128];
        let (mut m1, mut m2) = (1u8, 2u8);
        for (g, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[32 * g + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
        out.extend_from_slice(&scales);
        out.extend_from_slice(&qh);
        out.extend_from_slice(&ql);
    }
    Ok(out)
}

/// Quantises to Q6_K as ggml's `quantize_row_q6_K_ref`. `x.len()` must be a multiple
/// of 256.
pub fn quantize_q6_k(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::with_capacity(x.len() / QK_K * 210);
    for blk in blocks_of(x, QK_K)? {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..16 {
            let scale = make_qx_quants(32, &blk[16 * ib..16 * ib + 16], &mut l[16 * ib..][..16]);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            out.extend_from_slice(&[0u8; 210]);
            continue;
        }
        let iscale = -128.0 / max_scale;
        let d = h(1.0 / iscale);
        let sc: [i8; 16] =
            std::array::from_fn(|ib| nearest_int(iscale * scales[ib]).min(127) as i8);
        for j in 0..16 {
            let dj = d.to_f32() * sc[j] as f32;
            if dj == 0.0 {
                continue;
            }
            for i in 0..16 {
                let q = nearest_int(blk[16 * j + i] / dj).clamp(-32, 31);
                l[16 * j + i] = (q + 32) as i8;
            }
        }
        let l: [u8; QK_K] = std::array::from_fn(|i| l[i] as u8);
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for (n, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                let q = |k: usize| l[j + i + 32 * k];
                ql[64 * n + i] = (q(0) & 0x0F) | ((q(2) & 0x0F) << 4);
                ql[64 * n + i + 32] = (q(1) & 0x0F) | ((q(3) & 0x0F) << 4);
                qh[32 * n + i] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend(sc.iter().map(|&s| s as u8));
        out.extend_from_slice(&d.to_le_bytes());
    }
    Ok(out)
}

/// Quantises to Q3_K as ggml's `quantize_row_q3_K_ref`. `x.len()` must be a multiple
/// of 256.
pub fn quantize_q3_k(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::with_capacity(x.len() / QK_K * 110);
    for blk in blocks_of(x, QK_K)? {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &blk[16 * j..16 * j + 16], &mut l[16 * j..][..16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let mut packed = [0u8; 12];
        let d = if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // ggml stores nearest_int's result in an int8_t before clamping.
                let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let q = q as u8;
                if j < 8 {
                    packed[j] = q & 0x0F;
                } else {
                    packed[j - 8] |= (q & 0x0F) << 4;
                }
                packed[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            h(1.0 / iscale)
        } else {
            h(0.0)
        };
        let sc = super::q3_k_scales(&packed);
        for j in 0..16 {
            let dj = d.to_f32() * sc[j] as f32;
            if dj == 0.0 {
                continue;
            }
            for i in 0..16 {
                let q = nearest_int(blk[16 * j + i] / dj).clamp(-4, 3);
                l[16 * j + i] = (q + 4) as i8;
            }
        }
        let mut hmask = [0u8; 32];
        let mut low = [0u8; QK_K];
        for (j, (&q, low)) in l.iter().zip(low.iter_mut()).enumerate() {
            let mut q = q as u8;
            if q > 3 {
                hmask[j % 32] |= 1 << (j / 32);
                q -= 4;
            }
            *low = q;
        }
        out.extend_from_slice(&hmask);
        pack_2bit(&low, &mut out);
        out.extend_from_slice(&packed);
        out.extend_from_slice(&d.to_le_bytes());
    }
    Ok(out)
}

/// Quantises to Q2_K as ggml's `quantize_row_q2_K_ref`. `x.len()` must be a multiple
/// of 256.
pub fn quantize_q2_k(x: &[f32]) -> Result<Vec<u8>, GgufError> {
    let search = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let mut out = Vec::with_capacity(x.len() / QK_K * 84);
    for blk in blocks_of(x, QK_K)? {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        let mut weights = [0.0f32; 16];
        for j in 0..16 {
            let g = &blk[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(g) {
                *w = v.abs();
            }
            let (scale, min) = make_qkx2_quants(&search, g, &weights, &mut l[16 * j..][..16]);
            scales[j] = scale;
            mins[j] = min;
            if scale > max_scale {
                max_scale = scale;
            }
            if min > max_min {
                max_min = min;
            }
        }
        let mut sc = [0u8; 16];
        let d = if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for j in 0..16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            h(max_scale / 15.0)
        } else {
            h(0.0)
        };
        let dmin = if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for j in 0..16 {
                sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            h(max_min / 15.0)
        } else {
            h(0.0)
        };
        for j in 0..16 {
            let dj = d.to_f32() * (sc[j] & 0x0F) as f32;
            if dj == 0.0 {
                continue;
            }
            let dm = dmin.to_f32() * (sc[j] >> 4) as f32;
            for i in 0..16 {
                let q = nearest_int((blk[16 * j + i] + dm) / dj).clamp(0, 3);
                l[16 * j + i] = q as u8;
            }
        }
        out.extend_from_slice(&sc);
        pack_2bit(&l, &mut out);
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
    }
    Ok(out)
}

//! Dequantisation of the K formats (256-element super-blocks), in the same order of
//! float operations as ggml's `dequantize_row_q*_K` so results are bit-identical to it
//! and to the `gguf` Python package's `gguf.quants.dequantize`.

use super::{scale_min_k4, BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K};

/// Q2_K: 16 groups of 16, each `d * (scale & 15) * q - dmin * (scale >> 4)`, 2-bit `q`.
pub(super) fn dequant_q2_k(b: &[u8], o: &mut [f32]) {
    let blk: BlockQ2_K = bytemuck::pod_read_unaligned(b);
    let d = blk.d.to_f32();
    let min = blk.dmin.to_f32();
    let mut is = 0;
    for n in 0..2 {
        let q = &blk.qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let sc = blk.scales[is];
                is += 1;
                let dl = d * (sc & 0x0F) as f32;
                let ml = min * (sc >> 4) as f32;
                let y = &mut o[128 * n + 32 * j + 16 * half..][..16];
                for (l, y) in y.iter_mut().enumerate() {
                    *y = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block, unpacked and offset by -32.
pub fn q3_k_scales(packed: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, s) in out.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 0x0F
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *s = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Q3_K: 16 groups of 16, each `d * scale * (q - 4 * !hbit)`, 2-bit `q` plus a high bit.
pub(super) fn dequant_q3_k(b: &[u8], o: &mut [f32]) {
    let blk: BlockQ3_K = bytemuck::pod_read_unaligned(b);
    let d_all = blk.d.to_f32();
    let scales = q3_k_scales(&blk.scales);
    let mut is = 0;
    let mut m = 1u8;
    for n in 0..2 {
        let q = &blk.qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let dl = d_all * scales[is] as f32;
                is += 1;
                let y = &mut o[128 * n + 32 * j + 16 * half..][..16];
                for (l, y) in y.iter_mut().enumerate() {
                    let i = l + 16 * half;
                    let low = ((q[i] >> shift) & 3) as i8;
                    let sub = if blk.hmask[i] & m != 0 { 0 } else { 4 };
                    *y = dl * (low - sub) as f32;
                }
            }
            m <<= 1;
        }
    }
}

/// Q4_K: 8 groups of 32, each `d * scale * q - dmin * min`, 4-bit `q`.
pub(super) fn dequant_q4_k(b: &[u8], o: &mut [f32]) {
    let blk: BlockQ4_K = bytemuck::pod_read_unaligned(b);
    let d = blk.d.to_f32();
    let dmin = blk.dmin.to_f32();
    for g in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * g, &blk.scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, &blk.scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &blk.qs[32 * g..32 * g + 32];
        let y = &mut o[64 * g..64 * g + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: as Q4_K with a fifth bit per element in `qh`.
pub(super) fn dequant_q5_k(b: &[u8], o: &mut [f32]) {
    let blk: BlockQ5_K = bytemuck::pod_read_unaligned(b);
    let d = blk.d.to_f32();
    let dmin = blk.dmin.to_f32();
    let (mut u1, mut u2) = (1u8, 2u8);
    for g in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * g, &blk.scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, &blk.scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let ql = &blk.qs[32 * g..32 * g + 32];
        let y = &mut o[64 * g..64 * g + 64];
        for l in 0..32 {
            let h1 = if blk.qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if blk.qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
        u1 <<= 2;
        u2 <<= 2;
    }
}

/// Q6_K: 16 groups of 16, `d * scale * (q - 32)`, 6 bits each (4 in `ql`, 2 in `qh`).
pub(super) fn dequant_q6_k(b: &[u8], o: &mut [f32]) {
    let blk: BlockQ6_K = bytemuck::pod_read_unaligned(b);
    let d = blk.d.to_f32();
    for n in 0..2 {
        let ql = &blk.ql[64 * n..64 * n + 64];
        let qh = &blk.qh[32 * n..32 * n + 32];
        let sc = &blk.scales[8 * n..8 * n + 8];
        let y = &mut o[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
}

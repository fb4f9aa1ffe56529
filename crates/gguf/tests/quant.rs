//! Dequantisation of hand-made blocks with known values, and quantise -> dequantise
//! round trips within each format's error bound.

use gguf::quant::{
    self, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ6_K, BlockQ8_0,
};
use gguf::{dequantize, dequantize_row, quantize_q8_0, GgmlType};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn h(x: f32) -> f16 {
    f16::from_f32(x)
}

#[test]
fn plain_float_types() {
    let x = [1.5f32, -2.25, 0.0, 65504.0];
    let f32_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(dequantize_row(GgmlType::F32, &f32_bytes, 4).unwrap(), x);
    let f16_bytes: Vec<u8> = x.iter().flat_map(|v| h(*v).to_le_bytes()).collect();
    assert_eq!(dequantize_row(GgmlType::F16, &f16_bytes, 4).unwrap(), x);
    // BF16 keeps the top 16 bits of an f32: 1.5 and -2.25 are exact, 3.14159 is not.
    let y = [1.5f32, -2.25, std::f32::consts::PI];
    let bf: Vec<u8> = y
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let out = dequantize_row(GgmlType::BF16, &bf, 3).unwrap();
    assert_eq!(&out[..2], &y[..2]);
    assert_eq!(out[2], 3.140625);
}

#[test]
fn q8_0_known_block() {
    let mut qs = [0i8; 32];
    for (i, q) in qs.iter_mut().enumerate() {
        *q = i as i8 * 8 - 127; // -127, -119, ..., 121
    }
    let blk = BlockQ8_0 { d: h(0.5), qs };
    let out = dequantize_row(GgmlType::Q8_0, bytemuck::bytes_of(&blk), 32).unwrap();
    for (i, y) in out.iter().enumerate() {
        assert_eq!(*y, (i as f32 * 8.0 - 127.0) * 0.5);
    }
}

#[test]
fn q8_0_quantise_rounds_like_ggml() {
    // amax 127 gives d = 1 exactly: q = round(x) with halves away from zero.
    let mut x = [0.0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 0.5;
    x[4] = -0.49;
    x[5] = 126.5;
    let b = quantize_q8_0(&x).unwrap();
    assert_eq!(b.len(), 34);
    assert_eq!(f16::from_le_bytes([b[0], b[1]]), h(1.0));
    let qs: Vec<i8> = b[2..].iter().map(|&v| v as i8).collect();
    assert_eq!(&qs[..6], &[127, 3, -3, 1, 0, 127]);
    // An all-zero block has d = 0 and zero quants.
    assert_eq!(quantize_q8_0(&[0.0; 32]).unwrap(), vec![0u8; 34]);
    // d is stored as f16 of amax/127, quants use 1/d in f32.
    let mut y = [0.1f32; 32];
    y[7] = -1.0;
    let b = quantize_q8_0(&y).unwrap();
    assert_eq!(f16::from_le_bytes([b[0], b[1]]), h(1.0 / 127.0));
    assert_eq!(b[2 + 7] as i8, -127);
    assert_eq!(b[2] as i8, 13); // 0.1 * 127 = 12.7
    assert!(quantize_q8_0(&[0.0; 33]).is_err());
}

#[test]
fn q4_0_known_block_low_nibbles_first() {
    let mut qs = [0u8; 16];
    for (j, q) in qs.iter_mut().enumerate() {
        *q = j as u8 | ((15 - j as u8) << 4);
    }
    let blk = BlockQ4_0 { d: h(2.0), qs };
    let out = dequantize_row(GgmlType::Q4_0, bytemuck::bytes_of(&blk), 32).unwrap();
    for j in 0..16 {
        assert_eq!(out[j], (j as f32 - 8.0) * 2.0, "element {j}");
        assert_eq!(
            out[j + 16],
            (15.0 - j as f32 - 8.0) * 2.0,
            "element {}",
            j + 16
        );
    }
}

#[test]
fn q4_1_known_block() {
    let mut qs = [0u8; 16];
    for (j, q) in qs.iter_mut().enumerate() {
        *q = (j as u8 % 16) | (((j as u8 * 3) % 16) << 4);
    }
    let blk = BlockQ4_1 {
        d: h(0.25),
        m: h(-1.0),
        qs,
    };
    let out = dequantize_row(GgmlType::Q4_1, bytemuck::bytes_of(&blk), 32).unwrap();
    for j in 0..16 {
        assert_eq!(out[j], j as f32 * 0.25 - 1.0);
        assert_eq!(out[j + 16], ((j * 3) % 16) as f32 * 0.25 - 1.0);
    }
}

/// The 5-bit values 0..32 of element i, laid out as ggml does: low nibbles in `qs`
/// (elements 0..15 low, 16..31 high), bit 4 of element i in bit i of `qh`.
fn pack_q5(v: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for (i, q) in v.iter().enumerate() {
        qh |= u32::from(q >> 4) << i;
    }
    for j in 0..16 {
        qs[j] = (v[j] & 15) | ((v[j + 16] & 15) << 4);
    }
    (qh.to_le_bytes(), qs)
}

#[test]
fn q5_0_and_q5_1_known_blocks() {
    let mut v = [0u8; 32];
    for (i, q) in v.iter_mut().enumerate() {
        *q = ((i * 13 + 5) % 32) as u8;
    }
    let (qh, qs) = pack_q5(&v);
    let b0 = BlockQ5_0 { d: h(0.5), qh, qs };
    let out = dequantize_row(GgmlType::Q5_0, bytemuck::bytes_of(&b0), 32).unwrap();
    for i in 0..32 {
        assert_eq!(out[i], (v[i] as f32 - 16.0) * 0.5, "Q5_0 element {i}");
    }
    let b1 = BlockQ5_1 {
        d: h(0.125),
        m: h(3.0),
        qh,
        qs,
    };
    let out = dequantize_row(GgmlType::Q5_1, bytemuck::bytes_of(&b1), 32).unwrap();
    for i in 0..32 {
        assert_eq!(out[i], v[i] as f32 * 0.125 + 3.0, "Q5_1 element {i}");
    }
}

/// Packs eight 6-bit scales and mins the way ggml's Q4_K does.
fn pack_k4_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    q
}

#[test]
fn q4_k_known_block() {
    let sc = [1u8, 2, 63, 17, 33, 47, 5, 60];
    let m = [0u8, 3, 9, 62, 20, 41, 7, 1];
    let scales = pack_k4_scales(&sc, &m);
    for g in 0..8 {
        assert_eq!(quant::scale_min_k4(g, &scales), (sc[g], m[g]), "group {g}");
    }
    let mut rng = StdRng::seed_from_u64(4);
    let mut nib = [0u8; 256]; // element -> 4-bit value
    rng.fill(&mut nib[..]);
    nib.iter_mut().for_each(|v| *v &= 15);
    // Group 2k takes the low nibbles of qs[32k..32k+32], group 2k+1 the high ones.
    let mut qs = [0u8; 128];
    for k in 0..4 {
        for l in 0..32 {
            qs[32 * k + l] = nib[64 * k + l] | (nib[64 * k + 32 + l] << 4);
        }
    }
    let blk = BlockQ4_K {
        d: h(0.5),
        dmin: h(0.25),
        scales,
        qs,
    };
    let out = dequantize_row(GgmlType::Q4_K, bytemuck::bytes_of(&blk), 256).unwrap();
    for (i, y) in out.iter().enumerate() {
        let g = i / 32;
        let want = 0.5 * sc[g] as f32 * nib[i] as f32 - 0.25 * m[g] as f32;
        assert_eq!(*y, want, "element {i}");
    }
}

#[test]
fn q6_k_known_block() {
    let mut rng = StdRng::seed_from_u64(6);
    let q: Vec<u8> = (0..256).map(|_| rng.gen_range(0..64u8)).collect();
    let scales: [i8; 16] = std::array::from_fn(|i| i as i8 * 9 - 70);
    // ggml's layout: per 128-element half n, element 128n + l + 32s (s = 0..4, l < 32)
    // has its low 4 bits in ql[64n + l + 32(s%2)] (low nibble for s < 2, high after)
    // and its top 2 bits in qh[32n + l] bits 2s..2s+1.
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for n in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                let v = q[128 * n + 32 * s + l];
                let li = 64 * n + l + 32 * (s % 2);
                ql[li] |= (v & 15) << (4 * (s / 2));
                qh[32 * n + l] |= (v >> 4) << (2 * s);
            }
        }
    }
    let blk = BlockQ6_K {
        ql,
        qh,
        scales,
        d: h(0.125),
    };
    let out = dequantize_row(GgmlType::Q6_K, bytemuck::bytes_of(&blk), 256).unwrap();
    for (i, y) in out.iter().enumerate() {
        let want = 0.125 * scales[i / 16] as f32 * (q[i] as f32 - 32.0);
        assert_eq!(*y, want, "element {i}");
    }
}

#[test]
fn unaligned_input_is_fine() {
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 7.0 - 4.0).collect();
    let b = quantize_q8_0(&x).unwrap();
    let mut shifted = vec![0u8; 1];
    shifted.extend_from_slice(&b);
    let a = dequantize_row(GgmlType::Q8_0, &b, 64).unwrap();
    let c = dequantize_row(GgmlType::Q8_0, &shifted[1..], 64).unwrap();
    assert_eq!(a, c);
}

#[test]
fn length_and_type_errors() {
    let e = dequantize_row(GgmlType::Q8_0, &[0; 33], 32).unwrap_err();
    assert!(
        e.to_string()
            .contains("Q8_0 data for 32 elements must be 34 bytes, found 33"),
        "{e}"
    );
    let e = dequantize_row(GgmlType::Q4_0, &[0; 18], 31).unwrap_err();
    assert!(
        e.to_string().contains("whole number of 32-element blocks"),
        "{e}"
    );
    let e = dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut [0.0; 256]).unwrap_err();
    assert!(
        e.to_string()
            .contains("dequantisation is not implemented for IQ2_XXS"),
        "{e}"
    );
}

/// Random blocks with varied magnitudes and offsets.
fn random_data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let scale = [0.01f32, 1.0, 30.0][(i / 32) % 3];
            let offset = if (i / 96) % 2 == 1 { 0.5 * scale } else { 0.0 };
            rng.gen_range(-1.0f32..1.0) * scale + offset
        })
        .collect()
}

#[test]
fn round_trips_within_bounds() {
    let x = random_data(32 * 48, 11);
    // (type, quantiser, bound on |x - y| relative to the block's max |x|)
    // Q8_0: half a step of amax/127, plus f16 rounding of d (2^-11 relative, times 127).
    // Q4_0/Q5_0: the value at the far end of the signed range can be a whole step off.
    // Q4_1/Q5_1: half a step of (max - min)/levels, plus f16 rounding of d and m.
    type Quantiser = fn(&[f32]) -> Result<Vec<u8>, gguf::GgufError>;
    let cases: [(GgmlType, Quantiser, f32); 5] = [
        (GgmlType::Q8_0, quantize_q8_0, 0.5 / 127.0 + 1.0 / 2048.0),
        (
            GgmlType::Q4_0,
            quant::quantize_q4_0,
            1.0 / 8.0 + 8.0 / 2048.0,
        ),
        (
            GgmlType::Q4_1,
            quant::quantize_q4_1,
            2.0 * 0.5 / 15.0 + 32.0 / 2048.0,
        ),
        (
            GgmlType::Q5_0,
            quant::quantize_q5_0,
            1.0 / 16.0 + 16.0 / 2048.0,
        ),
        (
            GgmlType::Q5_1,
            quant::quantize_q5_1,
            2.0 * 0.5 / 31.0 + 64.0 / 2048.0,
        ),
    ];
    for (ty, q, bound) in cases {
        let bytes = q(&x).unwrap();
        assert_eq!(bytes.len() as u64, ty.row_bytes(x.len() as u64).unwrap());
        let y = dequantize_row(ty, &bytes, x.len()).unwrap();
        let mut worst = 0.0f32;
        for (bx, by) in x.chunks(32).zip(y.chunks(32)) {
            let amax = bx.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (a, b) in bx.iter().zip(by) {
                let rel = (a - b).abs() / amax;
                worst = worst.max(rel);
                assert!(rel <= bound, "{ty}: |{a} - {b}| / {amax} = {rel} > {bound}");
            }
        }
        // The bound is not vacuous: the error is a real fraction of it.
        assert!(worst > bound * 0.2, "{ty}: worst {worst} vs bound {bound}");
    }
}

#[test]
fn requantising_q8_0_is_stable() {
    let x = random_data(32 * 16, 3);
    let once = quantize_q8_0(&x).unwrap();
    let y = dequantize_row(GgmlType::Q8_0, &once, x.len()).unwrap();
    assert_eq!(quantize_q8_0(&y).unwrap(), once);
}

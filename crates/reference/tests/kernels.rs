//! Every kernel on tiny cases computed by hand (or, for the packed weight types, against
//! an independent dequantise-then-f64-dot).

use gguf::GgmlType;
use half::f16;
use reference::kernels::*;
use reference::synthetic::Rng;
use reference::RefError;

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "lengths differ: {a:?} vs {b:?}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y} (tol {tol})\n  got      {a:?}\n  expected {b:?}"
        );
    }
}

#[test]
fn rmsnorm_hand_computed() {
    // mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5, so the scale is 1/sqrt(7.5).
    let s = 1.0 / 7.5f32.sqrt();
    let mut out = [0.0; 4];
    rmsnorm(&[1.0, 2.0, 3.0, 4.0], &[1.0, 1.0, 2.0, 0.5], 0.0, &mut out);
    close(&out, &[s, 2.0 * s, 6.0 * s, 2.0 * s], 1e-6);
    // eps is added to the mean of squares, inside the square root.
    rmsnorm(&[3.0, 4.0], &[1.0, 1.0], 0.5, &mut out[..2]);
    let s = 1.0 / (12.5f32 + 0.5).sqrt();
    close(&out[..2], &[3.0 * s, 4.0 * s], 1e-6);
}

#[test]
fn softmax_hand_computed_and_stable() {
    let expected = [0.090_030_57, 0.244_728_47, 0.665_240_96];
    let mut x = [1.0, 2.0, 3.0];
    softmax(&mut x);
    close(&x, &expected, 1e-6);
    // Large values must not overflow: only differences matter.
    let mut big = [1000.0, 1001.0, 1002.0];
    softmax(&mut big);
    close(&big, &expected, 1e-6);
    let mut huge = [3.0e38, -3.0e38, 3.0e38];
    softmax(&mut huge);
    close(&huge, &[0.5, 0.0, 0.5], 1e-6);
    let mut empty: [f32; 0] = [];
    softmax(&mut empty);
}

#[test]
fn rope_normal_rotates_adjacent_pairs() {
    // head_dim 4: theta_0 = pos, theta_1 = pos * base^(-1/2) = pos / 100 for base 10000.
    let mut x = [1.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
    rope(&mut x, 2, 4, 1, 10_000.0, RopeMode::Normal);
    let (c0, s0) = (1.0f32.cos(), 1.0f32.sin());
    let (c1, s1) = (0.01f32.cos(), 0.01f32.sin());
    close(
        &x,
        &[
            c0,
            s0,
            -s1,
            c1,
            2.0 * c0 - 3.0 * s0,
            2.0 * s0 + 3.0 * c0,
            4.0 * c1 - 5.0 * s1,
            4.0 * s1 + 5.0 * c1,
        ],
        1e-6,
    );
    // Position 0 is the identity.
    let mut y = [0.3, -0.7, 1.5, 2.5];
    rope(&mut y, 1, 4, 0, 10_000.0, RopeMode::Normal);
    assert_eq!(y, [0.3, -0.7, 1.5, 2.5]);
}

#[test]
fn rope_neox_rotates_half_split_pairs() {
    // Pairs are (x0, x2) with theta = pos and (x1, x3) with theta = pos / 100.
    let mut x = [1.0, 0.0, 0.0, 1.0];
    rope(&mut x, 1, 4, 1, 10_000.0, RopeMode::Neox);
    close(
        &x,
        &[1.0f32.cos(), -0.01f32.sin(), 1.0f32.sin(), 0.01f32.cos()],
        1e-6,
    );
    // pos 3, base 100, head_dim 4: theta_0 = 3, theta_1 = 3 * 100^(-1/2) = 0.3.
    let mut y = [2.0, 1.0, -1.0, 4.0];
    rope(&mut y, 1, 4, 3, 100.0, RopeMode::Neox);
    let (c0, s0, c1, s1) = (3.0f32.cos(), 3.0f32.sin(), 0.3f32.cos(), 0.3f32.sin());
    close(
        &y,
        &[
            2.0 * c0 + s0,       // a cos - b sin with (a, b) = (2, -1)
            1.0 * c1 - 4.0 * s1, // (a, b) = (1, 4)
            2.0 * s0 - c0,
            1.0 * s1 + 4.0 * c1,
        ],
        1e-6,
    );
}

#[test]
fn attention_weights_positions_by_softmax_of_scaled_scores() {
    // One head, head_dim 2, two positions. k0 = (0,0), k1 = (1,0); q = (sqrt(2) ln 3, 0):
    // scores are 0 and ln 3 after the 1/sqrt(2) scale, so p = (1/4, 3/4).
    let q = [2f32.sqrt() * 3f32.ln(), 0.0];
    let k = [0.0, 0.0, 1.0, 0.0];
    let v = [4.0, 8.0, -4.0, 0.0];
    let mut out = [0.0; 2];
    attention(&q, &k, &v, 1, 1, 2, 2, &mut out);
    close(&out, &[0.25 * 4.0 + 0.75 * -4.0, 0.25 * 8.0], 1e-6);
    // n_pos = 1 ignores the second cache row entirely.
    attention(&q, &k, &v, 1, 1, 2, 1, &mut out);
    close(&out, &[4.0, 8.0], 1e-6);
}

#[test]
fn attention_gqa_maps_query_heads_to_kv_heads() {
    // 4 query heads over 2 kv heads: heads 0,1 read kv head 0, heads 2,3 read kv head 1.
    // A zero query attends uniformly, so each head's output is the mean of its kv head's
    // values; distinct values per kv head reveal the mapping.
    let head_dim = 2;
    let q = [0.0f32; 8];
    // Cache rows (position-major): [kv0 (2), kv1 (2)] per position.
    let k = [0.0f32; 8];
    let v = [
        1.0, 2.0, 10.0, 20.0, // position 0
        3.0, 4.0, 30.0, 40.0, // position 1
    ];
    let mut out = [0.0; 8];
    attention(&q, &k, &v, 4, 2, head_dim, 2, &mut out);
    close(&out, &[2.0, 3.0, 2.0, 3.0, 20.0, 30.0, 20.0, 30.0], 1e-6);

    // Now make only query head 3 (kv head 1) sharp on position 1.
    let mut q = [0.0f32; 8];
    q[6] = 100.0;
    let mut k = [0.0f32; 8];
    k[6] = 1.0; // position 1, kv head 1, element 0
    attention(&q, &k, &v, 4, 2, head_dim, 2, &mut out);
    close(&out, &[2.0, 3.0, 2.0, 3.0, 20.0, 30.0, 30.0, 40.0], 1e-6);
}

#[test]
fn swiglu_add_argmax() {
    let mut out = [0.0; 3];
    swiglu(&[0.0, 1.0, -1.0], &[2.0, 3.0, 4.0], &mut out);
    // silu(1) = 1/(1+e^-1) = 0.7310586, silu(-1) = -0.2689414.
    close(&out, &[0.0, 3.0 * 0.731_058_6, 4.0 * -0.268_941_4], 1e-6);

    let mut acc = [1.0, 2.0, 3.0];
    add(&mut acc, &[0.5, -2.0, 1.0]);
    assert_eq!(acc, [1.5, 0.0, 4.0]);

    assert_eq!(argmax(&[1.0, 5.0, 2.0, 5.0]), 1, "first of equal maxima");
    assert_eq!(argmax(&[f32::NAN, -1.0, 3.0]), 2, "NaN never wins");
    assert_eq!(argmax(&[-3.0]), 0);
    assert_eq!(argmax(&[]), 0);
}

#[test]
fn q8_0_matvec_hand_built_block() {
    // One row of one block: d = 0.5, q = 0, 1, -2, 3, -4, ... ; x = 1 at j, so out = 0.5*q[j].
    let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
    let qs: Vec<i8> = (0..32).map(|j| if j % 2 == 0 { -j } else { j }).collect();
    block.extend(qs.iter().map(|&q| q as u8));
    for j in [0usize, 1, 2, 17, 31] {
        let mut x = [0.0f32; 32];
        x[j] = 1.0;
        let mut out = [0.0f32; 1];
        matvec(GgmlType::Q8_0, &block, 1, 32, &x, &mut out).unwrap();
        assert_eq!(out[0], 0.5 * f32::from(qs[j]), "element {j}");
    }
    // Sum over all elements: 0.5 * sum(q).
    let mut out = [0.0f32; 1];
    matvec(GgmlType::Q8_0, &block, 1, 32, &[1.0; 32], &mut out).unwrap();
    let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
    assert_eq!(out[0], 0.5 * sum as f32);
}

#[test]
fn q4_1_matvec_hand_built_block_nibble_order() {
    // d = 1, m = -8: element = nibble - 8. Byte j holds element j (low nibble) and element
    // j + 16 (high nibble). Use byte j = (15 - j) << 4 | j.
    let mut block = f16::from_f32(1.0).to_le_bytes().to_vec();
    block.extend(f16::from_f32(-8.0).to_le_bytes());
    block.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
    let mut expected = [0.0f32; 32];
    for j in 0..16 {
        expected[j] = j as f32 - 8.0;
        expected[j + 16] = (15 - j) as f32 - 8.0;
    }
    for (e, expect) in expected.iter().enumerate() {
        let mut x = [0.0f32; 32];
        x[e] = 1.0;
        let mut out = [0.0f32; 1];
        matvec(GgmlType::Q4_1, &block, 1, 32, &x, &mut out).unwrap();
        assert_eq!(out[0], *expect, "element {e}");
    }
}

/// Random packed data of type `ty` for `n` elements: quantised random values where the
/// project has a quantiser, otherwise random bytes with every f16 scale made finite.
fn random_weights(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let x = rng.vec(n, 1.0);
    if let Ok(b) = gguf::quant::quantize(ty, &x) {
        return b;
    }
    let mut bytes: Vec<u8> = (0..ty.row_bytes(n as u64).unwrap())
        .map(|_| rng.next_u64() as u8)
        .collect();
    let scale = f16::from_f32(0.01).to_le_bytes();
    for block in bytes.chunks_exact_mut(ty.type_size()) {
        match ty {
            // Q4_K: d, dmin at the start; Q6_K: d at the end.
            GgmlType::Q4_K => {
                block[0..2].copy_from_slice(&scale);
                block[2..4].copy_from_slice(&scale);
            }
            GgmlType::Q6_K => {
                let l = block.len();
                block[l - 2..].copy_from_slice(&scale);
            }
            GgmlType::BF16 => {
                block.copy_from_slice(&half::bf16::from_f32(rng.uniform()).to_le_bytes())
            }
            other => panic!("no generator for {other}"),
        }
    }
    bytes
}

#[test]
fn matvec_every_type_matches_dequantise_then_dot() {
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    let mut rng = Rng::new(7);
    let (rows, cols) = (5, 512);
    for ty in types {
        let w = random_weights(&mut rng, ty, rows * cols);
        let x = rng.vec(cols, 1.0);
        let mut out = vec![0.0f32; rows];
        matvec(ty, &w, rows, cols, &x, &mut out).unwrap();
        let dense = gguf::quant::dequantize_row(ty, &w, rows * cols).unwrap();
        let expected: Vec<f32> = dense
            .chunks_exact(cols)
            .map(|r| {
                r.iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>() as f32
            })
            .collect();
        assert!(
            expected.iter().any(|v| v.abs() > 1e-3),
            "{ty}: degenerate test data"
        );
        close(&out, &expected, 1e-5);

        // matmul over 3 tokens is matvec per token, token-major.
        let xs = rng.vec(3 * cols, 1.0);
        let mut mm = vec![0.0f32; 3 * rows];
        matmul(ty, &w, rows, cols, &xs, 3, &mut mm).unwrap();
        for t in 0..3 {
            let mut one = vec![0.0f32; rows];
            matvec(ty, &w, rows, cols, &xs[t * cols..(t + 1) * cols], &mut one).unwrap();
            assert_eq!(&mm[t * rows..(t + 1) * rows], &one[..], "{ty} token {t}");
        }
    }
}

#[test]
fn matvec_rejects_bad_sizes() {
    let w = vec![0u8; 34];
    let mut out = [0.0f32; 2];
    let err = matvec(GgmlType::Q8_0, &w, 2, 32, &[0.0; 32], &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            RefError::ShortData {
                need: 68,
                have: 34,
                ..
            }
        ),
        "{err}"
    );
    let err = matvec(GgmlType::Q8_0, &w, 1, 16, &[0.0; 16], &mut out[..1]).unwrap_err();
    assert!(err.to_string().contains("blocks of 32"), "{err}");
    let err = matvec(GgmlType::Q8_0, &w, 1, 32, &[0.0; 31], &mut out[..1]).unwrap_err();
    assert!(
        matches!(
            err,
            RefError::Length {
                expected: 32,
                found: 31,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn embedding_row_dequantises_the_right_row() {
    let mut rng = Rng::new(3);
    let (rows, cols) = (4, 64);
    let x = rng.vec(rows * cols, 1.0);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        let table = gguf::quant::quantize(ty, &x).unwrap();
        let dense = gguf::quant::dequantize_row(ty, &table, rows * cols).unwrap();
        let mut out = vec![0.0f32; cols];
        embedding_row(ty, &table, cols, 2, &mut out).unwrap();
        assert_eq!(&out[..], &dense[2 * cols..3 * cols], "{ty}");
        let err = embedding_row(ty, &table, cols, 4, &mut out).unwrap_err();
        assert!(
            matches!(err, RefError::RowOutOfRange { row: 4, rows: 4 }),
            "{ty}: {err}"
        );
    }
    // F32 rows are the values themselves.
    let table = gguf::quant::quantize_f32(&x);
    let mut out = vec![0.0f32; cols];
    embedding_row(GgmlType::F32, &table, cols, 1, &mut out).unwrap();
    assert_eq!(&out[..], &x[cols..2 * cols]);
}

#[test]
fn gelu_tanh_hand_computed_and_geglu() {
    // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), values from the formula by hand.
    assert_eq!(gelu_tanh(0.0), 0.0);
    assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
    assert!((gelu_tanh(-1.0) + 0.158_808).abs() < 1e-5);
    assert!((gelu_tanh(3.0) - 2.996_363).abs() < 1e-5);
    let mut out = [0.0; 2];
    geglu(&[1.0, -1.0], &[2.0, 3.0], &mut out);
    close(&out, &[2.0 * 0.841_192, 3.0 * -0.158_808], 1e-5);
}

#[test]
fn rmsnorm_heads_normalises_each_head_alone() {
    // Two heads of 2: [3, 4] has mean square 12.5, [0, 2] has 2.
    let mut x = [3.0, 4.0, 0.0, 2.0];
    rmsnorm_heads(&mut x, &[1.0, 2.0], 0.0);
    let (a, b) = (1.0 / 12.5f32.sqrt(), 1.0 / 2.0f32.sqrt());
    close(&x, &[3.0 * a, 8.0 * a, 0.0, 4.0 * b], 1e-6);
}

#[test]
fn softcap_bounds_logits() {
    let mut x = [0.0, 30.0, -1000.0];
    softcap(&mut x, 30.0);
    close(&x, &[0.0, 30.0 * 1.0f32.tanh(), -30.0], 1e-5);
}

#[test]
fn rope_ext_scale_and_factors_divide_the_angle() {
    let mut rng = Rng::new(5);
    let x = rng.vec(2 * 8, 1.0);
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        // Position 6 with every frequency divided by 2, or scaled by 1/2 == position 3.
        let mut want = x.clone();
        rope(&mut want, 2, 8, 3, 10_000.0, mode);
        let mut by_factor = x.clone();
        rope_ext(
            &mut by_factor,
            2,
            8,
            6,
            10_000.0,
            1.0,
            Some(&[2.0; 4]),
            mode,
        );
        close(&by_factor, &want, 1e-6);
        let mut by_scale = x.clone();
        rope_ext(&mut by_scale, 2, 8, 6, 10_000.0, 0.5, None, mode);
        close(&by_scale, &want, 1e-6);
        // A factor on pair 1 only leaves the other pairs as plain RoPE at position 6.
        let mut plain = x.clone();
        rope(&mut plain, 2, 8, 6, 10_000.0, mode);
        let mut one = x.clone();
        rope_ext(
            &mut one,
            2,
            8,
            6,
            10_000.0,
            1.0,
            Some(&[1.0, 4.0, 1.0, 1.0]),
            mode,
        );
        let pair1: &[usize] = match mode {
            RopeMode::Normal => &[2, 3, 10, 11],
            RopeMode::Neox => &[1, 5, 9, 13],
        };
        for i in 0..16 {
            if pair1.contains(&i) {
                assert!(
                    (one[i] - plain[i]).abs() > 1e-4,
                    "{mode:?} element {i} unchanged"
                );
            } else {
                assert_eq!(one[i], plain[i], "{mode:?} element {i}");
            }
        }
    }
}

#[test]
fn attention_window_equals_brute_force_masked_attention() {
    // 4 query heads over 2 kv heads of 8, 11 positions; window: positions 6..=10.
    let (nh, nkv, hd, n_pos, first) = (4, 2, 8, 11, 6);
    let mut rng = Rng::new(9);
    let q = rng.vec(nh * hd, 1.0);
    let k = rng.vec(n_pos * nkv * hd, 1.0);
    let v = rng.vec(n_pos * nkv * hd, 1.0);
    let scale = 0.3;
    let mut got = vec![0.0; nh * hd];
    attention_ext(&q, &k, &v, nh, nkv, hd, first, n_pos, scale, &mut got);
    // Brute force: every position scored, those before the window set to -inf.
    let mut want = vec![0.0f32; nh * hd];
    for h in 0..nh {
        let kvh = h / (nh / nkv);
        let row = |t: usize| (t * nkv + kvh) * hd;
        let mut s: Vec<f32> = (0..n_pos)
            .map(|t| {
                if t < first {
                    f32::NEG_INFINITY
                } else {
                    (0..hd).map(|i| q[h * hd + i] * k[row(t) + i]).sum::<f32>() * scale
                }
            })
            .collect();
        softmax(&mut s);
        for t in 0..n_pos {
            for i in 0..hd {
                want[h * hd + i] += s[t] * v[row(t) + i];
            }
        }
    }
    close(&got, &want, 1e-5);
    // And the window matters: the full attention differs.
    let mut full = vec![0.0; nh * hd];
    attention_ext(&q, &k, &v, nh, nkv, hd, 0, n_pos, scale, &mut full);
    assert!(full.iter().zip(&got).any(|(a, b)| (a - b).abs() > 1e-3));
}

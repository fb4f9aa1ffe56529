//! The K-quants (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K) read in place by the GPU kernels, against
//! the CPU twin (gguf's dequantisation, bit-exact with ggml's, then an f32 matvec), through
//! the engine's own keys and bindings: the decode matvec (row per lane and the column
//! split), prefill (four tokens per invocation), the fused epilogues' addressing (gate/up
//! in two bindings, row-range parts) and the embedding gather.
//!
//! Shapes: rows of 256 (one super-block: row per lane only), 768 and 1280 columns (an
//! odd number of super-blocks, so every other row of Q6_K and Q3_K starts 2 bytes past
//! a word; the column split with chunks left over), 1536 and 2048 (three and four whole
//! rounds of the split: a lane's chunks taken in pairs and, at three, one alone) and
//! 202 rows (a partial workgroup tile). Word offsets 1, 5 and 16 put the super-blocks
//! of the word-aligned types off and on texel boundaries (Q4_K and Q5_K at 16, a whole
//! texel, take the texel-aligned decoders, as the engine picks them:
//! `kernels::k_texel_aligned`).
//!
//! Tolerances (u = 2^-24): a dot product of n terms summed in f32 in either order is
//! within about n·u·Σ|w·x| of the exact one (Higham's γ_n), so GPU and reference may differ
//! by `TOL_K · n · u · Σ|w·x|` with TOL_K = 4, as in kernels.rs; the decoded weights
//! themselves are exact (the scales are the same products d·scale in both). The embedding:
//! the GPU writes d·q − m with one fma where the reference rounds d·q first, one rounding
//! of a product no larger than the row's largest element plus m, so 8·u times the row's
//! largest magnitude.

mod common;

use common::gpu::*;
use common::*;
use engine::kernels::{self, InMode, Kernels, MatmulBindings, MatmulPush, OutMode, Slot};
use gguf::GgmlType;
use reference::kernels as rk;
use reference::synthetic::Rng;
use vk::{BufferView, TexelFormat};

const K_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
];

/// Random weights of `ty` (rows × cols) with `pad` bytes of garbage in front, and their
/// dequantisation.
fn weights(
    rng: &mut Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    pad: usize,
) -> (Vec<u8>, Vec<f32>) {
    let w = gguf::quant::quantize(ty, &rng.vec(rows * cols, 1.0)).unwrap();
    let mut deq = vec![0.0; rows * cols];
    gguf::quant::dequantize(ty, &w, &mut deq).unwrap();
    let mut bytes: Vec<u8> = (0..pad).map(|i| (i * 37 + 11) as u8).collect();
    bytes.extend_from_slice(&w);
    (bytes, deq)
}

/// The residual-add matmul (out += W·x, and x∘g for the next norm) for every K type:
/// prefill, decode with the column split where picked, and the row-per-lane fallback.
#[test]
fn k_quant_matmul_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(13);
    let (rows, n_tok) = (202, 5);
    let dummy = zeros(&ctx, "dummy", 4);
    let dummy_w = BufferView::new(&ctx, dummy.binding(), TexelFormat::R32Uint).unwrap();
    let step = step_buffer(&ctx, 0, &[], &[]);
    let g = rng.vec(rows + 4, 1.0);
    let gbuf = upload(&ctx, "g", &g);
    let mut splits_seen = std::collections::BTreeSet::new();
    for ty in K_TYPES {
        for (cols, pad) in [(256, 20), (768, 64), (1280, 20), (1536, 4), (2048, 20)] {
            let (bytes, w) = weights(&mut rng, ty, rows, cols, pad);
            let (_wbuf, wv) = weight_view(&ctx, "w", &bytes, ty);
            let x = rng.vec(n_tok * cols, 1.0);
            let xbuf = upload(&ctx, "x", &x);
            let xv = xview(&ctx, &xbuf);
            let mut want = vec![0.0; n_tok * rows];
            rk::matmul(ty, &bytes[pad..], rows, cols, &x, n_tok, &mut want).unwrap();
            let init = rng.vec(n_tok * rows, 1.0);
            rk::add(&mut want, &init);
            let mags: Vec<f32> = (0..n_tok)
                .flat_map(|t| magnitudes(&w, cols, &x[t * cols..(t + 1) * cols]))
                .collect();
            let tol = |i: usize| TOL_K * cols as f32 * U * mags[i] + 2.0 * U * init[i].abs() + 1e-6;
            for k in engine_keys(&ks, ty, (InMode::Plain, OutMode::Add), cols) {
                splits_seen.insert(k.split_k);
                let out = upload(&ctx, "out", &init);
                let xg = zeros(&ctx, "xg", n_tok * rows);
                let bindings = MatmulBindings {
                    w0: &wv,
                    w1: &dummy_w,
                    x: &xv,
                    aux: gbuf.binding(),
                    out0: out.binding(),
                    out1: xg.binding(),
                    out2: dummy.binding(),
                    step: step.binding(),
                    xr: &xv,
                };
                let push = MatmulPush {
                    n_tok: n_tok as u32,
                    ncols: cols as u32,
                    x_ld: cols as u32,
                    out_ld: rows as u32,
                    aux_ofs: 4,
                    write_xg: 1,
                    ..Default::default()
                };
                let slots = [Slot {
                    slot: 0,
                    nrows: rows as u32,
                    wofs: (pad / 4) as u32,
                    orow: 0,
                }];
                dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
                let what = format!("{ty:?} {cols} columns {k:?}");
                assert_close(&what, &read_f32(&out, n_tok * rows), &want, tol);
                let xg_want = times_g(&want, &g[4..]);
                assert_close(
                    &format!("{what} x∘g"),
                    &read_f32(&xg, n_tok * rows),
                    &xg_want,
                    |i| (tol(i) + U * want[i].abs()) * g[4 + i % rows].abs(),
                );
            }
        }
    }
    // where the device's shapes split columns (8-lane subgroups: not at lavapipe's 4 or
    // 16), 768 and 1280 columns are one and two rounds of 8 lanes' chunks, 4 left over;
    // 1536 and 2048 three and four rounds, none left
    if ks.shapes().split_lanes.is_some() {
        assert!(
            splits_seen.is_superset(&[0, 1, 2, 3, 4].into()),
            "{splits_seen:?}"
        );
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// rmsnorm folded in, the weight in two row-range parts bound in two buffers (the second
/// 32 bytes into its binding), as the logits of a large tied embedding arrive; the part
/// boundary falls on an even row, as the residency plan keeps parts word-aligned.
#[test]
fn k_quant_logits_over_row_range_parts_match_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(14);
    let (rows, cols, eps, split) = (150, 768, 1e-5, 96);
    let dummy = zeros(&ctx, "dummy", 4);
    let dummy_w = BufferView::new(&ctx, dummy.binding(), TexelFormat::R32Uint).unwrap();
    let step = step_buffer(&ctx, 0, &[], &[]);
    for ty in K_TYPES {
        let (bytes, w) = weights(&mut rng, ty, rows, cols, 0);
        let row_bytes = bytes.len() / rows;
        assert_eq!((split * row_bytes) % 4, 0);
        let (_a, va) = weight_view(&ctx, "wa", &bytes[..split * row_bytes], ty);
        let mut b_bytes = vec![0u8; 32];
        b_bytes.extend_from_slice(&bytes[split * row_bytes..]);
        let (_b, vb) = weight_view(&ctx, "wb", &b_bytes, ty);
        let x = rng.vec(cols, 3.0);
        let norm_w = rng.vec(cols, 1.0);
        let (xbuf, xgbuf) = (
            upload(&ctx, "x", &x),
            upload(&ctx, "xg", &times_g(&x, &norm_w)),
        );
        let (xv, xgv) = (xview(&ctx, &xbuf), xview(&ctx, &xgbuf));
        let mut xn = vec![0.0; cols];
        rk::rmsnorm(&x, &norm_w, eps, &mut xn);
        let mut want = vec![0.0; rows];
        rk::matvec(ty, &bytes, rows, cols, &xn, &mut want).unwrap();
        let mags = magnitudes(&w, cols, &xn);
        for k in engine_keys(&ks, ty, (InMode::RmsNorm, OutMode::Store), cols) {
            let out = zeros(&ctx, "out", rows);
            for (view, slot) in [
                (
                    &va,
                    Slot {
                        slot: 0,
                        nrows: split as u32,
                        wofs: 0,
                        orow: 0,
                    },
                ),
                (
                    &vb,
                    Slot {
                        slot: 0,
                        nrows: (rows - split) as u32,
                        wofs: 8,
                        orow: split as u32,
                    },
                ),
            ] {
                let bindings = MatmulBindings {
                    w0: view,
                    w1: &dummy_w,
                    x: &xgv,
                    aux: dummy.binding(),
                    out0: out.binding(),
                    out1: dummy.binding(),
                    out2: dummy.binding(),
                    step: step.binding(),
                    xr: &xv,
                };
                let push = MatmulPush {
                    n_tok: 1,
                    ncols: cols as u32,
                    x_ld: cols as u32,
                    out_ld: rows as u32,
                    eps,
                    ..Default::default()
                };
                dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &[slot]);
            }
            // the normalised input carries a few ulps of the scale: 8 more u per term
            assert_close(
                &format!("{ty:?} logits {k:?}"),
                &read_f32(&out, rows),
                &want,
                |i| (TOL_K * cols as f32 + 8.0) * U * mags[i] + 1e-6,
            );
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// gate and up in two bindings (up 20 bytes in: its own word offset), SwiGLU out.
#[test]
fn k_quant_gate_up_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(15);
    let (hidden, dim, n_tok, eps) = (70, 1280, 2, 1e-5);
    let dummy = zeros(&ctx, "dummy", 4);
    let step = step_buffer(&ctx, 0, &[], &[]);
    for ty in K_TYPES {
        let (wg, fg) = weights(&mut rng, ty, hidden, dim, 0);
        let (wu, fu) = weights(&mut rng, ty, hidden, dim, 20);
        let ((_bg, vg), (_bu, vu)) = (
            weight_view(&ctx, "wg", &wg, ty),
            weight_view(&ctx, "wu", &wu, ty),
        );
        let x = rng.vec(n_tok * dim, 1.0);
        let norm_w = rng.vec(dim, 1.0);
        let (xbuf, xgbuf) = (
            upload(&ctx, "x", &x),
            upload(&ctx, "xg", &times_g(&x, &norm_w)),
        );
        let (xv, xgv) = (xview(&ctx, &xbuf), xview(&ctx, &xgbuf));
        for k in engine_keys(&ks, ty, (InMode::RmsNorm, OutMode::Glu), dim) {
            let out = zeros(&ctx, "hb", n_tok * hidden);
            let bindings = MatmulBindings {
                w0: &vg,
                w1: &vu,
                x: &xgv,
                aux: dummy.binding(),
                out0: out.binding(),
                out1: dummy.binding(),
                out2: dummy.binding(),
                step: step.binding(),
                xr: &xv,
            };
            let push = MatmulPush {
                n_tok: n_tok as u32,
                ncols: dim as u32,
                x_ld: dim as u32,
                out_ld: hidden as u32,
                eps,
                ..Default::default()
            };
            let slots = [
                Slot {
                    slot: 0,
                    nrows: hidden as u32,
                    wofs: 0,
                    orow: 0,
                },
                Slot {
                    slot: 1,
                    nrows: hidden as u32,
                    wofs: 5,
                    orow: 0,
                },
            ];
            dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
            let got = read_f32(&out, n_tok * hidden);
            let mut xn = vec![0.0; dim];
            for t in 0..n_tok {
                rk::rmsnorm(&x[t * dim..(t + 1) * dim], &norm_w, eps, &mut xn);
                let (mut g, mut u, mut h) =
                    (vec![0.0; hidden], vec![0.0; hidden], vec![0.0; hidden]);
                rk::matvec(ty, &wg, hidden, dim, &xn, &mut g).unwrap();
                rk::matvec(ty, &wu[20..], hidden, dim, &xn, &mut u).unwrap();
                rk::swiglu(&g, &u, &mut h);
                let (mg, mu) = (magnitudes(&fg, dim, &xn), magnitudes(&fu, dim, &xn));
                // d(silu(g)·u) <= |u|·1.1·δg + |silu(g)|·δu, plus the exp's few ulps
                assert_close(
                    &format!("{ty:?} swiglu token {t} {k:?}"),
                    &got[t * hidden..(t + 1) * hidden],
                    &h,
                    |i| {
                        let e = (TOL_K * dim as f32 + 8.0) * U;
                        1.1 * u[i].abs() * e * mg[i]
                            + rk::silu(g[i]).abs() * e * mu[i]
                            + 1e-5 * h[i].abs()
                            + 1e-6
                    },
                );
            }
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// Embedding rows gathered and dequantised for every K type, from a table in two parts
/// (the second 16 bytes into its binding), odd and even rows.
#[test]
fn k_quant_embedding_gather_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(16);
    let rows = 10;
    let tokens = [3u32, 0, 9, 7, 4];
    for ty in K_TYPES {
        for cols in [256, 768] {
            let g = rng.vec(cols + 8, 1.0);
            let table = gguf::quant::quantize(ty, &rng.vec(rows * cols, 2.0)).unwrap();
            let parts = TwoParts {
                rows,
                cols,
                split: 6,
                pad: 16,
            };
            let (got, got_g) = embed_gather(&ctx, &mut ks, ty, &table, parts, &tokens, &g);
            for (t, &tok) in tokens.iter().enumerate() {
                let mut want = vec![0.0; cols];
                rk::embedding_row(ty, &table, cols, tok as usize, &mut want).unwrap();
                let big = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let tol = |_: usize| 8.0 * U * big + 1e-7;
                let what = format!("{ty:?} {cols} columns token {tok}");
                assert_close(&what, &got[t * cols..(t + 1) * cols], &want, tol);
                let want_g = times_g(&want, &g[8..]);
                assert_close(
                    &format!("{what} x∘g"),
                    &got_g[t * cols..(t + 1) * cols],
                    &want_g,
                    |i| (tol(i) + U * want[i].abs()) * g[8 + i].abs() + 1e-7,
                );
            }
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// The K types are read by the kernels, bound as 16-byte texels, and named in the
/// engine's refusals.
#[test]
fn k_quant_tables() {
    for ty in K_TYPES {
        assert!(kernels::supported_weight_type(ty) && kernels::is_k_quant(ty));
        assert_eq!(kernels::weight_texel_format(ty), TexelFormat::Rgba32Uint);
        assert_eq!(ty.block_size(), kernels::K_SUPER_BLOCK);
    }
    assert!(!kernels::is_k_quant(GgmlType::Q8_0));
    let names = kernels::supported_weight_type_names();
    for n in ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "Q8_0"] {
        assert!(names.contains(n), "{names}");
    }
}

/// The column split's output does not depend on how many row pairs a workgroup takes
/// (`MatmulKey::pairs`, which the engine sets per matrix to spread the workgroups over a
/// CPU device's threads: `Kernels::decode_pairs`): every row's sum is formed the same
/// way whichever workgroup forms it, so pairs 8 (the shape's), 9, 6 and 3 give the same
/// bits, for the residual add (576 and 202 rows) and gate/up (202 rows), at one, three
/// and four rounds of chunks, and for Q8_0 as for the paired K-quant chunks. The residual
/// add's pairs 8 is held to the reference here, so that four equally wrong outputs cannot
/// pass; gate/up's is in `k_quant_gate_up_matches_reference` (and kernels.rs for Q8_0).
#[test]
fn split_rows_do_not_depend_on_the_workgroup_pairs() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let wg = ks.shapes().decode.wg;
    if ks.column_split(wg, 1536) == 0 {
        eprintln!("no column split on this device: nothing to compare");
        return;
    }
    let mut rng = Rng::new(17);
    let dummy = zeros(&ctx, "dummy", 4);
    let step = step_buffer(&ctx, 0, &[], &[]);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        for (rows, cols, gated) in [
            (576, 1536, false),
            (202, 2048, false),
            (202, 512, false),
            (202, 1536, true),
        ] {
            let (wa, fa) = weights(&mut rng, ty, rows, cols, 0);
            let (wb, _) = weights(&mut rng, ty, rows, cols, 20);
            let ((_ba, va), (_bb, vb)) = (
                weight_view(&ctx, "wa", &wa, ty),
                weight_view(&ctx, "wb", &wb, ty),
            );
            let x = rng.vec(cols, 1.0);
            let xbuf = upload(&ctx, "x", &x);
            let xv = xview(&ctx, &xbuf);
            // gate/up is built with the norm folded in only
            let (in_mode, out_mode) = if gated {
                (InMode::RmsNorm, OutMode::Glu)
            } else {
                (InMode::Plain, OutMode::Add)
            };
            let base = kernels::MatmulKey {
                wtype: ty,
                in_mode,
                out_mode,
                wg,
                pairs: ks.shapes().decode.pairs,
                tb: 1,
                split_k: ks.column_split(wg, cols as u32),
                texel_aligned: false,
            };
            assert!(base.split_k > 0, "{ty:?} {cols}");
            let mut outs = Vec::new();
            for pairs in [base.pairs, 9, 6, 3] {
                let k = kernels::MatmulKey { pairs, ..base };
                let out = zeros(&ctx, "out", rows);
                let bindings = MatmulBindings {
                    w0: &va,
                    w1: &vb,
                    x: &xv,
                    aux: dummy.binding(),
                    out0: out.binding(),
                    out1: dummy.binding(),
                    out2: dummy.binding(),
                    step: step.binding(),
                    xr: &xv,
                };
                let push = MatmulPush {
                    n_tok: 1,
                    ncols: cols as u32,
                    x_ld: cols as u32,
                    out_ld: rows as u32,
                    eps: 1e-5,
                    ..Default::default()
                };
                let mut slots = vec![Slot {
                    slot: 0,
                    nrows: rows as u32,
                    wofs: 0,
                    orow: 0,
                }];
                if gated {
                    slots.push(Slot {
                        slot: 1,
                        nrows: rows as u32,
                        wofs: 5,
                        orow: 0,
                    });
                }
                dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
                outs.push((pairs, read_f32(&out, rows)));
            }
            let what = format!("{ty:?} {rows}x{cols} {out_mode:?}");
            if !gated {
                let mut want = vec![0.0; rows];
                rk::matvec(ty, &wa, rows, cols, &x, &mut want).unwrap();
                let mags = magnitudes(&fa, cols, &x);
                assert_close(&what, &outs[0].1, &want, |i| {
                    TOL_K * cols as f32 * U * mags[i] + 1e-6
                });
            }
            for (pairs, got) in &outs[1..] {
                let same = got
                    .iter()
                    .zip(&outs[0].1)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{what}: pairs {pairs} differs from pairs {}",
                    outs[0].0
                );
            }
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// The texel-aligned decoders of Q4_K and Q5_K (`K_TEXEL_ALIGNED`, which the engine picks
/// for views at word offsets that are multiples of 4) give the same bits as the general
/// ones on the same aligned weights, for every key the engine runs (prefill GEMM, column
/// split at one to four rounds, row per lane); the general ones are held to the reference
/// by `k_quant_matmul_matches_reference`.
#[test]
fn texel_aligned_decoders_equal_the_general_ones() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(29);
    let (rows, n_tok, pad) = (202, 5, 64);
    let dummy = zeros(&ctx, "dummy", 4);
    let dummy_w = BufferView::new(&ctx, dummy.binding(), TexelFormat::R32Uint).unwrap();
    let step = step_buffer(&ctx, 0, &[], &[]);
    let slots = [Slot {
        slot: 0,
        nrows: rows as u32,
        wofs: (pad / 4) as u32,
        orow: 0,
    }];
    let mut runs = 0;
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K] {
        assert!(kernels::k_texel_aligned(ty, &slots), "{ty:?} at word 16");
        for cols in [256, 768, 1280, 1536, 2048] {
            let (bytes, _) = weights(&mut rng, ty, rows, cols, pad);
            let (_wbuf, wv) = weight_view(&ctx, "w", &bytes, ty);
            let x = rng.vec(n_tok * cols, 1.0);
            let xbuf = upload(&ctx, "x", &x);
            let xv = xview(&ctx, &xbuf);
            for k in engine_keys(&ks, ty, (InMode::Plain, OutMode::Add), cols) {
                let mut outs = Vec::new();
                for texel_aligned in [false, true] {
                    let k = kernels::MatmulKey { texel_aligned, ..k };
                    let out = zeros(&ctx, "out", n_tok * rows);
                    let bindings = MatmulBindings {
                        w0: &wv,
                        w1: &dummy_w,
                        x: &xv,
                        aux: dummy.binding(),
                        out0: out.binding(),
                        out1: dummy.binding(),
                        out2: dummy.binding(),
                        step: step.binding(),
                        xr: &xv,
                    };
                    let push = MatmulPush {
                        n_tok: n_tok as u32,
                        ncols: cols as u32,
                        x_ld: cols as u32,
                        out_ld: rows as u32,
                        ..Default::default()
                    };
                    dispatch_matmul_key(&ctx, &mut ks, k, &bindings, push, &slots);
                    outs.push(read_f32(&out, n_tok * rows));
                }
                assert!(
                    outs[0].iter().any(|v| *v != 0.0),
                    "{ty:?} {cols} {k:?}: no output"
                );
                let same = outs[0]
                    .iter()
                    .zip(&outs[1])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty:?} {cols} columns {k:?}: aligned decoders differ");
                runs += 1;
            }
        }
    }
    assert!(runs >= 20, "{runs} key runs");
    drop(ks);
    assert_no_validation_errors(&ctx);
}

//! The weight types Q5_0, Q5_1 and BF16 on the GPU kernels against their CPU twin
//! (`gguf::quant::dequantize`, through `reference::kernels`), at odd shapes, through the
//! engine's own keys, layouts and binding structs: the residual-add matmul for every
//! pipeline the engine picks (prefill, column-split decode, row-per-lane decode), the
//! rmsnorm-folded logits, gate/up SwiGLU (weights through the second binding) and the
//! embedding gather.
//!
//! Shapes: 202 rows (not a multiple of any workgroup's tile), rows of 64, 320, 576 and
//! 1088 columns (1, 5, 9 and 17 chunks: multiples of 64, the last three not of 128; 576
//! and 1088 take the column split with chunks left over), and word offsets 16, 17 and 19
//! into the binding so every realignment of a chunk inside a 16-byte texel is read (a
//! Q5_0 row of 9 chunks is 99 words, so its rows start at every word of a texel anyway).
//!
//! Tolerance (as in kernels.rs): a dot product of n terms summed in f32 in a different
//! order from the reference is off by at most about n·u·Σ|w·x| each way; we allow
//! `TOL_K · n · u · Σ|w·x| + 1e-6` with TOL_K = 4 and u = 2^-24, plus a few ulps where the
//! rmsnorm scale or the add are folded in. The elements themselves are exact in f32 on
//! both sides (a 5-bit integer or a bf16 times an f16 scale). Each test also checks that
//! the bound discriminates: the same GPU output compared with a wrong decoder's
//! reference (Q5: the fifth bit dropped; BF16: the two halves of each word swapped) must
//! break it.

mod common;

use common::gpu::*;
use common::*;
use engine::kernels::{
    self, InMode, Kernels, MatmulBindings, MatmulKey, MatmulPush, OutMode, Slot,
};
use gguf::GgmlType;
use reference::kernels as rk;
use reference::synthetic::Rng;
use vk::TexelFormat;

/// The types of this file.
const TYPES: [GgmlType; 3] = [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::BF16];

/// `n` random weights of `ty` as GGUF blocks. BF16 has no quantiser in `gguf` (convert
/// does not write it): its bytes are the top halves of random f32 (any 16 bits are a
/// bf16), so every bit pattern of the mantissa is exercised.
fn random_blocks(rng: &mut Rng, ty: GgmlType, n: usize, scale: f32) -> Vec<u8> {
    let x = rng.vec(n, scale);
    if ty == GgmlType::BF16 {
        x.iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect()
    } else {
        gguf::quant::quantize(ty, &x).unwrap()
    }
}

/// The weights as a wrong decoder would read them (to check that the tolerances catch
/// one): Q5_0/Q5_1 with every fifth bit (`qh`) cleared, BF16 with the halves of each
/// 4-byte word swapped (elements 2i and 2i+1 exchanged).
fn wrong_decoding(ty: GgmlType, bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    match ty {
        GgmlType::Q5_0 => b.chunks_exact_mut(22).for_each(|blk| blk[2..6].fill(0)),
        GgmlType::Q5_1 => b.chunks_exact_mut(24).for_each(|blk| blk[4..8].fill(0)),
        GgmlType::BF16 => b.chunks_exact_mut(4).for_each(|w| w.rotate_left(2)),
        _ => unreachable!("only the types of this file"),
    }
    b
}

/// The largest `|got - want| / tol` (at most 1: within tolerance) and where.
fn worst(got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32) -> (f32, usize) {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| ((g - w).abs() / tol(i), i))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a })
}

/// Asserts `got` is within `tol` of `want`, and that it is NOT within `tol` of `wrong`
/// (what a wrong decoder gives): the bound is tight enough to catch one.
fn assert_close_and_discriminating(
    what: &str,
    got: &[f32],
    want: &[f32],
    wrong: &[f32],
    tol: impl Fn(usize) -> f32,
) {
    let (r, i) = worst(got, want, &tol);
    assert!(
        r <= 1.0,
        "{what}[{i}]: gpu {} vs reference {} (tolerance {})",
        got[i],
        want[i],
        tol(i)
    );
    let (r, _) = worst(got, wrong, &tol);
    assert!(
        r > 1.0,
        "{what}: a wrong decoder's result is within the tolerance too"
    );
}

/// The types of this file are read by the GPU kernels, bound as the engine binds them,
/// and every pipeline of each exists.
#[test]
fn new_types_are_supported_and_every_variant_builds() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    for ty in TYPES {
        assert!(kernels::supported_weight_type(ty), "{ty:?}");
        assert_eq!(
            kernels::weight_texel_format(ty),
            TexelFormat::Rgba32Uint,
            "{ty:?}: chunks are read as 16-byte texels"
        );
        ks.embed(ty).unwrap();
        for (in_mode, out_mode) in [
            (InMode::RmsNorm, OutMode::Qkv),
            (InMode::Plain, OutMode::Add),
            (InMode::RmsNorm, OutMode::Glu),
            (InMode::RmsNorm, OutMode::Store),
        ] {
            for tb in kernels::MATMUL_TB {
                if out_mode != OutMode::Store || tb == 1 {
                    let k = row_key(ty, in_mode, out_mode, tb);
                    ks.matmul(k).unwrap();
                    for split_k in 1..=kernels::SPLIT_MAX_CHUNKS_PER_LANE {
                        if tb == 1 && ks.column_split(8, 64 * 8 * split_k) == split_k {
                            ks.matmul(MatmulKey { split_k, ..k }).unwrap();
                        }
                    }
                }
            }
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// The residual-add matmul (plain input, `out += W·x`, and `x∘g` for the next norm) for
/// every shape and word offset of the module docs and every pipeline the engine picks.
#[test]
fn matmul_add_matches_the_cpu_twin_at_odd_shapes() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(13);
    let (rows, n_tok) = (202, 5);
    let dummy = zeros(&ctx, "dummy", 4);
    let step = step_buffer(&ctx, 0, &[], &[]);
    let g = rng.vec(rows + 4, 1.0);
    let gbuf = upload(&ctx, "g", &g);
    for ty in TYPES {
        let dummy_w = wview(&ctx, &dummy, ty);
        for (cols, wofs) in [(64, 17), (320, 16), (576, 19), (576, 16), (1088, 17)] {
            let w = random_blocks(&mut rng, ty, rows * cols, 1.0);
            let wf = dequant(ty, &w, rows * cols);
            let mut bytes: Vec<u8> = (0..4 * wofs).map(|i| (i * 37) as u8).collect();
            bytes.extend_from_slice(&w);
            let wbuf = wupload(&ctx, "w", &bytes);
            let wv = wview(&ctx, &wbuf, ty);
            let x = rng.vec(n_tok * cols, 1.0);
            let xbuf = upload(&ctx, "x", &x);
            let xv = xview(&ctx, &xbuf);
            let init = rng.vec(n_tok * rows, 1.0);
            let mut want = vec![0.0; n_tok * rows];
            rk::matmul(ty, &w, rows, cols, &x, n_tok, &mut want).unwrap();
            rk::add(&mut want, &init);
            let mut wrong = vec![0.0; n_tok * rows];
            rk::matmul(
                ty,
                &wrong_decoding(ty, &w),
                rows,
                cols,
                &x,
                n_tok,
                &mut wrong,
            )
            .unwrap();
            rk::add(&mut wrong, &init);
            let mags: Vec<f32> = (0..n_tok)
                .flat_map(|t| magnitudes(&wf, cols, &x[t * cols..(t + 1) * cols]))
                .collect();
            let tol = |i: usize| TOL_K * cols as f32 * U * mags[i] + 1e-6 + 2.0 * U * init[i].abs();
            let keys = engine_keys(&ks, ty, (InMode::Plain, OutMode::Add), cols);
            if cols >= 576 {
                assert!(
                    keys.iter().any(|k| k.split_k > 0) || ks.column_split(8, 576) == 0,
                    "{cols} columns: the column split is among the keys tested"
                );
            }
            for k in keys {
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
                    wofs: wofs as u32,
                    orow: 0,
                }];
                dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
                let got = read_f32(&out, n_tok * rows);
                let what = format!("{ty:?} {cols} columns, word offset {wofs}, {k:?}");
                assert_close_and_discriminating(&what, &got, &want, &wrong, tol);
                let xg_got = read_f32(&xg, n_tok * rows);
                let xg_want = times_g(&want, &g[4..]);
                let (r, i) = worst(&xg_got, &xg_want, |i| {
                    (tol(i) + U * want[i].abs()) * g[4 + i % rows].abs() + 1e-7
                });
                assert!(r <= 1.0, "{what} x∘g[{i}]: {} vs {}", xg_got[i], xg_want[i]);
            }
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// The logits' pipeline (rmsnorm folded in, stored) and gate/up SwiGLU (up through the
/// second weight binding at its own word offset), 576 columns.
#[test]
fn logits_and_swiglu_match_the_cpu_twin() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(14);
    let (rows, cols, n_tok, eps) = (202, 576, 3, 1e-5);
    let dummy = zeros(&ctx, "dummy", 4);
    let step = step_buffer(&ctx, 0, &[], &[]);
    for ty in TYPES {
        let wa = random_blocks(&mut rng, ty, rows * cols, 1.0);
        let wb = random_blocks(&mut rng, ty, rows * cols, 1.0);
        let (fa, fb) = (dequant(ty, &wa, rows * cols), dequant(ty, &wb, rows * cols));
        let mut wb_pad = vec![0u8; 20]; // up at word 5 of its binding
        wb_pad.extend_from_slice(&wb);
        let (ba, bb) = (wupload(&ctx, "wa", &wa), wupload(&ctx, "wb", &wb_pad));
        let (va, vb) = (wview(&ctx, &ba, ty), wview(&ctx, &bb, ty));
        let x = rng.vec(n_tok * cols, 3.0);
        let norm_w = rng.vec(cols, 1.0);
        let (xbuf, xgbuf) = (
            upload(&ctx, "x", &x),
            upload(&ctx, "xg", &times_g(&x, &norm_w)),
        );
        let (xv, xgv) = (xview(&ctx, &xbuf), xview(&ctx, &xgbuf));
        // the CPU twin, per token: rmsnorm, then the matvecs (right and wrong decoders)
        let mut xn = vec![0.0; cols];
        let (wrong_a, wrong_b) = (wrong_decoding(ty, &wa), wrong_decoding(ty, &wb));
        let (mut ya, mut yb, mut za, mut zb) = (vec![], vec![], vec![], vec![]);
        let (mut ma, mut mb) = (vec![], vec![]);
        for t in 0..n_tok {
            rk::rmsnorm(&x[t * cols..(t + 1) * cols], &norm_w, eps, &mut xn);
            let mv = |w: &[u8]| {
                let mut o = vec![0.0; rows];
                rk::matvec(ty, w, rows, cols, &xn, &mut o).unwrap();
                o
            };
            ya.extend(mv(&wa));
            yb.extend(mv(&wb));
            za.extend(mv(&wrong_a));
            zb.extend(mv(&wrong_b));
            ma.extend(magnitudes(&fa, cols, &xn));
            mb.extend(magnitudes(&fb, cols, &xn));
        }
        let e = (TOL_K * cols as f32 + 8.0) * U;
        // the logits: one token at a time, as the engine reads them
        for k in engine_keys(&ks, ty, (InMode::RmsNorm, OutMode::Store), cols) {
            let out = zeros(&ctx, "out", n_tok * rows);
            let bindings = MatmulBindings {
                w0: &va,
                w1: &va,
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
                ncols: cols as u32,
                x_ld: cols as u32,
                out_ld: rows as u32,
                eps,
                ..Default::default()
            };
            let slots = [Slot {
                slot: 0,
                nrows: rows as u32,
                wofs: 0,
                orow: 0,
            }];
            dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
            let got = read_f32(&out, n_tok * rows);
            assert_close_and_discriminating(&format!("{ty:?} logits {k:?}"), &got, &ya, &za, |i| {
                e * ma[i] + 1e-6
            });
        }
        // gate (w0) and up (w1, 5 words in): silu(gate·x) * (up·x)
        let swiglu = |g: &[f32], u: &[f32]| {
            let mut h = vec![0.0; g.len()];
            rk::swiglu(g, u, &mut h);
            h
        };
        let (want, wrong) = (swiglu(&ya, &yb), swiglu(&za, &zb));
        // d(silu(g)·u) <= |u|·1.1·δg + |silu(g)|·δu, plus the exp's few ulps
        let tol = |i: usize| {
            1.1 * yb[i].abs() * e * ma[i]
                + rk::silu(ya[i]).abs() * e * mb[i]
                + 1e-5 * want[i].abs()
                + 1e-6
        };
        for k in engine_keys(&ks, ty, (InMode::RmsNorm, OutMode::Glu), cols) {
            let out = zeros(&ctx, "hb", n_tok * rows);
            let bindings = MatmulBindings {
                w0: &va,
                w1: &vb,
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
                ncols: cols as u32,
                x_ld: cols as u32,
                out_ld: rows as u32,
                eps,
                ..Default::default()
            };
            let slots = [
                Slot {
                    slot: 0,
                    nrows: rows as u32,
                    wofs: 0,
                    orow: 0,
                },
                Slot {
                    slot: 1,
                    nrows: rows as u32,
                    wofs: 5,
                    orow: 0,
                },
            ];
            dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
            let got = read_f32(&out, n_tok * rows);
            assert_close_and_discriminating(
                &format!("{ty:?} swiglu {k:?}"),
                &got,
                &want,
                &wrong,
                tol,
            );
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// Embedding rows gathered and dequantised from a table in two row-range parts (the
/// second 3 words into its binding), rows of 320 columns (5 chunks: a partial
/// workgroup), and x∘g for the first norm.
#[test]
fn embedding_gather_matches_the_cpu_twin() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(15);
    let (rows, cols, split) = (11, 320, 6);
    let tokens = [3u32, 0, 10, 7, 6];
    let g = rng.vec(cols + 8, 1.0);
    let parts = TwoParts {
        rows,
        cols,
        split,
        pad: 12,
    };
    for ty in TYPES {
        let table = random_blocks(&mut rng, ty, rows * cols, 2.0);
        let (got, got_g) = embed_gather(&ctx, &mut ks, ty, &table, parts, &tokens, &g);
        let wrong_table = wrong_decoding(ty, &table);
        for (t, &tok) in tokens.iter().enumerate() {
            let mut want = vec![0.0; cols];
            let mut wrong = vec![0.0; cols];
            rk::embedding_row(ty, &table, cols, tok as usize, &mut want).unwrap();
            rk::embedding_row(ty, &wrong_table, cols, tok as usize, &mut wrong).unwrap();
            // one fma with the block scale (and min): 2 ulps of the larger term
            let tol = |i: usize| 4.0 * U * want[i].abs() + 1e-6;
            let row = &got[t * cols..(t + 1) * cols];
            assert_close_and_discriminating(
                &format!("{ty:?} token {tok}"),
                row,
                &want,
                &wrong,
                tol,
            );
            let want_g = times_g(&want, &g[8..]);
            let (r, i) = worst(&got_g[t * cols..(t + 1) * cols], &want_g, |i| {
                (tol(i) + U * want[i].abs()) * g[8 + i].abs() + 1e-7
            });
            assert!(r <= 1.0, "{ty:?} token {tok} x∘g[{i}]");
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

//! Every GPU kernel against its CPU twin in `reference::kernels`, on seeded random inputs.
//!
//! Tolerances are written down per test. For a dot product of n terms accumulated in f32
//! the rounding error is at most about n·u·Σ|w·x| (u = 2^-24, Higham's γ_n); the GPU and
//! the reference sum in different orders, so each may be off by that much: we allow
//! `TOL_K · n · u · Σ|w·x|` with TOL_K = 4, plus the rmsnorm scale's few ulps where it is
//! folded in.

mod common;

use common::gpu::*;
use common::*;
use engine::kernels::{
    self, ArgmaxBindings, ArgmaxPush, AttentionBindings, AttentionPush, EmbedBindings, InMode,
    Kernels, MatmulBindings, MatmulKey, MatmulPush, OutMode, Slot,
};
use gguf::GgmlType;
use reference::kernels as rk;
use reference::synthetic::Rng;
use reference::RopeMode;

const TYPES: [GgmlType; 5] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::F16,
    GgmlType::F32,
];

/// lavapipe (the CI device) has subgroup arithmetic: the column split must be chosen
/// there for the engine's shapes (so the tests below exercise it), and refused where the
/// per-lane share is 0 or above the unrolled maximum.
#[test]
fn column_split_is_chosen_where_the_device_allows() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let caps = ctx.caps();
    if caps.one_subgroup_of(8).is_none() || ks.shapes().split_lanes != Some(8) {
        eprintln!(
            "8-lane workgroups are not one subgroup here (subgroup size {}) or the shapes \
             ({}) do not split: the row-per-lane kernel is used",
            caps.subgroup_size,
            ks.shapes().name
        );
        assert_eq!(ks.column_split(8, 576), 0);
        return;
    }
    assert_eq!(
        ks.column_split(8, 576),
        1,
        "9 chunks: one round of 8 lanes, 1 left"
    );
    assert_eq!(ks.column_split(8, 1536), 3, "24 chunks: three rounds");
    assert_eq!(
        ks.column_split(8, 192),
        0,
        "3 chunks: less than one per lane"
    );
    assert_eq!(
        ks.column_split(8, 64 * 40),
        0,
        "5 chunks per lane: not unrolled"
    );
    ks.set_column_split(false);
    assert_eq!(ks.column_split(8, 576), 0, "turned off");
    // a split key the device cannot run is an error, not a wrong result
    let bad = MatmulKey {
        split_k: 1,
        ..row_key(GgmlType::Q8_0, InMode::Plain, OutMode::Add, 4)
    };
    assert!(ks.matmul(bad).is_err());
}

/// Random weights of `ty`, `pad` bytes of garbage in front (to test word offsets).
fn weights(
    rng: &mut Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    pad: usize,
) -> (Vec<u8>, Vec<f32>) {
    let w = gguf::quant::quantize(ty, &rng.vec(rows * cols, 1.0)).unwrap();
    let deq = dequant(ty, &w, rows * cols);
    let mut bytes: Vec<u8> = (0..pad).map(|i| (i * 37) as u8).collect();
    bytes.extend_from_slice(&w);
    (bytes, deq)
}

/// Residual-add matmul for every type, decode (one token per invocation) and prefill
/// (four) shapes, a row count that leaves a partial tile, a word offset; the add also
/// writes `x∘g` for the next norm (g read at a float offset).
#[test]
fn matmul_store_and_add_match_reference_for_every_type() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(1);
    let (rows, n_tok) = (202, 5);
    // 3 chunks per row (row per lane only), 11 (one per lane and 3 left over), 24 (3 each)
    for cols in [192, 704, 1536] {
        let dummy = zeros(&ctx, "dummy", 4);
        let dummy_w = wview(&ctx, &dummy, GgmlType::F32);
        let step = step_buffer(&ctx, 0, &[], &[]);
        let g = rng.vec(rows + 4, 1.0); // the next norm weight, 4 floats in
        let gbuf = upload(&ctx, "g", &g);
        for ty in TYPES {
            let (bytes, w) = weights(&mut rng, ty, rows, cols, 64);
            let wbuf = wupload(&ctx, "w", &bytes);
            let wv = wview(&ctx, &wbuf, ty);
            let x = rng.vec(n_tok * cols, 1.0);
            let xbuf = upload(&ctx, "x", &x);
            let xv = xview(&ctx, &xbuf);
            let mut want = vec![0.0; n_tok * rows];
            rk::matmul(ty, &bytes[64..], rows, cols, &x, n_tok, &mut want).unwrap();
            let init = rng.vec(n_tok * rows, 1.0);
            {
                let out_mode = OutMode::Add;
                for k in engine_keys(&ks, ty, (InMode::Plain, out_mode), cols) {
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
                        write_xg: u32::from(out_mode == OutMode::Add),
                        ..Default::default()
                    };
                    let slots = [Slot {
                        slot: 0,
                        nrows: rows as u32,
                        wofs: 16,
                        orow: 0,
                    }];
                    dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
                    let got = read_f32(&out, n_tok * rows);
                    let mut expect = want.clone();
                    if out_mode == OutMode::Add {
                        rk::add(&mut expect, &init);
                    }
                    let mags: Vec<f32> = (0..n_tok)
                        .flat_map(|t| magnitudes(&w, cols, &x[t * cols..(t + 1) * cols]))
                        .collect();
                    let tol = |i: usize| {
                        TOL_K * cols as f32 * U * mags[i]
                            + 1e-6
                            + if out_mode == OutMode::Add {
                                2.0 * U * init[i].abs()
                            } else {
                                0.0
                            }
                    };
                    assert_close(
                        &format!("{ty:?} {cols} columns {out_mode:?} {k:?}"),
                        &got,
                        &expect,
                        tol,
                    );
                    if out_mode == OutMode::Add {
                        let xg_want = times_g(&expect, &g[4..]);
                        let xg_got = read_f32(&xg, n_tok * rows);
                        assert_close(&format!("{ty:?} x∘g"), &xg_got, &xg_want, |i| {
                            (tol(i) + U * expect[i].abs()) * g[4 + i % rows].abs()
                        });
                    }
                }
            }
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// rmsnorm folded in (input x∘g, 1/rms taken from the raw x); a weight split in two
/// row-range parts bound in two buffers (two dispatches writing disjoint rows), as views
/// larger than maxStorageBufferRange arrive.
#[test]
fn matmul_with_folded_rmsnorm_and_row_range_parts() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(2);
    let (rows, cols, n_tok, eps) = (160, 576, 3, 1e-5);
    let dummy = zeros(&ctx, "dummy", 4);
    let dummy_w = wview(&ctx, &dummy, GgmlType::F32);
    let step = step_buffer(&ctx, 0, &[], &[]);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
        let (bytes, w) = weights(&mut rng, ty, rows, cols, 0);
        let row_bytes = bytes.len() / rows;
        let split = 96; // rows 0..96 in part A, 96..160 in part B (B with 32 bytes in front)
        let part_a = wupload(&ctx, "wa", &bytes[..split * row_bytes]);
        let mut b_bytes = vec![0u8; 32];
        b_bytes.extend_from_slice(&bytes[split * row_bytes..]);
        let part_b = wupload(&ctx, "wb", &b_bytes);
        let x: Vec<f32> = rng.vec(n_tok * cols, 3.0);
        let norm_w = rng.vec(cols, 1.0);
        let (xbuf, xgbuf) = (
            upload(&ctx, "x", &x),
            upload(&ctx, "xg", &times_g(&x, &norm_w)),
        );
        let (xv, xgv) = (xview(&ctx, &xbuf), xview(&ctx, &xgbuf));
        let out = zeros(&ctx, "out", n_tok * rows);
        let mut want = vec![0.0; n_tok * rows];
        let mut xn = vec![0.0; cols];
        let mut mags = Vec::new();
        for t in 0..n_tok {
            rk::rmsnorm(&x[t * cols..(t + 1) * cols], &norm_w, eps, &mut xn);
            rk::matvec(
                ty,
                &bytes,
                rows,
                cols,
                &xn,
                &mut want[t * rows..(t + 1) * rows],
            )
            .unwrap();
            mags.extend(magnitudes(&w, cols, &xn));
        }
        // the logits' pipeline: one token per invocation
        for k in engine_keys(&ks, ty, (InMode::RmsNorm, OutMode::Store), cols) {
            for (buf, slot) in [
                (
                    &part_a,
                    Slot {
                        slot: 0,
                        nrows: split as u32,
                        wofs: 0,
                        orow: 0,
                    },
                ),
                (
                    &part_b,
                    Slot {
                        slot: 0,
                        nrows: (rows - split) as u32,
                        wofs: 8,
                        orow: split as u32,
                    },
                ),
            ] {
                let wv = wview(&ctx, buf, ty);
                let bindings = MatmulBindings {
                    w0: &wv,
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
                    n_tok: n_tok as u32,
                    ncols: cols as u32,
                    x_ld: cols as u32,
                    out_ld: rows as u32,
                    eps,
                    ..Default::default()
                };
                dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &[slot]);
            }
            let got = read_f32(&out, n_tok * rows);
            // the normalised input carries a few ulps of the scale: 8 more u per term
            assert_close(&format!("{ty:?} rmsnorm {k:?}"), &got, &want, |i| {
                (TOL_K * cols as f32 + 8.0) * U * mags[i] + 1e-6
            });
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// q/k/v in one dispatch over three views: rmsnorm in, rope (llama's pairing: a neox
/// model's q/k/v goes through heads.comp, tests/kernels_arch.rs) on q and k, k and v
/// written as f16 into the cache rows of positions pos0..pos0+n.
#[test]
fn qkv_rope_and_cache_write_match_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(3);
    let (dim, n_heads, n_kv, hd, n_tok, pos0, ctx_len, eps, base) =
        (576, 4, 2, 32, 3, 5u32, 16, 1e-5, 10000.0);
    let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
    let freqs = kernels::rope_freqs(base, hd);
    for (ty, mode) in [
        (GgmlType::Q8_0, RopeMode::Normal),
        (GgmlType::Q4_1, RopeMode::Normal),
        (GgmlType::F16, RopeMode::Normal),
    ] {
        let step = step_buffer(&ctx, pos0, &freqs, &[]);
        let (wq, fq) = weights(&mut rng, ty, q_dim, dim, 0);
        let (wk, fk) = weights(&mut rng, ty, kv_dim, dim, 0);
        let (wv, fv) = weights(&mut rng, ty, kv_dim, dim, 0);
        let x = rng.vec(n_tok * dim, 1.0);
        let norm_w = rng.vec(dim, 1.0);
        // q, k and v through binding 0, each at its own word offset (as the engine binds
        // them: one texel view spanning the three tensors)
        let mut wqkv = wq.clone();
        wqkv.extend_from_slice(&wk);
        wqkv.extend_from_slice(&wv);
        let bqkv = wupload(&ctx, "wqkv", &wqkv);
        let vqkv = wview(&ctx, &bqkv, ty);
        let (ofs_k, ofs_v) = (wq.len() as u32 / 4, (wq.len() + wk.len()) as u32 / 4);
        let (xbuf, xgbuf) = (
            upload(&ctx, "x", &x),
            upload(&ctx, "xg", &times_g(&x, &norm_w)),
        );
        let (xv, xgv) = (xview(&ctx, &xbuf), xview(&ctx, &xgbuf));
        let dummy = zeros(&ctx, "dummy", 4);
        let qout = zeros(&ctx, "q", n_tok * q_dim);
        let kc = zeros_f16(&ctx, "kc", ctx_len * kv_dim);
        let vc = zeros_f16(&ctx, "vc", ctx_len * kv_dim);
        let qkv = (InMode::RmsNorm, OutMode::Qkv);
        for k in engine_keys(&ks, ty, qkv, dim) {
            let dummy_w = wview(&ctx, &dummy, ty);
            let bindings = MatmulBindings {
                w0: &vqkv,
                w1: &dummy_w,
                x: &xgv,
                aux: dummy.binding(),
                out0: qout.binding(),
                out1: kc.binding(),
                out2: vc.binding(),
                step: step.binding(),
                xr: &xv,
            };
            let push = MatmulPush {
                n_tok: n_tok as u32,
                ncols: dim as u32,
                x_ld: dim as u32,
                out_ld: q_dim as u32,
                kv_ld: kv_dim as u32,
                head_dim: hd as u32,
                eps,
                ..Default::default()
            };
            let slots = [
                Slot {
                    slot: 0,
                    nrows: q_dim as u32,
                    wofs: 0,
                    orow: 0,
                },
                Slot {
                    slot: 1,
                    nrows: kv_dim as u32,
                    wofs: ofs_k,
                    orow: 0,
                },
                Slot {
                    slot: 2,
                    nrows: kv_dim as u32,
                    wofs: ofs_v,
                    orow: 0,
                },
            ];
            dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
            let (gq, gk, gv) = (
                read_f32(&qout, n_tok * q_dim),
                read_f16(&kc, ctx_len * kv_dim),
                read_f16(&vc, ctx_len * kv_dim),
            );
            let mut xn = vec![0.0; dim];
            for t in 0..n_tok {
                let pos = pos0 as usize + t;
                rk::rmsnorm(&x[t * dim..(t + 1) * dim], &norm_w, eps, &mut xn);
                let mut q = vec![0.0; q_dim];
                let mut kk = vec![0.0; kv_dim];
                let mut v = vec![0.0; kv_dim];
                rk::matvec(ty, &wq, q_dim, dim, &xn, &mut q).unwrap();
                rk::matvec(ty, &wk, kv_dim, dim, &xn, &mut kk).unwrap();
                rk::matvec(ty, &wv, kv_dim, dim, &xn, &mut v).unwrap();
                rk::rope(&mut q, n_heads, hd, pos, base, mode);
                rk::rope(&mut kk, n_kv, hd, pos, base, mode);
                // rope mixes two rows of similar magnitude: bound by the larger magnitude of the
                // head, plus the angle error (pos · few ulps) times the value
                let tol = |mags: &[f32]| {
                    let m = mags.iter().copied().fold(0.0, f32::max);
                    move |_: usize| (TOL_K * dim as f32 + 8.0) * U * m * 2.0 + 1e-5 * m + 1e-6
                };
                let mq = magnitudes(&fq, dim, &xn);
                let mk = magnitudes(&fk, dim, &xn);
                let mv = magnitudes(&fv, dim, &xn);
                // the caches hold f16: the reference rounded the same way, give or take
                // one f16 step where the two sums fall either side of a rounding edge
                let tol16 = |mags: &[f32]| {
                    let m = mags.iter().copied().fold(0.0, f32::max);
                    let t = tol(mags);
                    move |i: usize| t(i) + m / 1024.0
                };
                let what = format!("{ty:?} {mode:?} token {t}");
                assert_close(
                    &format!("{what} q"),
                    &gq[t * q_dim..(t + 1) * q_dim],
                    &q,
                    tol(&mq),
                );
                assert_close(
                    &format!("{what} k"),
                    &gk[pos * kv_dim..(pos + 1) * kv_dim],
                    &f16_round(&kk),
                    tol16(&mk),
                );
                assert_close(
                    &format!("{what} v"),
                    &gv[pos * kv_dim..(pos + 1) * kv_dim],
                    &f16_round(&v),
                    tol16(&mv),
                );
            }
            // rows of other positions untouched
            assert!(gk[..pos0 as usize * kv_dim].iter().all(|&v| v == 0.0));
            assert!(gv[(pos0 as usize + n_tok) * kv_dim..]
                .iter()
                .all(|&v| v == 0.0));
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// gate and up in one dispatch, SwiGLU in the epilogue.
#[test]
fn gate_up_swiglu_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(4);
    let (hidden, dim, n_tok, eps) = (200, 576, 2, 1e-5);
    let dummy = zeros(&ctx, "dummy", 4);
    let step = step_buffer(&ctx, 0, &[], &[]);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
        let (wg, fg) = weights(&mut rng, ty, hidden, dim, 0);
        // up 64 bytes into its binding: its own word offset (slot 1) must be used
        let (wu, fu) = weights(&mut rng, ty, hidden, dim, 64);
        let x = rng.vec(n_tok * dim, 1.0);
        let norm_w = rng.vec(dim, 1.0);
        let (bg, bu) = (wupload(&ctx, "wg", &wg), wupload(&ctx, "wu", &wu));
        let (vg, vu) = (wview(&ctx, &bg, ty), wview(&ctx, &bu, ty));
        let (xbuf, xgbuf) = (
            upload(&ctx, "x", &x),
            upload(&ctx, "xg", &times_g(&x, &norm_w)),
        );
        let (xv, xgv) = (xview(&ctx, &xbuf), xview(&ctx, &xgbuf));
        let out = zeros(&ctx, "hb", n_tok * hidden);
        for k in engine_keys(&ks, ty, (InMode::RmsNorm, OutMode::Glu), dim) {
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
                    wofs: 16,
                    orow: 0,
                },
            ];
            let groups = dispatch_matmul(&ctx, &mut ks, k, &bindings, push, &slots);
            // each invocation reads gate and up: only gate's rows own workgroups
            assert_eq!(groups[0], (hidden as u32).div_ceil(k.tile_rows()));
            let got = read_f32(&out, n_tok * hidden);
            let mut xn = vec![0.0; dim];
            for t in 0..n_tok {
                rk::rmsnorm(&x[t * dim..(t + 1) * dim], &norm_w, eps, &mut xn);
                let (mut g, mut u, mut h) =
                    (vec![0.0; hidden], vec![0.0; hidden], vec![0.0; hidden]);
                rk::matvec(ty, &wg, hidden, dim, &xn, &mut g).unwrap();
                rk::matvec(ty, &wu[64..], hidden, dim, &xn, &mut u).unwrap();
                rk::swiglu(&g, &u, &mut h);
                let (mg, mu) = (magnitudes(&fg, dim, &xn), magnitudes(&fu, dim, &xn));
                // d(silu(g)·u) <= (|u|·1.1·δg + |silu(g)|·δu), plus the exp's few ulps
                assert_close(
                    &format!("{ty:?} swiglu token {t}"),
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

/// Embedding rows gathered and dequantised, for every type, from a table in two parts.
#[test]
fn embedding_gather_matches_reference_for_every_type() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(5);
    let (rows, cols) = (10, 128);
    let tokens = [3u32, 0, 9, 7];
    let g = rng.vec(cols + 8, 1.0);
    let parts = TwoParts {
        rows,
        cols,
        split: 6,
        pad: 16,
    };
    for ty in TYPES {
        let table = gguf::quant::quantize(ty, &rng.vec(rows * cols, 2.0)).unwrap();
        let (got, got_g) = embed_gather(&ctx, &mut ks, ty, &table, parts, &tokens, &g);
        for (t, &tok) in tokens.iter().enumerate() {
            let mut want = vec![0.0; cols];
            rk::embedding_row(ty, &table, cols, tok as usize, &mut want).unwrap();
            // one multiply (or fma) by the block scale: 2 ulps
            let tol = |i: usize| 2.0 * U * want[i].abs() * 2.0 + 1e-7;
            assert_close(
                &format!("{ty:?} token {tok}"),
                &got[t * cols..(t + 1) * cols],
                &want,
                tol,
            );
            let want_g = times_g(&want, &g[8..]);
            assert_close(
                &format!("{ty:?} token {tok} x∘g"),
                &got_g[t * cols..(t + 1) * cols],
                &want_g,
                |i| (tol(i) + U * want[i].abs()) * g[8 + i].abs() + 1e-7,
            );
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// Causal GQA attention of a batch over the cache: fewer positions than lanes (lanes with
/// nothing to do), and many (each lane's running maximum grows and rescales its sums).
/// Each batch runs whole (t0 = 0) and for its last token alone (t0 = n_tok - 1, which
/// writes row 0 of out, as a prompt's last layer does for its last token).
#[test]
fn attention_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(6);
    for (n_heads, n_kv, hd, ctx_len, pos0, n_tok) in [
        (6, 2, 32, 40, 17u32, 3),
        (9, 3, 64, 300, 2, 2),
        (4, 4, 16, 300, 250, 4),
    ] {
        let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
        let q = rng.vec(n_tok * q_dim, 2.0);
        // values an f16 cache holds exactly, so that the reference reads what the kernel does
        let kc = f16_round(&rng.vec(ctx_len * kv_dim, 2.0));
        let vc = f16_round(&rng.vec(ctx_len * kv_dim, 1.0));
        for t0 in [0, n_tok - 1] {
            let push = AttentionPush {
                n_heads: n_heads as u32,
                n_kv_heads: n_kv as u32,
                head_dim: hd as u32,
                scale: 1.0 / (hd as f32).sqrt(),
                window: 0,
                t0: t0 as u32,
            };
            let got = run_attention(&ctx, &mut ks, &push, pos0, n_tok, &q, &kc, &vc);
            for t in t0..n_tok {
                let want = attention_want(&push, pos0, t, &q, &kc, &vc);
                // softmax weights carry the score error (hd·u·|q||k|·scale ≈ 1e-5
                // relative after exp) into a convex combination of values bounded by 1:
                // 1e-5 absolute
                let r = t - t0;
                assert_close(
                    &format!("attention hd={hd} pos0={pos0} t0={t0} token {t}"),
                    &got[r * q_dim..(r + 1) * q_dim],
                    &want,
                    |_| 1e-5,
                );
            }
            let rows = n_tok - t0;
            assert!(
                got[rows * q_dim..].iter().all(|&v| v == 0.0),
                "t0={t0}: rows past the {rows} that ran were written"
            );
        }
    }
    assert!(
        ks.attention(6).is_err() && ks.attention(512).is_err(),
        "head dimensions the kernel cannot hold are refused"
    );
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// The first index of the maximum.
#[test]
fn argmax_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(7);
    for n in [1usize, 5, 1000, 49152] {
        let mut logits = rng.vec(n, 10.0);
        if n > 10 {
            logits[n / 3] = 50.0;
            logits[n / 2] = 50.0; // a tie: the first wins
        }
        let lb = upload(&ctx, "logits", &logits);
        let res = upload(&ctx, "res", &[u32::MAX; 4]);
        let set = ks
            .argmax
            .descriptor_set_with(
                &ArgmaxBindings {
                    logits: lb.binding(),
                    result: res.binding(),
                }
                .descriptors(),
            )
            .unwrap();
        run(
            &ctx,
            &ks.argmax,
            &set,
            bytemuck::bytes_of(&ArgmaxPush { n: n as u32 }),
            [1, 1, 1],
        );
        let mut got = [0u32; 1];
        res.read(0, &mut got).unwrap();
        assert_eq!(got[0] as usize, rk::argmax(&logits), "n = {n}");
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// Every matmul variant the engine may ask for, for every weight type it reads, exists and
/// builds a pipeline, and every compiled matmul module is one the engine can ask for.
#[test]
fn every_matmul_variant_builds() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut used = std::collections::HashSet::new();
    let supported = GgmlType::ALL
        .into_iter()
        .filter(|t| kernels::supported_weight_type(*t));
    for ty in supported {
        for (in_mode, out_mode) in [
            (InMode::RmsNorm, OutMode::Qkv),
            (InMode::Plain, OutMode::Add),
            (InMode::RmsNorm, OutMode::Glu),
            (InMode::RmsNorm, OutMode::Store),
            (InMode::Plain, OutMode::Store),
            (InMode::RmsNorm, OutMode::GeGlu),
        ] {
            let mut keys = Vec::new();
            for tb in kernels::MATMUL_TB {
                // (rmsnorm, store) at TB 4: a plain q/k/v in prefill (graph.rs)
                keys.push(row_key(ty, in_mode, out_mode, tb));
            }
            // the prefill GEMM (matmul_mm.comp), every epilogue ((rmsnorm, store): the
            // plain q/k/v of the families with heads.comp)
            for tt in kernels::GEMM_TT {
                keys.push(row_key(ty, in_mode, out_mode, tt));
            }
            for split_k in 1..=kernels::SPLIT_MAX_CHUNKS_PER_LANE {
                keys.push(MatmulKey {
                    split_k,
                    ..row_key(ty, in_mode, out_mode, 1)
                });
            }
            for k in keys {
                used.insert(k.kernel().unwrap().name());
                if k.split_k == 0 || ks.column_split(8, 64 * 8 * k.split_k) == k.split_k {
                    ks.matmul(k).unwrap();
                }
            }
        }
        ks.embed(ty).unwrap();
    }
    for k in kernels::shaders() {
        if k.name().starts_with("matmul") {
            assert!(
                used.contains(k.name()),
                "{} is built but never used",
                k.name()
            );
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// The bindings structs the engine builds its sets with agree with the SPIR-V reflection
/// (crates/shader-build): every matmul variant of either kernel declares the
/// [`MatmulBindings`] layout (weights, x and xr as texel buffers), so one descriptor set
/// serves the decode and prefill pipelines of a dispatch; likewise [`EmbedBindings`],
/// [`AttentionBindings`] and [`ArgmaxBindings`].
#[test]
fn reflected_layouts_agree_with_the_engine_bindings() {
    let mut seen = 0;
    for k in kernels::shaders() {
        let (n, kinds): (u32, &[vk::DescriptorKind]) = match k.name().split('.').next() {
            Some("matmul" | "matmul_split" | "matmul_mm") => {
                (kernels::MATMUL_BINDINGS, &MatmulBindings::KINDS)
            }
            Some("embed") => (kernels::EMBED_BINDINGS, &EmbedBindings::KINDS),
            Some("attention") => (kernels::ATTENTION_BINDINGS, &AttentionBindings::KINDS),
            Some("argmax") => (kernels::ARGMAX_BINDINGS, &ArgmaxBindings::KINDS),
            _ => continue,
        };
        assert_eq!(k.bindings(), n, "{}", k.name());
        assert_eq!(k.descriptor_kinds(), kinds, "{}", k.name());
        seen += 1;
    }
    assert!(seen > 100, "{seen} kernels checked");
}

/// Every module the registry embeds is SPIR-V, declares as many descriptor kinds as
/// bindings, and builds a pipeline (bindings and push constants generous, no
/// specialisation), and `Kernel::ALL` names the modules one for one.
#[test]
fn every_kernel_builds_a_pipeline() {
    let Some(ctx) = ctx() else { return };
    assert_eq!(kernels::Kernel::ALL.len(), kernels::shaders().len());
    for (&kernel, shader) in kernels::Kernel::ALL.iter().zip(kernels::shaders()) {
        assert_eq!(kernel.shader(), Some(shader), "{kernel:?}");
    }
    for k in kernels::shaders() {
        let words = k.spirv();
        assert!(
            words.len() > 5 && words[0] == 0x0723_0203,
            "{} is not SPIR-V",
            k.name()
        );
        assert_eq!(k.descriptor_kinds().len(), k.bindings() as usize);
        let p = vk::Pipeline::new(
            &ctx,
            &vk::PipelineDesc {
                kernel: k,
                n_bindings: k.bindings().max(1),
                push_size: 128.min(ctx.caps().max_push_constants_size),
                spec: vec![],
            },
        );
        assert!(p.is_ok(), "{}: {:?}", k.name(), p.err());
    }
    assert_no_validation_errors(&ctx);
}

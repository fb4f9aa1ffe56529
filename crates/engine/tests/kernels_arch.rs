//! The kernels of the families beyond llama against their CPU twins in
//! `reference::kernels`, on seeded random inputs: `heads.comp` (biases, per-head RMS norms,
//! RoPE from a frequency table, q and cache writes), `post_norm.comp`, `softcap.comp`, and
//! `attention.comp`'s sliding window and score scale.
//!
//! Tolerances: each of these is a few dozen f32 operations per element on O(1) values, so
//! results agree to a few ulps, except the RoPE angle: the reference takes `pos·freq` and
//! its sine in f64, the GPU in f32, so an angle of up to `pos` radians carries `pos·u`
//! absolute error; 1e-4 absolute covers positions up to a few hundred with margin. A
//! wrong pairing, table, bias or norm moves values by O(0.1).

mod common;

use common::gpu::{attention_want, run, run_attention};
use common::*;
use engine::kernels::{
    self, AttentionPush, HeadsBindings, HeadsPush, Kernels, PostNormBindings, PostNormPush,
    SoftcapBindings, SoftcapPush, HEADS_BIAS, HEADS_NEOX, HEADS_NORM, STEP_FREQS_MAX,
};
use reference::kernels as rk;
use reference::synthetic::Rng;
use reference::RopeMode;

fn assert_near(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: gpu {g} vs reference {w} (tolerance {tol})"
        );
    }
}

/// heads.comp on a batch of tokens at pos0..: every flag combination, normal and neox
/// pairing, the global and the second frequency table, GQA (more q heads than kv heads);
/// k and v stored as f16.
#[test]
fn heads_match_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(31);
    for (case, (nh, nkv, hd, pos0, n_tok, flags, table)) in [
        (4, 2, 16, 5u32, 3usize, HEADS_BIAS | HEADS_NEOX, 0usize),
        (4, 1, 64, 300, 2, HEADS_NORM | HEADS_NEOX, 1),
        (2, 2, 32, 0, 4, HEADS_BIAS | HEADS_NORM, 0),
        (3, 1, 256, 77, 1, HEADS_NORM | HEADS_NEOX, 1),
        (2, 1, 8, 9, 2, 0, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let (q_dim, kv_dim) = (nh * hd, nkv * hd);
        let qkv_ld = q_dim + 2 * kv_dim;
        let ctx_len = pos0 as usize + n_tok + 3;
        let qkv = rng.vec(n_tok * qkv_ld, 2.0);
        // biases and norms at an offset inside their buffers, as weights in a file are
        let (bofs, nofs) = (4usize, 8usize);
        let bias: Vec<f32> = rng.vec(bofs + q_dim + 2 * kv_dim, 0.5);
        let norms: Vec<f32> = (0..nofs + 2 * hd)
            .map(|_| 1.0 + 0.3 * rng.uniform())
            .collect();
        // table 0: base 1e4 with Llama 3-like divisors; table 1: base 1e6
        let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + i as f32 / 4.0).collect();
        let mut tables = vec![0.0f32; 2 * STEP_FREQS_MAX];
        let t0 = kernels::rope_freqs_ext(10_000.0, 1.0, Some(&factors), hd);
        let t1 = kernels::rope_freqs(1_000_000.0, hd);
        tables[..hd / 2].copy_from_slice(&t0);
        tables[STEP_FREQS_MAX..STEP_FREQS_MAX + hd / 2].copy_from_slice(&t1);

        let qkv_b = upload(&ctx, "qkv", &qkv);
        let bias_b = upload(&ctx, "bias", &bias);
        let norm_b = upload(&ctx, "norms", &norms);
        let q_b = zeros(&ctx, "q", n_tok * q_dim);
        let kc_b = zeros_f16(&ctx, "kc", ctx_len * kv_dim);
        let vc_b = zeros_f16(&ctx, "vc", ctx_len * kv_dim);
        let step = step_buffer(&ctx, pos0, &[], &[]);
        let rope = upload(&ctx, "rope", &tables);
        let p = ks.heads().unwrap();
        let set = p
            .descriptor_set_with(
                &HeadsBindings {
                    qkv: qkv_b.binding(),
                    bq: bias_b.binding(),
                    bk: bias_b.binding(),
                    bv: bias_b.binding(),
                    q_norm: norm_b.binding(),
                    k_norm: norm_b.binding(),
                    q: q_b.binding(),
                    k_cache: kc_b.binding(),
                    v_cache: vc_b.binding(),
                    step: step.binding(),
                    rope: rope.binding(),
                }
                .descriptors(),
            )
            .unwrap();
        let push = HeadsPush {
            n_heads: nh as u32,
            n_kv_heads: nkv as u32,
            head_dim: hd as u32,
            qkv_ld: qkv_ld as u32,
            q_ld: q_dim as u32,
            kv_ld: kv_dim as u32,
            eps: 1e-6,
            flags,
            freq_ofs: (table * STEP_FREQS_MAX) as u32,
            bq_ofs: bofs as u32,
            bk_ofs: (bofs + q_dim) as u32,
            bv_ofs: (bofs + q_dim + kv_dim) as u32,
            qn_ofs: nofs as u32,
            kn_ofs: (nofs + hd) as u32,
            pad: [0; 2],
        };
        run(
            &ctx,
            p,
            &set,
            bytemuck::bytes_of(&push),
            kernels::heads_groups(&push, n_tok as u32),
        );
        let got_q = read_f32(&q_b, n_tok * q_dim);
        let got_k = read_f16(&kc_b, ctx_len * kv_dim);
        let got_v = read_f16(&vc_b, ctx_len * kv_dim);

        let mode = if flags & HEADS_NEOX != 0 {
            RopeMode::Neox
        } else {
            RopeMode::Normal
        };
        let (base, divisors) = if table == 0 {
            (10_000.0, Some(factors.as_slice()))
        } else {
            (1_000_000.0, None)
        };
        for t in 0..n_tok {
            let pos = pos0 as usize + t;
            let row = &qkv[t * qkv_ld..(t + 1) * qkv_ld];
            let mut q = row[..q_dim].to_vec();
            let mut k = row[q_dim..q_dim + kv_dim].to_vec();
            let mut v = row[q_dim + kv_dim..].to_vec();
            if flags & HEADS_BIAS != 0 {
                rk::add(&mut q, &bias[bofs..bofs + q_dim]);
                rk::add(&mut k, &bias[bofs + q_dim..bofs + q_dim + kv_dim]);
                rk::add(&mut v, &bias[bofs + q_dim + kv_dim..]);
            }
            if flags & HEADS_NORM != 0 {
                rk::rmsnorm_heads(&mut q, &norms[nofs..nofs + hd], 1e-6);
                rk::rmsnorm_heads(&mut k, &norms[nofs + hd..nofs + 2 * hd], 1e-6);
            }
            rk::rope_ext(&mut q, nh, hd, pos, base, 1.0, divisors, mode);
            rk::rope_ext(&mut k, nkv, hd, pos, base, 1.0, divisors, mode);
            let what = |s: &str| format!("case {case} token {t} {s}");
            let tol = 1e-4;
            assert_near(&what("q"), &got_q[t * q_dim..(t + 1) * q_dim], &q, tol);
            // the cache holds f16, rounded to nearest even as the reference rounds: v
            // exactly; k give or take one f16 step where the two sides' f32 values fall
            // either side of a rounding edge (2 of the ~800 keys here)
            let step16 = |x: &[f32]| x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 1024.0;
            let c = pos * kv_dim..(pos + 1) * kv_dim;
            let k_tol = tol + step16(&k);
            assert_near(&what("k"), &got_k[c.clone()], &f16_round(&k), k_tol);
            assert_near(&what("v"), &got_v[c], &f16_round(&v), 0.0);
        }
        // nothing written outside the batch's cache rows
        let first = pos0 as usize * kv_dim;
        let last = (pos0 as usize + n_tok) * kv_dim;
        assert!(got_k[..first]
            .iter()
            .chain(&got_k[last..])
            .all(|&x| x == 0.0));
        assert!(got_v[..first]
            .iter()
            .chain(&got_v[last..])
            .all(|&x| x == 0.0));
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// post_norm.comp: x += rmsnorm(y)∘w; xg = x∘g, for a batch, at odd widths (fewer and
/// more elements than lanes) and weights at offsets.
#[test]
fn post_norm_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(32);
    for (dim, n_tok) in [(40usize, 1usize), (640, 3), (1000, 2)] {
        let x = rng.vec(n_tok * dim, 3.0);
        let y = rng.vec(n_tok * dim, 5.0);
        let wts: Vec<f32> = (0..4 + 2 * dim)
            .map(|_| 1.0 + 0.5 * rng.uniform())
            .collect();
        let (w_ofs, g_ofs) = (4usize, 4 + dim);
        let (xb, yb, wb) = (
            upload(&ctx, "x", &x),
            upload(&ctx, "y", &y),
            upload(&ctx, "w", &wts),
        );
        let xg = zeros(&ctx, "xg", n_tok * dim);
        let p = ks.post_norm().unwrap();
        let set = p
            .descriptor_set_with(
                &PostNormBindings {
                    y: yb.binding(),
                    w: wb.binding(),
                    g: wb.binding(),
                    x: xb.binding(),
                    xg: xg.binding(),
                }
                .descriptors(),
            )
            .unwrap();
        let push = PostNormPush {
            dim: dim as u32,
            eps: 1e-6,
            w_ofs: w_ofs as u32,
            g_ofs: g_ofs as u32,
        };
        run(
            &ctx,
            p,
            &set,
            bytemuck::bytes_of(&push),
            [n_tok as u32, 1, 1],
        );
        let (got_x, got_xg) = (read_f32(&xb, n_tok * dim), read_f32(&xg, n_tok * dim));
        for t in 0..n_tok {
            let r = t * dim..(t + 1) * dim;
            let mut normed = vec![0.0; dim];
            rk::rmsnorm(&y[r.clone()], &wts[w_ofs..w_ofs + dim], 1e-6, &mut normed);
            let mut want = x[r.clone()].to_vec();
            rk::add(&mut want, &normed);
            let want_g: Vec<f32> = want
                .iter()
                .zip(&wts[g_ofs..g_ofs + dim])
                .map(|(a, b)| a * b)
                .collect();
            assert_near(
                &format!("dim {dim} token {t} x"),
                &got_x[r.clone()],
                &want,
                1e-5,
            );
            assert_near(
                &format!("dim {dim} token {t} xg"),
                &got_xg[r],
                &want_g,
                1e-5,
            );
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// softcap.comp over a row longer than a workgroup and not a multiple of it, with values
/// far past the cap (tanh saturates) and near zero.
#[test]
fn softcap_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(33);
    let n = 1000;
    let mut x = rng.vec(n, 100.0);
    x[0] = 1e30;
    x[1] = -1e30;
    x[2] = 1e-3;
    let b = upload(&ctx, "logits", &x);
    let p = ks.softcap().unwrap();
    let set = p
        .descriptor_set_with(
            &SoftcapBindings {
                logits: b.binding(),
            }
            .descriptors(),
        )
        .unwrap();
    let push = SoftcapPush {
        n: n as u32,
        cap: 30.0,
    };
    let groups = (n as u32).div_ceil(kernels::SOFTCAP_WG);
    run(&ctx, p, &set, bytemuck::bytes_of(&push), [groups, 1, 1]);
    let got = read_f32(&b, n);
    let mut want = x.clone();
    rk::softcap(&mut want, 30.0);
    // lavapipe's tanh is exp-based: its error is a few ulps of 1, not of the result, so
    // near 0 the capped value is off by up to cap·(a few u) absolute (1e-5 here; the
    // model tests bound logits at 2e-3)
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-6 * w.abs(),
            "softcap[{i}] of {}: gpu {g} vs reference {w}",
            x[i]
        );
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// attention.comp with a sliding window and a score scale of its own: each query sees
/// only its last `window` positions (windows shorter and longer than the lanes' stride).
#[test]
fn windowed_attention_matches_reference() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    let mut rng = Rng::new(34);
    for (n_heads, n_kv, hd, window, pos0, n_tok, scale) in [
        (4, 1, 64, 3usize, 10u32, 3usize, 0.2f32),
        (2, 2, 32, 20, 50, 2, 0.125),
        (4, 2, 16, 100, 5, 2, 0.25), // window past the positions: sees all
    ] {
        let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
        let ctx_len = pos0 as usize + n_tok;
        let q = rng.vec(n_tok * q_dim, 2.0);
        // values an f16 cache holds exactly, so that the reference reads what the kernel does
        let kc = f16_round(&rng.vec(ctx_len * kv_dim, 2.0));
        let vc = f16_round(&rng.vec(ctx_len * kv_dim, 1.0));
        let push = AttentionPush {
            n_heads: n_heads as u32,
            n_kv_heads: n_kv as u32,
            head_dim: hd as u32,
            scale,
            window: window as u32,
            t0: 0,
        };
        let got = run_attention(&ctx, &mut ks, &push, pos0, n_tok, &q, &kc, &vc);
        for t in 0..n_tok {
            let want = attention_want(&push, pos0, t, &q, &kc, &vc);
            let r = t * q_dim..(t + 1) * q_dim;
            assert_near(&format!("window {window} token {t}"), &got[r], &want, 1e-5);
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

/// The bindings structs of these kernels agree with the SPIR-V reflection.
#[test]
fn reflected_layouts_agree_with_the_bindings() {
    use kernels::Kernel;
    let heads = Kernel::Heads.shader().unwrap();
    assert_eq!(heads.bindings(), kernels::HEADS_BINDINGS);
    assert_eq!(heads.descriptor_kinds(), &HeadsBindings::KINDS);
    let post_norm = Kernel::PostNorm.shader().unwrap();
    assert_eq!(post_norm.bindings(), kernels::POST_NORM_BINDINGS);
    assert_eq!(post_norm.descriptor_kinds(), &PostNormBindings::KINDS);
    let softcap = Kernel::Softcap.shader().unwrap();
    assert_eq!(softcap.bindings(), kernels::SOFTCAP_BINDINGS);
    assert_eq!(softcap.descriptor_kinds(), &SoftcapBindings::KINDS);
}

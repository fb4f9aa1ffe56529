//! The whole forward pass on a tiny synthetic model (2 layers, dim 64, written with the
//! project's GGUF writer): the residual after every layer and the logits against the
//! reference, through the decode path (one token per submission) and the batched
//! prefill path; and 32 greedy steps.
//!
//! Tolerance: activations of this model are O(1); each layer adds matvec rounding of
//! about dim·u relative (1e-5) plus the rope/exp/rsqrt ulps. We allow
//! `TOL · (1 + max|ref|)` with TOL = 2e-4 per layer and for the logits: ten times the
//! expected error and far below any real bug (a wrong row, position or scale shows
//! up as O(1)).

mod common;

use std::sync::Arc;

use common::*;
use engine::{Session, SessionOptions};
use gguf::GgmlType;
use reference::{forward, Model, State};

const TOL: f32 = 2e-4;
const VOCAB: usize = 320;

fn tiny(ty: GgmlType, seed: u64) -> (std::path::PathBuf, Vec<u8>) {
    let bytes = reference::synthetic::tiny_llama(seed, 2, 64, 4, 2, 128, VOCAB, ty);
    let path = std::env::temp_dir().join(format!(
        "vkdecode-tiny-{}-{}-{seed}.gguf",
        std::process::id(),
        ty.name()
    ));
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

fn session(ctx: &Arc<vk::Context>, path: &std::path::Path) -> Session {
    let file = Arc::new(gguf::GgufFile::open(path).unwrap());
    Session::new(
        Arc::clone(ctx),
        file,
        &SessionOptions {
            ctx_len: 64,
            ..SessionOptions::default()
        },
    )
    .unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let m = want.iter().fold(0.0f32, |a, &b| a.max(b.abs()));
    let tol = TOL * (1.0 + m);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: gpu {g} vs reference {w} (tolerance {tol})"
        );
    }
}

/// Per-layer residuals and logits at every position, decode path then prefill path.
#[test]
fn tiny_model_layers_and_logits_match_reference() {
    let Some(ctx) = ctx() else { return };
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
        let (path, bytes) = tiny(ty, 11);
        let model = Model::from_bytes(&bytes).unwrap();
        let mut s = session(&ctx, &path);
        let prompt = [1u32, 70, 260, 3, 199, 42];

        // reference, token by token
        let mut state = State::new(model.config(), 64);
        let mut ref_layers: Vec<Vec<Vec<f32>>> = Vec::new(); // [pos][layer][dim]
        let mut ref_logits = Vec::new();
        for (pos, &t) in prompt.iter().enumerate() {
            let mut layers = Vec::new();
            let logits = forward(&model, &mut state, t, pos, &mut |_, x| {
                layers.push(x.to_vec())
            })
            .unwrap();
            ref_logits.push(logits.to_vec());
            ref_layers.push(layers);
        }

        // GPU decode path: one token per submission
        for (pos, &t) in prompt.iter().enumerate() {
            let mut layers = Vec::new();
            let logits = s
                .forward_observed(&[t], &mut |_, x| layers.push(x.to_vec()))
                .unwrap()
                .to_vec();
            for (l, x) in layers.iter().enumerate() {
                assert_close(
                    &format!("{ty:?} pos {pos} layer {l}"),
                    x,
                    &ref_layers[pos][l],
                );
            }
            assert_close(
                &format!("{ty:?} pos {pos} logits"),
                &logits,
                &ref_logits[pos],
            );
        }

        // GPU prefill path: the whole prompt in one batch, on a session of its own (a reset
        // keeps the cache rows the decode pass wrote, which would hide a missing write)
        drop(s);
        let mut s = session(&ctx, &path);
        let mut layers = Vec::new();
        let logits = s
            .forward_observed(&prompt, &mut |_, x| layers.push(x.to_vec()))
            .unwrap()
            .to_vec();
        let dim = model.config().dim;
        for (l, x) in layers.iter().enumerate() {
            for pos in 0..prompt.len() {
                assert_close(
                    &format!("{ty:?} batched pos {pos} layer {l}"),
                    &x[pos * dim..(pos + 1) * dim],
                    &ref_layers[pos][l],
                );
            }
        }
        assert_close(
            &format!("{ty:?} batched logits"),
            &logits,
            &ref_logits[prompt.len() - 1],
        );

        // and the plain entry points agree with the observed ones
        drop(s);
        let mut s = session(&ctx, &path);
        s.prefill(&prompt).unwrap();
        let l2 = s.last_logits().unwrap().to_vec();
        assert_close(
            &format!("{ty:?} prefill logits"),
            &l2,
            &ref_logits[prompt.len() - 1],
        );
        drop(s);
        let _ = std::fs::remove_file(&path);
    }
    assert_no_validation_errors(&ctx);
}

/// Greedy ids of the GPU equal the reference's for 32 steps (a divergence is tolerated
/// only where the reference's top-2 gap is below the logit tolerance; reported).
#[test]
fn tiny_model_greedy_32_steps_match_reference() {
    let Some(ctx) = ctx() else { return };
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
        let (path, bytes) = tiny(ty, 12);
        let model = Model::from_bytes(&bytes).unwrap();
        let mut s = session(&ctx, &path);
        let prompt = [1u32, 100, 200];
        let mut state = State::new(model.config(), 64);
        let mut ref_logits = Vec::new();
        for (pos, &t) in prompt.iter().enumerate() {
            ref_logits = forward(&model, &mut state, t, pos, &mut |_, _| {})
                .unwrap()
                .to_vec();
        }
        s.prefill(&prompt).unwrap();
        let mut gpu_next = s.last_argmax().unwrap();
        for step in 0..32 {
            let ref_next = reference::kernels::argmax(&ref_logits) as u32;
            if gpu_next != ref_next {
                let mut sorted = ref_logits.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let gap = sorted[0] - sorted[1];
                let tol = TOL * (1.0 + sorted[0].abs());
                assert!(gap < tol, "{ty:?} step {step}: gpu {gpu_next} vs reference {ref_next}, top-2 gap {gap} >= {tol}");
                eprintln!(
                    "{ty:?}: divergence at step {step} within tolerance (gap {gap}); stopping"
                );
                break;
            }
            let pos = prompt.len() + step;
            ref_logits = forward(&model, &mut state, ref_next, pos, &mut |_, _| {})
                .unwrap()
                .to_vec();
            gpu_next = s.decode_argmax(ref_next).unwrap();
        }
        drop(s);
        let _ = std::fs::remove_file(&path);
    }
    assert_no_validation_errors(&ctx);
}

/// Condition 2 and 3: per greedy decode token one host wait, 4 bytes read back, no GPU
/// allocation (counted by `vk::Context` as buffers are created and destroyed, so a buffer
/// made per token fails it, kept or freed); the logits are read only when asked for.
#[test]
fn decode_token_costs_one_wait_four_bytes_no_allocation() {
    let Some(ctx) = ctx() else { return };
    let (path, _) = tiny(GgmlType::Q8_0, 13);
    let mut s = session(&ctx, &path);
    s.prefill(&[1, 2, 3]).unwrap();
    let mut tok = s.last_argmax().unwrap();
    let before = s.counters();
    let dev_before = ctx.device_bytes();
    let ctx_waits_before = ctx.host_waits();
    let total_allocations_before = ctx.total_allocations();
    let n = 10;
    for _ in 0..n {
        tok = s.decode_argmax(tok).unwrap();
    }
    let after = s.counters();
    assert_eq!(
        after.host_waits - before.host_waits,
        n,
        "host waits per token"
    );
    assert_eq!(
        ctx.host_waits() - ctx_waits_before,
        n,
        "fence waits seen by the context"
    );
    assert_eq!(
        after.bytes_read_back - before.bytes_read_back,
        4 * n,
        "bytes read back per greedy token"
    );
    assert_eq!(
        after.allocations,
        ctx.live_allocations(),
        "the counter is the context's live count"
    );
    assert!(after.allocations > 0, "the session's buffers are counted");
    assert_eq!(
        after.allocations, before.allocations,
        "device allocations alive after decoding"
    );
    assert_eq!(
        ctx.total_allocations(),
        total_allocations_before,
        "device allocations made while decoding"
    );
    assert_eq!(
        ctx.device_bytes(),
        dev_before,
        "device bytes grew while decoding"
    );
    let l = s.decode_logits(tok).unwrap().len() as u64;
    assert_eq!(s.counters().bytes_read_back - after.bytes_read_back, 4 * l);
    drop(s);
    let _ = std::fs::remove_file(&path);
    assert_no_validation_errors(&ctx);
}

/// Bad input is an error, never a panic: empty prompt, a token outside the vocabulary,
/// a prompt longer than the context.
#[test]
fn bad_input_is_a_clear_error() {
    let Some(ctx) = ctx() else { return };
    let (path, _) = tiny(GgmlType::Q4_1, 14);
    let mut s = session(&ctx, &path);
    let e = s.prefill(&[]).unwrap_err().to_string();
    assert!(e.contains("empty prompt"), "{e}");
    let e = s.decode_argmax(VOCAB as u32).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    let e = s.prefill(&vec![5u32; 65]).unwrap_err().to_string();
    assert!(e.contains("context full"), "{e}");
    assert_eq!(s.pos(), 0);
    drop(s);
    let _ = std::fs::remove_file(&path);
    assert_no_validation_errors(&ctx);
}

//! The log-probabilities a slot reports (`SamplerOptions::logprobs`) against the CPU
//! reference on the tiny synthetic model: the reference's logits, shaped by the same
//! logit bias and penalties by hand, then log-softmaxed in f64. Tolerance 1e-3: the
//! logits agree within `2e-4 · (1 + max|logit|)` (model_tiny.rs) and a log-softmax moves
//! by at most twice the largest logit error.

mod common;

use std::collections::HashMap;

use common::ctx;
use engine::{SamplerOptions, SlotEvent, Slots, SlotsOptions, TokenLogprob};
use gguf::GgmlType;
use reference::{forward, Model, State};

const VOCAB: usize = 320;
const TOL: f32 = 1e-3;

/// The tiny synthetic model (weights from `seed`) written to a temporary file, and one
/// slot of 64 positions on it: the bytes, the path (removed by the test), the file.
fn tiny_slot(
    seed: u64,
    tag: &str,
) -> (
    Vec<u8>,
    std::path::PathBuf,
    std::sync::Arc<gguf::GgufFile>,
    Slots,
) {
    let bytes = reference::synthetic::tiny_llama(seed, 2, 64, 4, 2, 128, VOCAB, GgmlType::Q8_0);
    let path = std::env::temp_dir().join(format!("vkdecode-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let file = std::sync::Arc::new(gguf::GgufFile::open(&path).unwrap());
    let slots = Slots::load(
        &file,
        &SlotsOptions {
            slots: 1,
            ctx: engine::generate::CtxRequest::Exact(64),
            ..SlotsOptions::default()
        },
    )
    .unwrap();
    (bytes, path, file, slots)
}

#[test]
fn slot_logprobs_match_the_reference_after_bias_and_penalties() {
    let Some(_ctx) = ctx() else { return };
    let (bytes, path, file, mut slots) = tiny_slot(11, "logprobs");
    let prompt = vec![1u32, 70, 260, 3, 199, 42, 70, 70];
    let bias = vec![(7u32, 1.5f32), (9, f32::NEG_INFINITY)];
    let sampler = SamplerOptions {
        temperature: 0.9,
        seed: 3,
        logprobs: Some(5),
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        repeat_penalty: 1.2,
        logit_bias: bias.clone(),
        ..SamplerOptions::default()
    };
    slots
        .submit(
            0,
            engine::Request {
                prompt: prompt.clone(),
                max_tokens: Some(12),
                sampler: sampler.clone(),
                ignore_eos: true,
                ..Default::default()
            },
        )
        .unwrap();
    let mut got: Vec<TokenLogprob> = Vec::new();
    while slots.busy() > 0 {
        slots
            .step(&mut |e| {
                if let SlotEvent::Token { logprob, id, .. } = e {
                    let lp = logprob.expect("a logprob request reports every token");
                    assert_eq!(lp.token, id);
                    got.push(lp.clone());
                }
            })
            .unwrap();
    }
    assert_eq!(got.len(), 12);

    let model = Model::from_bytes(&bytes).unwrap();
    let mut state = State::new(model.config(), 64);
    let mut logits = Vec::new();
    for (pos, &t) in prompt.iter().enumerate() {
        logits = forward(&model, &mut state, t, pos, &mut |_, _| {})
            .unwrap()
            .to_vec();
    }
    // ignore_eos bans the end-of-generation tokens: part of the shaping too
    let tok = tokenizer::Tokenizer::from_gguf(file.gguf()).unwrap();
    assert!(!tok.eog_ids().is_empty());
    let mut bias = bias;
    bias.extend(tok.eog_ids().iter().map(|&e| (e, f32::NEG_INFINITY)));
    let mut seen = prompt.clone();
    for (step, lp) in got.iter().enumerate() {
        // the shaping by hand: bias, then llama.cpp's penalties over the window (the
        // whole history here: fewer than repeat_last_n = 64 tokens)
        let mut shaped: Vec<f64> = logits.iter().map(|&l| f64::from(l)).collect();
        for &(t, b) in &bias {
            shaped[t as usize] += f64::from(b);
        }
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for &t in &seen {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &c) in &counts {
            let l = shaped[t as usize];
            let l = if l > 0.0 { l / 1.2 } else { l * 1.2 };
            shaped[t as usize] = l - c as f64 * 0.5 - 0.25;
        }
        let max = shaped.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + shaped.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        let want = |t: u32| (shaped[t as usize] - lse) as f32;
        assert!(
            (lp.logprob - want(lp.token)).abs() < TOL,
            "step {step}: token {} logprob {} vs reference {}",
            lp.token,
            lp.logprob,
            want(lp.token)
        );
        assert_eq!(lp.top.len(), 5);
        let mut sorted: Vec<f64> = shaped.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        for (k, &(t, l)) in lp.top.iter().enumerate() {
            assert!(
                (l - want(t)).abs() < TOL,
                "step {step} top {k}: {t} {l} vs {}",
                want(t)
            );
            // the k-th best, up to ties within the tolerance
            assert!(
                (f64::from(l) - (sorted[k] - lse)).abs() < f64::from(TOL),
                "step {step}: top {k} is {t} ({l}), the reference's k-th best is {}",
                sorted[k] - lse
            );
        }
        assert_ne!(lp.token, 9, "a banned token was drawn");
        seen.push(lp.token);
        let pos = seen.len() - 1;
        logits = forward(&model, &mut state, lp.token, pos, &mut |_, _| {})
            .unwrap()
            .to_vec();
    }
    let _ = std::fs::remove_file(&path);
}

/// A scored prompt (`Request::prompt_logprobs`, the server's `echo` with `logprobs`): each
/// prompt token after the first gets the log-softmax of the reference's logits at the
/// position before it, with the reference's best alternatives; the prompt is fed whole
/// even when the slot holds it already.
#[test]
fn prompt_logprobs_match_the_reference() {
    let Some(_ctx) = ctx() else { return };
    let (bytes, path, _file, mut slots) = tiny_slot(5, "prompt-lp");
    let prompt = vec![1u32, 70, 260, 3, 199, 42, 70, 70, 11, 300];
    let mut runs = Vec::new();
    for _ in 0..2 {
        let adm = slots
            .submit(
                0,
                engine::Request {
                    prompt: prompt.clone(),
                    max_tokens: Some(2),
                    sampler: SamplerOptions::greedy(),
                    prompt_logprobs: Some(3),
                    ..Default::default()
                },
            )
            .unwrap();
        // the second run finds the prompt cached and still feeds it whole
        assert_eq!(adm.reused, 0);
        let mut got: Vec<TokenLogprob> = Vec::new();
        let mut generated = 0;
        while slots.busy() > 0 {
            slots
                .step(&mut |e| match e {
                    SlotEvent::PromptLogprob { logprob, .. } => {
                        assert_eq!(generated, 0, "prompt scores come before the answer");
                        got.push(logprob.clone());
                    }
                    SlotEvent::Token { .. } => generated += 1,
                    _ => {}
                })
                .unwrap();
        }
        assert_eq!(generated, 2);
        runs.push(got);
    }
    assert_eq!(runs[0], runs[1]);
    let got = &runs[0];
    assert_eq!(got.len(), prompt.len() - 1);

    let model = Model::from_bytes(&bytes).unwrap();
    let mut state = State::new(model.config(), 64);
    for (pos, &t) in prompt[..prompt.len() - 1].iter().enumerate() {
        let logits: Vec<f64> = forward(&model, &mut state, t, pos, &mut |_, _| {})
            .unwrap()
            .iter()
            .map(|&l| f64::from(l))
            .collect();
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        let lp = &got[pos];
        assert_eq!(lp.token, prompt[pos + 1]);
        let want = (logits[lp.token as usize] - lse) as f32;
        assert!(
            (lp.logprob - want).abs() < TOL,
            "position {pos}: {} vs reference {want}",
            lp.logprob
        );
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(lp.top.len(), 3);
        for (k, &(t, l)) in lp.top.iter().enumerate() {
            assert!(((logits[t as usize] - lse) as f32 - l).abs() < TOL);
            assert!(
                (f64::from(l) - (sorted[k] - lse)).abs() < f64::from(TOL),
                "position {pos} top {k}"
            );
        }
    }
    let _ = std::fs::remove_file(&path);
}

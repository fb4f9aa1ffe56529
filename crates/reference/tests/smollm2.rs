//! Acceptance: greedy decoding of the default model matches llama.cpp's CPU
//! backend on the same files (d775b8967; docs/facts.md).
//!
//! Needs `models/SmolLM2-135M-Instruct.Q8_0.gguf` and `.Q4_1.gguf` (run `models/fetch`).

use std::path::PathBuf;
use std::time::Instant;

use gguf::GgufFile;
use reference::kernels::argmax;
use reference::{forward, generate_greedy, Model, State};

/// "The capital of France is" (llama.cpp's `llama-tokenize` on the default model).
const PROMPT: [u32; 5] = [504, 3575, 282, 4649, 314];
/// `<|im_end|>`
const EOS: u32 = 2;

fn model_path(file: &str) -> PathBuf {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")).join(file);
    assert!(
        path.exists(),
        "{} not found: run `models/fetch` first (it downloads the default model and makes the Q8_0 copy)",
        path.display()
    );
    path
}

fn load(file: &str) -> Model {
    let f = GgufFile::open(model_path(file)).expect("open model");
    let t = Instant::now();
    let m = Model::load(&f).expect("load model");
    eprintln!("{file}: loaded in {:.2?}", t.elapsed());
    m
}

/// The `n` largest logits as (id, logit), largest first.
fn top(logits: &[f32], n: usize) -> Vec<(usize, f32)> {
    let mut v: Vec<(usize, f32)> = logits.iter().copied().enumerate().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.truncate(n);
    v
}

#[test]
fn q8_0_greedy_matches_llama_cpp() {
    let model = load("SmolLM2-135M-Instruct.Q8_0.gguf");
    let cfg = model.config();
    assert_eq!(
        (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads),
        (30, 576, 9, 3)
    );
    assert!(cfg.tied_output, "SmolLM2 has no output.weight");

    // First position after the prompt: " Paris" (7042) then " the" (260).
    let mut state = State::new(cfg, 64);
    let mut layers_seen = 0;
    let mut logits = Vec::new();
    let t = Instant::now();
    for (pos, &tok) in PROMPT.iter().enumerate() {
        layers_seen = 0;
        logits = forward(&model, &mut state, tok, pos, &mut |l, x| {
            assert_eq!(l, layers_seen);
            assert_eq!(x.len(), 576);
            layers_seen += 1;
        })
        .expect("forward")
        .to_vec();
    }
    let per_token = t.elapsed() / PROMPT.len() as u32;
    eprintln!("reference forward: {per_token:.2?} per token");
    assert_eq!(layers_seen, 30, "observe is called once per layer");
    let top5 = top(&logits, 5);
    eprintln!("first-position top-5: {top5:?}");
    assert_eq!(top5[0].0, 7042, "top-5 {top5:?}");
    assert_eq!(top5[1].0, 260, "top-5 {top5:?}");
    assert_eq!(argmax(&logits), 7042);

    let expected = [
        7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33, 40, 29, 32, 33, 29, 34, 34, 216,
        33, 34, 42, 33, 34, 42, 37, 35, 30, 2,
    ];
    let got = generate_greedy(&model, &PROMPT, 48, &|id| id == EOS).expect("generate");
    assert_eq!(got, expected, "greedy ids (stops at EOS)");
}

#[test]
fn q4_1_greedy_first_five_match_llama_cpp() {
    let model = load("SmolLM2-135M-Instruct.Q4_1.gguf");
    let got = generate_greedy(&model, &PROMPT, 5, &|id| id == EOS).expect("generate");
    assert_eq!(got, [7042, 30, 198, 198, 504]);
}

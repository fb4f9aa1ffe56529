//! The prefill GEMM (`matmul_mm.comp`) end to end and at the kernel level.
//!
//! - Model: the last prompt position's logits of a chunked prefill (the GEMM, chunks of
//!   [`Session::prefill_chunk`] tokens) equal the token-by-token decode path's logits at
//!   that position within TOL (`common::LOGIT_TOL`). Lavapipe's chunk (64 tokens) takes
//!   prompts of 1, 63, 64, 65 and 191 tokens (whole and partial chunks, three chunks);
//!   chunks of 16 ([`SessionOptions::prefill_chunk`]) take 15, 16, 17, 127 and 191 (12
//!   chunks, the last one partial: as many chunk boundaries as 767 tokens in chunks of 64,
//!   which this test ran before, 53 s in CI against 21 s now; the token-by-token pass is
//!   the cost, about 25 ms a token on lavapipe on a quiet machine). One token-by-token pass
//!   over the longest prompt gives the reference logits of every shorter prompt (a
//!   prefix's last position); each prompt is then prefilled on a fresh session, so every
//!   cache row it reads is one its own chunks wrote. Q8_0 (the default model) and Q4_1;
//!   the other types are covered by the kernel tests (here and tests/kernels.rs, whose
//!   prefill keys are the GEMM's).
//! - Kernel: the GEMM against `reference::kernels::matmul` for every weight type at
//!   shapes that leave partial tiles: rows not a multiple of the 128-row tile, token counts
//!   not a multiple of the 8-token tile, several tiles in y, a word offset.

mod common;

use std::sync::Arc;

use common::gpu::*;
use common::*;
use engine::kernels::GEMM_SHAPE;
use engine::kernels::{InMode, Kernels, MatmulBindings, MatmulKey, MatmulPush, OutMode, Slot};
use engine::{Session, SessionOptions};
use gguf::GgmlType;

const TOL: f32 = LOGIT_TOL;
/// Prompt lengths and the chunk each is prefilled in (`None`: the device's, 64 on
/// lavapipe).
const CASES: [(usize, Option<usize>); 10] = [
    (1, None),
    (63, None),
    (64, None),
    (65, None),
    (191, None),
    (15, Some(16)),
    (16, Some(16)),
    (17, Some(16)),
    (127, Some(16)),
    (191, Some(16)),
];
/// The longest prompt, and the context of every session.
const LONGEST: usize = 191;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `n` prompt tokens of English text through the model's tokenizer.
fn prompt(file: &gguf::GgufFile, n: usize) -> Vec<u32> {
    let tok = tokenizer::Tokenizer::from_gguf(file.gguf()).unwrap();
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut i = 0;
    while ids.len() < n {
        text.push_str(&format!(
            "Chapter {i}. The river ran past the mill, and the miller counted {} sacks of \
             flour before the rain came down over the valley. ",
            i * 7 + 3
        ));
        ids = tok.encode(&text, false, false).unwrap();
        i += 1;
    }
    ids.truncate(n);
    ids
}

/// Chunked GEMM prefill against token-by-token decode for each of [`CASES`].
fn check_model(name: &str) {
    let Some(ctx) = ctx() else { return };
    let file = Arc::new(gguf::GgufFile::open(model_path(name)).unwrap());
    let opts = |chunk: Option<usize>| SessionOptions {
        ctx_len: LONGEST + 1,
        prefill_chunk: chunk,
        ..SessionOptions::default()
    };
    let mut s = Session::new(Arc::clone(&ctx), file.clone(), &opts(None)).unwrap();
    let device_chunk = s.prefill_chunk();
    let ids = prompt(&file, LONGEST);
    // token by token: the logits after each length's last token
    let mut want: Vec<Option<Vec<f32>>> = vec![None; LONGEST + 1];
    for (pos, &t) in ids.iter().enumerate() {
        if CASES.iter().any(|&(n, _)| n == pos + 1) {
            want[pos + 1] = Some(s.decode_logits(t).unwrap().to_vec());
        } else {
            s.decode_argmax(t).unwrap();
        }
    }
    drop(s);
    // each prompt on a session of its own: a reset keeps the cache rows, so the rows
    // token by token (or a previous prompt) wrote would hide a chunk that writes none
    for (n, chunk) in CASES {
        let mut s = Session::new(Arc::clone(&ctx), file.clone(), &opts(chunk)).unwrap();
        assert_eq!(
            s.prefill_chunk(),
            chunk.map_or(device_chunk, |c| c.min(device_chunk))
        );
        s.prefill(&ids[..n]).unwrap();
        let got = s.last_logits().unwrap();
        let d = max_diff(got, want[n].as_ref().unwrap());
        println!(
            "{name}: {n} tokens in chunks of {}: max |diff| {d:.2e}",
            s.prefill_chunk()
        );
        assert!(
            d <= TOL,
            "{name}: a {n}-token prompt in chunks of {} differs from token-by-token by {d}",
            s.prefill_chunk()
        );
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn chunked_gemm_prefill_matches_token_by_token_q8_0() {
    check_model("SmolLM2-135M-Instruct.Q8_0.gguf");
}

#[test]
fn chunked_gemm_prefill_matches_token_by_token_q4_1() {
    check_model("SmolLM2-135M-Instruct.Q4_1.gguf");
}

/// Deterministic values in about ±1.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0) - 1.0)
        .collect()
}

/// The GEMM (engine's prefill key, Add epilogue) against the CPU matmul for every type:
/// 202 rows (a full 128-row tile and a partial one), 192 and 704 columns, 1, 2, 13 and
/// 21 tokens (partial 8-token tiles, up to three tiles in y), weights at a word offset;
/// at 1 and 2 tokens the small tile (`MatmulKey::for_tokens`) gives the same bits.
#[test]
fn gemm_matches_cpu_matmul_at_odd_shapes() {
    let Some(ctx) = ctx() else { return };
    let mut ks = Kernels::new(&ctx).unwrap();
    assert!(ks.gemm_supported(), "lavapipe runs the GEMM");
    let rows = 202;
    let dummy = zeros(&ctx, "dummy", 4);
    let step = step_buffer(&ctx, 0, &[], &[]);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::F16,
        GgmlType::F32,
    ] {
        let dummy_w = wview(&ctx, &dummy, ty);
        for cols in [192, 704] {
            let w = gguf::quant::quantize(ty, &values(rows * cols, 1)).unwrap();
            // 64 bytes in front: the view's rows start at word 16
            let mut bytes = vec![0xA5u8; 64];
            bytes.extend_from_slice(&w);
            let (_wbuf, wv) = weight_view(&ctx, "w", &bytes, ty);
            for n_tok in [1, 2, 13, 21] {
                let x = values(n_tok * cols, 2 + n_tok);
                let xbuf = upload(&ctx, "x", &x);
                let xv = xview(&ctx, &xbuf);
                let mut want = vec![0.0; n_tok * rows];
                reference::kernels::matmul(ty, &w, rows, cols, &x, n_tok, &mut want).unwrap();
                let out = zeros(&ctx, "out", n_tok * rows);
                let key = MatmulKey {
                    wtype: ty,
                    in_mode: InMode::Plain,
                    out_mode: OutMode::Add,
                    wg: GEMM_SHAPE.wg,
                    pairs: GEMM_SHAPE.pairs,
                    tb: GEMM_SHAPE.tb,
                    split_k: 0,
                    texel_aligned: false,
                };
                assert!(
                    key.kernel().unwrap().name().starts_with("matmul_mm."),
                    "the prefill key names the GEMM"
                );
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
                let slots = [Slot {
                    slot: 0,
                    nrows: rows as u32,
                    wofs: 16,
                    orow: 0,
                }];
                dispatch_matmul(&ctx, &mut ks, key, &bindings, push, &slots);
                let got = read_f32(&out, n_tok * rows);
                // one or two tokens: the small tile gives the same bits as the full one
                // (the serving slots' batch invariance rests on it)
                let small = key.for_tokens(n_tok as u32);
                assert_eq!(small != key, n_tok <= 2, "the small tile takes 1-2 tokens");
                if small != key {
                    assert_eq!(small.tb, engine::kernels::GEMM_SMALL_TILE);
                    let out_s = zeros(&ctx, "out_small", n_tok * rows);
                    let bindings = MatmulBindings {
                        out0: out_s.binding(),
                        ..bindings
                    };
                    dispatch_matmul(&ctx, &mut ks, small, &bindings, push, &slots);
                    let got_s = read_f32(&out_s, n_tok * rows);
                    for (i, (g, s)) in got.iter().zip(&got_s).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            s.to_bits(),
                            "{ty:?} {cols} columns, {n_tok} tokens, element {i}: tile {} {g} vs tile {} {s}",
                            key.tb,
                            small.tb
                        );
                    }
                }
                // f32 sums of `cols` products of magnitude <= 1, in another order
                let tol = 1e-5 * cols as f32;
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= tol,
                        "{ty:?} {cols} columns, {n_tok} tokens: token {} row {}: gpu {g} vs cpu {e}",
                        i / rows,
                        i % rows
                    );
                }
            }
        }
    }
    drop(ks);
    assert_no_validation_errors(&ctx);
}

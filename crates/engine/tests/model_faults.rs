//! Broken models give a typed error, never a wrong token: a tiny synthetic
//! model (the project's own GGUF writer) with one tensor spoiled in a temporary copy.

mod common;

use std::sync::Arc;

use common::*;
use engine::ActivationSizes;
use engine::{EngineError, Session, SessionOptions};
use gguf::GgmlType;

/// A tiny model whose `output_norm.weight` holds a NaN: every logit is NaN, and the
/// GPU's greedy path must say so instead of answering token 0.
#[test]
fn nan_logits_are_an_error_not_token_zero() {
    let Some(ctx) = ctx() else { return };
    let mut bytes = reference::synthetic::tiny_llama(7, 2, 64, 4, 2, 128, 320, GgmlType::Q8_0);
    let g = gguf::Gguf::parse(&bytes).unwrap();
    let t = g.tensor("output_norm.weight").unwrap();
    assert_eq!(t.ty, GgmlType::F32);
    let at = (g.data_offset + t.offset) as usize;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let path = std::env::temp_dir().join(format!("vkdecode-nan-norm-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let file = Arc::new(gguf::GgufFile::open(&path).unwrap());
    let mut s = Session::new(
        Arc::clone(&ctx),
        file,
        &SessionOptions {
            ctx_len: 32,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    s.prefill(&[1, 5, 9]).unwrap();
    match s.last_argmax() {
        Err(EngineError::NonFiniteLogits { pos }) => assert_eq!(pos, 2),
        other => panic!("prefill: expected NonFiniteLogits, got {other:?}"),
    }
    match s.decode_argmax(4) {
        Err(EngineError::NonFiniteLogits { pos }) => assert_eq!(pos, 3),
        other => panic!("decode: expected NonFiniteLogits, got {other:?}"),
    }
    // the logits themselves are there to inspect
    assert!(s.last_logits().unwrap().iter().all(|v| v.is_nan()));
    drop(s);
    let _ = std::fs::remove_file(&path);
    assert_no_validation_errors(&ctx);
}

/// A context whose KV cache size overflows 64 bits (a crafted `context_length` of 2^58:
/// `ctx_len · kv_dim · 4` wrapped, and the shaders wrote past tiny caches) is an error
/// that names the context length, never a wrapped size.
#[test]
fn a_context_whose_cache_size_overflows_is_refused() {
    let bytes = reference::synthetic::tiny_llama(7, 2, 64, 4, 2, 128, 320, GgmlType::Q8_0);
    let cfg = arch::Config::from_gguf(&gguf::Gguf::parse(&bytes).unwrap()).unwrap();
    match ActivationSizes::new(&cfg, 1 << 58, 64) {
        Err(e @ EngineError::ContextTooLarge { ctx_len, .. }) => {
            assert_eq!(ctx_len, 1 << 58);
            assert!(e.to_string().contains("288230376151711744"), "{e}");
        }
        other => panic!("expected ContextTooLarge, got {other:?}"),
    }
    let ok = ActivationSizes::new(&cfg, 64, 64).unwrap();
    assert_eq!(ok.kv, 64 * cfg.kv_dim() as u64 * 2);
}

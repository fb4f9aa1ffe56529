//! The reference's part: a crafted `context_length` (2^58, 2^32-1, 2^64-1)
//! used to wrap `ctx_len·kv_dim`, then panic ("range end index 192 out of range for slice
//! of length 0") or abort on allocation ("memory allocation of 3298534882560 bytes
//! failed", "capacity overflow"). The KV cache is now sized with checked arithmetic and
//! allocated fallibly: the answer is a typed error naming the context and the bytes.

mod common;

use common::{rewrite, tiny};
use gguf::{Gguf, Value};
use reference::state::kv_cache_bytes;
use reference::{generate_greedy, Config, Model, RefError, State};

/// SmolLM2-135M's shape (30 layers, 3 kv heads of 64), the file a hostile context length was first seen on.
fn smollm2_shape() -> Config {
    let tiny = Config::from_gguf(&Gguf::parse(&tiny()).unwrap()).unwrap();
    Config {
        n_layers: 30,
        dim: 576,
        hidden_dim: 1536,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        vocab_size: 49152,
        context_length: 8192,
        ..tiny
    }
}

#[test]
fn crafted_context_lengths_are_errors_naming_context_and_bytes() {
    for cfg in [
        smollm2_shape(),
        Config::from_gguf(&Gguf::parse(&tiny()).unwrap()).unwrap(),
    ] {
        for ctx in [1usize << 58, (1usize << 32) - 1, usize::MAX, 3_000_000_000] {
            let err = State::try_new(&cfg, ctx).unwrap_err();
            let bytes = kv_cache_bytes(&cfg, ctx);
            assert!(
                matches!(err, RefError::ContextTooLarge { ctx_len, bytes: b, .. } if ctx_len == ctx && b == bytes),
                "{err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(&ctx.to_string()), "{msg}");
            assert!(msg.contains(&bytes.to_string()), "{msg}");
        }
    }
    // A claimed context of 2^32-1 on SmolLM2: 2 x 30 layers x (2^32-1) x 192 x 2 bytes.
    assert_eq!(
        kv_cache_bytes(&smollm2_shape(), (1 << 32) - 1),
        2 * 30 * ((1u128 << 32) - 1) * 192 * 2
    );
}

#[test]
fn a_file_claiming_a_huge_context_is_refused_by_name_and_short_runs_still_work() {
    for ctx in [1u64 << 58, (1 << 32) - 1, u64::MAX] {
        let bytes = rewrite(&tiny(), |meta, _| {
            let slot = meta
                .iter_mut()
                .find(|(k, _)| k == "llama.context_length")
                .unwrap();
            slot.1 = Value::U64(ctx);
        });
        // The model description refuses the claim (arch's validation), naming the key:
        // not a panic, an abort, or a cache sized from a wrapped product.
        let err = Model::from_bytes(&bytes).unwrap_err().to_string();
        assert!(err.contains("llama.context_length"), "{err}");
    }
    // A valid model asked for such a context at run time: refused by the cache's sizing,
    // and a run of what it needs still works.
    let model = Model::from_bytes(&tiny()).unwrap();
    for ctx in [1usize << 58, usize::MAX] {
        let err = State::try_new(model.config(), ctx).unwrap_err();
        assert!(matches!(err, RefError::ContextTooLarge { .. }), "{err}");
    }
    let ids = generate_greedy(&model, &[5, 6, 7], 4, &|_| false).unwrap();
    assert_eq!(ids.len(), 4);
}

#[test]
fn state_sized_normally_still_works() {
    let cfg = Config::from_gguf(&Gguf::parse(&tiny()).unwrap()).unwrap();
    let s = State::try_new(&cfg, 256).unwrap();
    assert_eq!(s.key_cache.len(), 2);
    assert!(s.key_cache.iter().all(|c| c.len() == 256 * 32));
    assert_eq!(kv_cache_bytes(&cfg, 256), 2 * 2 * 256 * 32 * 2);
}

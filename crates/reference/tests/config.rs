//! `Config::from_gguf` on tiny synthetic files: what it reads, and the errors it gives for
//! a missing key, an unsupported architecture, a missing tensor and a wrong shape.

mod common;

use common::{as_qwen2, rewrite, tiny};
use gguf::{GgmlType, Gguf, Value};
use reference::{Arch, Config, ConfigError, FfnAct, RopeMode};

fn config_of(bytes: &[u8]) -> Result<Config, ConfigError> {
    Config::from_gguf(&Gguf::parse(bytes).unwrap())
}

fn set(meta: &mut [(String, Value)], key: &str, v: Value) {
    let slot = meta.iter_mut().find(|(k, _)| k == key).expect("key exists");
    slot.1 = v;
}

#[test]
fn reads_the_synthetic_models_hyper_parameters() {
    let cfg = config_of(&tiny()).unwrap();
    assert_eq!(
        cfg,
        Config {
            arch: Arch::Llama,
            n_layers: 2,
            dim: 64,
            hidden_dim: 128,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            vocab_size: 300,
            context_length: 256,
            rms_eps: 1e-5,
            rope_base: 10_000.0,
            rope_scale: 1.0,
            rope_mode: RopeMode::Normal,
            rope_freqs: false,
            tied_output: false,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            ffn_act: FfnAct::Silu,
            embd_scale: 1.0,
            attn_scale: 0.25,
            final_logit_softcap: None,
            sliding_window: None,
        }
    );
    assert_eq!(cfg.kv_dim(), 32);
}

#[test]
fn missing_key_is_named() {
    let bytes = rewrite(&tiny(), |meta, _| {
        meta.retain(|(k, _)| k != "llama.block_count")
    });
    let err = config_of(&bytes).unwrap_err();
    assert!(
        matches!(err, ConfigError::MissingKey(ref k) if k == "llama.block_count"),
        "{err}"
    );
    assert_eq!(err.to_string(), "missing metadata key 'llama.block_count'");
}

#[test]
fn absurd_layer_count_is_rejected_before_use() {
    let bytes = rewrite(&tiny(), |meta, _| {
        set(meta, "llama.block_count", Value::U64(1 << 40))
    });
    let msg = config_of(&bytes).unwrap_err().to_string();
    assert!(
        msg.contains("llama.block_count") && msg.contains("1099511627776 layers"),
        "{msg}"
    );
}

#[test]
fn wrongly_typed_key_is_named() {
    let bytes = rewrite(&tiny(), |meta, _| {
        set(meta, "llama.embedding_length", Value::String("64".into()))
    });
    let err = config_of(&bytes).unwrap_err().to_string();
    assert!(
        err.contains("llama.embedding_length") && err.contains("integer"),
        "{err}"
    );
}

#[test]
fn unsupported_architecture_is_named() {
    let bytes = rewrite(&tiny(), |meta, _| {
        set(meta, "general.architecture", Value::String("mamba".into()))
    });
    let err = config_of(&bytes).unwrap_err();
    assert!(
        matches!(err, ConfigError::UnsupportedArch(ref a) if a == "mamba"),
        "{err}"
    );
    assert!(err.to_string().contains("'mamba'"), "{err}");
}

#[test]
fn wrong_tensor_shape_names_tensor_expected_and_found() {
    let bytes = rewrite(&tiny(), |_, tensors| {
        let t = tensors
            .iter_mut()
            .find(|t| t.name == "blk.1.ffn_up.weight")
            .unwrap();
        t.shape = vec![64, 96];
        t.data = gguf::quant::quantize_q8_0(&vec![0.5; 64 * 96]).unwrap();
    });
    let err = config_of(&bytes).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ConfigError::TensorShape { ref name, ref found, .. } if name == "blk.1.ffn_up.weight" && found == &[64, 96]),
        "{msg}"
    );
    assert!(
        msg.contains("[64, 96]") && msg.contains("[64, 128]"),
        "{msg}"
    );
}

#[test]
fn metadata_disagreeing_with_shapes_is_caught() {
    // Without head_count_kv the model would have 4 kv heads: attn_k must then be 64 rows.
    let bytes = rewrite(&tiny(), |meta, _| {
        meta.retain(|(k, _)| k != "llama.attention.head_count_kv")
    });
    let msg = config_of(&bytes).unwrap_err().to_string();
    assert!(
        msg.contains("blk.0.attn_k.weight") && msg.contains("[64, 32]") && msg.contains("[64, 64]"),
        "{msg}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let bytes = rewrite(&tiny(), |_, tensors| {
        tensors.retain(|t| t.name != "blk.0.ffn_norm.weight")
    });
    let err = config_of(&bytes).unwrap_err();
    assert_eq!(err.to_string(), "missing tensor 'blk.0.ffn_norm.weight'");
}

#[test]
fn tied_output_when_output_weight_is_absent() {
    let bytes = rewrite(&tiny(), |_, tensors| {
        tensors.retain(|t| t.name != "output.weight")
    });
    assert!(config_of(&bytes).unwrap().tied_output);
}

#[test]
fn qwen2_needs_biases_and_uses_neox_rope() {
    let err = config_of(&as_qwen2(&tiny(), None)).unwrap_err();
    assert_eq!(err.to_string(), "missing tensor 'blk.0.attn_q.bias'");
    let cfg = config_of(&as_qwen2(&tiny(), Some(0.0))).unwrap();
    assert_eq!(cfg.arch, Arch::Qwen2);
    assert_eq!(cfg.rope_mode, RopeMode::Neox);
    assert_eq!((cfg.n_layers, cfg.dim, cfg.kv_dim()), (2, 64, 32));
}

#[test]
fn qwen3_and_gemma3_name_their_missing_or_misshapen_tensors() {
    use reference::synthetic::{tiny_gemma3, tiny_qwen3};
    let qwen3 = tiny_qwen3(1, GgmlType::Q8_0);
    let bytes = rewrite(&qwen3, |_, t| {
        t.retain(|t| t.name != "blk.1.attn_k_norm.weight")
    });
    assert_eq!(
        config_of(&bytes).unwrap_err().to_string(),
        "missing tensor 'blk.1.attn_k_norm.weight'"
    );
    // A Q norm over the whole query (q_dim) instead of one head (head_dim 32).
    let bytes = rewrite(&qwen3, |_, t| {
        let n = t
            .iter_mut()
            .find(|t| t.name == "blk.0.attn_q_norm.weight")
            .unwrap();
        n.shape = vec![128];
        n.data = gguf::quant::quantize_f32(&[1.0; 128]);
    });
    let msg = config_of(&bytes).unwrap_err().to_string();
    assert!(
        msg.contains("blk.0.attn_q_norm.weight") && msg.contains("[32]"),
        "{msg}"
    );

    let gemma3 = tiny_gemma3(1, GgmlType::Q8_0, 4);
    for name in [
        "blk.2.post_ffw_norm.weight",
        "blk.0.post_attention_norm.weight",
    ] {
        let bytes = rewrite(&gemma3, |_, t| t.retain(|t| t.name != name));
        assert_eq!(
            config_of(&bytes).unwrap_err().to_string(),
            format!("missing tensor '{name}'")
        );
    }
}

#[test]
fn gemma3_window_keys_and_their_defaults() {
    use reference::synthetic::tiny_gemma3;
    let gemma3 = tiny_gemma3(1, GgmlType::Q8_0, 4);
    let sw = config_of(&gemma3).unwrap().sliding_window.unwrap();
    assert_eq!((sw.window, sw.period, sw.rope_base), (4, 3, 10_000.0));
    // Without the pattern and the local base: llama.cpp's defaults, 6 and 10000.
    let bytes = rewrite(&gemma3, |meta, _| {
        meta.retain(|(k, _)| {
            k != "gemma3.attention.sliding_window_pattern" && k != "gemma3.rope.freq_base_swa"
        })
    });
    let sw = config_of(&bytes).unwrap().sliding_window.unwrap();
    assert_eq!((sw.window, sw.period, sw.rope_base), (4, 6, 10_000.0));
    // Without the window key (or 0), every layer is global.
    let bytes = rewrite(&gemma3, |meta, _| {
        set(meta, "gemma3.attention.sliding_window", Value::U32(0))
    });
    let cfg = config_of(&bytes).unwrap();
    assert_eq!(cfg.sliding_window, None);
    assert_eq!(cfg.layer_attention(0).rope_base, 1_000_000.0);
    // A local RoPE base that makes no sense is refused.
    let bytes = rewrite(&gemma3, |meta, _| {
        set(meta, "gemma3.rope.freq_base_swa", Value::F32(-1.0))
    });
    let msg = config_of(&bytes).unwrap_err().to_string();
    assert!(msg.contains("gemma3.rope.freq_base_swa"), "{msg}");
    // The same keys on a family that has no sliding window are ignored, as llama.cpp does.
    let qwen3 = rewrite(
        &reference::synthetic::tiny_qwen3(1, GgmlType::Q8_0),
        |meta, _| meta.push(("qwen3.attention.sliding_window".into(), Value::U32(4))),
    );
    assert_eq!(config_of(&qwen3).unwrap().sliding_window, None);
}

#[test]
fn unknown_architecture_lists_the_known_ones() {
    let bytes = rewrite(&tiny(), |meta, _| {
        set(meta, "general.architecture", Value::String("mamba".into()))
    });
    assert_eq!(
        config_of(&bytes).unwrap_err().to_string(),
        "unsupported architecture 'mamba' (supported: llama, qwen2, qwen3, gemma3)"
    );
}

#[test]
fn a_huge_key_length_is_refused_before_any_width_is_multiplied() {
    for v in [1u64 << 40, u64::MAX - 1] {
        let bytes = rewrite(&tiny(), |meta, _| {
            meta.push(("llama.attention.key_length".into(), Value::U64(v)))
        });
        let err = config_of(&bytes).unwrap_err();
        assert!(
            err.to_string().contains("widths out of range"),
            "key_length {v}: {err}"
        );
    }
}

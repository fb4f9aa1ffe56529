//! The families beyond llama on tiny synthetic models (qwen2, qwen3, gemma3, Llama 3's
//! `rope_freqs`): they load through the model description, decode, and each feature the
//! description names is shown to be applied the way it says (a test here fails when a
//! Q/K norm is dropped or made whole-vector, a sliding window is ignored, or the RoPE
//! divisors are not read).

mod common;

use common::{rewrite, Tensor};
use gguf::{GgmlType, Gguf};
use reference::synthetic::{
    tiny_gemma3, tiny_llama, tiny_llama3, tiny_model, tiny_qwen2, tiny_qwen3, TinySpec,
};
use reference::{forward, forward_layers, generate_greedy, Arch, Config, FfnAct, Model, State};

fn config_of(bytes: &[u8]) -> Config {
    Config::from_gguf(&Gguf::parse(bytes).unwrap()).unwrap()
}

/// Logits after feeding `tokens` from position 0.
fn logits_after(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut state = State::new(model.config(), tokens.len());
    let (last, head) = tokens.split_last().unwrap();
    for (pos, &t) in head.iter().enumerate() {
        forward_layers(model, &mut state, t, pos, &mut |_, _| {}).unwrap();
    }
    forward(model, &mut state, *last, head.len(), &mut |_, _| {})
        .unwrap()
        .to_vec()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Multiplies the f32 data of tensor `name` elementwise by `f(index)`.
fn scale_tensor(tensors: &mut [Tensor], name: &str, f: impl Fn(usize) -> f32) {
    let t = tensors.iter_mut().find(|t| t.name == name).expect(name);
    assert_eq!(t.ty, GgmlType::F32, "{name} must be F32 to edit");
    for (i, c) in t.data.chunks_exact_mut(4).enumerate() {
        let v = f32::from_le_bytes(c.try_into().unwrap()) * f(i);
        c.copy_from_slice(&v.to_le_bytes());
    }
}

const PROMPT: [u32; 6] = [5, 77, 140, 9, 300, 12];

#[test]
fn every_family_loads_through_the_description_and_decodes() {
    let cases = [
        ("qwen2", tiny_qwen2(11, GgmlType::Q8_0)),
        ("qwen3", tiny_qwen3(12, GgmlType::Q8_0)),
        ("gemma3", tiny_gemma3(13, GgmlType::Q8_0, 4)),
        ("llama3", tiny_llama3(14, GgmlType::Q8_0)),
    ];
    let mut all_logits = Vec::new();
    for (name, bytes) in &cases {
        let cfg = config_of(bytes);
        let (arch, qkv_bias, qk_norm, post_norms, act, tied, freqs) = match *name {
            "qwen2" => (Arch::Qwen2, true, false, false, FfnAct::Silu, false, false),
            "qwen3" => (Arch::Qwen3, false, true, false, FfnAct::Silu, true, false),
            "gemma3" => (
                Arch::Gemma3,
                false,
                true,
                true,
                FfnAct::GeluTanh,
                true,
                false,
            ),
            _ => (Arch::Llama, false, false, false, FfnAct::Silu, false, true),
        };
        assert_eq!(cfg.arch, arch, "{name}");
        assert_eq!(
            (
                cfg.qkv_bias,
                cfg.qk_norm,
                cfg.post_norms,
                cfg.ffn_act,
                cfg.tied_output,
                cfg.rope_freqs
            ),
            (qkv_bias, qk_norm, post_norms, act, tied, freqs),
            "{name}"
        );
        assert_eq!(
            cfg.expected_tensors().len(),
            Gguf::parse(bytes).unwrap().tensors.len(),
            "{name}: every tensor in the file is one the description expects"
        );
        let model = Model::from_bytes(bytes).unwrap();
        let logits = logits_after(&model, &PROMPT);
        assert!(logits.iter().all(|v| v.is_finite()), "{name}");
        let ids = generate_greedy(&model, &PROMPT, 32, &|_| false).unwrap();
        assert_eq!(ids.len(), 32, "{name}");
        assert!(ids.iter().all(|&i| (i as usize) < cfg.vocab_size), "{name}");
        all_logits.push(logits);
    }
    // gemma3's options as the description gives them.
    let cfg = config_of(&cases[2].1);
    assert_eq!(cfg.embd_scale, 8.0, "sqrt(dim 64)");
    assert_eq!(cfg.attn_scale, 0.125, "1/sqrt(head_dim 64)");
    assert_eq!(cfg.final_logit_softcap, Some(30.0));
    assert!(all_logits[2].iter().all(|v| v.abs() < 30.0), "softcapped");
    assert_eq!((cfg.q_dim(), cfg.kv_dim()), (128, 64));
}

#[test]
fn gemma3_layers_alternate_sliding_window_and_global_with_their_own_rope_base() {
    let cfg = config_of(&tiny_gemma3(1, GgmlType::F32, 4));
    for l in 0..3 {
        let la = cfg.layer_attention(l);
        if l == 2 {
            assert_eq!((la.window, la.rope_base), (None, 1_000_000.0), "layer {l}");
        } else {
            assert_eq!((la.window, la.rope_base), (Some(4), 10_000.0), "layer {l}");
        }
        assert_eq!(la.rope_scale, 1.0);
    }
    assert_eq!(cfg.layer_attention(0).first_visible(10), 7);
    assert_eq!(cfg.layer_attention(0).first_visible(2), 0);
    assert_eq!(cfg.layer_attention(2).first_visible(10), 0);
}

#[test]
fn gemma3_sliding_window_layers_never_read_past_their_window() {
    let model = Model::from_bytes(&tiny_gemma3(2, GgmlType::F32, 4)).unwrap();
    let cfg = model.config().clone();
    let tokens: Vec<u32> = (0..12).map(|i| 20 + 7 * i).collect();
    let n = tokens.len();
    let mut state = State::new(&cfg, n);
    for (pos, &t) in tokens[..n - 1].iter().enumerate() {
        forward_layers(&model, &mut state, t, pos, &mut |_, _| {}).unwrap();
    }
    let pos = n - 1;
    let clean = state.clone();
    let want = forward(&model, &mut state.clone(), tokens[pos], pos, &mut |_, _| {})
        .unwrap()
        .to_vec();

    // Poison every cached position the sliding-window layers must not see: unchanged.
    let kv = cfg.kv_dim();
    let mut poisoned = clean.clone();
    for l in 0..2 {
        let first = cfg.layer_attention(l).first_visible(pos);
        assert_eq!(first, 8);
        poisoned.key_cache[l][..first * kv].fill(half::f16::NAN);
        poisoned.value_cache[l][..first * kv].fill(half::f16::NAN);
    }
    let got = forward(&model, &mut poisoned, tokens[pos], pos, &mut |_, _| {}).unwrap();
    assert_eq!(
        got,
        &want[..],
        "a sliding-window layer read outside its window"
    );

    // The same poison in the global layer reaches the logits (it sees everything), and
    // the first in-window position of a local layer is read.
    let mut global = clean.clone();
    global.value_cache[2][..kv].fill(half::f16::NAN);
    let got = forward(&model, &mut global, tokens[pos], pos, &mut |_, _| {}).unwrap();
    assert!(
        got.iter().all(|v| v.is_nan()),
        "the global layer ignored position 0"
    );
    let mut edge = clean.clone();
    edge.value_cache[0][8 * kv..9 * kv].fill(half::f16::NAN);
    let got = forward(&model, &mut edge, tokens[pos], pos, &mut |_, _| {}).unwrap();
    assert!(
        got.iter().all(|v| v.is_nan()),
        "position 8 is inside the window of 4 at 11"
    );
}

#[test]
fn qk_norms_are_per_head_and_applied() {
    // Scaling head 0's rows of attn_q (and kv head 0's rows of attn_k) by 3 leaves a model
    // with per-head Q/K norms unchanged (up to eps), and changes one without them.
    let tokens = &PROMPT;
    let scale_head0 = |bytes: &[u8], hd: usize| {
        rewrite(bytes, |_, tensors| {
            for l in 0..2 {
                for n in ["attn_q.weight", "attn_k.weight"] {
                    // Rows are `dim` long; head 0 is rows 0..hd.
                    scale_tensor(tensors, &format!("blk.{l}.{n}"), |i| {
                        if i < hd * 64 {
                            3.0
                        } else {
                            1.0
                        }
                    });
                }
            }
        })
    };
    for (name, bytes, hd) in [
        ("qwen3", tiny_qwen3(3, GgmlType::F32), 32),
        ("gemma3", tiny_gemma3(3, GgmlType::F32, 4), 64),
    ] {
        let base = logits_after(&Model::from_bytes(&bytes).unwrap(), tokens);
        let scaled = logits_after(
            &Model::from_bytes(&scale_head0(&bytes, hd)).unwrap(),
            tokens,
        );
        let d = max_diff(&base, &scaled);
        assert!(
            d < 1e-3,
            "{name}: scaling one head of Q/K moved logits by {d}"
        );
        // The norm weights are read: doubling layer 0's q norm changes the output.
        let doubled = rewrite(&bytes, |_, t| {
            scale_tensor(t, "blk.0.attn_q_norm.weight", |_| 2.0)
        });
        let d = max_diff(
            &base,
            &logits_after(&Model::from_bytes(&doubled).unwrap(), tokens),
        );
        assert!(d > 1e-2, "{name}: attn_q_norm ignored (diff {d})");
    }
    let llama = tiny_llama(3, 2, 64, 4, 2, 128, 320, GgmlType::F32);
    let base = logits_after(&Model::from_bytes(&llama).unwrap(), tokens);
    let scaled = logits_after(
        &Model::from_bytes(&scale_head0(&llama, 16)).unwrap(),
        tokens,
    );
    assert!(
        max_diff(&base, &scaled) > 1e-2,
        "without Q/K norms the scale must matter"
    );
}

#[test]
fn llama3_rope_freqs_divide_the_frequencies() {
    let bytes = tiny_llama3(4, GgmlType::F32);
    let model = Model::from_bytes(&bytes).unwrap();
    let freqs = model.rope_freqs.as_ref().expect("rope_freqs.weight loaded");
    assert_eq!(freqs.len(), 8, "head_dim 16 / 2");
    assert_eq!((freqs[0], freqs[7]), (1.0, 8.0));

    // All divisors 1: exactly the model without the tensor.
    let ones = rewrite(&bytes, |_, t| {
        let r = t
            .iter_mut()
            .find(|t| t.name == "rope_freqs.weight")
            .unwrap();
        r.data = gguf::quant::quantize_f32(&[1.0; 8]);
    });
    let without = rewrite(&bytes, |_, t| t.retain(|t| t.name != "rope_freqs.weight"));
    assert!(!config_of(&without).rope_freqs);
    let l_ones = logits_after(&Model::from_bytes(&ones).unwrap(), &PROMPT);
    let l_without = logits_after(&Model::from_bytes(&without).unwrap(), &PROMPT);
    assert_eq!(l_ones, l_without);
    // The real divisors change the output (position > 0 only: position 0 is unrotated).
    let l_freqs = logits_after(&model, &PROMPT);
    assert!(max_diff(&l_freqs, &l_without) > 1e-3);
    assert_eq!(
        logits_after(&model, &PROMPT[..1]),
        logits_after(&Model::from_bytes(&without).unwrap(), &PROMPT[..1])
    );
}

#[test]
fn linear_rope_scaling_is_read_and_other_kinds_refused() {
    let bytes = tiny_model(&TinySpec::new(Arch::Qwen3, 5, GgmlType::Q8_0));
    let with = |ty: &str, factor: f32| {
        rewrite(&bytes, |meta, _| {
            meta.push((
                "qwen3.rope.scaling.type".into(),
                gguf::Value::String(ty.into()),
            ));
            meta.push(("qwen3.rope.scaling.factor".into(), gguf::Value::F32(factor)));
        })
    };
    assert_eq!(config_of(&bytes).rope_scale, 1.0);
    assert_eq!(config_of(&with("linear", 4.0)).rope_scale, 0.25);
    let err = Config::from_gguf(&Gguf::parse(&with("yarn", 4.0)).unwrap()).unwrap_err();
    assert!(err.to_string().contains("yarn"), "{err}");
    let err = Config::from_gguf(&Gguf::parse(&with("linear", -2.0)).unwrap()).unwrap_err();
    assert!(err.to_string().contains("-2"), "{err}");
}

//! The forward pass on tiny synthetic models: checked against the same steps computed
//! straight from the packed GGUF bytes with the kernels, and for its error handling.

mod common;

use common::{as_qwen2, tiny};
use gguf::{GgmlType, Gguf};
use reference::kernels::{self, argmax, RopeMode};
use reference::synthetic::tiny_llama;
use reference::{forward, generate_greedy, Model, RefError, State};

/// The forward pass written again over the packed weights: every matvec through
/// `kernels::matvec` on the tensor's own bytes, the embedding through
/// `kernels::embedding_row`. Returns the residual stream after each layer and the logits.
fn forward_from_packed(bytes: &[u8], tokens: &[u32]) -> (Vec<Vec<f32>>, Vec<f32>) {
    let g = Gguf::parse(bytes).unwrap();
    let cfg = reference::Config::from_gguf(&g).unwrap();
    let (dim, hd, kvd, hid) = (cfg.dim, cfg.head_dim, cfg.kv_dim(), cfg.hidden_dim);
    let t = |n: &str| {
        let t = g.tensor(n).unwrap();
        (t.ty, g.tensor_data(bytes, t))
    };
    let mv = |n: &str, x: &[f32], rows: usize| {
        let (ty, w) = t(n);
        let mut out = vec![0.0; rows];
        kernels::matvec(ty, w, rows, x.len(), x, &mut out).unwrap();
        out
    };
    let vecf = |n: &str| {
        let (ty, w) = t(n);
        let len = g.tensor(n).unwrap().n_elements() as usize;
        gguf::quant::dequantize_row(ty, w, len).unwrap()
    };
    let mut kc = vec![Vec::new(); cfg.n_layers];
    let mut vc = vec![Vec::new(); cfg.n_layers];
    let mut layers_x = Vec::new();
    let mut logits = Vec::new();
    for (pos, &tok) in tokens.iter().enumerate() {
        let mut x = vec![0.0; dim];
        let (ety, etab) = t("token_embd.weight");
        kernels::embedding_row(ety, etab, dim, tok as usize, &mut x).unwrap();
        layers_x.clear();
        for l in 0..cfg.n_layers {
            let b = |n: &str| format!("blk.{l}.{n}");
            let mut xb = vec![0.0; dim];
            kernels::rmsnorm(&x, &vecf(&b("attn_norm.weight")), cfg.rms_eps, &mut xb);
            let mut q = mv(&b("attn_q.weight"), &xb, cfg.n_heads * hd);
            let mut k = mv(&b("attn_k.weight"), &xb, kvd);
            let v = mv(&b("attn_v.weight"), &xb, kvd);
            kernels::rope(
                &mut q,
                cfg.n_heads,
                hd,
                pos,
                cfg.rope_base,
                RopeMode::Normal,
            );
            kernels::rope(
                &mut k,
                cfg.n_kv_heads,
                hd,
                pos,
                cfg.rope_base,
                RopeMode::Normal,
            );
            // the caches keep f16, as forward's (and the engine's)
            kc[l].extend(k.iter().map(|&x| half::f16::from_f32(x)));
            vc[l].extend(v.iter().map(|&x| half::f16::from_f32(x)));
            let mut att = vec![0.0; cfg.n_heads * hd];
            kernels::attention(
                &q,
                &kc[l],
                &vc[l],
                cfg.n_heads,
                cfg.n_kv_heads,
                hd,
                pos + 1,
                &mut att,
            );
            kernels::add(&mut x, &mv(&b("attn_output.weight"), &att, dim));
            kernels::rmsnorm(&x, &vecf(&b("ffn_norm.weight")), cfg.rms_eps, &mut xb);
            let gate = mv(&b("ffn_gate.weight"), &xb, hid);
            let up = mv(&b("ffn_up.weight"), &xb, hid);
            let mut h = vec![0.0; hid];
            kernels::swiglu(&gate, &up, &mut h);
            kernels::add(&mut x, &mv(&b("ffn_down.weight"), &h, dim));
            layers_x.push(x.clone());
        }
        let mut xb = vec![0.0; dim];
        kernels::rmsnorm(&x, &vecf("output_norm.weight"), cfg.rms_eps, &mut xb);
        logits = mv("output.weight", &xb, cfg.vocab_size);
    }
    (layers_x, logits)
}

fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tol,
        "{what}: worst relative difference {worst} > {tol}"
    );
}

/// Logits at every position of `tokens` from a fresh state.
fn logits_per_position(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut state = State::new(model.config(), tokens.len());
    tokens
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            forward(model, &mut state, t, pos, &mut |_, _| {})
                .unwrap()
                .to_vec()
        })
        .collect()
}

#[test]
fn forward_matches_the_kernels_over_packed_weights_for_each_type() {
    let tokens = [5u32, 17, 260, 3, 99];
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        let bytes = tiny_llama(11, 2, 64, 4, 2, 128, 300, ty);
        let model = Model::from_bytes(&bytes).unwrap();
        let mut state = State::new(model.config(), 16);
        let mut observed = Vec::new();
        let mut logits = Vec::new();
        for (pos, &tok) in tokens.iter().enumerate() {
            observed.clear();
            logits = forward(&model, &mut state, tok, pos, &mut |l, x| {
                observed.push((l, x.to_vec()))
            })
            .unwrap()
            .to_vec();
        }
        let (layers_x, expected) = forward_from_packed(&bytes, &tokens);
        assert_eq!(
            observed.iter().map(|o| o.0).collect::<Vec<_>>(),
            [0, 1],
            "{ty}"
        );
        for (l, x) in &observed {
            assert_close(x, &layers_x[*l], 1e-5, &format!("{ty} layer {l}"));
        }
        assert_close(&logits, &expected, 1e-5, &format!("{ty} logits"));
        let spread = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(spread > 0.1, "{ty}: logits are degenerate ({spread})");
    }
}

#[test]
fn tiny_llama_is_seeded() {
    let a = tiny_llama(5, 2, 64, 4, 2, 128, 300, GgmlType::Q4_1);
    assert_eq!(a, tiny_llama(5, 2, 64, 4, 2, 128, 300, GgmlType::Q4_1));
    assert_ne!(a, tiny_llama(6, 2, 64, 4, 2, 128, 300, GgmlType::Q4_1));
    let g = Gguf::parse(&a).unwrap();
    assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 300);
    assert_eq!(
        g.tensor("blk.1.ffn_down.weight").unwrap().ty,
        GgmlType::Q4_1
    );
    assert_eq!(g.tensor("blk.1.ffn_norm.weight").unwrap().ty, GgmlType::F32);
}

#[test]
fn the_kv_cache_carries_earlier_tokens() {
    let model = Model::from_bytes(&tiny()).unwrap();
    let a = logits_per_position(&model, &[10, 50]);
    let b = logits_per_position(&model, &[11, 50]);
    let again = logits_per_position(&model, &[10, 50]);
    assert_eq!(a, again, "deterministic");
    assert_ne!(a[1], b[1], "position 1 must see the token at position 0");
}

#[test]
fn qwen2_differs_from_llama_only_by_rope_mode_and_biases() {
    let llama = Model::from_bytes(&tiny()).unwrap();
    let qwen = Model::from_bytes(&as_qwen2(&tiny(), Some(0.0))).unwrap();
    let biased = Model::from_bytes(&as_qwen2(&tiny(), Some(0.25))).unwrap();
    let tokens = [42, 7];
    let (l, q, qb) = (
        logits_per_position(&llama, &tokens),
        logits_per_position(&qwen, &tokens),
        logits_per_position(&biased, &tokens),
    );
    // At position 0 RoPE is the identity, so zero biases give llama's logits exactly.
    assert_eq!(l[0], q[0]);
    // At position 1 the pairs rotated differ between normal and neox.
    assert_ne!(l[1], q[1]);
    // Biases change the result.
    assert_ne!(q[0], qb[0]);
}

#[test]
fn generate_greedy_is_argmax_and_stops_at_eog() {
    let model = Model::from_bytes(&tiny()).unwrap();
    let prompt = [1u32, 40, 41];
    let got = generate_greedy(&model, &prompt, 8, &|_| false).unwrap();
    assert_eq!(got.len(), 8);

    // The same by hand: feed the prompt, then each argmax.
    let mut state = State::new(model.config(), 16);
    let mut manual = Vec::new();
    let mut next = 0;
    for (pos, &t) in prompt.iter().enumerate() {
        next = argmax(forward(&model, &mut state, t, pos, &mut |_, _| {}).unwrap()) as u32;
    }
    for pos in prompt.len()..prompt.len() + 8 {
        manual.push(next);
        next = argmax(forward(&model, &mut state, next, pos, &mut |_, _| {}).unwrap()) as u32;
    }
    assert_eq!(got, manual);

    // An end-of-generation id is kept and stops the generation.
    let stop = got[2];
    let first = got.iter().position(|&t| t == stop).unwrap();
    let cut = generate_greedy(&model, &prompt, 8, &|t| t == stop).unwrap();
    assert_eq!(cut, got[..=first]);
}

#[test]
fn bad_tokens_positions_and_prompts_are_errors() {
    let model = Model::from_bytes(&tiny()).unwrap();
    let mut state = State::new(model.config(), 4);
    let err = forward(&model, &mut state, 300, 0, &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(
            err,
            RefError::TokenOutOfRange {
                token: 300,
                vocab: 300
            }
        ),
        "{err}"
    );
    let err = forward(&model, &mut state, 3, 4, &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(err, RefError::ContextFull { pos: 4, ctx_len: 4 }),
        "{err}"
    );

    let err = generate_greedy(&model, &[], 4, &|_| false).unwrap_err();
    assert!(matches!(err, RefError::EmptyPrompt), "{err}");
    // The tiny model's context is 256 positions.
    let err = generate_greedy(&model, &[3; 250], 10, &|_| false).unwrap_err();
    assert!(err.to_string().contains("256"), "{err}");

    let other = Model::from_bytes(&tiny_llama(1, 3, 64, 4, 2, 128, 300, GgmlType::Q8_0)).unwrap();
    let mut small = State::new(model.config(), 4);
    let err = forward(&other, &mut small, 3, 0, &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, RefError::StateMismatch), "{err}");
}

//! The whole decoder forward pass in f32, one token at a time, for every family the model
//! description knows (llama, qwen2, qwen3, gemma3), reading its options from
//! [`arch::Config`] rather than matching on the family.
//!
//! Reads top to bottom like llama2.c's `forward()`: the embedding row (× `embd_scale`),
//! then per layer: rmsnorm, q/k/v (+ biases), per-head Q/K norms, RoPE (this layer's base
//! and scale, `rope_freqs` divisors), KV-cache write, attention (this layer's window,
//! `attn_scale`), output projection, post-attention norm, residual; rmsnorm, gate/up,
//! act(gate)·up, down, post-FFN norm, residual. Then the final rmsnorm, the logits and the
//! optional softcap.

use crate::kernels::{
    add, argmax, attention_ext, geglu, rmsnorm, rmsnorm_heads, rope_ext, softcap, store_f16, swiglu,
};
use crate::{Model, RefError, State};
use arch::FfnAct;

/// One token at position `pos` (the KV cache holds positions `0..pos`). Returns the logits.
///
/// `observe(layer, x)` is called with the residual stream after every layer.
pub fn forward<'s>(
    model: &Model,
    state: &'s mut State,
    token: u32,
    pos: usize,
    observe: &mut dyn FnMut(usize, &[f32]),
) -> Result<&'s [f32], RefError> {
    forward_layers(model, state, token, pos, observe)?;
    Ok(logits(model, state))
}

/// Every layer of [`forward`] without the logits: fills the KV cache at `pos` and leaves
/// the residual stream in `state.x`. Prompt positions whose logits nobody reads need only
/// this (the output projection is the largest matrix of small models).
pub fn forward_layers(
    model: &Model,
    state: &mut State,
    token: u32,
    pos: usize,
    observe: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), RefError> {
    let _span = tracing::debug_span!("reference_forward", token, pos).entered();
    let cfg = model.config();
    let s = state;
    if token as usize >= cfg.vocab_size {
        return Err(RefError::TokenOutOfRange {
            token,
            vocab: cfg.vocab_size,
        });
    }
    if pos >= s.ctx_len {
        return Err(RefError::ContextFull {
            pos,
            ctx_len: s.ctx_len,
        });
    }
    if !s.fits(cfg) {
        return Err(RefError::StateMismatch);
    }
    let kv_dim = cfg.kv_dim();
    let freqs = model.rope_freqs.as_deref();

    s.x.copy_from_slice(model.token_embd.row(token as usize));
    if cfg.embd_scale != 1.0 {
        s.x.iter_mut().for_each(|v| *v *= cfg.embd_scale);
    }

    for (l, layer) in model.layers.iter().enumerate() {
        let la = cfg.layer_attention(l);

        // Attention.
        rmsnorm(&s.x, &layer.attn_norm, cfg.rms_eps, &mut s.xb);
        layer.attn_q.matvec(&s.xb, &mut s.q);
        layer.attn_k.matvec(&s.xb, &mut s.k);
        layer.attn_v.matvec(&s.xb, &mut s.v);
        for (out, bias) in [
            (&mut s.q, &layer.attn_q_bias),
            (&mut s.k, &layer.attn_k_bias),
            (&mut s.v, &layer.attn_v_bias),
        ] {
            if let Some(b) = bias {
                add(out, b);
            }
        }
        if let Some(w) = &layer.attn_q_norm {
            rmsnorm_heads(&mut s.q, w, cfg.rms_eps);
        }
        if let Some(w) = &layer.attn_k_norm {
            rmsnorm_heads(&mut s.k, w, cfg.rms_eps);
        }
        for (x, heads) in [(&mut s.q, cfg.n_heads), (&mut s.k, cfg.n_kv_heads)] {
            rope_ext(
                x,
                heads,
                cfg.head_dim,
                pos,
                la.rope_base,
                la.rope_scale,
                freqs,
                cfg.rope_mode,
            );
        }

        let row = pos * kv_dim..(pos + 1) * kv_dim;
        // the caches hold f16, as the engine's
        store_f16(&mut s.key_cache[l][row.clone()], &s.k);
        store_f16(&mut s.value_cache[l][row], &s.v);
        attention_ext(
            &s.q,
            &s.key_cache[l],
            &s.value_cache[l],
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            la.first_visible(pos),
            pos + 1,
            cfg.attn_scale,
            &mut s.att,
        );
        layer.attn_output.matvec(&s.att, &mut s.xb);
        residual_add(
            &mut s.x,
            &s.xb,
            &mut s.xb2,
            &layer.post_attention_norm,
            cfg.rms_eps,
        );

        // Feed-forward.
        rmsnorm(&s.x, &layer.ffn_norm, cfg.rms_eps, &mut s.xb);
        layer.ffn_gate.matvec(&s.xb, &mut s.hb);
        layer.ffn_up.matvec(&s.xb, &mut s.hb2);
        match cfg.ffn_act {
            FfnAct::Silu => swiglu(&s.hb, &s.hb2, &mut s.hb3),
            FfnAct::GeluTanh => geglu(&s.hb, &s.hb2, &mut s.hb3),
        }
        layer.ffn_down.matvec(&s.hb3, &mut s.xb);
        residual_add(
            &mut s.x,
            &s.xb,
            &mut s.xb2,
            &layer.post_ffw_norm,
            cfg.rms_eps,
        );

        observe(l, &s.x);
    }
    Ok(())
}

/// `x += out`, or `x += rmsnorm(out)·post_norm` when the layer has a post-norm (`tmp`
/// holds the normed output).
fn residual_add(
    x: &mut [f32],
    out: &[f32],
    tmp: &mut [f32],
    post_norm: &Option<Vec<f32>>,
    eps: f32,
) {
    match post_norm {
        Some(w) => {
            rmsnorm(out, w, eps, tmp);
            add(x, tmp);
        }
        None => add(x, out),
    }
}

/// The logits of the residual stream [`forward_layers`] left in `state.x`: final rmsnorm,
/// output projection, softcap when the model has one.
pub fn logits<'s>(model: &Model, state: &'s mut State) -> &'s [f32] {
    let cfg = model.config();
    let s = state;
    rmsnorm(&s.x, &model.output_norm, cfg.rms_eps, &mut s.xb);
    model.output_weight().matvec(&s.xb, &mut s.logits);
    if let Some(cap) = cfg.final_logit_softcap {
        softcap(&mut s.logits, cap);
    }
    &s.logits
}

/// Greedy decoding: feeds `prompt`, then appends the argmax token up to `max_new` times.
/// Returns the generated ids only; an end-of-generation token (`is_eog`) is included and
/// stops generation. The KV cache is sized to `prompt.len() + max_new`, which must not
/// exceed the model's context length.
pub fn generate_greedy(
    model: &Model,
    prompt: &[u32],
    max_new: usize,
    is_eog: &dyn Fn(u32) -> bool,
) -> Result<Vec<u32>, RefError> {
    Ok(generate_greedy_traced(model, prompt, max_new, is_eog)?
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}

/// [`generate_greedy`], also returning for each generated id the margin between the two
/// largest logits it was chosen from (a small margin is where implementations may
/// legitimately part ways).
pub fn generate_greedy_traced(
    model: &Model,
    prompt: &[u32],
    max_new: usize,
    is_eog: &dyn Fn(u32) -> bool,
) -> Result<Vec<(u32, f32)>, RefError> {
    let Some((&last, head)) = prompt.split_last() else {
        return Err(RefError::EmptyPrompt);
    };
    let cfg = model.config();
    let ctx_len = prompt.len().saturating_add(max_new);
    if ctx_len > cfg.context_length {
        return Err(RefError::ContextFull {
            pos: ctx_len - 1,
            ctx_len: cfg.context_length,
        });
    }
    let mut state = State::try_new(cfg, ctx_len)?;
    let mut out = Vec::with_capacity(max_new);
    for (pos, &tok) in head.iter().enumerate() {
        forward_layers(model, &mut state, tok, pos, &mut |_, _| {})?;
    }
    let mut next = pick(forward(
        model,
        &mut state,
        last,
        head.len(),
        &mut |_, _| {},
    )?);
    for pos in prompt.len()..ctx_len {
        out.push(next);
        if is_eog(next.0) || pos + 1 == ctx_len {
            break;
        }
        next = pick(forward(model, &mut state, next.0, pos, &mut |_, _| {})?);
    }
    Ok(out)
}

/// The argmax and its margin over the runner-up.
fn pick(logits: &[f32]) -> (u32, f32) {
    let best = argmax(logits);
    let second = logits
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    (best as u32, logits[best] - second)
}

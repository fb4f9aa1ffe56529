//! The whole Llama forward pass in f32, one token at a time, over weights dequantised at
//! load (this crate is a yardstick, never the fast path: simple beats small or fast).
//!
//! Reads top to bottom like llama2.c's `forward()`: embedding row, then per layer rmsnorm,
//! q/k/v, rope, KV-cache write, attention, output projection, residual, rmsnorm,
//! gate/up, SwiGLU, down, residual; then the final rmsnorm and the logits.

use gguf::{GgmlType, Gguf, GgufFile, TensorInfo};

use crate::kernels::{add, argmax, attention, matvec_f32, rmsnorm, rope, swiglu};
use crate::RefError;
use arch::{Arch, Config};

/// A dequantised weight matrix: `rows` rows of `cols` f32, row-major.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `rows × cols`.
    pub data: Vec<f32>,
}

impl Matrix {
    /// `out = W·x` (see [`matvec_f32`]).
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) {
        matvec_f32(&self.data, self.rows, self.cols, x, out);
    }

    /// Row `r` (`cols` elements).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// One decoder block's weights, named as in GGUF (`blk.N.<name>`).
#[derive(Clone, Debug)]
pub struct Layer {
    /// `[dim]`
    pub attn_norm: Vec<f32>,
    /// `q_dim × dim`
    pub attn_q: Matrix,
    /// `kv_dim × dim`
    pub attn_k: Matrix,
    /// `kv_dim × dim`
    pub attn_v: Matrix,
    /// qwen2 only: `[q_dim]`, `[kv_dim]`, `[kv_dim]`.
    pub attn_q_bias: Option<Vec<f32>>,
    pub attn_k_bias: Option<Vec<f32>>,
    pub attn_v_bias: Option<Vec<f32>>,
    /// `dim × q_dim`
    pub attn_output: Matrix,
    /// `[dim]`
    pub ffn_norm: Vec<f32>,
    /// `hidden_dim × dim`
    pub ffn_gate: Matrix,
    /// `hidden_dim × dim`
    pub ffn_up: Matrix,
    /// `dim × hidden_dim`
    pub ffn_down: Matrix,
}

/// A model's configuration and all its weights, dequantised to f32.
#[derive(Clone, Debug)]
pub struct Model {
    config: Config,
    /// `vocab × dim`
    pub token_embd: Matrix,
    pub layers: Vec<Layer>,
    /// `[dim]`
    pub output_norm: Vec<f32>,
    /// `vocab × dim`; `None` when tied to `token_embd`.
    pub output: Option<Matrix>,
}

impl Model {
    /// Reads the configuration ([`Config::from_gguf`]) and dequantises every weight.
    pub fn load(file: &GgufFile) -> Result<Model, RefError> {
        let _span = tracing::info_span!(
            "reference_load",
            path = %file.path().display(),
            bytes = file.bytes().len()
        )
        .entered();
        Model::from_parts(file.gguf(), file.bytes())
    }

    /// Like [`Model::load`] for a whole GGUF file held in memory (synthetic models).
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, RefError> {
        let g = Gguf::parse(bytes)?;
        Model::from_parts(&g, bytes)
    }

    /// Like [`Model::load`] from a parsed header and the file bytes it was parsed from.
    pub fn from_parts(g: &Gguf, bytes: &[u8]) -> Result<Model, RefError> {
        let config = Config::from_gguf(g)?;
        let get = |name: &str| -> Result<(&TensorInfo, &[u8]), RefError> {
            let t = g.tensor(name).ok_or_else(|| {
                RefError::Config(arch::ConfigError::MissingTensor(name.to_string()))
            })?;
            Ok((t, g.tensor_data(bytes, t)))
        };
        let vector = |name: &str| -> Result<Vec<f32>, RefError> {
            let (t, bytes) = get(name)?;
            dequantize(name, t.ty, bytes, t.n_elements() as usize)
        };
        let matrix = |name: &str| -> Result<Matrix, RefError> {
            let (t, bytes) = get(name)?;
            let cols = t.shape.first().copied().unwrap_or(0) as usize;
            let rows = t.shape.get(1).copied().unwrap_or(1) as usize;
            let data = dequantize(name, t.ty, bytes, rows * cols)?;
            Ok(Matrix { rows, cols, data })
        };
        let bias = |name: String| -> Result<Option<Vec<f32>>, RefError> {
            match config.arch {
                Arch::Qwen2 => vector(&name).map(Some),
                Arch::Llama => Ok(None),
            }
        };

        let mut layers = Vec::with_capacity(config.n_layers);
        for l in 0..config.n_layers {
            let b = |n: &str| format!("blk.{l}.{n}");
            layers.push(Layer {
                attn_norm: vector(&b("attn_norm.weight"))?,
                attn_q: matrix(&b("attn_q.weight"))?,
                attn_k: matrix(&b("attn_k.weight"))?,
                attn_v: matrix(&b("attn_v.weight"))?,
                attn_q_bias: bias(b("attn_q.bias"))?,
                attn_k_bias: bias(b("attn_k.bias"))?,
                attn_v_bias: bias(b("attn_v.bias"))?,
                attn_output: matrix(&b("attn_output.weight"))?,
                ffn_norm: vector(&b("ffn_norm.weight"))?,
                ffn_gate: matrix(&b("ffn_gate.weight"))?,
                ffn_up: matrix(&b("ffn_up.weight"))?,
                ffn_down: matrix(&b("ffn_down.weight"))?,
            });
        }
        Ok(Model {
            token_embd: matrix("token_embd.weight")?,
            output_norm: vector("output_norm.weight")?,
            output: if config.tied_output {
                None
            } else {
                Some(matrix("output.weight")?)
            },
            layers,
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The output projection (`output.weight`, or `token_embd.weight` when tied).
    pub fn output_weight(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

fn dequantize(name: &str, ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, RefError> {
    let need = crate::row_bytes(ty, n)?;
    if bytes.len() < need {
        return Err(RefError::ShortData {
            what: format!("tensor {name}"),
            need,
            have: bytes.len(),
        });
    }
    let mut out = vec![0.0f32; n];
    gguf::quant::dequantize(ty, &bytes[..need], &mut out)?;
    Ok(out)
}

/// Activations and the KV cache, allocated once (llama2.c's `RunState`).
#[derive(Clone, Debug)]
pub struct State {
    /// Positions the KV cache holds.
    pub ctx_len: usize,
    /// `[dim]` the residual stream.
    pub x: Vec<f32>,
    /// `[dim]` normed input of a sub-block, then its output before the residual add.
    pub xb: Vec<f32>,
    /// `[q_dim]` query.
    pub q: Vec<f32>,
    /// `[kv_dim]` key of the current position.
    pub k: Vec<f32>,
    /// `[kv_dim]` value of the current position.
    pub v: Vec<f32>,
    /// `[q_dim]` attention output (all heads).
    pub att: Vec<f32>,
    /// `[hidden_dim]` gate projection.
    pub hb: Vec<f32>,
    /// `[hidden_dim]` up projection.
    pub hb2: Vec<f32>,
    /// `[hidden_dim]` silu(gate)·up.
    pub hb3: Vec<f32>,
    /// `[vocab]`
    pub logits: Vec<f32>,
    /// Per layer `[ctx_len][kv_dim]` (position-major).
    pub key_cache: Vec<Vec<f32>>,
    /// Per layer `[ctx_len][kv_dim]` (position-major).
    pub value_cache: Vec<Vec<f32>>,
}

impl State {
    /// Buffers for `cfg` with a KV cache of `ctx_len` positions.
    pub fn new(cfg: &Config, ctx_len: usize) -> State {
        let (dim, q, kv, h) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.hidden_dim);
        State {
            ctx_len,
            x: vec![0.0; dim],
            xb: vec![0.0; dim],
            q: vec![0.0; q],
            k: vec![0.0; kv],
            v: vec![0.0; kv],
            att: vec![0.0; q],
            hb: vec![0.0; h],
            hb2: vec![0.0; h],
            hb3: vec![0.0; h],
            logits: vec![0.0; cfg.vocab_size],
            key_cache: vec![vec![0.0; ctx_len * kv]; cfg.n_layers],
            value_cache: vec![vec![0.0; ctx_len * kv]; cfg.n_layers],
        }
    }
}

/// Whether every buffer of `s` has the size [`State::new`] gives for `cfg`.
fn state_fits(s: &State, cfg: &Config) -> bool {
    let (dim, q, kv, h) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.hidden_dim);
    let sizes = [
        (s.x.len(), dim),
        (s.xb.len(), dim),
        (s.q.len(), q),
        (s.k.len(), kv),
        (s.v.len(), kv),
        (s.att.len(), q),
        (s.hb.len(), h),
        (s.hb2.len(), h),
        (s.hb3.len(), h),
        (s.logits.len(), cfg.vocab_size),
        (s.key_cache.len(), cfg.n_layers),
        (s.value_cache.len(), cfg.n_layers),
    ];
    sizes.iter().all(|(a, b)| a == b)
        && s.key_cache
            .iter()
            .chain(&s.value_cache)
            .all(|c| c.len() == s.ctx_len * kv)
}

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
    let _span = tracing::debug_span!("reference_forward", token, pos).entered();
    let cfg = &model.config;
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
    let kv_dim = cfg.kv_dim();
    if !state_fits(s, cfg) {
        return Err(RefError::StateMismatch);
    }

    s.x.copy_from_slice(model.token_embd.row(token as usize));

    for (l, layer) in model.layers.iter().enumerate() {
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
        rope(
            &mut s.q,
            cfg.n_heads,
            cfg.head_dim,
            pos,
            cfg.rope_base,
            cfg.rope_mode,
        );
        rope(
            &mut s.k,
            cfg.n_kv_heads,
            cfg.head_dim,
            pos,
            cfg.rope_base,
            cfg.rope_mode,
        );

        let row = pos * kv_dim..(pos + 1) * kv_dim;
        s.key_cache[l][row.clone()].copy_from_slice(&s.k);
        s.value_cache[l][row].copy_from_slice(&s.v);
        let n_pos = pos + 1;
        attention(
            &s.q,
            &s.key_cache[l][..n_pos * kv_dim],
            &s.value_cache[l][..n_pos * kv_dim],
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            n_pos,
            &mut s.att,
        );
        layer.attn_output.matvec(&s.att, &mut s.xb);
        add(&mut s.x, &s.xb);

        // Feed-forward.
        rmsnorm(&s.x, &layer.ffn_norm, cfg.rms_eps, &mut s.xb);
        layer.ffn_gate.matvec(&s.xb, &mut s.hb);
        layer.ffn_up.matvec(&s.xb, &mut s.hb2);
        swiglu(&s.hb, &s.hb2, &mut s.hb3);
        layer.ffn_down.matvec(&s.hb3, &mut s.xb);
        add(&mut s.x, &s.xb);

        observe(l, &s.x);
    }

    rmsnorm(&s.x, &model.output_norm, cfg.rms_eps, &mut s.xb);
    model.output_weight().matvec(&s.xb, &mut s.logits);
    Ok(&s.logits)
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
    if prompt.is_empty() {
        return Err(RefError::EmptyPrompt);
    }
    let ctx_len = prompt.len() + max_new;
    if ctx_len > model.config.context_length {
        return Err(RefError::ContextFull {
            pos: ctx_len - 1,
            ctx_len: model.config.context_length,
        });
    }
    let mut state = State::new(&model.config, ctx_len);
    let mut out = Vec::with_capacity(max_new);
    let mut logits_argmax = 0u32;
    for (pos, &tok) in prompt.iter().enumerate() {
        let logits = forward(model, &mut state, tok, pos, &mut |_, _| {})?;
        logits_argmax = argmax(logits) as u32;
    }
    for pos in prompt.len()..ctx_len {
        let next = logits_argmax;
        out.push(next);
        if is_eog(next) || pos + 1 == ctx_len {
            break;
        }
        let logits = forward(model, &mut state, next, pos, &mut |_, _| {})?;
        logits_argmax = argmax(logits) as u32;
    }
    Ok(out)
}

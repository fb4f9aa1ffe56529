//! Model hyper-parameters read from GGUF metadata, checked against the tensor shapes.
//!
//! Keys follow llama.cpp's naming (`<arch>.block_count`, `<arch>.attention.head_count`,
//! ...; see ggml `docs/gguf.md`, "LLM" section). Shapes are GGUF's, fastest dimension
//! first: `blk.0.attn_q.weight` is `[dim, n_heads·head_dim]`, i.e. `n_heads·head_dim` rows
//! of `dim` elements.

use gguf::{Gguf, Value};

use crate::{Arch, ConfigError, FfnAct, ModelTensor, RopeMode, SlidingWindow};

/// Hyper-parameters of a decoder, and what its graph does (per-family behaviour resolved
/// into plain fields by [`Config::from_gguf`]).
///
/// Every RMS norm multiplies by its weight as stored: Gemma's `(1 + w)` is already in the
/// file (llama.cpp's converter adds the 1 to every `*norm.weight` of gemma3), so no family
/// adds anything at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub n_layers: usize,
    /// Width of the residual stream (`embedding_length`).
    pub dim: usize,
    /// Width of the feed-forward hidden layer (`feed_forward_length`).
    pub hidden_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// `attention.key_length` (= `value_length`), else `dim / n_heads`.
    pub head_dim: usize,
    pub vocab_size: usize,
    /// The context length the model was trained for.
    pub context_length: usize,
    pub rms_eps: f32,
    /// RoPE base of the global (non-sliding-window) layers: `rope.freq_base`.
    pub rope_base: f32,
    /// RoPE position scale of the global layers: `1/rope.scaling.factor` for linear
    /// scaling, 1 without.
    pub rope_scale: f32,
    pub rope_mode: RopeMode,
    /// `rope_freqs.weight` (`[head_dim/2]`) exists: frequency `i` is divided by its
    /// entry `i` (Llama 3.1+ long-context scaling, baked into the file by the converter).
    pub rope_freqs: bool,
    /// No `output.weight`: logits use `token_embd.weight`.
    pub tied_output: bool,
    /// q/k/v biases (`blk.N.attn_{q,k,v}.bias`), added after the projections.
    pub qkv_bias: bool,
    /// Per-head RMS norms of Q and K before RoPE (`blk.N.attn_{q,k}_norm.weight`).
    pub qk_norm: bool,
    /// RMS norms of the attention and FFN outputs before each residual add
    /// (`blk.N.post_attention_norm.weight`, `blk.N.post_ffw_norm.weight`).
    pub post_norms: bool,
    /// The gated FFN's activation.
    pub ffn_act: FfnAct,
    /// Factor applied to the embedding row: √dim (gemma3) or 1.
    pub embd_scale: f32,
    /// Factor applied to the query·key scores: `1/√head_dim` (gemma3: the same, from
    /// `query_pre_attn_scalar` = head_dim, except the 27B's `1/√(dim/n_heads)`, as
    /// llama.cpp does).
    pub attn_scale: f32,
    /// `Some(c)`: `logits = c·tanh(logits/c)` (`<arch>.final_logit_softcapping`).
    pub final_logit_softcap: Option<f32>,
    /// The sliding-window layers, if any ([`Config::layer_attention`]).
    pub sliding_window: Option<SlidingWindow>,
}

impl Config {
    /// Reads `<arch>.block_count` and the other hyper-parameters. An unsupported
    /// architecture is an error naming it; every tensor the forward pass needs must exist
    /// with the shape the metadata implies (the error names the tensor, expected vs found).
    pub fn from_gguf(g: &Gguf) -> Result<Config, ConfigError> {
        let arch_name = meta_str(g, "general.architecture")?;
        let arch = Arch::from_name(&arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArch(arch_name.clone()))?;
        let p = arch.name();
        let n_layers = meta_usize(g, &format!("{p}.block_count"))?;
        let dim = meta_usize(g, &format!("{p}.embedding_length"))?;
        let hidden_dim = meta_usize(g, &format!("{p}.feed_forward_length"))?;
        let n_heads = meta_usize(g, &format!("{p}.attention.head_count"))?;
        let n_kv_heads =
            meta_usize_opt(g, &format!("{p}.attention.head_count_kv"))?.unwrap_or(n_heads);
        let context_length = meta_usize(g, &format!("{p}.context_length"))?;
        let rms_eps = meta_f32(g, &format!("{p}.attention.layer_norm_rms_epsilon"))?;
        let rope_base = meta_f32_opt(g, &format!("{p}.rope.freq_base"))?.unwrap_or(10_000.0);

        // Each layer has at least 9 tensors: a larger count is a corrupt header, caught
        // here before anything is sized by it.
        if n_layers > g.tensors.len() / 9 {
            return Err(bad(
                &format!("{p}.block_count"),
                &format!(
                    "{n_layers} layers, but the file has only {} tensors",
                    g.tensors.len()
                ),
            ));
        }
        for (key, v) in [("block_count", n_layers), ("embedding_length", dim)] {
            if v == 0 {
                return Err(bad(&format!("{p}.{key}"), "must be positive"));
            }
        }
        if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(bad(
                &format!("{p}.attention.head_count_kv"),
                &format!("{n_kv_heads} kv heads do not divide {n_heads} heads"),
            ));
        }
        let head_dim = match meta_usize_opt(g, &format!("{p}.attention.key_length"))? {
            Some(k) => k,
            None => {
                if !dim.is_multiple_of(n_heads) {
                    return Err(bad(
                        &format!("{p}.attention.head_count"),
                        &format!("{n_heads} heads do not divide embedding length {dim}"),
                    ));
                }
                dim / n_heads
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(bad(
                &format!("{p}.attention.key_length"),
                &format!("head dimension {head_dim} must be even and positive"),
            ));
        }
        // Widths are products of header numbers: bound them before anything multiplies
        // them (q_dim, kv_dim, the expected shapes), so a crafted key_length or head count
        // is an error here rather than a wrapped size later.
        const MAX_WIDTH: usize = 1 << 28;
        let q_width = n_heads.checked_mul(head_dim).filter(|&w| w <= MAX_WIDTH);
        if q_width.is_none() || dim > MAX_WIDTH || hidden_dim > MAX_WIDTH {
            return Err(bad(
                &format!("{p}.attention.key_length"),
                &format!(
                    "widths out of range: {n_heads} heads x {head_dim}, dim {dim}, feed-forward {hidden_dim} (each at most {MAX_WIDTH})"
                ),
            ));
        }
        if let Some(vl) = meta_usize_opt(g, &format!("{p}.attention.value_length"))? {
            if vl != head_dim {
                return Err(bad(
                    &format!("{p}.attention.value_length"),
                    &format!("{vl} differs from key length {head_dim} (not supported)"),
                ));
            }
        }
        if let Some(rd) = meta_usize_opt(g, &format!("{p}.rope.dimension_count"))? {
            if rd != head_dim {
                return Err(bad(
                    &format!("{p}.rope.dimension_count"),
                    &format!("partial rotary ({rd} of {head_dim} dims) is not supported"),
                ));
            }
        }

        let embd = tensor_shape(g, ModelTensor::TokenEmbd.name())?;
        if embd.len() != 2 || embd[0] != dim as u64 {
            return Err(ConfigError::TensorShape {
                name: ModelTensor::TokenEmbd.name().into(),
                expected: format!("[{dim}, n_vocab]"),
                found: embd,
            });
        }
        let vocab_size = usize::try_from(embd[1]).map_err(|_| ConfigError::TensorShape {
            name: ModelTensor::TokenEmbd.name().into(),
            expected: format!("[{dim}, n_vocab]"),
            found: embd.clone(),
        })?;
        let tied_output = g.tensor(ModelTensor::Output.name()).is_none();
        let rope_scale = rope_scale(g, p)?;
        let sliding_window = sliding_window(g, arch)?;
        let final_logit_softcap = if arch.has_logit_softcap() {
            let key = format!("{p}.final_logit_softcapping");
            match meta_f32_opt(g, &key)? {
                Some(c) if c > 0.0 => Some(c),
                Some(0.0) => None,
                Some(c) => return Err(bad(&key, &format!("{c} must be positive (or 0: off)"))),
                None => None,
            }
        } else {
            None
        };
        // gemma3 scales queries by 1/sqrt(query_pre_attn_scalar): head_dim for every size
        // but the 27B (62 layers), whose scalar is dim/n_heads (llama.cpp, gemma3.cpp).
        let attn_scale = if arch == Arch::Gemma3 && n_layers == 62 {
            1.0 / ((dim / n_heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };

        let cfg = Config {
            arch,
            n_layers,
            dim,
            hidden_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            context_length,
            rms_eps,
            rope_base,
            rope_scale,
            rope_mode: arch.rope_mode(),
            rope_freqs: arch.has_rope_freqs() && g.tensor(ModelTensor::RopeFreqs.name()).is_some(),
            tied_output,
            qkv_bias: arch.qkv_bias(),
            qk_norm: arch.qk_norm(),
            post_norms: arch.post_norms(),
            ffn_act: arch.ffn_act(),
            embd_scale: if arch.scales_embedding() {
                (dim as f32).sqrt()
            } else {
                1.0
            },
            attn_scale,
            final_logit_softcap,
            sliding_window,
        };
        for (name, shape) in cfg.expected_tensors() {
            let found = tensor_shape(g, &name)?;
            if found != shape {
                return Err(ConfigError::TensorShape {
                    name,
                    expected: format!("{shape:?}"),
                    found,
                });
            }
        }
        crate::validate::validate(&cfg)?;
        Ok(cfg)
    }

    /// Width of one position's keys (and values): `n_kv_heads·head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of the queries and of the attention output: `n_heads·head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}

/// RoPE position scale of the global layers, as llama.cpp reads it: the factor from
/// `rope.scaling.factor` (or the older `rope.scale_linear`), 1/factor; only linear scaling
/// (or none) is supported.
fn rope_scale(g: &Gguf, p: &str) -> Result<f32, ConfigError> {
    let type_key = format!("{p}.rope.scaling.type");
    if g.get(&type_key).is_some() {
        let ty = meta_str(g, &type_key)?;
        if ty != "none" && ty != "linear" {
            return Err(bad(
                &type_key,
                &format!("RoPE scaling '{ty}' is not supported (only linear or none)"),
            ));
        }
    }
    let factor_key = format!("{p}.rope.scaling.factor");
    let factor = match meta_f32_opt(g, &factor_key)? {
        Some(f) => Some((factor_key, f)),
        None => {
            let old = format!("{p}.rope.scale_linear");
            meta_f32_opt(g, &old)?.map(|f| (old, f))
        }
    };
    match factor {
        None => Ok(1.0),
        Some((_, 0.0)) => Ok(1.0),
        Some((_, f)) if f >= crate::validate::MIN_ROPE_SCALING_FACTOR => Ok(1.0 / f),
        Some((key, f)) => Err(bad(
            &key,
            &format!(
                "RoPE scaling factor {f} must be at least {} (or 0: none)",
                crate::validate::MIN_ROPE_SCALING_FACTOR
            ),
        )),
    }
}

/// The sliding-window layers of families that have them: `attention.sliding_window`
/// (absent or 0: none), `attention.sliding_window_pattern` (default 6),
/// `rope.freq_base_swa` (default 10000).
fn sliding_window(g: &Gguf, arch: Arch) -> Result<Option<SlidingWindow>, ConfigError> {
    if !arch.has_sliding_window() {
        return Ok(None);
    }
    let p = arch.name();
    let window = match meta_usize_opt(g, &format!("{p}.attention.sliding_window"))? {
        None | Some(0) => return Ok(None),
        Some(w) => w,
    };
    let period = meta_usize_opt(g, &format!("{p}.attention.sliding_window_pattern"))?.unwrap_or(6);
    let base_key = format!("{p}.rope.freq_base_swa");
    // its range is checked with the other layers' base (validate)
    let rope_base = meta_f32_opt(g, &base_key)?.unwrap_or(10_000.0);
    Ok(Some(SlidingWindow {
        window,
        period,
        rope_base,
    }))
}

fn bad(key: &str, reason: &str) -> ConfigError {
    ConfigError::BadMetadata {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

fn tensor_shape(g: &Gguf, name: &str) -> Result<Vec<u64>, ConfigError> {
    g.tensor(name)
        .map(|t| t.shape.clone())
        .ok_or_else(|| ConfigError::MissingTensor(name.to_string()))
}

fn meta_str(g: &Gguf, key: &str) -> Result<String, ConfigError> {
    match g.get(key) {
        None => Err(ConfigError::MissingKey(key.to_string())),
        Some(v) => match v.as_str() {
            Some(s) => Ok(s.to_string()),
            None => Err(bad(key, "expected a string")),
        },
    }
}

fn meta_usize_opt(g: &Gguf, key: &str) -> Result<Option<usize>, ConfigError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_integer() {
            Some(n) => usize::try_from(n)
                .map(Some)
                .map_err(|_| bad(key, &format!("{n} does not fit in usize"))),
            None => Err(bad(key, "expected a non-negative integer")),
        },
    }
}

fn meta_usize(g: &Gguf, key: &str) -> Result<usize, ConfigError> {
    meta_usize_opt(g, key)?.ok_or_else(|| ConfigError::MissingKey(key.to_string()))
}

fn meta_f32_opt(g: &Gguf, key: &str) -> Result<Option<f32>, ConfigError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match as_f32(v) {
            Some(x) if x.is_finite() => Ok(Some(x)),
            Some(x) => Err(bad(key, &format!("{x} is not finite"))),
            None => Err(bad(key, "expected a float")),
        },
    }
}

fn meta_f32(g: &Gguf, key: &str) -> Result<f32, ConfigError> {
    meta_f32_opt(g, key)?.ok_or_else(|| ConfigError::MissingKey(key.to_string()))
}

fn as_f32(v: &Value) -> Option<f32> {
    match *v {
        Value::F32(x) => Some(x),
        Value::F64(x) => Some(x as f32),
        _ => None,
    }
}

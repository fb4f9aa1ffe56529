//! Model hyper-parameters read from GGUF metadata, checked against the tensor shapes.
//!
//! Keys follow llama.cpp's naming (`<arch>.block_count`, `<arch>.attention.head_count`,
//! ...; see ggml `docs/gguf.md`, "LLM" section). Shapes are GGUF's, fastest dimension
//! first: `blk.0.attn_q.weight` is `[dim, n_heads·head_dim]`, i.e. `n_heads·head_dim` rows
//! of `dim` elements.

use gguf::{Gguf, Value};

use crate::ConfigError;

/// Which elements of a head RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// llama ("normal"): pairs `(x[2i], x[2i+1])`. GGUF's llama Q/K weights are stored
    /// permuted so that adjacent pairs are the rotated ones.
    Normal,
    /// GPT-NeoX style (qwen2): pairs `(x[i], x[i + head_dim/2])`.
    Neox,
}

/// The decoder families vkdecode knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama` (SmolLM2, Llama 2/3, ...): normal RoPE, no q/k/v biases.
    Llama,
    /// `qwen2`: q/k/v biases and NeoX RoPE.
    Qwen2,
}

impl Arch {
    /// The `general.architecture` string and metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// Hyper-parameters of a Llama-family decoder.
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
    pub head_dim: usize,
    pub vocab_size: usize,
    /// The context length the model was trained for.
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_mode: RopeMode,
    /// No `output.weight`: logits use `token_embd.weight`.
    pub tied_output: bool,
}

impl Config {
    /// Reads `<arch>.block_count` and the other hyper-parameters. An unsupported
    /// architecture is an error naming it; every tensor the forward pass needs must exist
    /// with the shape the metadata implies (the error names the tensor, expected vs found).
    pub fn from_gguf(g: &Gguf) -> Result<Config, ConfigError> {
        let arch_name = meta_str(g, "general.architecture")?;
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => return Err(ConfigError::UnsupportedArch(other.to_string())),
        };
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

        let embd = tensor_shape(g, "token_embd.weight")?;
        if embd.len() != 2 || embd[0] != dim as u64 {
            return Err(ConfigError::TensorShape {
                name: "token_embd.weight".into(),
                expected: format!("[{dim}, n_vocab]"),
                found: embd,
            });
        }
        let vocab_size = embd[1] as usize;
        let tied_output = g.tensor("output.weight").is_none();

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
            rope_mode: match arch {
                Arch::Llama => RopeMode::Normal,
                Arch::Qwen2 => RopeMode::Neox,
            },
            tied_output,
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

    /// Every tensor the forward pass reads, with its GGUF shape (fastest dimension first).
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (d, h, q, kv) = (
            self.dim as u64,
            self.hidden_dim as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
        );
        let mut t = vec![
            (
                "token_embd.weight".to_string(),
                vec![d, self.vocab_size as u64],
            ),
            ("output_norm.weight".to_string(), vec![d]),
        ];
        if !self.tied_output {
            t.push(("output.weight".to_string(), vec![d, self.vocab_size as u64]));
        }
        for l in 0..self.n_layers {
            let b = |n: &str| format!("blk.{l}.{n}");
            t.push((b("attn_norm.weight"), vec![d]));
            t.push((b("attn_q.weight"), vec![d, q]));
            t.push((b("attn_k.weight"), vec![d, kv]));
            t.push((b("attn_v.weight"), vec![d, kv]));
            if self.arch == Arch::Qwen2 {
                t.push((b("attn_q.bias"), vec![q]));
                t.push((b("attn_k.bias"), vec![kv]));
                t.push((b("attn_v.bias"), vec![kv]));
            }
            t.push((b("attn_output.weight"), vec![q, d]));
            t.push((b("ffn_norm.weight"), vec![d]));
            t.push((b("ffn_gate.weight"), vec![d, h]));
            t.push((b("ffn_up.weight"), vec![d, h]));
            t.push((b("ffn_down.weight"), vec![h, d]));
        }
        t
    }
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

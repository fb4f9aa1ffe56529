//! A model's weights, dequantised to f32 at load (this crate is a yardstick, never the
//! fast path: simple beats small or fast). Which tensors exist comes from the model
//! description ([`arch::Config`]); the forward pass is in [`crate::forward`].

use gguf::{GgmlType, Gguf, GgufFile, TensorInfo};

use crate::kernels::matvec_f32;
use crate::RefError;
use arch::Config;

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
    /// `Config::qkv_bias` (qwen2): `[q_dim]`, `[kv_dim]`, `[kv_dim]`.
    pub attn_q_bias: Option<Vec<f32>>,
    pub attn_k_bias: Option<Vec<f32>>,
    pub attn_v_bias: Option<Vec<f32>>,
    /// `Config::qk_norm` (qwen3, gemma3): `[head_dim]` each, shared by every head.
    pub attn_q_norm: Option<Vec<f32>>,
    pub attn_k_norm: Option<Vec<f32>>,
    /// `dim × q_dim`
    pub attn_output: Matrix,
    /// `Config::post_norms` (gemma3): `[dim]`.
    pub post_attention_norm: Option<Vec<f32>>,
    /// `[dim]`
    pub ffn_norm: Vec<f32>,
    /// `hidden_dim × dim`
    pub ffn_gate: Matrix,
    /// `hidden_dim × dim`
    pub ffn_up: Matrix,
    /// `dim × hidden_dim`
    pub ffn_down: Matrix,
    /// `Config::post_norms` (gemma3): `[dim]`.
    pub post_ffw_norm: Option<Vec<f32>>,
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
    /// `Config::rope_freqs` (Llama 3.1+): `[head_dim/2]` RoPE frequency divisors.
    pub rope_freqs: Option<Vec<f32>>,
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
        // A tensor the description says exists (`present`), else `None`.
        let opt_vector = |present: bool, name: String| -> Result<Option<Vec<f32>>, RefError> {
            if present {
                vector(&name).map(Some)
            } else {
                Ok(None)
            }
        };

        let c = &config;
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let b = |n: &str| format!("blk.{l}.{n}");
            layers.push(Layer {
                attn_norm: vector(&b("attn_norm.weight"))?,
                attn_q: matrix(&b("attn_q.weight"))?,
                attn_k: matrix(&b("attn_k.weight"))?,
                attn_v: matrix(&b("attn_v.weight"))?,
                attn_q_bias: opt_vector(c.qkv_bias, b("attn_q.bias"))?,
                attn_k_bias: opt_vector(c.qkv_bias, b("attn_k.bias"))?,
                attn_v_bias: opt_vector(c.qkv_bias, b("attn_v.bias"))?,
                attn_q_norm: opt_vector(c.qk_norm, b("attn_q_norm.weight"))?,
                attn_k_norm: opt_vector(c.qk_norm, b("attn_k_norm.weight"))?,
                attn_output: matrix(&b("attn_output.weight"))?,
                post_attention_norm: opt_vector(c.post_norms, b("post_attention_norm.weight"))?,
                ffn_norm: vector(&b("ffn_norm.weight"))?,
                ffn_gate: matrix(&b("ffn_gate.weight"))?,
                ffn_up: matrix(&b("ffn_up.weight"))?,
                ffn_down: matrix(&b("ffn_down.weight"))?,
                post_ffw_norm: opt_vector(c.post_norms, b("post_ffw_norm.weight"))?,
            });
        }
        Ok(Model {
            token_embd: matrix("token_embd.weight")?,
            output_norm: vector("output_norm.weight")?,
            output: if c.tied_output {
                None
            } else {
                Some(matrix("output.weight")?)
            },
            rope_freqs: opt_vector(c.rope_freqs, "rope_freqs.weight".into())?,
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

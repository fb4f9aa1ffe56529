//! A model's weights, dequantised to f32 at load (this crate is a yardstick, never the
//! fast path: simple beats small or fast). Which tensors exist comes from the model
//! description ([`arch::Config`]); the forward pass is in [`crate::forward`].

use gguf::{GgmlType, Gguf, GgufFile, TensorInfo};

use crate::kernels::matvec_f32;
use crate::RefError;
use arch::{Config, LayerTensor, ModelTensor};

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
        let opt_vector = |present: bool, name: &str| -> Result<Option<Vec<f32>>, RefError> {
            if present {
                vector(name).map(Some)
            } else {
                Ok(None)
            }
        };

        let c = &config;
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            use LayerTensor::*;
            let m = |t: LayerTensor| matrix(&t.name(l));
            let v = |t: LayerTensor| vector(&t.name(l));
            let opt = |t: LayerTensor| opt_vector(c.has_layer(t), &t.name(l));
            layers.push(Layer {
                attn_norm: v(AttnNorm)?,
                attn_q: m(AttnQ)?,
                attn_k: m(AttnK)?,
                attn_v: m(AttnV)?,
                attn_q_bias: opt(AttnQBias)?,
                attn_k_bias: opt(AttnKBias)?,
                attn_v_bias: opt(AttnVBias)?,
                attn_q_norm: opt(AttnQNorm)?,
                attn_k_norm: opt(AttnKNorm)?,
                attn_output: m(AttnOutput)?,
                post_attention_norm: opt(PostAttnNorm)?,
                ffn_norm: v(FfnNorm)?,
                ffn_gate: m(FfnGate)?,
                ffn_up: m(FfnUp)?,
                ffn_down: m(FfnDown)?,
                post_ffw_norm: opt(PostFfwNorm)?,
            });
        }
        Ok(Model {
            token_embd: matrix(ModelTensor::TokenEmbd.name())?,
            output_norm: vector(ModelTensor::OutputNorm.name())?,
            output: if c.has(ModelTensor::Output) {
                Some(matrix(ModelTensor::Output.name())?)
            } else {
                None
            },
            rope_freqs: opt_vector(c.has(ModelTensor::RopeFreqs), ModelTensor::RopeFreqs.name())?,
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

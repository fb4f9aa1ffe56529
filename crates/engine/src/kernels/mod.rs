//! The host side of the decode kernels in `shaders/`: push-constant blocks (each the
//! `#[repr(C)]` twin of a GLSL block, size-asserted), specialisation choices, and the
//! pipelines the forward pass uses, created and owned in one place.
//!
//! Kernels (one `.comp` each; CPU twins in `reference::kernels`):
//! - `embed.comp`: embedding row gather, dequantised in registers;
//! - `matmul.comp` (lanes own rows) and `matmul_split.comp` (lanes split each row's
//!   columns, one token): `Y = W·X`, weights read in place from the GGUF blocks (Q8_0,
//!   Q4_0, Q4_1, F16, F32), with the fusions of DESIGN.md as build-time variants
//!   ([`Epilogue`]): rmsnorm folded into the input, and the output stored, added to the
//!   residual, rope-rotated into q and the KV cache, or gated by SwiGLU;
//! - `matmul_mm.comp`: the prefill GEMM over tiles of prompt tokens (same contract);
//! - `attention.comp`: causal GQA attention of a batch over the KV cache;
//! - `argmax.comp`: the greedy token on the GPU.

mod argmax;
mod attention;
mod embed;
mod gemm;
mod matmul;

pub use argmax::*;
pub use attention::*;
pub use embed::*;
pub use gemm::*;
pub use matmul::*;

use std::collections::HashMap;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use vk::{Kernel, Pipeline, PipelineDesc};

use crate::EngineError;

/// Columns per chunk of `matmul.comp` / `embed.comp`: rows must be a multiple of this.
pub const CHUNK: usize = 64;
/// Entries of the rope frequency table in the step buffer (`STEP_FREQS_MAX`).
pub const STEP_FREQS_MAX: usize = 128;
/// Largest workgroup `attention.comp` and `argmax.comp` accept (`MAX_WG`).
pub const MAX_REDUCE_WG: u32 = 256;

/// Header of the step buffer (GLSL twin: `STEP_BUFFER` in `shaders/include/step.glsl`),
/// followed by `STEP_FREQS_MAX` f32 rope frequencies and the batch's token ids.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct StepHeader {
    /// Position of the batch's first token.
    pub pos0: u32,
    pub pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<StepHeader>() == 16);
/// Byte offset of the token ids in the step buffer.
pub const STEP_TOKENS_OFFSET: u64 = 16 + 4 * STEP_FREQS_MAX as u64;

/// Whether the matmul and embedding kernels read this weight type.
pub fn supported_weight_type(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::F16 | GgmlType::F32
    )
}

/// The texel format weights of `ty` are bound with (the `W_TEXEL_WORDS` of
/// `shaders/include/quant.glsl`): Q8_0, Q4_0 and Q4_1 chunks (17, 9 and 10 words) are
/// read as 16-byte texels and realigned in registers, 2.5-3.4x fewer fetches; F16 and
/// F32 word by word.
pub fn weight_texel_format(ty: GgmlType) -> vk::TexelFormat {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => vk::TexelFormat::Rgba32Uint,
        _ => vk::TexelFormat::R32Uint,
    }
}

/// Every pipeline, created once (the set is small: a handful per weight type present).
pub struct Kernels {
    ctx: Arc<vk::Context>,
    matmul: HashMap<MatmulKey, Pipeline>,
    embed: HashMap<GgmlType, Pipeline>,
    /// Per head dimension.
    attention: HashMap<u32, Pipeline>,
    pub argmax: Pipeline,
    /// Whether one-token matmuls may split columns across lanes ([`Kernels::column_split`]).
    column_split: bool,
}

impl Kernels {
    pub fn new(ctx: &Arc<vk::Context>) -> Result<Kernels, EngineError> {
        let argmax = Pipeline::new(
            ctx,
            &PipelineDesc {
                kernel: Kernel::Argmax,
                n_bindings: ARGMAX_BINDINGS,
                push_size: std::mem::size_of::<ArgmaxPush>() as u32,
                spec: vec![ARGMAX_WG],
            },
        )?;
        Ok(Kernels {
            ctx: Arc::clone(ctx),
            matmul: HashMap::new(),
            embed: HashMap::new(),
            attention: HashMap::new(),
            argmax,
            column_split: true,
        })
    }

    /// [`MatmulKey::split_k`] for a one-token matmul over `ncols` columns with `wg`
    /// lanes: the whole rounds of `wg` chunks in a row where the lanes can split it (one
    /// subgroup per workgroup with subgroup arithmetic in compute, and 1 to
    /// [`SPLIT_MAX_CHUNKS_PER_LANE`] chunks per lane, which the kernel unrolls), otherwise
    /// 0 (lanes own rows).
    pub fn column_split(&self, wg: u32, ncols: u32) -> u32 {
        let chunks = ncols / CHUNK as u32;
        if self.column_split && self.can_split(wg) && wg > 0 {
            let k = chunks / wg;
            if (1..=SPLIT_MAX_CHUNKS_PER_LANE).contains(&k) {
                return k;
            }
        }
        0
    }

    /// Whether `wg` lanes (one subgroup) can split rows on this device.
    fn can_split(&self, wg: u32) -> bool {
        let caps = self.ctx.caps();
        caps.subgroup_in_compute
            && caps.subgroup_operations.contains(&"arithmetic")
            && caps.subgroup_size >= wg
    }

    /// Turns the column split off (every matmul built afterwards has lanes own rows):
    /// the fallback for devices without subgroup arithmetic, forced for tests and A/B.
    pub fn set_column_split(&mut self, on: bool) {
        self.column_split = on;
    }

    /// The attention pipeline for heads of `head_dim` (a multiple of 4, at most
    /// [`ATTENTION_MAX_HEAD_DIM`]), created on first request.
    pub fn attention(&mut self, head_dim: u32) -> Result<&Pipeline, EngineError> {
        if head_dim == 0 || !head_dim.is_multiple_of(4) || head_dim > ATTENTION_MAX_HEAD_DIM {
            return Err(EngineError::Unsupported(format!(
                "head dimension {head_dim}: the attention kernel needs a multiple of 4 up to {ATTENTION_MAX_HEAD_DIM}"
            )));
        }
        if !self.attention.contains_key(&head_dim) {
            let p = Pipeline::new(
                &self.ctx,
                &PipelineDesc {
                    kernel: Kernel::Attention,
                    n_bindings: ATTENTION_BINDINGS,
                    push_size: std::mem::size_of::<AttentionPush>() as u32,
                    spec: vec![ATTENTION_WG, head_dim / 4],
                },
            )?;
            self.attention.insert(head_dim, p);
        }
        Ok(&self.attention[&head_dim])
    }

    /// An attention pipeline created earlier by [`Kernels::attention`].
    pub fn attention_ref(&self, head_dim: u32) -> Option<&Pipeline> {
        self.attention.get(&head_dim)
    }

    /// The matmul pipeline for `key`, created on first request.
    pub fn matmul(&mut self, key: MatmulKey) -> Result<&Pipeline, EngineError> {
        if key.split_k > 0
            && (key.tb != 1 || key.split_k > SPLIT_MAX_CHUNKS_PER_LANE || !self.can_split(key.wg))
        {
            return Err(EngineError::Unsupported(format!(
                "a column-split matmul of {} rounds of {} lanes and {} tokens (see Kernels::column_split)",
                key.split_k, key.wg, key.tb
            )));
        }
        if !self.matmul.contains_key(&key) {
            let p = Pipeline::new(
                &self.ctx,
                &PipelineDesc {
                    kernel: key.kernel()?,
                    n_bindings: MATMUL_BINDINGS,
                    push_size: std::mem::size_of::<MatmulPush>() as u32,
                    spec: vec![key.wg, key.pairs],
                },
            )?;
            self.matmul.insert(key, p);
        }
        Ok(&self.matmul[&key])
    }

    /// A matmul pipeline created earlier by [`Kernels::matmul`].
    pub fn matmul_ref(&self, key: &MatmulKey) -> Option<&Pipeline> {
        self.matmul.get(key)
    }

    /// The embedding pipeline for a table of type `ty`, created on first request.
    pub fn embed(&mut self, ty: GgmlType) -> Result<&Pipeline, EngineError> {
        if !self.embed.contains_key(&ty) {
            let p = Pipeline::new(
                &self.ctx,
                &PipelineDesc {
                    kernel: embed_kernel(ty)?,
                    n_bindings: EMBED_BINDINGS,
                    push_size: std::mem::size_of::<EmbedPush>() as u32,
                    spec: vec![EMBED_WG],
                },
            )?;
            self.embed.insert(ty, p);
        }
        Ok(&self.embed[&ty])
    }

    pub fn embed_ref(&self, ty: GgmlType) -> Option<&Pipeline> {
        self.embed.get(&ty)
    }

    /// How many pipelines exist.
    pub fn count(&self) -> usize {
        self.matmul.len() + self.embed.len() + 2
    }
}

/// Rope frequencies `base^(-2i/head_dim)` for `i < head_dim/2`, computed in f64 as
/// `reference::kernels::rope` does, so GPU and reference angles agree.
pub fn rope_freqs(base: f32, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| f64::from(base).powf(-2.0 * i as f64 / head_dim as f64) as f32)
        .collect()
}

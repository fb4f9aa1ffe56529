//! The host side of the decode kernels in `shaders/`: push-constant blocks (each the
//! `#[repr(C)]` twin of a GLSL block, size-asserted), bindings, specialisation constants
//! and pipeline description, each in its kernel's file; here, [`Kernels`]: the pipelines
//! the forward pass uses, created on first request and owned in one place.
//!
//! Kernels (one `.comp` each; CPU twins in `reference::kernels`):
//! - `embed.comp`: embedding row gather, dequantised in registers;
//! - `matmul.comp` (lanes own rows) and `matmul_split.comp` (lanes split each row's
//!   columns, one token): `Y = W·X`, weights read in place from the GGUF blocks (Q8_0,
//!   Q4_0, Q4_1, Q5_0, Q5_1, BF16, F16, F32, and the K-quants Q4_K, Q5_K, Q6_K, Q3_K,
//!   Q2_K), with the fusions of docs/design.md ("Decode") as build-time variants
//!   ([`Epilogue`]): rmsnorm folded into the input, and the output stored, added to the
//!   residual, rope-rotated into q and the KV cache, or gated by SwiGLU;
//! - `matmul_mm.comp`: the prefill GEMM over tiles of prompt tokens (same contract);
//! - `attention.comp`: causal GQA attention of a batch over the KV cache;
//! - `argmax.comp`: the greedy token on the GPU;
//! - `heads.comp`, `post_norm.comp`, `softcap.comp`: the steps of the families beyond
//!   llama (per-head biases, Q/K norms and RoPE; post-norm residual adds; logit softcap).

mod argmax;
mod attention;
mod embed;
mod gemm;
mod heads;
mod matmul;
mod post_norm;
mod registry;
mod shapes;
mod softcap;

pub use argmax::*;
pub use attention::*;
pub use embed::*;
pub use gemm::*;
pub use heads::*;
pub use matmul::*;
pub use post_norm::*;
pub use registry::{shaders, Kernel};
pub use shapes::*;
pub use softcap::*;

use std::collections::HashMap;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use vk::{Pipeline, PipelineDesc};

use crate::EngineError;

/// The variable [`Kernels::new`] reads its profile from (kernel tests and benches; the CLI
/// takes `--kernels`).
pub(crate) const KERNELS_ENV: &str = "VKDECODE_KERNELS";

/// Columns per chunk of `matmul.comp` / `embed.comp`: rows must be a multiple of this.
pub const CHUNK: usize = 64;
/// Entries of the rope frequency table in the step buffer (`STEP_FREQS_MAX`).
pub const STEP_FREQS_MAX: usize = 128;
/// Bytes of one key or value element in the KV cache: f16 ([`arch::KV_ELEMENT_BYTES`],
/// which every size of the cache is computed from). The writers store pairs of elements
/// as one word (`packHalf2x16`), attention reads the caches through RGBA16F texel views.
pub(crate) const KV_BYTES: u64 = arch::KV_ELEMENT_BYTES;

/// Header of the step buffer (GLSL twin: `STEP_BUFFER` in `shaders/include/step.glsl`),
/// followed by `STEP_FREQS_MAX` f32 rope frequencies and the batch's token ids.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct StepHeader {
    /// Position of the batch's first token.
    pub pos0: u32,
    pub pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<StepHeader>() == 16);
/// Byte offset of the token ids in the step buffer.
pub const STEP_TOKENS_OFFSET: u64 = 16 + 4 * STEP_FREQS_MAX as u64;
/// Most tokens in one batch (`STEP_MAX_BATCH`): the step buffer holds this many token
/// ids, then as many positions (`STEP_POS`), then as many KV-cache rows (`STEP_ROW`).
pub const STEP_MAX_BATCH: usize = 64;
/// Byte offset of the per-token positions in the step buffer.
pub(crate) const STEP_POS_OFFSET: u64 = STEP_TOKENS_OFFSET + 4 * STEP_MAX_BATCH as u64;
/// Byte offset of the per-token KV-cache rows in the step buffer.
pub(crate) const STEP_ROW_OFFSET: u64 = STEP_POS_OFFSET + 4 * STEP_MAX_BATCH as u64;
/// Bytes of the step buffer.
pub(crate) const STEP_BYTES: u64 = STEP_ROW_OFFSET + 4 * STEP_MAX_BATCH as u64;

/// Whether the matmul and embedding kernels read this weight type: whether the registry
/// built an embedding gather for it (`variants.rs` builds every kernel over one list of
/// weight types).
pub fn supported_weight_type(ty: GgmlType) -> bool {
    Kernel::Embed { wtype: ty }.shader().is_some()
}

/// The weight types the kernels read, by name ("Q8_0, Q4_0, ..."), for error messages.
pub fn supported_weight_type_names() -> String {
    GgmlType::ALL
        .iter()
        .filter(|t| supported_weight_type(**t))
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `ty` is a K-quant: 256-element super-blocks, so the kernels need rows that
/// are a multiple of [`K_SUPER_BLOCK`] columns.
pub fn is_k_quant(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q3_K | GgmlType::Q2_K
    )
}

/// Elements per K-quant super-block.
pub const K_SUPER_BLOCK: usize = 256;

/// The texel format weights of `ty` are bound with (`shaders/include/quant.glsl`): the
/// block types are read as 16-byte texels and realigned in registers (Q8_0, Q4_0, Q4_1,
/// Q5_0, Q5_1 and BF16 chunks of 17, 9, 10, 11, 12 and 32 words: 2.5-3.6x fewer fetches
/// than word by word; the K-quants' runs of 4 to 16 words likewise,
/// `include/quant_k.glsl`); F16 and F32 word by word.
pub fn weight_texel_format(ty: GgmlType) -> vk::TexelFormat {
    match ty {
        GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::BF16 => vk::TexelFormat::Rgba32Uint,
        ty if is_k_quant(ty) => vk::TexelFormat::Rgba32Uint,
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
    /// `heads.comp`, `post_norm.comp`, `softcap.comp`: created when a model needs them.
    heads: Option<Pipeline>,
    post_norm: Option<Pipeline>,
    softcap: Option<Pipeline>,
    /// Whether one-token matmuls may split columns across lanes ([`Kernels::column_split`]).
    column_split: bool,
    /// The matmul shapes of the profile (`set_shapes` may replace them in tests).
    shapes: Shapes,
    /// The profile these pipelines were made for, and why ([`Shapes::for_profile`]).
    profile: ProfileChoice,
    /// The worker threads a CPU device runs workgroups on ([`cpu_device_threads`]); 0 on
    /// any other device.
    cpu_threads: u32,
}

/// The worker threads lavapipe runs a dispatch's workgroups on: `LP_NUM_THREADS` where
/// set (0: none, everything on the submitting thread), else one per CPU this process may
/// run on (lavapipe's default; capped at its 32).
fn cpu_device_threads() -> u32 {
    let set = std::env::var("LP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    let n =
        set.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    n.min(32)
}

impl Kernels {
    /// The pipelines of `ctx`'s device in the profile `VKDECODE_KERNELS` names (`auto`,
    /// `cpu`, `gpu`; unset: `auto`): the kernel tests and benches run either profile
    /// through it. A session takes its profile from `SessionOptions::kernels` instead.
    pub fn new(ctx: &Arc<vk::Context>) -> Result<Kernels, EngineError> {
        let profile = match std::env::var(KERNELS_ENV) {
            Ok(v) if !v.trim().is_empty() => KernelProfile::parse(&v)
                .map_err(|e| EngineError::Input(format!("{KERNELS_ENV}: {e}")))?,
            _ => KernelProfile::Auto,
        };
        Kernels::with_profile(ctx, profile)
    }

    /// The pipelines of `ctx`'s device in `profile` ([`Shapes::for_profile`]).
    pub(crate) fn with_profile(
        ctx: &Arc<vk::Context>,
        profile: KernelProfile,
    ) -> Result<Kernels, EngineError> {
        let choice = Shapes::for_profile(ctx.caps(), profile);
        let shapes = choice.shapes;
        tracing::info!(
            kernels = choice.profile.as_str(),
            shapes = shapes.name,
            why = %choice.why,
            subgroup = ctx.caps().subgroup_size,
            "kernel profile"
        );
        let argmax = Pipeline::new(ctx, &argmax_desc()?)?;
        Ok(Kernels {
            ctx: Arc::clone(ctx),
            matmul: HashMap::new(),
            embed: HashMap::new(),
            attention: HashMap::new(),
            argmax,
            heads: None,
            post_norm: None,
            softcap: None,
            column_split: true,
            shapes,
            profile: choice,
            cpu_threads: if ctx.caps().device_type == vk::DeviceType::Cpu {
                cpu_device_threads()
            } else {
                0
            },
        })
    }

    /// The matmul shapes in use.
    pub fn shapes(&self) -> &Shapes {
        &self.shapes
    }

    /// The profile these pipelines were made for, and why.
    pub fn profile(&self) -> &ProfileChoice {
        &self.profile
    }

    /// The matmul pipeline key of a dispatch of variant `v` for a batch kind, in this
    /// device's shapes.
    pub fn matmul_key(&self, v: &MatmulVariant, batch: Batch) -> MatmulKey {
        let shape = self.shapes.of(batch, v.last_token_only);
        let split_k = if shape.tb == 1 { v.split_k } else { 0 };
        let pairs = if split_k > 0 && v.pairs > 0 {
            v.pairs
        } else {
            shape.pairs
        };
        MatmulKey {
            wtype: v.wtype,
            in_mode: v.in_mode,
            out_mode: v.out_mode,
            wg: shape.wg,
            pairs,
            tb: shape.tb,
            split_k,
            texel_aligned: v.texel_aligned,
        }
    }

    /// [`MatmulVariant::pairs`] for a one-token column-split dispatch over
    /// views of `rows` rows: on a CPU device, the pairs that spread its workgroups evenly
    /// over the device's threads (`MatmulShape::balanced_pairs`); elsewhere, or without
    /// the split, 0 (the shape's own).
    pub fn decode_pairs(&self, split_k: u32, gated: bool, rows: &[u32]) -> u32 {
        if split_k == 0 || self.cpu_threads < 2 {
            return 0;
        }
        self.shapes
            .decode
            .balanced_pairs(gated, rows, self.cpu_threads)
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

    /// Whether workgroups of `wg` lanes can split rows: the shapes in use split with
    /// that many lanes, and the device guarantees such a workgroup is one subgroup with
    /// subgroup arithmetic ([`vk::Capabilities::one_subgroup_of`]).
    fn can_split(&self, wg: u32) -> bool {
        self.shapes.split_lanes == Some(wg) && self.ctx.caps().one_subgroup_of(wg).is_some()
    }

    /// Turns the column split off (every matmul built afterwards has lanes own rows):
    /// the fallback for devices without subgroup arithmetic, forced for tests and A/B.
    pub fn set_column_split(&mut self, on: bool) {
        self.column_split = on;
    }

    /// The attention pipeline for heads of `head_dim` (a multiple of 4, at most
    /// `ATTENTION_MAX_HEAD_DIM`), created on first request.
    pub fn attention(&mut self, head_dim: u32) -> Result<&Pipeline, EngineError> {
        if !self.attention.contains_key(&head_dim) {
            let p = Pipeline::new(&self.ctx, &attention_desc(head_dim)?)?;
            self.attention.insert(head_dim, p);
        }
        Ok(&self.attention[&head_dim])
    }

    /// An attention pipeline created earlier by [`Kernels::attention`].
    pub(crate) fn attention_ref(&self, head_dim: u32) -> Option<&Pipeline> {
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
            let start = std::time::Instant::now();
            let desc = key.desc()?;
            let p = if key.split_k > 0 {
                // one subgroup per workgroup: required of the device where it must be asked
                Pipeline::with_subgroup_size(&self.ctx, &desc, key.wg)?
            } else {
                Pipeline::new(&self.ctx, &desc)?
            };
            tracing::debug!(
                kernel = desc.kernel.name(),
                ms = start.elapsed().as_millis() as u64,
                "created matmul pipeline"
            );
            self.matmul.insert(key, p);
        }
        Ok(&self.matmul[&key])
    }

    /// The embedding pipeline for a table of type `ty`, created on first request.
    pub fn embed(&mut self, ty: GgmlType) -> Result<&Pipeline, EngineError> {
        if !self.embed.contains_key(&ty) {
            let p = Pipeline::new(&self.ctx, &embed_desc(ty)?)?;
            self.embed.insert(ty, p);
        }
        Ok(&self.embed[&ty])
    }

    pub(crate) fn embed_ref(&self, ty: GgmlType) -> Option<&Pipeline> {
        self.embed.get(&ty)
    }

    /// How many pipelines exist.
    pub fn count(&self) -> usize {
        let extra = [&self.heads, &self.post_norm, &self.softcap]
            .iter()
            .filter(|p| p.is_some())
            .count();
        self.matmul.len() + self.embed.len() + self.attention.len() + 1 + extra
    }

    /// The `heads.comp` pipeline, created on first request.
    pub fn heads(&mut self) -> Result<&Pipeline, EngineError> {
        once(&self.ctx, &mut self.heads, &heads_desc()?)
    }

    pub(crate) fn heads_ref(&self) -> Option<&Pipeline> {
        self.heads.as_ref()
    }

    /// The `post_norm.comp` pipeline, created on first request.
    pub fn post_norm(&mut self) -> Result<&Pipeline, EngineError> {
        once(&self.ctx, &mut self.post_norm, &post_norm_desc()?)
    }

    pub(crate) fn post_norm_ref(&self) -> Option<&Pipeline> {
        self.post_norm.as_ref()
    }

    /// The `softcap.comp` pipeline, created on first request.
    pub fn softcap(&mut self) -> Result<&Pipeline, EngineError> {
        once(&self.ctx, &mut self.softcap, &softcap_desc()?)
    }

    pub(crate) fn softcap_ref(&self) -> Option<&Pipeline> {
        self.softcap.as_ref()
    }
}

/// The pipeline in `slot`, created from `desc` the first time.
fn once<'p>(
    ctx: &Arc<vk::Context>,
    slot: &'p mut Option<Pipeline>,
    desc: &PipelineDesc,
) -> Result<&'p Pipeline, EngineError> {
    if slot.is_none() {
        *slot = Some(Pipeline::new(ctx, desc)?);
    }
    Ok(slot.as_ref().expect("created above"))
}

/// Rope frequencies `base^(-2i/head_dim)` for `i < head_dim/2`, computed in f64 as
/// `reference::kernels::rope` does, so GPU and reference angles agree.
pub fn rope_freqs(base: f32, head_dim: usize) -> Vec<f32> {
    rope_freqs_ext(base, 1.0, None, head_dim)
}

/// Rope frequencies with linear position scaling and per-frequency divisors (Llama 3's
/// `rope_freqs.weight`): `scale·base^(-2i/head_dim)/factors[i]`, in f64 as
/// `reference::kernels::rope_ext` computes the angle, so that `pos·freq` is its angle.
pub fn rope_freqs_ext(base: f32, scale: f32, factors: Option<&[f32]>, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let f = f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
            let d = factors
                .and_then(|fs| fs.get(i))
                .map_or(1.0, |&d| f64::from(d));
            (f64::from(scale) * f / d) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step buffer's layout is written twice, in `shaders/include/step.glsl` and
    /// here: the GLSL defines must equal the Rust constants (a mismatch moves every
    /// token's position and cache row).
    #[test]
    fn step_layout_matches_step_glsl() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shaders/include/step.glsl"
        );
        let glsl = std::fs::read_to_string(path).expect("shaders/include/step.glsl");
        let define = |name: &str| -> usize {
            let line = glsl
                .lines()
                .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
                .unwrap_or_else(|| panic!("step.glsl defines {name}"));
            let value = line
                .split_whitespace()
                .nth(2)
                .unwrap()
                .trim_end_matches('u');
            value.parse().unwrap_or_else(|_| panic!("{name} = {value}"))
        };
        assert_eq!(define("STEP_MAX_BATCH"), STEP_MAX_BATCH);
        assert_eq!(define("STEP_FREQS_MAX"), STEP_FREQS_MAX);
    }
}

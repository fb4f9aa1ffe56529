//! The host side of the decode kernels in `shaders/`: push-constant blocks (each the
//! `#[repr(C)]` twin of a GLSL block, size-asserted), specialisation choices, and the
//! pipelines the forward pass uses, created and owned in one place.
//!
//! Kernels (one `.comp` each; CPU twins in `reference::kernels`):
//! - `embed.comp`: embedding row gather, dequantised in registers;
//! - `matmul.comp`: `Y = W·X` over a batch of tokens, weights read in place from the GGUF
//!   blocks (Q8_0, Q4_0, Q4_1, F16, F32), with the fusions of DESIGN.md selected by
//!   specialisation constants: rmsnorm folded into the input, and the output stored, added
//!   to the residual, rope-rotated into q and the KV cache, or gated by SwiGLU;
//! - `attention.comp`: causal GQA attention of a batch over the KV cache;
//! - `argmax.comp`: the greedy token on the GPU.

use std::collections::HashMap;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use vk::{DescriptorKind, Kernel, Pipeline, PipelineDesc};

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

/// Push constants of `matmul.comp` (GLSL twin: `shaders/include/matmul_push.glsl`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq)]
pub struct MatmulPush {
    pub n_tok: u32,
    pub x_tok0: u32,
    pub ncols: u32,
    pub x_ld: u32,
    pub out_ld: u32,
    pub kv_ld: u32,
    pub head_dim: u32,
    pub eps: f32,
    /// Cumulative workgroup ends of views 0, 1, 2.
    pub tiles: [u32; 4],
    pub nrows: [u32; 4],
    /// Word offset of each view's first row inside its binding.
    pub wofs: [u32; 4],
    /// Global row of each view's first row.
    pub orow: [u32; 4],
    /// Float offset of the next norm weight inside the aux binding (OUT_ADD).
    pub aux_ofs: u32,
    /// OUT_ADD: also write `out1 = x * aux` (the next rmsnorm's input), when non-zero.
    pub write_xg: u32,
}
const _: () = assert!(std::mem::size_of::<MatmulPush>() == 104);

/// Push constants of `embed.comp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct EmbedPush {
    pub ncols: u32,
    pub out_ld: u32,
    pub n_tok: u32,
    /// Float offset of the first norm weight inside its binding.
    pub g_ofs: u32,
    /// Rows `[part_end[v-1], part_end[v])` live in binding `v`.
    pub part_end: [u32; 4],
    pub wofs: [u32; 4],
}
const _: () = assert!(std::mem::size_of::<EmbedPush>() == 48);

/// Push constants of `attention.comp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AttentionPush {
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub scale: f32,
}
const _: () = assert!(std::mem::size_of::<AttentionPush>() == 16);

/// Push constants of `argmax.comp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ArgmaxPush {
    pub n: u32,
}

/// How `matmul.comp` reads its input (spec constant `IN_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InMode {
    /// `X` as is.
    Plain = 0,
    /// `X = x∘g` (written by the producer of x), the result scaled by `1/rms(XR)`.
    RmsNorm = 1,
}

/// What `matmul.comp` does with its result (spec constant `OUT_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutMode {
    /// `out0 = Y`.
    Store = 0,
    /// `out0 += Y` (the residual add), and optionally `out1 = out0 ∘ aux`.
    Add = 1,
    /// Views q, k, v: rope q and k; q to out0, k and v to the caches (out1, out2) at
    /// position `pos0 + t`.
    Qkv = 2,
    /// Views gate, up: `out0 = silu(gate·x) * (up·x)`.
    Glu = 3,
}

/// One `matmul.comp` pipeline: weight type and specialisation constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulKey {
    pub wtype: GgmlType,
    pub in_mode: InMode,
    pub out_mode: OutMode,
    pub neox: bool,
    pub n_views: u32,
    /// Every view is read through binding 0 (at its own word offset): spares the
    /// per-view branches, which lavapipe executes for every view (masked), not just the
    /// workgroup's own.
    pub shared_w: bool,
    /// Invocations per workgroup.
    pub wg: u32,
    /// Row pairs per invocation.
    pub pairs: u32,
    /// Tokens per invocation.
    pub tb: u32,
    /// Row pairs computed in lockstep, sharing each input fetch (1..4, divides `pairs`).
    pub group: u32,
    /// Chunks (64 columns) per row when the lanes split each row's columns instead of
    /// owning rows (one token only; see `matmul.comp`), from [`Kernels::column_split`];
    /// 0: lanes own rows.
    pub split_chunks: u32,
}

impl MatmulKey {
    /// Output rows one workgroup covers.
    pub fn tile_rows(&self) -> u32 {
        match self.out_mode {
            OutMode::Glu => self.wg * self.pairs,
            _ => 2 * self.wg * self.pairs,
        }
    }
}

/// Which weight rows a matmul slot (binding 0, 1 or 2) holds in one dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub slot: usize,
    pub nrows: u32,
    /// Word offset of the first row inside the binding.
    pub wofs: u32,
    /// Global row index of the first row.
    pub orow: u32,
}

/// Fills the per-view fields of `push` for `slots` and returns the workgroup counts of a
/// dispatch of `key` over `push.n_tok` tokens.
pub fn matmul_layout(key: &MatmulKey, push: &mut MatmulPush, slots: &[Slot]) -> [u32; 3] {
    let tile = key.tile_rows();
    let mut counts = [0u32; 3];
    for s in slots {
        // Glu: one invocation reads row p of gate (slot 0) and of up (slot 1), so only
        // slot 0 owns workgroups
        if key.out_mode != OutMode::Glu || s.slot == 0 {
            counts[s.slot] = s.nrows.div_ceil(tile);
        }
        push.nrows[s.slot] = s.nrows;
        push.wofs[s.slot] = s.wofs;
        push.orow[s.slot] = s.orow;
    }
    push.tiles = [
        counts[0],
        counts[0] + counts[1],
        counts[0] + counts[1] + counts[2],
        0,
    ];
    [push.tiles[2], push.n_tok.div_ceil(key.tb), 1]
}

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

/// The matmul kernel for weights of `ty`: the column-split variant (subgroup arithmetic)
/// or the row-per-lane one, which needs no subgroup operations.
fn matmul_kernel(ty: GgmlType, split: bool) -> Result<Kernel, EngineError> {
    Ok(match (ty, split) {
        (GgmlType::Q8_0, false) => Kernel::MatmulQ8_0,
        (GgmlType::Q4_0, false) => Kernel::MatmulQ4_0,
        (GgmlType::Q4_1, false) => Kernel::MatmulQ4_1,
        (GgmlType::F16, false) => Kernel::MatmulF16,
        (GgmlType::F32, false) => Kernel::MatmulF32,
        (GgmlType::Q8_0, true) => Kernel::MatmulQ8_0Split,
        (GgmlType::Q4_0, true) => Kernel::MatmulQ4_0Split,
        (GgmlType::Q4_1, true) => Kernel::MatmulQ4_1Split,
        (GgmlType::F16, true) => Kernel::MatmulF16Split,
        (GgmlType::F32, true) => Kernel::MatmulF32Split,
        (other, _) => {
            return Err(EngineError::Unsupported(format!(
                "weights of type {} (the GPU kernels read Q8_0, Q4_0, Q4_1, F16 and F32)",
                other.name()
            )))
        }
    })
}

fn embed_kernel(ty: GgmlType) -> Result<Kernel, EngineError> {
    Ok(match ty {
        GgmlType::Q8_0 => Kernel::EmbedQ8_0,
        GgmlType::Q4_0 => Kernel::EmbedQ4_0,
        GgmlType::Q4_1 => Kernel::EmbedQ4_1,
        GgmlType::F16 => Kernel::EmbedF16,
        GgmlType::F32 => Kernel::EmbedF32,
        other => {
            return Err(EngineError::Unsupported(format!(
            "an embedding table of type {} (the GPU kernels read Q8_0, Q4_0, Q4_1, F16 and F32)",
            other.name()
        )))
        }
    })
}

/// Most chunks per lane per row the column-split matmul unrolls (`matmul.comp`).
pub const SPLIT_MAX_CHUNKS_PER_LANE: u32 = 4;

/// Bindings of `matmul.comp`: w0, w1, w2, x, aux, out0, out1, out2, step, xr.
pub const MATMUL_BINDINGS: u32 = 10;
/// Descriptor kinds of `matmul.comp`: weights (in [`weight_texel_format`]), x and xr
/// (RGBA32F) are texel buffers.
pub const MATMUL_KINDS: [DescriptorKind; 10] = [
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::UniformTexelBuffer,
];
/// Bindings of `embed.comp`: w0, w1, w2, x, step, xg, g.
pub const EMBED_BINDINGS: u32 = 7;
/// Descriptor kinds of `embed.comp`: the table parts are texel buffers.
pub const EMBED_KINDS: [DescriptorKind; 7] = [
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
];
/// Bindings of `attention.comp`: q, k cache, v cache, out, step.
pub const ATTENTION_BINDINGS: u32 = 5;
/// Descriptor kinds of `attention.comp`: q and the caches are RGBA32F texel buffers (so
/// the head dimension must be a multiple of 4).
pub const ATTENTION_KINDS: [DescriptorKind; 5] = [
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::UniformTexelBuffer,
    DescriptorKind::StorageBuffer,
    DescriptorKind::StorageBuffer,
];
/// Largest head dimension `attention.comp` is built for (it keeps q and the running
/// output of a head in registers).
pub const ATTENTION_MAX_HEAD_DIM: u32 = 256;
/// Bindings of `argmax.comp`: logits, result.
pub const ARGMAX_BINDINGS: u32 = 2;

/// Workgroup size of `embed.comp`.
pub const EMBED_WG: u32 = 8;
/// Workgroup size of `attention.comp`.
pub const ATTENTION_WG: u32 = 8;
/// Workgroup size of `argmax.comp`.
pub const ARGMAX_WG: u32 = 64;

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

    /// `split_chunks` for a one-token matmul over `ncols` columns with `wg` lanes: the
    /// row's chunk count where the lanes can split it (one subgroup per workgroup with
    /// subgroup arithmetic in compute, and 1 to [`SPLIT_MAX_CHUNKS_PER_LANE`] chunks per
    /// lane, which the kernel unrolls), otherwise 0 (lanes own rows).
    pub fn column_split(&self, wg: u32, ncols: u32) -> u32 {
        let chunks = ncols / CHUNK as u32;
        if self.column_split && self.can_split(wg, chunks) {
            chunks
        } else {
            0
        }
    }

    /// Whether `wg` lanes can split rows of `chunks` chunks on this device.
    fn can_split(&self, wg: u32, chunks: u32) -> bool {
        let caps = self.ctx.caps();
        let subgroups = caps.subgroup_in_compute
            && caps.subgroup_operations.contains(&"arithmetic")
            && caps.subgroup_size >= wg;
        subgroups && wg > 0 && (1..=SPLIT_MAX_CHUNKS_PER_LANE).contains(&(chunks / wg))
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
            let p = Pipeline::with_kinds(
                &self.ctx,
                &PipelineDesc {
                    kernel: Kernel::Attention,
                    n_bindings: ATTENTION_BINDINGS,
                    push_size: std::mem::size_of::<AttentionPush>() as u32,
                    spec: vec![ATTENTION_WG, head_dim / 4],
                },
                &ATTENTION_KINDS,
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
        if key.split_chunks > 0 && (key.tb != 1 || !self.can_split(key.wg, key.split_chunks)) {
            return Err(EngineError::Unsupported(format!(
                "a column-split matmul of {} chunks per row with {} lanes and {} tokens (see Kernels::column_split)",
                key.split_chunks, key.wg, key.tb
            )));
        }
        if !self.matmul.contains_key(&key) {
            let p = Pipeline::with_kinds(
                &self.ctx,
                &PipelineDesc {
                    kernel: matmul_kernel(key.wtype, key.split_chunks > 0)?,
                    n_bindings: MATMUL_BINDINGS,
                    push_size: std::mem::size_of::<MatmulPush>() as u32,
                    spec: vec![
                        key.wg,
                        key.pairs,
                        key.tb,
                        key.in_mode as u32,
                        key.out_mode as u32,
                        u32::from(key.neox),
                        key.n_views,
                        u32::from(key.shared_w),
                        key.group,
                        key.split_chunks,
                    ],
                },
                &MATMUL_KINDS,
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
            let p = Pipeline::with_kinds(
                &self.ctx,
                &PipelineDesc {
                    kernel: embed_kernel(ty)?,
                    n_bindings: EMBED_BINDINGS,
                    push_size: std::mem::size_of::<EmbedPush>() as u32,
                    spec: vec![EMBED_WG],
                },
                &EMBED_KINDS,
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

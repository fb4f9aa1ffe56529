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
//! - `attention.comp`: causal GQA attention of a batch over the KV cache;
//! - `argmax.comp`: the greedy token on the GPU.

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
    /// OUT_QKV: rope pairs `(i, i + head_dim/2)` (neox) when non-zero, else `(2i, 2i+1)`.
    pub rope_neox: u32,
}
const _: () = assert!(std::mem::size_of::<MatmulPush>() == 108);

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

/// Set in `argmax.comp`'s result word when the logits row held a NaN or an infinity
/// (the low 31 bits are the index).
pub const ARGMAX_NON_FINITE: u32 = 1 << 31;

/// Push constants of `argmax.comp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ArgmaxPush {
    pub n: u32,
}

/// How the matmul kernels read their input (define `IN_RMSNORM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InMode {
    /// `X` as is.
    Plain = 0,
    /// `X = x∘g` (written by the producer of x), the result scaled by `1/rms(XR)`.
    RmsNorm = 1,
}

/// What the matmul kernels do with their result (define `OUT_MODE`).
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

/// One matmul pipeline: the build-time variant (weight type, epilogue, tokens per
/// invocation, column split) and the two specialisation constants left (workgroup size
/// and pairs per invocation: loop bounds only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulKey {
    pub wtype: GgmlType,
    pub in_mode: InMode,
    pub out_mode: OutMode,
    /// Rope pairs `(i, i + head_dim/2)` (OUT_QKV only): a push-constant flag, in the key
    /// because a workgroup must then hold whole heads (it sets `pairs`).
    pub neox: bool,
    /// Invocations per workgroup.
    pub wg: u32,
    /// Row pairs per invocation.
    pub pairs: u32,
    /// Tokens per invocation (1 or 4: [`MATMUL_TB`]).
    pub tb: u32,
    /// Whole rounds of `wg` chunks (64 columns) per row when the lanes split each row's
    /// columns instead of owning rows (one token only; `matmul_split.comp`'s `SPLIT_K`),
    /// from [`Kernels::column_split`]; 0: lanes own rows.
    pub split_k: u32,
}

/// Tokens per invocation the row-per-lane matmul is built for (crates/vk/build.rs).
pub const MATMUL_TB: [u32; 2] = [1, 4];

/// The fused steps the matmul kernels are built for (the `EPILOGUES` of
/// crates/vk/build.rs): each an input mode with an output mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// rmsnorm in; rope q and k, q to out0, k and v to the caches.
    Qkv,
    /// Plain in; added to the residual.
    Add,
    /// rmsnorm in; SwiGLU of gate and up.
    Glu,
    /// rmsnorm in; stored (the logits).
    Logits,
}

impl Epilogue {
    /// The epilogue of an (input, output) mode pair, if one is built.
    pub fn of(in_mode: InMode, out_mode: OutMode) -> Option<Epilogue> {
        match (in_mode, out_mode) {
            (InMode::RmsNorm, OutMode::Qkv) => Some(Epilogue::Qkv),
            (InMode::Plain, OutMode::Add) => Some(Epilogue::Add),
            (InMode::RmsNorm, OutMode::Glu) => Some(Epilogue::Glu),
            (InMode::RmsNorm, OutMode::Store) => Some(Epilogue::Logits),
            _ => None,
        }
    }

    /// The variant's name in crates/vk/build.rs.
    pub fn name(self) -> &'static str {
        match self {
            Epilogue::Qkv => "qkv",
            Epilogue::Add => "add",
            Epilogue::Glu => "glu",
            Epilogue::Logits => "logits",
        }
    }
}

impl MatmulKey {
    /// Output rows one workgroup covers.
    pub fn tile_rows(&self) -> u32 {
        match self.out_mode {
            OutMode::Glu => self.wg * self.pairs,
            _ => 2 * self.wg * self.pairs,
        }
    }

    /// The compiled variant this key runs: `matmul.<type>.tb<TB>.<epilogue>` or
    /// `matmul_split.<type>.k<SPLIT_K>.<epilogue>`.
    pub fn kernel(&self) -> Result<Kernel, EngineError> {
        let epi = Epilogue::of(self.in_mode, self.out_mode).ok_or_else(|| {
            EngineError::Unsupported(format!(
                "a matmul with input {:?} and output {:?} (built: qkv, add, glu, logits)",
                self.in_mode, self.out_mode
            ))
        })?;
        if !supported_weight_type(self.wtype) {
            return Err(EngineError::Unsupported(format!(
                "weights of type {} (the GPU kernels read Q8_0, Q4_0, Q4_1, F16 and F32)",
                self.wtype.name()
            )));
        }
        let ty = self.wtype.name().to_ascii_lowercase();
        let name = if self.split_k > 0 {
            format!("matmul_split.{ty}.k{}.{}", self.split_k, epi.name())
        } else {
            format!("matmul.{ty}.tb{}.{}", self.tb, epi.name())
        };
        Kernel::by_name(&name).ok_or_else(|| {
            EngineError::Unsupported(format!("the matmul variant `{name}` (not built)"))
        })
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

/// Bytes each output binding (out0, out1, out2) of a matmul dispatch writes up to, for
/// the rows of `slots` and the tokens of `push` (the caches: any position below
/// `ctx_len`). The recorder compares them with the bound ranges, so a dispatch never
/// writes past a buffer (robustBufferAccess is off: that would be undefined behaviour).
pub fn matmul_write_bytes(
    out_mode: OutMode,
    write_xg: bool,
    slots: &[Slot],
    push: &MatmulPush,
    ctx_len: usize,
) -> [u64; 3] {
    // one past the last global row written through slot `slot` (any slot: None)
    let end = |slot: Option<usize>| {
        slots
            .iter()
            .filter(|s| slot.is_none() || slot == Some(s.slot))
            .map(|s| u64::from(s.orow) + u64::from(s.nrows))
            .max()
            .unwrap_or(0)
    };
    // bytes up to row `end` of token row `n - 1`, rows `ld` floats apart
    let bytes = |n: u64, ld: u32, end: u64| {
        if end == 0 || n == 0 {
            0
        } else {
            ((n - 1) * u64::from(ld) + end) * 4
        }
    };
    let n_tok = u64::from(push.n_tok);
    match out_mode {
        OutMode::Store | OutMode::Glu => [bytes(n_tok, push.out_ld, end(Some(0))), 0, 0],
        OutMode::Add => {
            let o = bytes(n_tok, push.out_ld, end(None));
            [o, if write_xg { o } else { 0 }, 0]
        }
        OutMode::Qkv => [
            bytes(n_tok, push.out_ld, end(Some(0))),
            bytes(ctx_len as u64, push.kv_ld, end(Some(1))),
            bytes(ctx_len as u64, push.kv_ld, end(Some(2))),
        ],
    }
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

/// The embedding kernel for a table of type `ty`: `embed.<type>`.
fn embed_kernel(ty: GgmlType) -> Result<Kernel, EngineError> {
    let name = format!("embed.{}", ty.name().to_ascii_lowercase());
    match Kernel::by_name(&name) {
        Some(k) if supported_weight_type(ty) => Ok(k),
        _ => Err(EngineError::Unsupported(format!(
            "an embedding table of type {} (the GPU kernels read Q8_0, Q4_0, Q4_1, F16 and F32)",
            ty.name()
        ))),
    }
}

/// Most chunks per lane per row the column-split matmul unrolls (its largest `SPLIT_K`).
pub const SPLIT_MAX_CHUNKS_PER_LANE: u32 = 4;

/// Bindings of the matmul kernels: w0, w1, x, aux, out0, out1, out2, step, xr
/// (weights, x and xr are texel buffers: their kinds come from the SPIR-V).
pub const MATMUL_BINDINGS: u32 = 9;
/// Bindings of `embed.comp`: w0, w1, w2, x, step, xg, g.
pub const EMBED_BINDINGS: u32 = 7;
/// Bindings of `attention.comp`: q, k cache, v cache, out, step.
pub const ATTENTION_BINDINGS: u32 = 5;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(slot: usize, nrows: u32, orow: u32) -> Slot {
        Slot {
            slot,
            nrows,
            wofs: 0,
            orow,
        }
    }

    /// What a dispatch writes: token rows of out0 up to its last row, the caches up to the
    /// last position of the context, and x∘g only when asked for.
    #[test]
    fn matmul_write_bytes_cover_the_last_row_written() {
        let push = MatmulPush {
            n_tok: 3,
            out_ld: 576,
            kv_ld: 192,
            ..MatmulPush::default()
        };
        let qkv = [slot(0, 576, 0), slot(1, 192, 0), slot(2, 192, 0)];
        assert_eq!(
            matmul_write_bytes(OutMode::Qkv, false, &qkv, &push, 100),
            [
                (2 * 576 + 576) * 4,
                (99 * 192 + 192) * 4,
                (99 * 192 + 192) * 4
            ]
        );
        // a row-range part ending at row 400 of 576: its token rows end there
        let part = [slot(0, 100, 300)];
        assert_eq!(
            matmul_write_bytes(OutMode::Add, true, &part, &push, 100),
            [(2 * 576 + 400) * 4, (2 * 576 + 400) * 4, 0]
        );
        assert_eq!(
            matmul_write_bytes(OutMode::Add, false, &part, &push, 100)[1],
            0
        );
        let one = MatmulPush {
            n_tok: 1,
            out_ld: 49152,
            ..MatmulPush::default()
        };
        assert_eq!(
            matmul_write_bytes(OutMode::Store, false, &[slot(0, 49152, 0)], &one, 8),
            [49152 * 4, 0, 0]
        );
    }
}

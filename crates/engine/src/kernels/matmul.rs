//! `matmul.comp` and `matmul_split.comp`: `Y = W·X` with the weights read in place
//! from their GGUF blocks, and the fused epilogues of docs/design.md ("Decode") as
//! build-time variants.
//! The contract: [`MatmulPush`] (push constants), [`MatmulKey`] (the variant and its
//! pipeline), [`MatmulBindings`] (set 0, in binding order).

use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use vk::{BufferBinding, BufferView, Descriptor, DescriptorKind, PipelineDesc, Shader};

use super::{supported_weight_type, Kernel, KV_BYTES};
use crate::EngineError;

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
    /// Views q, k, v: rope q and k (pairs `(2i, 2i+1)`); q to out0, k and v to the
    /// caches (out1, out2: f16, a pair per word) at each token's cache row.
    Qkv = 2,
    /// Views gate, up: `out0 = silu(gate·x) * (up·x)`.
    Glu = 3,
    /// Views gate, up: `out0 = gelu_tanh(gate·x) * (up·x)` (gemma3; `OUT_GLU` with
    /// `ACT_GELU`).
    GeGlu = 4,
}

impl OutMode {
    /// Gate and up in bindings 0 and 1, one output row per pair (Glu, GeGlu).
    pub(crate) fn is_gated(self) -> bool {
        matches!(self, OutMode::Glu | OutMode::GeGlu)
    }
}

/// What selects a matmul dispatch's pipeline, apart from the batch kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulVariant {
    pub wtype: GgmlType,
    pub in_mode: InMode,
    pub out_mode: OutMode,
    /// Reads only the last token of the batch (the logits).
    pub last_token_only: bool,
    /// `MatmulKey::split_k` of the one-token pipeline (0: lanes own rows).
    pub split_k: u32,
    /// `MatmulKey::pairs` of the one-token column-split pipeline, chosen for the rows of
    /// the dispatch ([`super::Kernels::decode_pairs`]); 0: the shape's own.
    pub pairs: u32,
    /// `MatmulKey::texel_aligned`, from the dispatch's slots
    /// ([`k_texel_aligned`]).
    pub texel_aligned: bool,
}

/// One matmul pipeline: the build-time variant (weight type, epilogue, tokens per
/// invocation, column split) and the three specialisation constants left (workgroup size
/// and pairs per invocation: loop bounds; whether the K-quant super-blocks start on
/// texels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulKey {
    pub wtype: GgmlType,
    pub in_mode: InMode,
    pub out_mode: OutMode,
    /// Invocations per workgroup.
    pub wg: u32,
    /// Row pairs per invocation.
    pub pairs: u32,
    /// Tokens per invocation (1 or 4: [`MATMUL_TB`]), or per workgroup of the prefill
    /// GEMM ([`GEMM_TT`](super::GEMM_TT)).
    pub tb: u32,
    /// Whole rounds of `wg` chunks (64 columns) per row when the lanes split each row's
    /// columns instead of owning rows (one token only; `matmul_split.comp`'s `SPLIT_K`),
    /// from [`Kernels::column_split`](super::Kernels::column_split); 0: lanes own rows.
    pub split_k: u32,
    /// Every super-block of the dispatch starts on a texel ([`k_texel_aligned`]): the
    /// K-quant decoders' `K_TEXEL_ALIGNED`.
    pub texel_aligned: bool,
}

/// Tokens per invocation the row-per-lane matmul is built for (`TB` in kernels/variants.rs).
pub const MATMUL_TB: [u32; 2] = [1, 4];

/// The fused steps the matmul kernels are built for (`EPILOGUE` in kernels/variants.rs,
/// whose defines select each): an input mode with an output mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// rmsnorm in; rope q and k, q to out0, k and v to the caches.
    Qkv,
    /// Plain in; added to the residual.
    Add,
    /// rmsnorm in; SwiGLU of gate and up.
    Glu,
    /// rmsnorm in; stored (the logits, and a plain q/k/v before `heads.comp`).
    Logits,
    /// Plain in; stored (attn_output and ffn_down before `post_norm.comp`).
    Store,
    /// rmsnorm in; GELU(tanh)-gated gate and up.
    GeGlu,
}

impl Epilogue {
    /// The epilogue of an (input, output) mode pair, if one is built.
    pub fn of(in_mode: InMode, out_mode: OutMode) -> Option<Epilogue> {
        match (in_mode, out_mode) {
            (InMode::RmsNorm, OutMode::Qkv) => Some(Epilogue::Qkv),
            (InMode::Plain, OutMode::Add) => Some(Epilogue::Add),
            (InMode::RmsNorm, OutMode::Glu) => Some(Epilogue::Glu),
            (InMode::RmsNorm, OutMode::Store) => Some(Epilogue::Logits),
            (InMode::Plain, OutMode::Store) => Some(Epilogue::Store),
            (InMode::RmsNorm, OutMode::GeGlu) => Some(Epilogue::GeGlu),
            _ => None,
        }
    }
}

impl MatmulKey {
    /// This key for a dispatch over `n_tok` tokens: a GEMM key's tile shrinks to
    /// [`GEMM_SMALL_TILE`](super::GEMM_SMALL_TILE) when that covers them (every token's
    /// rows come out bit-identical at either tile: matmul_mm.comp), others are unchanged.
    pub fn for_tokens(self, n_tok: u32) -> MatmulKey {
        if super::is_gemm_tile(self.tb) && n_tok <= super::GEMM_SMALL_TILE {
            MatmulKey {
                tb: super::GEMM_SMALL_TILE,
                ..self
            }
        } else {
            self
        }
    }

    /// Output rows one workgroup covers.
    pub fn tile_rows(&self) -> u32 {
        rows_per_workgroup(self.wg, self.pairs, self.out_mode.is_gated())
    }

    /// The pipeline of this key: specialisation constants 0, the workgroup size, 1, the
    /// row pairs per lane, and 2, whether every part is texel-aligned (a column-split key
    /// also needs each workgroup to be one subgroup: [`MatmulKey::split_k`]).
    pub(super) fn desc(&self) -> Result<PipelineDesc, EngineError> {
        Ok(PipelineDesc {
            kernel: self.kernel()?,
            n_bindings: MATMUL_BINDINGS,
            push_size: std::mem::size_of::<MatmulPush>() as u32,
            spec: vec![self.wg, self.pairs, u32::from(self.texel_aligned)],
        })
    }

    /// The registry's kernel this key runs: the GEMM for a GEMM tile, the column split
    /// for a split key, else the row-per-lane matmul; the epilogue of its modes.
    pub fn kernel(&self) -> Result<&'static Shader, EngineError> {
        let epi = Epilogue::of(self.in_mode, self.out_mode).ok_or_else(|| {
            EngineError::Unsupported(format!(
                "a matmul with input {:?} and output {:?} (built: qkv, add, glu, logits, store, geglu)",
                self.in_mode, self.out_mode
            ))
        })?;
        if !supported_weight_type(self.wtype) {
            return Err(EngineError::Unsupported(format!(
                "weights of type {} (the GPU kernels read {})",
                self.wtype.name(),
                super::supported_weight_type_names()
            )));
        }
        let wtype = self.wtype;
        let kernel = if super::is_gemm_tile(self.tb) {
            Kernel::MatmulMm {
                wtype,
                tt: self.tb,
                epilogue: epi,
            }
        } else if self.split_k > 0 {
            Kernel::MatmulSplit {
                wtype,
                split_k: self.split_k,
                epilogue: epi,
            }
        } else {
            Kernel::Matmul {
                wtype,
                tb: self.tb,
                epilogue: epi,
            }
        };
        kernel.built()
    }
}

/// Whether the K-quant decoders may take every word-addressed run of a dispatch to start
/// on a texel (`K_TEXEL_ALIGNED` in include/quant_k_common.glsl): the weights are Q4_K or
/// Q5_K, whose super-blocks are whole texels (144 and 176 bytes), and every view's word
/// offset is a multiple of 4. GGUF's tensor alignment (32 bytes) makes real files so;
/// then those decoders skip the realignment and a texel fetch per run (a Q4_K pair of
/// chunks takes 5 fetches, not 7). Any other type, or any offset off a texel: false.
pub fn k_texel_aligned(wtype: GgmlType, slots: &[Slot]) -> bool {
    matches!(wtype, GgmlType::Q4_K | GgmlType::Q5_K)
        && !slots.is_empty()
        && slots.iter().all(|s| s.wofs % 4 == 0)
}

/// Output rows a workgroup of `wg` invocations with `pairs` row pairs each covers (a
/// gated pair is a gate row and an up row: one output row).
pub(crate) fn rows_per_workgroup(wg: u32, pairs: u32, gated: bool) -> u32 {
    if gated {
        wg * pairs
    } else {
        2 * wg * pairs
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
        if !key.out_mode.is_gated() || s.slot == 0 {
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
pub(crate) fn matmul_write_bytes(
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
    // bytes up to row `end` of token row `n - 1`, rows `ld` elements of `size` bytes apart
    let sized = |size: u64, n: u64, ld: u32, end: u64| {
        if end == 0 || n == 0 {
            0
        } else {
            ((n - 1) * u64::from(ld) + end) * size
        }
    };
    let bytes = |n, ld, end| sized(4, n, ld, end);
    let n_tok = u64::from(push.n_tok);
    match out_mode {
        // a store of several views (a plain q/k/v) writes every view's rows into out0
        OutMode::Store => [bytes(n_tok, push.out_ld, end(None)), 0, 0],
        OutMode::Glu | OutMode::GeGlu => [bytes(n_tok, push.out_ld, end(Some(0))), 0, 0],
        OutMode::Add => {
            let o = bytes(n_tok, push.out_ld, end(None));
            [o, if write_xg { o } else { 0 }, 0]
        }
        OutMode::Qkv => [
            bytes(n_tok, push.out_ld, end(Some(0))),
            sized(KV_BYTES, ctx_len as u64, push.kv_ld, end(Some(1))),
            sized(KV_BYTES, ctx_len as u64, push.kv_ld, end(Some(2))),
        ],
    }
}

/// Most chunks per lane per row the column-split matmul unrolls (its largest `SPLIT_K`).
pub const SPLIT_MAX_CHUNKS_PER_LANE: u32 = 4;

/// Bindings of the matmul kernels: w0, w1, x, aux, out0, out1, out2, step, xr
/// (weights, x and xr are texel buffers: their kinds come from the SPIR-V).
pub const MATMUL_BINDINGS: u32 = 9;

/// What a matmul dispatch binds, by name (GLSL: `shaders/include/matmul.glsl`).
#[derive(Clone)]
pub struct MatmulBindings<'a> {
    /// Weights of views 0 (and 2) and of view 1 (gate/up: up), texel buffers.
    pub w0: &'a BufferView,
    pub w1: &'a BufferView,
    /// The dot input (xg for IN_RMSNORM), RGBA32F texels.
    pub x: &'a BufferView,
    /// OUT_ADD: the next norm weight.
    pub aux: BufferBinding,
    pub out0: BufferBinding,
    pub out1: BufferBinding,
    pub out2: BufferBinding,
    /// The step buffer (position, rope frequencies, token ids).
    pub step: BufferBinding,
    /// The raw residual the rms is taken of (IN_RMSNORM), RGBA32F texels.
    pub xr: &'a BufferView,
}

impl<'a> MatmulBindings<'a> {
    /// Descriptor kinds, in binding order, that the SPIR-V declares.
    pub const KINDS: [DescriptorKind; MATMUL_BINDINGS as usize] = {
        use DescriptorKind::{StorageBuffer as S, UniformTexelBuffer as T};
        [T, T, T, S, S, S, S, S, T]
    };

    /// The descriptor writes, in binding order.
    pub fn descriptors(&self) -> [Descriptor<'a>; MATMUL_BINDINGS as usize] {
        [
            Descriptor::Texel(self.w0),
            Descriptor::Texel(self.w1),
            Descriptor::Texel(self.x),
            Descriptor::Buffer(self.aux.clone()),
            Descriptor::Buffer(self.out0.clone()),
            Descriptor::Buffer(self.out1.clone()),
            Descriptor::Buffer(self.out2.clone()),
            Descriptor::Buffer(self.step.clone()),
            Descriptor::Texel(self.xr),
        ]
    }
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

    /// Only Q4_K and Q5_K (super-blocks of whole texels) take the aligned decoders, and
    /// only when every view of the dispatch starts on a texel.
    #[test]
    fn texel_aligned_only_for_whole_texel_super_blocks_on_texels() {
        let at = |wofs: &[u32]| -> Vec<Slot> {
            wofs.iter()
                .enumerate()
                .map(|(i, &w)| Slot {
                    wofs: w,
                    ..slot(i, 256, 0)
                })
                .collect()
        };
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K] {
            assert!(k_texel_aligned(ty, &at(&[0])));
            assert!(k_texel_aligned(ty, &at(&[16, 36 * 640, 8])));
            assert!(
                !k_texel_aligned(ty, &at(&[16, 5])),
                "{ty:?}: one view off a texel"
            );
            assert!(!k_texel_aligned(ty, &at(&[2])));
            assert!(!k_texel_aligned(ty, &[]));
        }
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::F32,
        ] {
            assert!(!k_texel_aligned(ty, &at(&[0])), "{ty:?}");
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
                (99 * 192 + 192) * 2,
                (99 * 192 + 192) * 2
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

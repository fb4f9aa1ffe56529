//! `attention.comp`: causal GQA attention of a batch over the KV cache. The contract:
//! [`AttentionPush`], the variant (head dimension, a specialisation constant),
//! [`AttentionBindings`].

use bytemuck::{Pod, Zeroable};
use vk::{BufferBinding, BufferView, Descriptor, DescriptorKind, PipelineDesc};

use super::Kernel;
use crate::EngineError;

/// Push constants of `attention.comp` (GLSL twin: its `push_constant` block).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AttentionPush {
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// Factor of the scores (`Config::attn_scale`).
    pub scale: f32,
    /// Positions a query sees, itself included (a sliding-window layer); 0: every one.
    pub window: u32,
    /// The batch's first token whose query runs: workgroup row `y` is token `t0 + y` and
    /// writes row `y` of `out` (0 but for a prompt whose last token alone goes on).
    pub t0: u32,
}
const _: () = assert!(std::mem::size_of::<AttentionPush>() == 24);

/// Bindings of `attention.comp`: q, k cache, v cache, out, step.
pub const ATTENTION_BINDINGS: u32 = 5;
/// Largest head dimension `attention.comp` is built for (it keeps q and the running
/// output of a head in registers).
pub(crate) const ATTENTION_MAX_HEAD_DIM: u32 = 256;
/// Workgroup size of `attention.comp`.
pub(crate) const ATTENTION_WG: u32 = 8;

/// The pipeline of `attention.comp` for heads of `head_dim` (a multiple of 4, at most
/// [`ATTENTION_MAX_HEAD_DIM`]): specialisation constants 0, the workgroup size, and 1,
/// the quads per head.
pub(super) fn attention_desc(head_dim: u32) -> Result<PipelineDesc, EngineError> {
    if head_dim == 0 || !head_dim.is_multiple_of(4) || head_dim > ATTENTION_MAX_HEAD_DIM {
        return Err(EngineError::Unsupported(format!(
            "head dimension {head_dim}: the attention kernel needs a multiple of 4 up to {ATTENTION_MAX_HEAD_DIM}"
        )));
    }
    Ok(PipelineDesc {
        kernel: Kernel::Attention.built()?,
        n_bindings: ATTENTION_BINDINGS,
        push_size: std::mem::size_of::<AttentionPush>() as u32,
        spec: vec![ATTENTION_WG, head_dim / 4],
    })
}

/// What the attention kernel binds, by name (GLSL: `shaders/attention.comp`).
#[derive(Clone)]
pub struct AttentionBindings<'a> {
    /// q as RGBA32F texels, and the layer's key and value caches as RGBA16F texels (f16,
    /// `super::KV_BYTES`).
    pub q: &'a BufferView,
    pub k_cache: &'a BufferView,
    pub v_cache: &'a BufferView,
    /// att_out written.
    pub out: BufferBinding,
    pub step: BufferBinding,
}

impl<'a> AttentionBindings<'a> {
    /// Descriptor kinds, in binding order, that the SPIR-V declares.
    pub const KINDS: [DescriptorKind; ATTENTION_BINDINGS as usize] = {
        use DescriptorKind::{StorageBuffer as S, UniformTexelBuffer as T};
        [T, T, T, S, S]
    };

    /// The descriptor writes, in binding order.
    pub fn descriptors(&self) -> [Descriptor<'a>; ATTENTION_BINDINGS as usize] {
        [
            Descriptor::Texel(self.q),
            Descriptor::Texel(self.k_cache),
            Descriptor::Texel(self.v_cache),
            Descriptor::Buffer(self.out.clone()),
            Descriptor::Buffer(self.step.clone()),
        ]
    }
}

//! `heads.comp`: the per-head steps between a plain q/k/v matmul and attention (q/k/v
//! biases, per-head Q/K RMS norms, RoPE with the layer's frequency table, q and the
//! KV-cache writes, f16), for the families llama's fused epilogue does not cover (and
//! every neox model's q/k/v: `graph::GraphShape::fused_qkv`). The
//! contract: [`HeadsPush`], one variant, [`HeadsBindings`].

use bytemuck::{Pod, Zeroable};
use vk::{BufferBinding, Descriptor, DescriptorKind, PipelineDesc};

use super::Kernel;
use crate::EngineError;

/// `HeadsPush::flags`: add the q/k/v biases.
pub const HEADS_BIAS: u32 = 1;
/// `HeadsPush::flags`: RMS-norm every head of q and k.
pub const HEADS_NORM: u32 = 2;
/// `HeadsPush::flags`: rope pairs `(i, i + head_dim/2)` instead of `(2i, 2i+1)`.
pub const HEADS_NEOX: u32 = 4;

/// Push constants of `heads.comp` (GLSL twin: its `push_constant` block).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq)]
pub struct HeadsPush {
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// Floats between token rows of the q/k/v input (`(n_heads + 2 n_kv_heads)·head_dim`).
    pub qkv_ld: u32,
    /// Floats between token rows of q.
    pub q_ld: u32,
    /// Floats between positions of the caches.
    pub kv_ld: u32,
    pub eps: f32,
    /// [`HEADS_BIAS`] | [`HEADS_NORM`] | [`HEADS_NEOX`].
    pub flags: u32,
    /// Offset of this layer's frequency table in the rope binding.
    pub freq_ofs: u32,
    /// Float offsets of the q, k, v biases and the q, k norm weights in their bindings.
    pub bq_ofs: u32,
    pub bk_ofs: u32,
    pub bv_ofs: u32,
    pub qn_ofs: u32,
    pub kn_ofs: u32,
    pub pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<HeadsPush>() == 64);

/// Bindings of `heads.comp`: qkv, bq, bk, bv, qn, kn, q, k cache, v cache, step, rope.
pub const HEADS_BINDINGS: u32 = 11;

/// Workgroups of a `heads.comp` dispatch over `n_tok` tokens: one per (head, token).
pub fn heads_groups(push: &HeadsPush, n_tok: u32) -> [u32; 3] {
    [push.n_heads + 2 * push.n_kv_heads, n_tok, 1]
}

/// The pipeline of `heads.comp` (no specialisation constant).
pub(super) fn heads_desc() -> Result<PipelineDesc, EngineError> {
    Ok(PipelineDesc {
        kernel: Kernel::Heads.built()?,
        n_bindings: HEADS_BINDINGS,
        push_size: std::mem::size_of::<HeadsPush>() as u32,
        spec: vec![],
    })
}

/// What the heads kernel binds, by name (GLSL: `shaders/heads.comp`). Unused biases and
/// norms: any buffer (the flags say they are not read).
#[derive(Clone)]
pub struct HeadsBindings {
    /// `[n_tok][qkv_ld]`: q heads, then k heads, then v heads.
    pub qkv: BufferBinding,
    pub bq: BufferBinding,
    pub bk: BufferBinding,
    pub bv: BufferBinding,
    pub q_norm: BufferBinding,
    pub k_norm: BufferBinding,
    /// q written, `[n_tok][q_ld]`.
    pub q: BufferBinding,
    /// The layer's caches, written at each token's row (the step buffer's `row`).
    pub k_cache: BufferBinding,
    pub v_cache: BufferBinding,
    pub step: BufferBinding,
    /// The frequency tables (`theta_i = pos · rope[freq_ofs + i]`).
    pub rope: BufferBinding,
}

impl HeadsBindings {
    /// Descriptor kinds, in binding order, that the SPIR-V declares.
    pub const KINDS: [DescriptorKind; HEADS_BINDINGS as usize] =
        [DescriptorKind::StorageBuffer; HEADS_BINDINGS as usize];

    /// The descriptor writes, in binding order.
    pub fn descriptors(&self) -> [Descriptor<'static>; HEADS_BINDINGS as usize] {
        [
            &self.qkv,
            &self.bq,
            &self.bk,
            &self.bv,
            &self.q_norm,
            &self.k_norm,
            &self.q,
            &self.k_cache,
            &self.v_cache,
            &self.step,
            &self.rope,
        ]
        .map(|b| Descriptor::Buffer(b.clone()))
    }
}

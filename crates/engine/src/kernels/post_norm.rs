//! `post_norm.comp`: the residual add of a block whose output is RMS-normed first
//! (gemma3's post-attention and post-FFN norms): `x += rmsnorm(y)∘w; xg = x∘g`. The
//! contract: [`PostNormPush`], one variant (the workgroup size, a specialisation
//! constant), [`PostNormBindings`].

use bytemuck::{Pod, Zeroable};
use vk::{BufferBinding, Descriptor, DescriptorKind, PipelineDesc};

use super::Kernel;
use crate::EngineError;

/// Push constants of `post_norm.comp` (GLSL twin: its `push_constant` block).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq)]
pub struct PostNormPush {
    pub dim: u32,
    pub eps: f32,
    /// Float offsets of the post-norm weight and the next norm weight in their bindings.
    pub w_ofs: u32,
    pub g_ofs: u32,
}
const _: () = assert!(std::mem::size_of::<PostNormPush>() == 16);

/// Bindings of `post_norm.comp`: y, w, g, x, xg.
pub const POST_NORM_BINDINGS: u32 = 5;
/// Workgroup size of `post_norm.comp` (a power of two: its reduction halves it).
pub(crate) const POST_NORM_WG: u32 = 64;

/// The pipeline of `post_norm.comp`: specialisation constant 0 is the workgroup size.
pub(super) fn post_norm_desc() -> Result<PipelineDesc, EngineError> {
    Ok(PipelineDesc {
        kernel: Kernel::PostNorm.built()?,
        n_bindings: POST_NORM_BINDINGS,
        push_size: std::mem::size_of::<PostNormPush>() as u32,
        spec: vec![POST_NORM_WG],
    })
}

/// What the post-norm add binds, by name (GLSL: `shaders/post_norm.comp`).
#[derive(Clone)]
pub struct PostNormBindings {
    /// The block's output, `[n_tok][dim]`.
    pub y: BufferBinding,
    /// The post norm's weight.
    pub w: BufferBinding,
    /// The next norm's weight (xg = x∘g).
    pub g: BufferBinding,
    /// The residual, read and written.
    pub x: BufferBinding,
    pub xg: BufferBinding,
}

impl PostNormBindings {
    /// Descriptor kinds, in binding order, that the SPIR-V declares.
    pub const KINDS: [DescriptorKind; POST_NORM_BINDINGS as usize] =
        [DescriptorKind::StorageBuffer; POST_NORM_BINDINGS as usize];

    /// The descriptor writes, in binding order.
    pub fn descriptors(&self) -> [Descriptor<'static>; POST_NORM_BINDINGS as usize] {
        [&self.y, &self.w, &self.g, &self.x, &self.xg].map(|b| Descriptor::Buffer(b.clone()))
    }
}

//! `embed.comp`: the embedding row gather, dequantised in registers, also writing
//! x∘g (the first rmsnorm's input). The contract: [`EmbedPush`], the variant (the table's
//! weight type: `embed.<type>`), [`EmbedBindings`].

use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;
use vk::{BufferBinding, BufferView, Descriptor, DescriptorKind, PipelineDesc, Shader};

use super::Kernel;
use crate::EngineError;

/// Push constants of `embed.comp` (GLSL twin: its `push_constant` block).
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
    /// Factor applied to the row (`Config::embd_scale`: √dim for gemma3, else 1).
    pub scale: f32,
}
const _: () = assert!(std::mem::size_of::<EmbedPush>() == 52);

/// The embedding kernel for a table of type `ty`.
pub(super) fn embed_kernel(ty: GgmlType) -> Result<&'static Shader, EngineError> {
    Kernel::Embed { wtype: ty }.shader().ok_or_else(|| {
        EngineError::Unsupported(format!(
            "an embedding table of type {} (the GPU kernels read {})",
            ty.name(),
            super::supported_weight_type_names()
        ))
    })
}

/// Bindings of `embed.comp`: w0, w1, w2, x, step, xg, g.
pub const EMBED_BINDINGS: u32 = 7;
/// Workgroup size of `embed.comp`.
pub const EMBED_WG: u32 = 8;

/// The pipeline of the embedding gather for a table of type `ty`: specialisation
/// constant 0 is the workgroup size.
pub(super) fn embed_desc(ty: GgmlType) -> Result<PipelineDesc, EngineError> {
    Ok(PipelineDesc {
        kernel: embed_kernel(ty)?,
        n_bindings: EMBED_BINDINGS,
        push_size: std::mem::size_of::<EmbedPush>() as u32,
        spec: vec![EMBED_WG],
    })
}

/// What the embedding gather binds, by name (GLSL: `shaders/embed.comp`).
#[derive(Clone)]
pub struct EmbedBindings<'a> {
    /// The table's row-range parts (unused ones: any weight view), texel buffers.
    pub w0: &'a BufferView,
    pub w1: &'a BufferView,
    pub w2: &'a BufferView,
    /// The residual written, one row per token.
    pub x: BufferBinding,
    pub step: BufferBinding,
    /// x∘g written.
    pub xg: BufferBinding,
    /// The first norm weight.
    pub g: BufferBinding,
}

impl<'a> EmbedBindings<'a> {
    /// Descriptor kinds, in binding order, that the SPIR-V declares.
    pub const KINDS: [DescriptorKind; EMBED_BINDINGS as usize] = {
        use DescriptorKind::{StorageBuffer as S, UniformTexelBuffer as T};
        [T, T, T, S, S, S, S]
    };

    /// The descriptor writes, in binding order.
    pub fn descriptors(&self) -> [Descriptor<'a>; EMBED_BINDINGS as usize] {
        [
            Descriptor::Texel(self.w0),
            Descriptor::Texel(self.w1),
            Descriptor::Texel(self.w2),
            Descriptor::Buffer(self.x.clone()),
            Descriptor::Buffer(self.step.clone()),
            Descriptor::Buffer(self.xg.clone()),
            Descriptor::Buffer(self.g.clone()),
        ]
    }
}

//! `argmax.comp`: the greedy token on the GPU. The contract: [`ArgmaxPush`], one
//! variant, [`ArgmaxBindings`].

use bytemuck::{Pod, Zeroable};
use vk::{BufferBinding, Descriptor, DescriptorKind, PipelineDesc};

use super::Kernel;
use crate::EngineError;

/// Set in `argmax.comp`'s result word when the logits row held a NaN or an infinity
/// (the low 31 bits are the index).
pub(crate) const ARGMAX_NON_FINITE: u32 = 1 << 31;

/// Push constants of `argmax.comp` (GLSL twin: its `push_constant` block).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ArgmaxPush {
    pub n: u32,
}
const _: () = assert!(std::mem::size_of::<ArgmaxPush>() == 4);

/// Bindings of `argmax.comp`: logits, result.
pub const ARGMAX_BINDINGS: u32 = 2;
/// Workgroup size of `argmax.comp`: at most its shared arrays' `MAX_WG` (256).
pub(crate) const ARGMAX_WG: u32 = 64;
const _: () = assert!(ARGMAX_WG <= 256);

/// The pipeline of `argmax.comp`: specialisation constant 0 is the workgroup size.
pub(super) fn argmax_desc() -> Result<PipelineDesc, EngineError> {
    Ok(PipelineDesc {
        kernel: Kernel::Argmax.built()?,
        n_bindings: ARGMAX_BINDINGS,
        push_size: std::mem::size_of::<ArgmaxPush>() as u32,
        spec: vec![ARGMAX_WG],
    })
}

/// What the argmax kernel binds, by name (GLSL: `shaders/argmax.comp`).
#[derive(Clone)]
pub struct ArgmaxBindings {
    pub logits: BufferBinding,
    /// One word: the index, with `ARGMAX_NON_FINITE` set for a non-finite row.
    pub result: BufferBinding,
}

impl ArgmaxBindings {
    /// Descriptor kinds, in binding order, that the SPIR-V declares.
    pub const KINDS: [DescriptorKind; ARGMAX_BINDINGS as usize] =
        [DescriptorKind::StorageBuffer, DescriptorKind::StorageBuffer];

    /// The descriptor writes, in binding order.
    pub fn descriptors(&self) -> [Descriptor<'static>; ARGMAX_BINDINGS as usize] {
        [
            Descriptor::Buffer(self.logits.clone()),
            Descriptor::Buffer(self.result.clone()),
        ]
    }
}

//! `softcap.comp`: final logit softcapping in place, `x = cap·tanh(x/cap)`. The contract:
//! [`SoftcapPush`], one variant, [`SoftcapBindings`].

use bytemuck::{Pod, Zeroable};
use vk::{BufferBinding, Descriptor, DescriptorKind, PipelineDesc};

use super::Kernel;
use crate::EngineError;

/// Push constants of `softcap.comp` (GLSL twin: its `push_constant` block).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq)]
pub struct SoftcapPush {
    pub n: u32,
    pub cap: f32,
}
const _: () = assert!(std::mem::size_of::<SoftcapPush>() == 8);

/// Bindings of `softcap.comp`: the logits.
pub const SOFTCAP_BINDINGS: u32 = 1;
/// Workgroup size of `softcap.comp` (its `local_size_x`).
pub const SOFTCAP_WG: u32 = 64;

/// The pipeline of `softcap.comp` (no specialisation constant).
pub(super) fn softcap_desc() -> Result<PipelineDesc, EngineError> {
    Ok(PipelineDesc {
        kernel: Kernel::Softcap.built()?,
        n_bindings: SOFTCAP_BINDINGS,
        push_size: std::mem::size_of::<SoftcapPush>() as u32,
        spec: vec![],
    })
}

/// What the softcap kernel binds (GLSL: `shaders/softcap.comp`).
#[derive(Clone)]
pub struct SoftcapBindings {
    pub logits: BufferBinding,
}

impl SoftcapBindings {
    /// Descriptor kinds, in binding order, that the SPIR-V declares.
    pub const KINDS: [DescriptorKind; SOFTCAP_BINDINGS as usize] = [DescriptorKind::StorageBuffer];

    /// The descriptor writes, in binding order.
    pub fn descriptors(&self) -> [Descriptor<'static>; SOFTCAP_BINDINGS as usize] {
        [Descriptor::Buffer(self.logits.clone())]
    }
}

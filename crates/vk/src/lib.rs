//! vk: the Vulkan compute runtime of vkdecode, on `ash`.
//!
//! Every Vulkan handle belongs to exactly one Rust type that destroys it in `Drop`;
//! children hold an `Arc<Context>` so the device outlives them. This crate knows
//! nothing of GGUF or Llama. `unsafe` lives here (Vulkan calls), each block with a
//! `// SAFETY:` comment.
//!
//! - [`Context`]: instance, optional validation messenger, physical device, device, one
//!   compute queue and the `gpu-allocator` allocator.
//! - [`Capabilities`]: what the driver reports, never assumed.
//! - [`Buffer`] (allocator-backed) and [`ImportedBuffer`] (`VK_EXT_external_memory_host`).
//! - [`Pipeline`], [`DescriptorSet`], [`CommandBuffer`], [`QueryPool`].
//! - [`Shader`]: a SPIR-V module embedded by a build script (shader-build), unpacked on
//!   first use; [`CHECKSUM`] is this crate's own.

mod buffer;
mod caps;
pub mod checksum;
mod command;
mod context;
mod error;
mod import;
mod pipeline;
mod pipeline_cache;
mod shader;
pub mod testing;
mod texel;
pub mod validation;

pub use ash;
pub use buffer::{Buffer, BufferBinding, BufferDesc, BufferRef, MemLocation};
pub use caps::{
    Capabilities, DeviceType, MemoryHeapInfo, MemoryTypeInfo, SubgroupGuarantee,
    SubgroupSizeControl,
};
pub use command::{CommandBuffer, QueryPool};
pub use context::{default_device, enumerate_devices, Context, ContextOptions};
pub use error::VkError;
pub use import::ImportedBuffer;
pub use pipeline::{
    spirv_override, Descriptor, DescriptorKind, DescriptorSet, Pipeline, PipelineDesc,
    SPIRV_DIR_ENV,
};
pub use shader::{Shader, ShaderPack, CHECKSUM};
pub use texel::{BufferView, TexelFormat};

//! Texel buffer views: a buffer range read by shaders with `texelFetch`. On lavapipe a
//! texel fetch is a plain gather with no per-lane branch, where a storage-buffer load
//! inside control flow becomes a per-lane loop (docs/facts.md, "Decode kernels on
//! lavapipe").

use std::sync::Arc;

use ash::vk;

use crate::buffer::{BufferBinding, BufferRef};
use crate::error::{VkError, VkResultExt};
use crate::Context;

/// Texel formats the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TexelFormat {
    /// One u32 per texel (`utextureBuffer`, `.x`).
    R32Uint,
    /// Four u32 per texel (`utextureBuffer`).
    Rgba32Uint,
    /// Four f32 per texel (`textureBuffer`).
    Rgba32Float,
    /// Four f16 per texel, read as f32 (`textureBuffer`).
    Rgba16Float,
}

impl TexelFormat {
    fn vk(self) -> vk::Format {
        match self {
            TexelFormat::R32Uint => vk::Format::R32_UINT,
            TexelFormat::Rgba32Uint => vk::Format::R32G32B32A32_UINT,
            TexelFormat::Rgba32Float => vk::Format::R32G32B32A32_SFLOAT,
            TexelFormat::Rgba16Float => vk::Format::R16G16B16A16_SFLOAT,
        }
    }

    /// Bytes per texel.
    pub fn size(self) -> u64 {
        match self {
            TexelFormat::R32Uint => 4,
            TexelFormat::Rgba16Float => 8,
            TexelFormat::Rgba32Uint | TexelFormat::Rgba32Float => 16,
        }
    }
}

/// A `VkBufferView`; holds the buffer it views. The view is destroyed when this value
/// and every descriptor set and recording that uses it are gone.
pub struct BufferView {
    raw: Arc<RawView>,
    texels: u64,
}

/// The view handle and the buffer under it.
pub(crate) struct RawView {
    view: vk::BufferView,
    _buffer: BufferRef,
    ctx: Arc<Context>,
}

impl Drop for RawView {
    fn drop(&mut self) {
        // SAFETY: nothing can reach the view any more (sets and recordings hold this
        // value); the buffer is released after it.
        unsafe { self.ctx.device().destroy_buffer_view(self.view, None) };
    }
}

impl BufferView {
    /// A view of `binding` (the range rounded down to whole texels). The offset must be a
    /// multiple of the device's texel-buffer offset alignment and the texel count at most
    /// `maxTexelBufferElements`.
    pub fn new(
        ctx: &Arc<Context>,
        binding: BufferBinding,
        format: TexelFormat,
    ) -> Result<BufferView, VkError> {
        let (align, max_texels) = ctx.texel_limits();
        let texels = binding.range / format.size();
        let why = if !binding.offset.is_multiple_of(align.max(1)) {
            Some(format!(
                "offset {} is not a multiple of minTexelBufferOffsetAlignment {align}",
                binding.offset
            ))
        } else if texels == 0 || texels > u64::from(max_texels) {
            Some(format!(
                "{texels} texels: 0 or above maxTexelBufferElements {max_texels}"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(VkError::Pipeline {
                kernel: "texel buffer view",
                why,
            });
        }
        let info = vk::BufferViewCreateInfo::default()
            .buffer(binding.buffer.raw())
            .format(format.vk())
            .offset(binding.offset)
            .range(texels * format.size());
        // SAFETY: valid create info for a live buffer (created with UNIFORM_TEXEL_BUFFER
        // usage by `Buffer::new` / `ImportedBuffer::import`); offset and range checked.
        let view =
            unsafe { ctx.device().create_buffer_view(&info, None) }.call("vkCreateBufferView")?;
        Ok(BufferView {
            raw: Arc::new(RawView {
                view,
                _buffer: binding.buffer,
                ctx: Arc::clone(ctx),
            }),
            texels,
        })
    }

    /// Texels in the view.
    pub fn texels(&self) -> u64 {
        self.texels
    }

    pub(crate) fn raw(&self) -> vk::BufferView {
        self.raw.view
    }

    pub(crate) fn keep(&self) -> Arc<RawView> {
        Arc::clone(&self.raw)
    }
}

impl std::fmt::Debug for BufferView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferView")
            .field("texels", &self.texels)
            .finish()
    }
}

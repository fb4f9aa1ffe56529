//! Allocator-backed buffers: `VkBuffer` + gpu-allocator `Allocation`, freed together.

use std::sync::Arc;

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::MemoryLocation;

use crate::error::{VkError, VkResultExt};
use crate::Context;

/// Buffers at least this large get their own `VkDeviceMemory`.
const DEDICATED_MIN: u64 = 32 << 20;

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemLocation {
    /// Device-local; host access only if the device happens to expose it (unified memory).
    GpuOnly,
    /// Host-visible, written by the host, read by the GPU (uniforms, staging).
    CpuToGpu,
    /// Host-visible and cached, written by the GPU, read back by the host.
    GpuToCpu,
}

/// Describes a [`Buffer`] to create.
#[derive(Clone, Debug)]
pub struct BufferDesc {
    /// Size in bytes (> 0).
    pub size: u64,
    /// Memory location.
    pub location: MemLocation,
    /// Usage on top of `STORAGE_BUFFER` (e.g. `TRANSFER_SRC | TRANSFER_DST`).
    pub usage: vk::BufferUsageFlags,
    /// Name for errors and tracing.
    pub name: String,
}

impl BufferDesc {
    /// A storage buffer usable as copy source and destination.
    pub fn storage(name: &str, size: u64, location: MemLocation) -> BufferDesc {
        BufferDesc {
            size,
            location,
            usage: vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST,
            name: name.to_string(),
        }
    }
}

/// A range of a buffer as bound into a descriptor set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferBinding {
    /// The buffer.
    pub buffer: vk::Buffer,
    /// Byte offset (a multiple of `minStorageBufferOffsetAlignment`).
    pub offset: u64,
    /// Byte length (at most `maxStorageBufferRange`).
    pub range: u64,
}

/// A buffer with its memory; both are released in `Drop`.
pub struct Buffer {
    buffer: vk::Buffer,
    allocation: Option<Allocation>,
    size: u64,
    name: String,
    ctx: Arc<Context>,
}

impl Buffer {
    /// Creates and binds a buffer of `desc.size` bytes.
    pub fn new(ctx: &Arc<Context>, desc: &BufferDesc) -> Result<Buffer, VkError> {
        if desc.size == 0 {
            return Err(VkError::OutOfBounds {
                name: desc.name.clone(),
                offset: 0,
                len: 0,
                size: 0,
            });
        }
        let dev = ctx.device();
        let info = vk::BufferCreateInfo::default()
            .size(desc.size)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::UNIFORM_TEXEL_BUFFER
                    | desc.usage,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid create info on a live device.
        let buffer = unsafe { dev.create_buffer(&info, None) }.call("vkCreateBuffer")?;
        // SAFETY: `buffer` was just created on this device.
        let requirements = unsafe { dev.get_buffer_memory_requirements(buffer) };
        let location = match desc.location {
            MemLocation::GpuOnly => MemoryLocation::GpuOnly,
            MemLocation::CpuToGpu => MemoryLocation::CpuToGpu,
            MemLocation::GpuToCpu => MemoryLocation::GpuToCpu,
        };
        let allocation_scheme = if desc.size >= DEDICATED_MIN {
            AllocationScheme::DedicatedBuffer(buffer)
        } else {
            AllocationScheme::GpuAllocatorManaged
        };
        let allocated = match ctx.allocator().lock() {
            Ok(mut a) => a.allocate(&AllocationCreateDesc {
                name: &desc.name,
                requirements,
                location,
                linear: true,
                allocation_scheme,
            }),
            Err(_) => Err(gpu_allocator::AllocationError::Internal(
                "allocator mutex poisoned".into(),
            )),
        };
        let allocation = match allocated {
            Ok(a) => a,
            Err(source) => {
                // SAFETY: the buffer is unused and unbound.
                unsafe { dev.destroy_buffer(buffer, None) };
                return Err(VkError::Alloc {
                    name: desc.name.clone(),
                    size: desc.size,
                    source,
                });
            }
        };
        // SAFETY: the allocation satisfies `requirements` of this buffer.
        let bound =
            unsafe { dev.bind_buffer_memory(buffer, allocation.memory(), allocation.offset()) };
        let size_alloc = allocation.size();
        let out = Buffer {
            buffer,
            allocation: Some(allocation),
            size: desc.size,
            name: desc.name.clone(),
            ctx: Arc::clone(ctx),
        };
        ctx.add_device_bytes(size_alloc, true);
        ctx.count_allocation(true);
        bound.call("vkBindBufferMemory")?; // on error `out` is dropped and freed
        Ok(out)
    }

    fn host_ptr(&self) -> Result<*mut u8, VkError> {
        let a = self
            .allocation
            .as_ref()
            .ok_or_else(|| VkError::NotHostVisible(self.name.clone()))?;
        if !a
            .memory_properties()
            .contains(vk::MemoryPropertyFlags::HOST_COHERENT)
        {
            return Err(VkError::NotHostVisible(self.name.clone()));
        }
        a.mapped_ptr()
            .map(|p| p.as_ptr() as *mut u8)
            .ok_or_else(|| VkError::NotHostVisible(self.name.clone()))
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), VkError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(VkError::OutOfBounds {
                name: self.name.clone(),
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Copies `data` into the buffer at byte `offset` (host-visible, coherent memory only).
    /// The GPU must not be using the range.
    pub fn write<T: bytemuck::Pod>(&self, offset: u64, data: &[T]) -> Result<(), VkError> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.check(offset, bytes.len() as u64)?;
        let base = self.host_ptr()?;
        // SAFETY: the persistent mapping covers the allocation, which holds at least
        // `size` bytes, and the range was checked; the caller guarantees no GPU access
        // races this write; coherent memory needs no flush.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset as usize), bytes.len())
        };
        Ok(())
    }

    /// Copies from the buffer at byte `offset` into `out` (host-visible, coherent only).
    pub fn read<T: bytemuck::Pod>(&self, offset: u64, out: &mut [T]) -> Result<(), VkError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.check(offset, bytes.len() as u64)?;
        let base = self.host_ptr()?;
        // SAFETY: as in `write`; `out` is a distinct host allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(
                base.add(offset as usize),
                bytes.as_mut_ptr(),
                bytes.len(),
            )
        };
        Ok(())
    }

    /// The whole buffer as a binding.
    pub fn binding(&self) -> BufferBinding {
        BufferBinding {
            buffer: self.buffer,
            offset: 0,
            range: self.size,
        }
    }

    /// A sub-range as a binding (caller keeps offset alignment).
    pub fn binding_range(&self, offset: u64, range: u64) -> BufferBinding {
        BufferBinding {
            buffer: self.buffer,
            offset,
            range,
        }
    }

    /// The raw handle.
    pub fn raw(&self) -> vk::Buffer {
        self.buffer
    }

    /// Size in bytes as asked.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the caller guarantees the GPU no longer uses this buffer (all
        // submissions touching it have been waited for); the buffer is destroyed
        // before its memory is freed.
        unsafe { self.ctx.device().destroy_buffer(self.buffer, None) };
        if let Some(a) = self.allocation.take() {
            self.ctx.add_device_bytes(a.size(), false);
            self.ctx.count_allocation(false);
            if let Ok(mut alloc) = self.ctx.allocator().lock() {
                if let Err(e) = alloc.free(a) {
                    tracing::warn!(buffer = %self.name, "freeing buffer memory: {e}");
                }
            }
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("name", &self.name)
            .field("size", &self.size)
            .finish()
    }
}

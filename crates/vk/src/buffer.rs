//! Allocator-backed buffers: `VkBuffer` + gpu-allocator `Allocation`, freed together.

use std::any::Any;
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

/// A shared handle on a buffer and its memory: what bindings, texel views, descriptor
/// sets and command buffers hold, so that a buffer lives as long as anything that can
/// reach it on the GPU. Compares by identity.
#[derive(Clone)]
pub struct BufferRef(pub(crate) Arc<RawBuffer>);

impl BufferRef {
    pub(crate) fn raw(&self) -> vk::Buffer {
        self.0.buffer
    }

    /// The buffer's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
}

impl PartialEq for BufferRef {
    fn eq(&self, other: &BufferRef) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for BufferRef {}

impl std::fmt::Debug for BufferRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferRef({})", self.0.name)
    }
}

/// A range of a buffer as bound into a descriptor set; holds the buffer alive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferBinding {
    /// The buffer.
    pub buffer: BufferRef,
    /// Byte offset (a multiple of `minStorageBufferOffsetAlignment`).
    pub offset: u64,
    /// Byte length (at most `maxStorageBufferRange`).
    pub range: u64,
}

/// What backs a [`RawBuffer`].
pub(crate) enum Memory {
    /// A gpu-allocator allocation (taken in `Drop`).
    Allocated(Option<Allocation>),
    /// Device memory imported from a host pointer, and the owner of that host memory
    /// (dropped after the device memory is freed).
    Imported {
        memory: vk::DeviceMemory,
        len: u64,
        _host: Arc<dyn Any + Send + Sync>,
    },
}

/// One `VkBuffer` and its memory, destroyed when the last holder goes.
pub(crate) struct RawBuffer {
    pub(crate) buffer: vk::Buffer,
    pub(crate) memory: Memory,
    pub(crate) name: String,
    pub(crate) ctx: Arc<Context>,
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: nothing can reach the buffer any more: every binding, view, set and
        // recording that used it held this value, and recordings are released only
        // after their submission completed. The buffer goes before its memory.
        unsafe { self.ctx.device().destroy_buffer(self.buffer, None) };
        match &mut self.memory {
            Memory::Allocated(a) => {
                if let Some(a) = a.take() {
                    self.ctx.add_device_bytes(a.size(), false);
                    self.ctx.count_allocation(false);
                    if let Ok(mut alloc) = self.ctx.allocator().lock() {
                        if let Err(e) = alloc.free(a) {
                            tracing::warn!(buffer = %self.name, "freeing buffer memory: {e}");
                        }
                    }
                }
            }
            Memory::Imported { memory, len, .. } => {
                // SAFETY: the buffer bound to it was destroyed above; the host memory
                // (`_host`) is released after this, with the other fields.
                unsafe { self.ctx.device().free_memory(*memory, None) };
                self.ctx.add_imported_bytes(*len, false);
                self.ctx.count_allocation(false);
            }
        }
    }
}

/// A buffer with its memory; both are released when the buffer and everything that
/// binds it (bindings, views, descriptor sets, recordings) are gone.
pub struct Buffer {
    raw: Arc<RawBuffer>,
    size: u64,
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
        ctx.add_device_bytes(size_alloc, true);
        ctx.count_allocation(true);
        let out = Buffer {
            raw: Arc::new(RawBuffer {
                buffer,
                memory: Memory::Allocated(Some(allocation)),
                name: desc.name.clone(),
                ctx: Arc::clone(ctx),
            }),
            size: desc.size,
        };
        bound.call("vkBindBufferMemory")?; // on error `out` is dropped and freed
        Ok(out)
    }

    fn host_ptr(&self) -> Result<*mut u8, VkError> {
        let Memory::Allocated(Some(a)) = &self.raw.memory else {
            return Err(VkError::NotHostVisible(self.raw.name.clone()));
        };
        if !a
            .memory_properties()
            .contains(vk::MemoryPropertyFlags::HOST_COHERENT)
        {
            return Err(VkError::NotHostVisible(self.raw.name.clone()));
        }
        a.mapped_ptr()
            .map(|p| p.as_ptr() as *mut u8)
            .ok_or_else(|| VkError::NotHostVisible(self.raw.name.clone()))
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), VkError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(VkError::OutOfBounds {
                name: self.raw.name.clone(),
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
        self.binding_range(0, self.size)
    }

    /// A sub-range as a binding (caller keeps offset alignment).
    pub fn binding_range(&self, offset: u64, range: u64) -> BufferBinding {
        BufferBinding {
            buffer: self.buffer_ref(),
            offset,
            range,
        }
    }

    /// A shared handle on the buffer (keeps it alive).
    pub fn buffer_ref(&self) -> BufferRef {
        BufferRef(Arc::clone(&self.raw))
    }

    pub(crate) fn raw(&self) -> vk::Buffer {
        self.raw.buffer
    }

    /// Size in bytes as asked.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Name given at creation.
    pub fn name(&self) -> &str {
        &self.raw.name
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("name", &self.raw.name)
            .field("size", &self.size)
            .finish()
    }
}

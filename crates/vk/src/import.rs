//! Host-pointer import (`VK_EXT_external_memory_host`): the GPU reads host pages in place.

use std::any::Any;
use std::sync::Arc;

use ash::vk;

use crate::buffer::{BufferBinding, BufferRef, Memory, RawBuffer};
use crate::error::{VkError, VkResultExt};
use crate::Context;

/// A `VkBuffer` bound to `VkDeviceMemory` imported from a host pointer.
///
/// Used for weights: the engine binds it read-only (shaders declare it `readonly`).
/// The buffer, its memory and the owner of the host range live as long as this value
/// or anything binding it; they are released in that order.
pub struct ImportedBuffer {
    raw: Arc<RawBuffer>,
    len: u64,
    ptr: usize,
}

impl ImportedBuffer {
    /// Imports `len` bytes at `ptr` as a storage buffer (usage `STORAGE_BUFFER | TRANSFER_SRC`).
    ///
    /// Checks before calling the driver: the extension is enabled, `ptr` and `len` are
    /// multiples of `minImportedHostPointerAlignment`, `len > 0`, `len` within
    /// `maxMemoryAllocationSize` (and `maxBufferSize` when reported). A driver refusal is
    /// returned as [`VkError::Import`] with the driver's result.
    ///
    /// `owner` is kept alive until the device memory is freed (after the last holder of
    /// the buffer goes): pass what owns the host range (the file mapping, an anonymous
    /// map).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped readable memory for as long as `owner` lives,
    /// aligned as above; the GPU must only read it if the mapping is read-only. Lavapipe
    /// checks nothing: an import past the end of a mapping succeeds and the first shader
    /// read kills the process.
    pub unsafe fn import(
        ctx: &Arc<Context>,
        ptr: *const u8,
        len: u64,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<ImportedBuffer, VkError> {
        let refuse = |why: String| VkError::Import {
            ptr: ptr as usize,
            len,
            why,
        };
        let caps = ctx.caps();
        let hm = ctx.host_memory().ok_or_else(|| {
            refuse("VK_EXT_external_memory_host is not supported by the device".into())
        })?;
        let align = caps
            .min_imported_host_pointer_alignment
            .unwrap_or(4096)
            .max(1);
        if len == 0 {
            return Err(refuse("empty range".into()));
        }
        if !(ptr as u64).is_multiple_of(align) || !len.is_multiple_of(align) {
            return Err(refuse(format!(
                "pointer and length must be multiples of minImportedHostPointerAlignment {align}"
            )));
        }
        if len > caps.max_memory_allocation_size {
            return Err(refuse(format!(
                "larger than maxMemoryAllocationSize {}",
                caps.max_memory_allocation_size
            )));
        }
        if let Some(mb) = caps.max_buffer_size {
            if len > mb {
                return Err(refuse(format!("larger than maxBufferSize {mb}")));
            }
        }
        let dev = ctx.device();
        let handle_type = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut host_props = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: the function pointer was loaded for this device with the extension
        // enabled; `ptr` is a host pointer the caller vouches for; `host_props` is a
        // valid out-structure.
        let r = unsafe {
            (hm.fp().get_memory_host_pointer_properties_ext)(
                dev.handle(),
                handle_type,
                ptr as *const std::ffi::c_void,
                &mut host_props,
            )
        };
        if r != vk::Result::SUCCESS {
            return Err(refuse(format!(
                "vkGetMemoryHostPointerPropertiesEXT returned {r}"
            )));
        }
        let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle_type);
        let info = vk::BufferCreateInfo::default()
            .size(len)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::UNIFORM_TEXEL_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut ext_info);
        // SAFETY: valid create info on a live device.
        let buffer = unsafe { dev.create_buffer(&info, None) }.call("vkCreateBuffer")?;
        // SAFETY: the buffer was just created on this device.
        let req = unsafe { dev.get_buffer_memory_requirements(buffer) };
        let types = req.memory_type_bits & host_props.memory_type_bits;
        let destroy_buffer = || {
            // SAFETY: the buffer is unbound and unused.
            unsafe { dev.destroy_buffer(buffer, None) }
        };
        if types == 0 {
            destroy_buffer();
            return Err(refuse(format!(
                "no memory type fits both the buffer ({:#x}) and the host pointer ({:#x})",
                req.memory_type_bits, host_props.memory_type_bits
            )));
        }
        if req.size > len {
            destroy_buffer();
            return Err(refuse(format!(
                "the buffer needs {} bytes, more than the range",
                req.size
            )));
        }
        let type_index = types.trailing_zeros();
        let mut import_info = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(handle_type)
            .host_pointer(ptr as *mut std::ffi::c_void);
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(len)
            .memory_type_index(type_index)
            .push_next(&mut import_info);
        // SAFETY: the host range is valid and aligned (checked above and by contract).
        let memory = match unsafe { dev.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(e) => {
                destroy_buffer();
                return Err(refuse(format!("vkAllocateMemory(import) returned {e}")));
            }
        };
        // SAFETY: memory and buffer belong to this device; offset 0 meets any alignment.
        if let Err(e) = unsafe { dev.bind_buffer_memory(buffer, memory, 0) } {
            // SAFETY: both are unused.
            unsafe {
                dev.destroy_buffer(buffer, None);
                dev.free_memory(memory, None);
            }
            return Err(VkError::Call {
                call: "vkBindBufferMemory",
                result: e,
            });
        }
        ctx.add_imported_bytes(len, true);
        ctx.count_allocation(true);
        Ok(ImportedBuffer {
            raw: Arc::new(RawBuffer {
                buffer,
                memory: Memory::Imported {
                    memory,
                    len,
                    _host: owner,
                },
                name: format!("import {:#x}+{len}", ptr as usize),
                ctx: Arc::clone(ctx),
            }),
            len,
            ptr: ptr as usize,
        })
    }

    /// The whole buffer as a binding.
    pub fn binding(&self) -> BufferBinding {
        BufferBinding {
            buffer: self.buffer_ref(),
            offset: 0,
            range: self.len,
        }
    }

    /// A shared handle on the buffer (keeps it, and the host range's owner, alive).
    pub fn buffer_ref(&self) -> BufferRef {
        BufferRef(Arc::clone(&self.raw))
    }

    /// Imported length in bytes.
    pub fn size(&self) -> u64 {
        self.len
    }

    /// The host address it imports.
    pub fn host_address(&self) -> usize {
        self.ptr
    }
}

impl std::fmt::Debug for ImportedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

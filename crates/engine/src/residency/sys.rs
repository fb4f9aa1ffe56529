//! The engine's only `unsafe` for residency: page-cache queries (`mincore`), `mlock`,
//! page-aligned anonymous memory (`mmap`), and the host-pointer import of ranges whose
//! owner is kept alive by the returned value. Each block has a SAFETY comment.

#![allow(unsafe_code)]

use std::sync::Arc;

use gguf::GgufFile;
use vk::{Context, ImportedBuffer, VkError};

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf only reads its integer argument.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Bytes of `map` in resident pages (`mincore`), clipped to the slice.
pub fn resident_bytes(map: &[u8]) -> std::io::Result<u64> {
    if map.is_empty() {
        return Ok(0);
    }
    let page = page_size() as usize;
    let addr = map.as_ptr() as usize;
    let start = addr / page * page;
    let end = addr + map.len();
    let len = end - start;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: [start, end) covers the pages of a live slice (so they are mapped);
    // `start` is page-aligned; `vec` has one byte per page; mincore only reads
    // page-table state and writes `vec`.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut total = 0u64;
    for (i, &v) in vec.iter().enumerate() {
        if v & 1 == 1 {
            let p0 = (start + i * page).max(addr);
            let p1 = (start + (i + 1) * page).min(end);
            total += (p1 - p0) as u64;
        }
    }
    Ok(total)
}

/// Pins the pages of `map` in memory until dropped (`mlock`/`munlock`).
pub struct Mlock {
    addr: usize,
    len: usize,
}

impl Mlock {
    /// Locks the pages of a live mapping that the caller keeps alive longer than this.
    pub fn new(map: &[u8]) -> std::io::Result<Mlock> {
        // SAFETY: the range is a live slice; mlock only changes page residency.
        let rc = unsafe { libc::mlock(map.as_ptr() as *const libc::c_void, map.len()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mlock {
            addr: map.as_ptr() as usize,
            len: map.len(),
        })
    }
}

impl Drop for Mlock {
    fn drop(&mut self) {
        // SAFETY: munlock of a range this value locked; harmless if already unmapped.
        unsafe { libc::munlock(self.addr as *const libc::c_void, self.len) };
    }
}

/// Page-aligned anonymous memory (`mmap(MAP_PRIVATE | MAP_ANONYMOUS)`), zero-filled.
pub struct AnonMap {
    base: *mut libc::c_void,
    map_len: usize,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; no thread-affine state.
unsafe impl Send for AnonMap {}
// SAFETY: shared access only reads through `&self`.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    /// Maps `len` bytes whose start is a multiple of `align` (a power of two).
    pub fn new(len: usize, align: usize) -> std::io::Result<AnonMap> {
        let align = align.max(1);
        let extra = if align > page_size() as usize {
            align
        } else {
            0
        };
        let map_len = len
            .checked_add(extra)
            .ok_or(std::io::ErrorKind::InvalidInput)?;
        // SAFETY: anonymous private mapping with no address hint; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let addr = base as usize;
        let aligned = addr.div_ceil(align) * align;
        Ok(AnonMap {
            base,
            map_len: map_len.max(1),
            ptr: aligned as *mut u8,
            len,
        })
    }

    /// The memory.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies inside the live mapping (aligned start + len ≤ map_len).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The memory, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped; no borrow outlives `self`.
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

/// Pages of the model file imported in place; holds the file so the mapping outlives
/// the import (field order = drop order: buffer first).
pub struct FileImport {
    /// The imported buffer.
    pub buffer: ImportedBuffer,
    _file: Arc<GgufFile>,
}

/// Imports `[start, start + len)` of the file mapping.
///
/// Refused (without calling the driver) unless the range lies inside the mapping's
/// pages: the mapping covers the file rounded up to whole system pages.
pub fn import_file(
    ctx: &Arc<Context>,
    file: &Arc<GgufFile>,
    start: u64,
    len: u64,
) -> Result<FileImport, VkError> {
    let bytes = file.bytes();
    let mapped = (bytes.len() as u64).div_ceil(page_size()) * page_size();
    let base = bytes.as_ptr();
    if start.checked_add(len).is_none_or(|e| e > mapped)
        || !(base as usize).is_multiple_of(page_size() as usize)
    {
        return Err(VkError::Import {
            ptr: base as usize + start as usize,
            len,
            why: format!("range {start}+{len} is not inside the mapping's {mapped} bytes of pages"),
        });
    }
    // SAFETY: the range lies inside the file mapping's pages (checked above; the last
    // page is mapped in full by mmap, bytes past EOF read as zero); `FileImport` holds
    // the `Arc<GgufFile>` so the mapping outlives the buffer; the engine binds weight
    // buffers read-only. Alignment is checked by `import`.
    let buffer = unsafe { ImportedBuffer::import(ctx, base.add(start as usize), len) }?;
    Ok(FileImport {
        buffer,
        _file: Arc::clone(file),
    })
}

/// Anonymous memory imported into the GPU; the buffer drops before the memory.
pub struct AnonImport {
    /// The imported buffer.
    pub buffer: ImportedBuffer,
    map: AnonMap,
}

impl AnonImport {
    /// Bytes of anonymous memory held.
    pub fn anon_bytes(&self) -> u64 {
        self.map.as_slice().len() as u64
    }
}

/// Imports the whole of `map` (its start and length must meet the import alignment).
pub fn import_anon(ctx: &Arc<Context>, map: AnonMap) -> Result<AnonImport, VkError> {
    let s = map.as_slice();
    // SAFETY: the memory is owned by `map`, which `AnonImport` keeps alive after the
    // buffer (field order); it is never written while imported (only through
    // `as_mut_slice`, which needs `&mut AnonMap`, unavailable once moved in here).
    let buffer = unsafe { ImportedBuffer::import(ctx, s.as_ptr(), s.len() as u64) }?;
    Ok(AnonImport { buffer, map })
}

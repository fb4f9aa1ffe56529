//! This crate's `unsafe` for residency: the page size (`sysconf`), page-cache queries
//! (`mincore`), and the host-pointer import of ranges whose owner is kept alive by the
//! returned value. Each block has a SAFETY comment. Anonymous memory and `mlock` are
//! memmap2's safe calls (see `weights.rs`).

#![allow(unsafe_code)]

use std::any::Any;
use std::sync::Arc;

use gguf::GgufFile;
use memmap2::MmapMut;
use vk::{Context, ImportedBuffer, VkError};

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf only reads its integer argument (`libc::sysconf` is declared
    // unsafe as every foreign function is; std has no safe page-size query).
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

/// Imports `[start, start + len)` of the file mapping; the buffer holds the file (and so
/// the mapping) alive.
///
/// Refused (without calling the driver) unless the range lies inside the mapping's
/// pages: the mapping covers the file rounded up to whole system pages.
pub fn import_file(
    ctx: &Arc<Context>,
    file: &Arc<GgufFile>,
    start: u64,
    len: u64,
) -> Result<ImportedBuffer, VkError> {
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
    // page is mapped in full by mmap, bytes past EOF read as zero); the buffer holds the
    // `Arc<GgufFile>` as the owner of the range, so the mapping outlives the device
    // memory; the engine binds weight buffers read-only. Alignment is checked by
    // `import`.
    unsafe {
        ImportedBuffer::import(
            ctx,
            base.add(start as usize),
            len,
            Arc::clone(file) as Arc<dyn Any + Send + Sync>,
        )
    }
}

/// Imports `len` bytes of `map` from `offset` (start and length must meet the import
/// alignment; refused without calling the driver if the range is not inside `map`).
/// The buffer owns the map from here on.
pub fn import_anon(
    ctx: &Arc<Context>,
    map: MmapMut,
    offset: usize,
    len: usize,
) -> Result<ImportedBuffer, VkError> {
    let Some(s) = offset.checked_add(len).and_then(|end| map.get(offset..end)) else {
        return Err(VkError::Import {
            ptr: map.as_ptr() as usize + offset,
            len: len as u64,
            why: format!(
                "range {offset}+{len} is not inside the {} bytes mapped",
                map.len()
            ),
        });
    };
    let ptr = s.as_ptr();
    // SAFETY: the range lies inside `map` (checked above), which the buffer owns from
    // here on (moving an MmapMut does not move its pages), so the memory outlives the
    // device memory; nothing can write it any more (the engine binds weight buffers
    // read-only). Alignment is checked by `import`.
    unsafe { ImportedBuffer::import(ctx, ptr, len as u64, Arc::new(map)) }
}

//! The model file in the kernel's page cache: evict it (for cold-start benchmarks) and
//! measure how much of it is resident.
//!
//! Eviction is `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)` (POSIX.1-2001; Linux drops
//! the clean, unmapped pages of the file at once, no root needed). Pages that are dirty,
//! or mapped by a live process, stay. Residency is `mincore(2)` over a private read-only
//! mapping of the file, which reports pages without faulting them in.
//!
//! These are the only `unsafe` calls of this module; each has a `SAFETY:` comment.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// What went wrong while evicting or measuring a file.
#[derive(Debug, thiserror::Error)]
pub enum PageCacheError {
    #[error("opening {path} to {what}: {source}")]
    Open {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("posix_fadvise(DONTNEED) on {path} failed: {source}")]
    Fadvise {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mapping {path} ({len} bytes) to measure its residency: {source}")]
    Map {
        path: PathBuf,
        len: u64,
        source: std::io::Error,
    },
    #[error("mincore over {path} ({len} bytes) failed: {source}")]
    Mincore {
        path: PathBuf,
        len: u64,
        source: std::io::Error,
    },
}

/// How much of a file is in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Residency {
    /// Bytes of the file in resident pages (whole pages, capped at the file's length).
    pub resident_bytes: u64,
    /// The file's length in bytes.
    pub file_bytes: u64,
}

impl Residency {
    /// Resident share of the file, 0.0 to 1.0 (1.0 for an empty file).
    pub fn fraction(&self) -> f64 {
        if self.file_bytes == 0 {
            1.0
        } else {
            self.resident_bytes as f64 / self.file_bytes as f64
        }
    }
}

/// Asks the kernel to drop the file's clean, unmapped pages from the page cache.
///
/// Dirty pages (written but not yet flushed) and pages mapped by a live process are kept;
/// measure with [`residency`] afterwards to see what actually went.
pub fn evict(path: &Path) -> Result<(), PageCacheError> {
    let file = File::open(path).map_err(|source| PageCacheError::Open {
        path: path.to_path_buf(),
        what: "evict it from the page cache",
        source,
    })?;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is valid
    // (owned by `file`, which lives until the end of this function). Offset 0 with
    // length 0 means "to the end of the file".
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        // posix_fadvise returns the error number instead of setting errno.
        return Err(PageCacheError::Fadvise {
            path: path.to_path_buf(),
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    Ok(())
}

/// Measures how much of the file is in the page cache, without reading it.
pub fn residency(path: &Path) -> Result<Residency, PageCacheError> {
    let file = File::open(path).map_err(|source| PageCacheError::Open {
        path: path.to_path_buf(),
        what: "measure its residency",
        source,
    })?;
    let len = file
        .metadata()
        .map_err(|source| PageCacheError::Open {
            path: path.to_path_buf(),
            what: "measure its residency (stat)",
            source,
        })?
        .len();
    if len == 0 {
        return Ok(Residency {
            resident_bytes: 0,
            file_bytes: 0,
        });
    }
    let map_err = |source| PageCacheError::Map {
        path: path.to_path_buf(),
        len,
        source,
    };
    let map_len = usize::try_from(len).map_err(|_| {
        map_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "file larger than the address space",
        ))
    })?;
    // SAFETY: the mapping is private and read-only and this function never dereferences
    // it: its address only goes to mincore, which inspects page-table state, so a file
    // that shrinks or changes meanwhile cannot fault here.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .len(map_len)
            .map_copy_read_only(&file)
    }
    .map_err(map_err)?;
    let resident_bytes =
        crate::sys::resident_bytes(&map).map_err(|source| PageCacheError::Mincore {
            path: path.to_path_buf(),
            len,
            source,
        })?;
    Ok(Residency {
        resident_bytes,
        file_bytes: len,
    })
}

/// Evicts the file, then measures what stayed resident.
pub fn evict_and_measure(path: &Path) -> Result<Residency, PageCacheError> {
    evict(path)?;
    residency(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn scratch_file(name: &str, len: usize) -> PathBuf {
        // If the temp dir is tmpfs, pages cannot be evicted: the test checks for that.
        let dir =
            std::env::temp_dir().join(format!("vkdecode-pagecache-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the scratch dir");
        let path = dir.join("data.bin");
        let mut f = File::create(&path).expect("creating the scratch file");
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        f.write_all(&data).expect("writing the scratch file");
        // Dirty pages cannot be evicted: flush them first.
        f.sync_all().expect("syncing the scratch file");
        path
    }

    fn is_tmpfs(path: &Path) -> bool {
        // /proc/self/mounts: the longest mount point that prefixes the path decides.
        let Ok(canon) = path.canonicalize() else {
            return false;
        };
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut best: Option<(usize, bool)> = None;
        for line in mounts.lines() {
            let mut it = line.split_whitespace();
            let (Some(_dev), Some(mnt), Some(fs)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            if canon.starts_with(mnt)
                && (best.is_none() || best.is_some_and(|(l, _)| mnt.len() > l))
            {
                best = Some((mnt.len(), fs == "tmpfs" || fs == "ramfs"));
            }
        }
        best.is_some_and(|(_, t)| t)
    }

    #[test]
    fn evict_then_read_back_changes_residency() {
        let len = 3 * 1024 * 1024 + 123;
        let path = scratch_file("evict", len);
        let r = evict_and_measure(&path).expect("evicting");
        assert_eq!(r.file_bytes, len as u64);
        if is_tmpfs(&path) {
            eprintln!(
                "note: {} is on tmpfs, where pages cannot be evicted",
                path.display()
            );
        } else {
            assert!(
                r.fraction() < 0.5,
                "after eviction {} of {} bytes still resident",
                r.resident_bytes,
                r.file_bytes
            );
        }
        let mut buf = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .expect("reading back");
        let r = residency(&path).expect("measuring");
        assert_eq!(
            r.resident_bytes, len as u64,
            "a file just read is wholly resident"
        );
        assert!((r.fraction() - 1.0).abs() < 1e-12);
        std::fs::remove_dir_all(path.parent().expect("has a parent")).ok();
    }

    #[test]
    fn errors_name_the_file() {
        let missing = Path::new("/nonexistent/vkdecode/model.gguf");
        let e = evict(missing).expect_err("missing file");
        assert!(
            e.to_string().contains("/nonexistent/vkdecode/model.gguf"),
            "{e}"
        );
        let e = residency(missing).expect_err("missing file");
        assert!(e.to_string().contains("measure its residency"), "{e}");
    }

    #[test]
    fn empty_file_is_fully_resident_by_convention() {
        let path = scratch_file("empty", 0);
        let r = residency(&path).expect("measuring");
        assert_eq!(
            r,
            Residency {
                resident_bytes: 0,
                file_bytes: 0
            }
        );
        assert_eq!(r.fraction(), 1.0);
        std::fs::remove_dir_all(path.parent().expect("has a parent")).ok();
    }
}

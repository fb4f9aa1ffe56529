//! An output file that has no name until it is complete.
//!
//! `open(dir, O_TMPFILE)` makes an inode in `dir` that no directory entry names: the
//! kernel frees it however the process ends, SIGKILL and power loss included, so a
//! killed writer leaves nothing behind. Once written, `linkat(2)` through
//! `/proc/self/fd/N` with `AT_SYMLINK_FOLLOW` gives it its name (the `open(2)` man page's
//! recipe; `AT_EMPTY_PATH` would need CAP_DAC_READ_SEARCH).
//!
//! linkat never replaces a name. Where the output already exists, the file is linked to a
//! temporary name beside it and renamed over it, so a reader sees the old file or the new
//! one, never a part; only a SIGKILL in the microseconds between the two calls leaves the
//! temporary name.
//!
//! Filesystems without O_TMPFILE (some network and FUSE ones, kernels before 3.11) and
//! systems without /proc make [`create`] return `None`: the caller then writes to a named
//! temporary file, which SIGKILL does leave behind.
//!
//! This module and `signals` are the crate's `unsafe` sites: std has no `linkat` that
//! follows a symlink (`std::fs::hard_link` passes no flags on Linux).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// An unnamed file open for writing in `dir`, or `None` where the filesystem or the
/// system cannot make one (see the module docs); other errors (no such directory, no
/// permission) are returned as they are.
pub fn create(dir: &Path) -> io::Result<Option<File>> {
    if !Path::new("/proc/self/fd").is_dir() {
        return Ok(None);
    }
    let opened = OpenOptions::new()
        .write(true)
        .read(true)
        .mode(0o666)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match opened {
        Ok(f) => Ok(Some(f)),
        // EOPNOTSUPP: the filesystem has none; EISDIR or EINVAL: the kernel does not know
        // the flag and opened (or refused) the directory itself
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Gives the unnamed `file` (from [`create`]) the name `path`, which must not exist
/// (`AlreadyExists` otherwise).
pub fn link(file: &File, path: &Path) -> io::Result<()> {
    let from =
        CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(io::Error::other)?;
    let to = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: both pointers are to NUL-terminated strings that live across the call;
    // linkat reads them and keeps neither.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

//! Files named on the command line for results written at the end of a run
//! (`--stats-json`, bench's `--json` and `--plot`), opened or checked before the run.
//!
//! Opening a FIFO for writing blocks until something reads it: a FIFO given with no
//! reader would hold the command, silent, before its first step and for ever. Such a FIFO
//! is refused at once; one with a reader is written as any file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Fails at once where `path` is a FIFO that nothing reads (ENXIO, said in words);
/// anything else passes (what opening it says is the caller's to report).
pub fn refuse_unread_fifo(path: &Path) -> io::Result<()> {
    let is_fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    if !is_fifo {
        return Ok(());
    }
    // O_NONBLOCK: a FIFO without a reader fails with ENXIO instead of blocking
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Err(io::Error::other(
            "a FIFO that nothing reads; start its reader first",
        )),
        Err(e) => Err(e),
    }
}

/// `File::create`, refusing a FIFO that nothing reads instead of blocking on it.
pub fn create(path: &Path) -> io::Result<File> {
    refuse_unread_fifo(path)?;
    File::create(path)
}

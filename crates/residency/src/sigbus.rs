//! One clear line instead of a bare signal when the mapped model file shrinks or is
//! rewritten under a run.
//!
//! The weights are the file's own pages (`--weights import`, and `auto` on integrated
//! and CPU devices). Truncating the file, or copying another file over it, takes pages
//! away from the mapping; the next read of one, by the CPU or by a CPU Vulkan driver's
//! worker thread, raises `SIGBUS`. That is the contract of file-backed weights, and it
//! cannot be turned into an error the code that read the page could handle. What
//! [`install`] does is say so: a `SIGBUS` whose faulting address lies in the model's
//! mapping writes
//!
//! ```text
//! vkdecode: SIGBUS reading the model file PATH: the model file changed or shrank while mapped; replace model files by rename
//! ```
//!
//! to standard error and exits with status [`EXIT_STATUS`] (74). Any other `SIGBUS`
//! goes to the handler that was there before (Rust's own, or the default action).
//!
//! Limit: the kernel cannot deliver a fault to a handler in a thread that blocks the
//! signal; it kills the process with the default action instead. Mesa's worker threads
//! block every signal but SIGSEGV and SIGSYS, and on lavapipe those threads run the
//! shaders that read imported weights, so a truncation noticed first by a shader still
//! ends in a bare SIGBUS (status 135). `Weights::check_file` between tokens catches a
//! file that shrank or was rewritten before the next token reads it.
//!
//! The handler is async-signal-safe: it reads one pointer published with release
//! ordering, compares an address, and calls `write(2)` on a message formatted at install
//! time, then `_exit(2)` (or `sigaction(2)` to restore the previous handler). It never
//! allocates, locks or formats.
//!
//! This module is one of this crate's named `unsafe` sites (the `sigaction`, `write` and
//! `_exit` calls and the handler's reads), each with a SAFETY comment.
#![allow(unsafe_code)]

use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use gguf::GgufFile;

/// Exit status of a process killed by a `SIGBUS` in the model mapping: 74, `EX_IOERR`
/// of sysexits.h ("an error occurred while doing I/O on some file"). Distinct from the
/// CLI's 1 (error), 2 (usage) and 130 (interrupted), and from 135 (128 + SIGBUS, the
/// status of the same fault without the handler).
pub const EXIT_STATUS: i32 = 74;

/// What the handler needs, formatted before it can run; leaked, so it is never freed
/// while a handler might read it.
struct Installed {
    /// The whole line, newline included.
    message: Box<[u8]>,
    /// The mapping's address range (whole pages: the last page's tail is mapped too).
    start: usize,
    end: usize,
    /// The handler in place before the first [`install`].
    previous: libc::sigaction,
}

static INSTALLED: AtomicPtr<Installed> = AtomicPtr::new(std::ptr::null_mut());
/// Serialises [`install`] calls (the handler itself never takes it).
static INSTALL_LOCK: Mutex<()> = Mutex::new(());

/// The line printed for a fault in the mapping of `path`.
pub fn message(path: &Path) -> String {
    format!(
        "vkdecode: SIGBUS reading the model file {}: the model file changed or shrank while \
         mapped; replace model files by rename\n",
        path.display()
    )
}

/// Installs (or re-points) the process-wide `SIGBUS` handler at `file`'s mapping: a
/// fault there prints [`message`] and exits with [`EXIT_STATUS`]. Call it once the file
/// is open and before its pages are read by a run; calling it again for another file
/// replaces the file named (the earlier record is leaked, a few hundred bytes).
pub fn install(file: &GgufFile) -> std::io::Result<()> {
    let bytes = file.bytes();
    let page = super::sys::page_size() as usize;
    let start = bytes.as_ptr() as usize;
    let end = start + bytes.len().div_ceil(page) * page;
    let _guard = INSTALL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let old = INSTALLED.load(Ordering::Acquire);
    let previous = if old.is_null() {
        // SAFETY: an all-zero `sigaction` is a valid value of this plain C struct; it is
        // only an out-parameter filled by the call below.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying the current action (null new action) writes `previous`.
        let rc = unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        previous
    } else {
        // SAFETY: `old` came from `Box::into_raw` below and is never freed.
        unsafe { (*old).previous }
    };
    let record = Box::new(Installed {
        message: message(file.path()).into_bytes().into_boxed_slice(),
        start,
        end,
        previous,
    });
    INSTALLED.store(Box::into_raw(record), Ordering::Release);
    if old.is_null() {
        // SAFETY: as above, a zeroed `sigaction` is valid; every field the kernel reads
        // is set below (handler, flags, empty mask).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigbus;
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `sa_mask` is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: installs a handler with the signature SA_SIGINFO expects; the handler
        // only reads the leaked record published above.
        let rc = unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The `SIGBUS` handler (see the module docs for what it may and may not do).
extern "C" fn on_sigbus(_signal: libc::c_int, info: *mut libc::siginfo_t, _uc: *mut libc::c_void) {
    let record = INSTALLED.load(Ordering::Acquire);
    if record.is_null() {
        return;
    }
    // SAFETY: a non-null pointer here was published by `install` from `Box::into_raw`
    // and is never freed; the record is immutable after publication.
    let record = unsafe { &*record };
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler; for SIGBUS
    // `si_addr` is the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    if (record.start..record.end).contains(&addr) {
        // SAFETY: write(2) and _exit(2) are async-signal-safe; the message is a live,
        // immutable buffer. A short write cannot be helped here and is harmless.
        unsafe {
            libc::write(
                libc::STDERR_FILENO,
                record.message.as_ptr().cast(),
                record.message.len(),
            );
            libc::_exit(EXIT_STATUS);
        }
    }
    // Not the model's pages: put the previous handler back; returning re-runs the
    // faulting access, which then reaches it.
    // SAFETY: sigaction(2) is async-signal-safe; `previous` is the action the kernel
    // reported before `install`.
    unsafe { libc::sigaction(libc::SIGBUS, &record.previous, std::ptr::null_mut()) };
}

/// Sends `SIGINT` to process `pid`: the CLI's supervisor (see `vkdecode`'s `supervise`
/// module) forwards a Ctrl-C to the worker it started, which runs in its own process
/// group.
pub fn interrupt(pid: u32) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("process id {pid} out of range"),
        )
    })?;
    // SAFETY: kill(2) reads no memory of ours; sending a signal to a process id has no
    // memory-safety precondition (the caller names a child it spawned and has not reaped).
    let rc = unsafe { libc::kill(pid, libc::SIGINT) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_file_and_the_cause() {
        let m = message(Path::new("/models/x.gguf"));
        assert!(m.contains("/models/x.gguf"), "{m}");
        assert!(
            m.contains(
                "the model file changed or shrank while mapped; replace model files by rename"
            ),
            "{m}"
        );
        assert!(m.ends_with('\n') && m.lines().count() == 1, "{m:?}");
    }
}

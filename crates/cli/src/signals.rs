//! Termination signals for the commands that start child processes (the main command's
//! worker, bench's decoders), and a child's tie to its parent's life.
//!
//! A process that starts children must not leave them behind. SIGINT, SIGTERM and SIGHUP
//! are caught here as counts ([`catch`], [`count`]), so that the parent can pass them on
//! ([`send`]), clean up, and leave with the conventional status `128 + signal`. SIGKILL
//! cannot be caught, so a child started with [`PARENT_ENV`] asks the kernel to kill it
//! when its parent dies ([`tie_to_parent`], `PR_SET_PDEATHSIG`) and then checks that the
//! parent that started it is still there: it may have died before the request was made.
//!
//! This module, `unnamed_file` and `heap` are the crate's `unsafe` sites: std has no safe
//! `sigaction`, `kill(2)` with a chosen signal, or `prctl`.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

/// Set by a parent in its child's environment: the parent's process id. A vkdecode
/// process that finds it ties its life to that parent's ([`tie_to_parent`]).
pub const PARENT_ENV: &str = "VKDECODE_PARENT";

/// The signals [`catch`] can handle, in the order of `COUNTS`.
pub const TERMINATION: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// How many times each signal of [`TERMINATION`] has arrived since [`catch`].
static COUNTS: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];

/// The handler: one atomic add, which is async-signal-safe.
extern "C" fn on_signal(sig: libc::c_int) {
    if let Some(i) = TERMINATION.iter().position(|&s| s == sig) {
        COUNTS[i].fetch_add(1, Ordering::SeqCst);
    }
}

/// Catches every signal of [`TERMINATION`]: from now on each only adds to its
/// [`count`]. Blocking system calls interrupted by one are restarted (`SA_RESTART`).
pub fn catch() -> std::io::Result<()> {
    for sig in TERMINATION {
        // SAFETY: an all-zero `sigaction` is a valid value of the C struct (no handler,
        // empty mask, no flags); the fields are then set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: `action.sa_mask` is a valid, owned sigset_t for sigemptyset to write.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: `action` is initialised and outlives the call; the handler it names is
        // async-signal-safe (one atomic add) and lives for the whole program; the old
        // action is not asked for (null).
        let rc = unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Ignores SIGXFSZ, so that a write past the file-size limit (`ulimit -f`) fails with
/// EFBIG, which the command reports naming the file, instead of killing the process with
/// no message.
pub fn ignore_file_size_limit() {
    // SAFETY: SIG_IGN is a valid disposition for SIGXFSZ; no handler code runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// How many times `sig` (one of [`TERMINATION`]) has arrived since [`catch`].
pub fn count(sig: libc::c_int) -> usize {
    TERMINATION
        .iter()
        .position(|&s| s == sig)
        .map_or(0, |i| COUNTS[i].load(Ordering::SeqCst))
}

/// The first of SIGTERM and SIGHUP that has arrived: a request to end now, which the
/// caller passes on to its children before cleaning up. (SIGINT is a request to stop
/// early and report, handled by each command.)
pub fn termination() -> Option<libc::c_int> {
    [libc::SIGTERM, libc::SIGHUP]
        .into_iter()
        .find(|&s| count(s) > 0)
}

/// Sends `sig` to the process `pid` (a child the caller started and has not reaped).
pub fn send(pid: u32, sig: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("process id {pid} out of range"),
        )
    })?;
    // SAFETY: kill(2) reads no memory of ours; a signal to a process id has no
    // memory-safety precondition.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// In a process started with [`PARENT_ENV`] set: asks the kernel for SIGKILL when the
/// parent dies, then returns whether the parent that started us is still our parent (if
/// it died first, we were reparented and the request came too late: the caller exits).
/// Without the variable (a process the user started) there is nothing to do: true.
pub fn tie_to_parent() -> bool {
    let Some(parent) = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    else {
        return true;
    };
    // The kernel sends the signal when the parent *thread* that started us ends: the
    // parents here (supervise, bench) start and wait for their children on their main
    // thread.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no memory of ours.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    // Without the request (not Linux?) the parent's own signal forwarding still holds.
    let _ = rc;
    std::os::unix::process::parent_id() == parent
}

//! The main command's guard against a model file that shrinks under a run, where the
//! engine's own `SIGBUS` handler cannot run.
//!
//! With imported weights the shaders read the file's page-cache pages. When the file is
//! truncated or copied over mid-run, the next read of a lost page raises `SIGBUS`. The
//! engine installs a handler that names the file (`residency::sigbus`), but on a
//! CPU Vulkan driver (lavapipe) the read happens in the driver's worker threads, which
//! block every signal, so the kernel kills the process outright: exit 135, no word.
//! So for runs whose weights may be file pages, `vkdecode` starts itself again as a
//! worker and waits: a worker killed by `SIGBUS` becomes the one-line message and exit
//! status 74 (`sigbus::EXIT_STATUS`), anything else is passed through.
//!
//! The worker must never outlive the process the user started. It runs in its own
//! process group (so a terminal's Ctrl-C reaches it only through here, once, and it stops
//! at the next chunk or token), and SIGINT, SIGTERM and SIGHUP sent to the parent
//! (`kill`, `timeout`, a closed terminal) are passed on to it; after SIGTERM or SIGHUP
//! the parent waits at most [`GRACE`] for it, kills it, and leaves with `128 + signal`.
//! SIGKILL cannot be passed on: the worker asked the kernel to kill it when its parent
//! dies (`signals::tie_to_parent`).

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use residency::sigbus;

use crate::signals;

/// Set in a worker's environment (and by `vkdecode bench` for its children, which it
/// measures itself): run the command in this process.
pub const WORKER_ENV: &str = "VKDECODE_WORKER";

/// How long the worker has to end after SIGTERM or SIGHUP is passed on before it is
/// killed (the generation has no state worth saving; this only lets it exit normally).
pub const GRACE: Duration = Duration::from_secs(1);

/// Whether this process is a worker (or was told to run unsupervised).
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

/// Runs this process's own command line again as a worker and returns the exit status
/// to leave with.
pub fn run(model: &Path, args: impl IntoIterator<Item = OsString>) -> Result<i32> {
    let exe = std::env::current_exe().context("finding the vkdecode binary to start a worker")?;
    signals::catch().context("installing the signal handlers")?;
    let mut child = Command::new(exe)
        .args(args)
        .env(WORKER_ENV, "1")
        .env(signals::PARENT_ENV, std::process::id().to_string())
        .process_group(0)
        .spawn()
        .context("starting the worker process")?;
    let pid = child.id();
    let mut forwarded = [0; signals::TERMINATION.len()];
    // the first SIGTERM or SIGHUP, and when it was passed on
    let mut ending: Option<(libc::c_int, Instant)> = None;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the worker")? {
            break status;
        }
        for (sig, sent) in signals::TERMINATION.into_iter().zip(&mut forwarded) {
            let seen = signals::count(sig);
            if seen > *sent {
                // the worker may have just exited: a failed send is not an error
                let _ = signals::send(pid, sig);
                *sent = seen;
                if sig != libc::SIGINT && ending.is_none() {
                    ending = Some((sig, Instant::now()));
                }
            }
        }
        if ending.is_some_and(|(_, since)| since.elapsed() > GRACE) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Some((sig, _)) = ending {
        return Ok(128 + sig);
    }
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(libc::SIGBUS)) => {
            errprint!("{}", sigbus::message(model));
            sigbus::EXIT_STATUS
        }
        // interrupted before its own Ctrl-C handler was installed
        (None, Some(libc::SIGINT)) => 130,
        (None, Some(sig)) => {
            errln!("vkdecode: the worker process was killed by signal {sig}");
            128 + sig
        }
        (None, None) => 1,
    })
}

//! The main command's guard against a model file that shrinks under a run (issue 12,
//! defect 3), where the engine's own `SIGBUS` handler cannot run.
//!
//! With imported weights the shaders read the file's page-cache pages. When the file is
//! truncated or copied over mid-run, the next read of a lost page raises `SIGBUS`. The
//! engine installs a handler that names the file (`engine::residency::sigbus`), but on a
//! CPU Vulkan driver (lavapipe) the read happens in the driver's worker threads, which
//! block every signal, so the kernel kills the process outright: exit 135, no word.
//! So for runs whose weights may be file pages, `vkdecode` starts itself again as a
//! worker and waits: a worker killed by `SIGBUS` becomes the one-line message and exit
//! status 74 (`sigbus::EXIT_STATUS`), anything else is passed through. Ctrl-C is
//! forwarded once to the worker (it runs in its own process group, so a terminal's
//! Ctrl-C reaches it only through here), which stops at the next chunk or token.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use engine::residency::sigbus;

/// Set in a worker's environment (and by `vkdecode bench` for its children, which it
/// measures itself): run the command in this process.
pub const WORKER_ENV: &str = "VKDECODE_WORKER";

/// Whether this process is a worker (or was told to run unsupervised).
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

/// Runs this process's own command line again as a worker and returns the exit status
/// to leave with.
pub fn run(model: &Path, args: impl IntoIterator<Item = OsString>) -> Result<i32> {
    let exe = std::env::current_exe().context("finding the vkdecode binary to start a worker")?;
    let interrupts = Arc::new(AtomicUsize::new(0));
    {
        let n = Arc::clone(&interrupts);
        ctrlc::set_handler(move || {
            n.fetch_add(1, Ordering::SeqCst);
        })
        .context("installing the Ctrl-C handler")?;
    }
    let mut child = Command::new(exe)
        .args(args)
        .env(WORKER_ENV, "1")
        .process_group(0)
        .spawn()
        .context("starting the worker process")?;
    let pid = child.id();
    let mut forwarded = 0;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the worker")? {
            break status;
        }
        let seen = interrupts.load(Ordering::SeqCst);
        if seen > forwarded {
            // the worker may have just exited: a failed send is not an error
            let _ = sigbus::interrupt(pid);
            forwarded = seen;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(libc::SIGBUS)) => {
            eprint!("{}", sigbus::message(model));
            sigbus::EXIT_STATUS
        }
        // interrupted before its own Ctrl-C handler was installed
        (None, Some(libc::SIGINT)) => 130,
        (None, Some(sig)) => {
            eprintln!("vkdecode: the worker process was killed by signal {sig}");
            128 + sig
        }
        (None, None) => 1,
    })
}

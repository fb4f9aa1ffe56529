//! A model file truncated under a run with imported weights gives one
//! line naming the file and the cause, and exit status 74, not a bare SIGBUS (135).
//!
//! The case runs in a child process (this test binary re-run with `CHILD` set): the
//! child maps a copy of a tiny synthetic model, installs the handler, truncates its copy
//! and reads the lost pages. Without the handler the child dies of the signal and the
//! assertion on its status fails. (A read by lavapipe's worker threads cannot be caught
//! in-process: see the `sigbus` module docs.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use gguf::{GgmlType, GgufFile};
use residency::sigbus;
use residency::{ResidencyOptions, Weights};

const CHILD: &str = "VKDECODE_SIGBUS_CHILD";
const CHILD_TEST: &str = "child_process_entry";

fn tiny_copy(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vkdecode-sigbus-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    let bytes = reference::synthetic::tiny_llama(21, 2, 64, 4, 2, 128, 320, GgmlType::Q8_0);
    assert!(bytes.len() > 4 * 4096, "the model must span several pages");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn truncate(path: &Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(4096)
        .unwrap();
}

/// Runs `mode` in a child on a fresh copy; returns (status, stderr, path).
fn run_child(mode: &str) -> (Option<i32>, String, PathBuf) {
    let path = tiny_copy(mode);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            CHILD_TEST,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{mode}:{}", path.display()))
        .env_remove("VKDECODE_FAULT")
        .output()
        .unwrap();
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        path,
    )
}

fn assert_reported(mode: &str) {
    let (code, stderr, path) = run_child(mode);
    assert_eq!(
        code,
        Some(sigbus::EXIT_STATUS),
        "{mode}: exit status (None = killed by a signal); stderr:\n{stderr}"
    );
    let line = sigbus::message(&path);
    assert!(
        stderr.contains(line.trim_end()),
        "{mode}: stderr lacks `{}`:\n{stderr}",
        line.trim_end()
    );
    assert!(
        !stderr.contains("read past the truncation"),
        "{mode}: {stderr}"
    );
}

#[test]
fn truncated_mapping_read_by_the_cpu_is_reported() {
    assert_reported("cpu");
}

/// The child's side, run by the tests above with `CHILD` set.
#[test]
#[ignore = "child process of the SIGBUS tests"]
fn child_process_entry() {
    let spec = std::env::var(CHILD).expect("run by the SIGBUS tests");
    let (mode, path) = spec.split_once(':').unwrap();
    let file = Arc::new(GgufFile::open(path).unwrap());
    sigbus::install(&file).unwrap();
    match mode {
        "cpu" => {
            truncate(Path::new(path));
            let bytes = file.bytes();
            let sum: u64 = bytes[8192..].iter().map(|&b| u64::from(b)).sum();
            eprintln!("read past the truncation without a fault (sum {sum})");
        }
        other => panic!("unknown mode {other}"),
    }
    std::process::exit(3);
}

/// The cheap between-tokens check: a rewrite in place (same size, new bytes and mtime)
/// is a typed error naming the file; before it, the check passes.
#[test]
fn rewrite_in_place_is_caught_by_check_file() {
    let Some(ctx) = vk::testing::validating_context() else {
        return;
    };
    let path = tiny_copy("rewrite");
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let w = Weights::load(&ctx, Arc::clone(&file), &ResidencyOptions::default()).unwrap();
    w.check_file().unwrap();
    let old = std::fs::metadata(&path).unwrap().modified().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // same length, later mtime: what `cp other.gguf model.gguf` of an equal-sized file does
    f.set_modified(old + std::time::Duration::from_secs(3))
        .unwrap();
    drop(f);
    let e = w.check_file().unwrap_err();
    assert_eq!(e.path, path);
    let e: residency::ResidencyError = e.into();
    assert!(e.to_string().contains("changed while mapped"), "{e}");
    drop(w);
    drop(file);
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
    assert_eq!(ctx.validation_errors(), 0);
}

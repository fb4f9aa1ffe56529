//! The process heap's policy: memory that is freed goes back to the system.
//!
//! glibc's malloc raises its mmap threshold to the size of each large block freed (up to
//! 32 MiB) and its trim threshold to twice that. The driver's shader compiler builds and
//! frees many blocks of 128 KiB to 1 MiB while the pipelines are created, so after the
//! first ones the rest come from the heap and stay there once freed: about 5 MiB of
//! RssAnon that nothing uses. Keeping glibc's starting mmap threshold (each such block
//! its own mapping, returned when freed) measured, against 24a091d on lavapipe:
//! - README's command: RssAnon 73.1 -> 68.3 MiB (median of 5; a 256 KiB threshold kept
//!   68.9, 512 KiB 70.2, 1 MiB 71.9);
//! - the paragraph prompt of `benches/ab-binaries` (7 alternating pairs): RssAnon 81.4 ->
//!   76.5 MiB, load 1.12x (409 -> 453 ms: the mappings made and unmade), prefill 0.99x,
//!   decode 1.02x.
//!
//! On a unified-memory device every megabyte the process keeps is one the model cannot
//! have, so the thresholds are fixed here, once, before any thread runs.
//!
//! This module is one of the crate's `unsafe` sites: mallopt has no safe wrapper.
#![allow(unsafe_code)]

/// Blocks of this size and larger are their own mappings, returned when freed (glibc's
/// starting value, kept instead of grown).
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;
/// Free memory at the top of the heap above this is returned to the system.
const TRIM_THRESHOLD: libc::c_int = 4 * 1024 * 1024;

/// Fixes malloc's thresholds (see the module docs). Call first in `main`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn return_freed_memory() {
    // SAFETY: mallopt only sets two of malloc's parameters; it takes plain integers and
    // is called before any other thread exists. A refusal (0) leaves glibc's defaults,
    // which are correct, only larger.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Other C libraries keep their own policy.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn return_freed_memory() {}

//! For tests and benchmarks: one rule for "is there a GPU to test on".

use std::sync::Arc;

use crate::{Context, ContextOptions};

/// The environment variable that lets GPU tests skip on a machine without Vulkan.
pub const ALLOW_NO_GPU: &str = "VKDECODE_ALLOW_NO_GPU";

/// A context with the validation layer on, or `None` when no usable device exists and
/// `VKDECODE_ALLOW_NO_GPU=1` is set. Without that variable a missing device panics, so a
/// GPU test never passes by silently testing nothing (CI runs them on lavapipe).
pub fn validating_context() -> Option<Arc<Context>> {
    match Context::new(&ContextOptions {
        device_index: None,
        validate: true,
    }) {
        Ok(c) => Some(c),
        Err(e) if std::env::var(ALLOW_NO_GPU).is_ok_and(|v| v == "1") => {
            eprintln!("skipping: no Vulkan device ({e})");
            None
        }
        Err(e) => panic!("no usable Vulkan device: {e} (set {ALLOW_NO_GPU}=1 to skip)"),
    }
}

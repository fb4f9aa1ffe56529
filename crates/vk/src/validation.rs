//! What the validation messenger counts as an error.
//!
//! With validation on (`VKDECODE_VALIDATE=1`, and every GPU test), the Khronos layer runs
//! with synchronization validation enabled, and every warning or error it or the driver
//! reports counts against the run, with one exception: a message whose id is in
//! [`ALLOWED`], each with the reason it is harmless. Messages are never matched by their
//! text. Drivers report through the same messenger with id 0 (Mesa names the source
//! location instead): id 0 is never allowed, so a driver's complaint always fails the run.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use ash::vk;

/// Message ids (`messageIdNumber`) that are let through, with the reason. Empty today:
/// a decode, a long prefill and a batched serve step are clean on Mesa 22 and Mesa 25
/// lavapipe with synchronization validation on.
pub const ALLOWED: &[(i32, &str)] = &[];

/// Whether a message with this id is let through ([`ALLOWED`]); id 0 never is.
pub fn allowed(id: i32) -> bool {
    id != 0 && ALLOWED.iter().any(|&(a, _)| a == id)
}

/// The counters the messenger writes through; boxed by the instance owner so its address
/// stays fixed for the callback.
#[derive(Default)]
pub(crate) struct Counters {
    /// Messages that count: not on [`ALLOWED`].
    pub(crate) errors: AtomicU64,
    /// Messages let through by id.
    pub(crate) allowed: AtomicU64,
}

/// The messenger callback: logs every message with its id and name, and counts it in
/// `errors` unless its id is on [`ALLOWED`].
pub(crate) unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    kind: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: `user` is the address of the boxed `Counters` in the instance owner, which
    // outlives the messenger; `data` is valid for the duration of the callback.
    let counters = unsafe { &*(user as *const Counters) };
    // SAFETY: as above; the strings are NUL-terminated when non-null.
    let (id, name, msg) = unsafe {
        let text = |p: *const std::ffi::c_char| {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        match data.as_ref() {
            Some(d) => (
                d.message_id_number,
                text(d.p_message_id_name),
                text(d.p_message),
            ),
            None => (0, String::new(), String::new()),
        }
    };
    if allowed(id) {
        counters.allowed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(target: "vk::validation", id = format!("{id:#010x}"), %name, "allowed: {msg}");
        return vk::FALSE;
    }
    counters.errors.fetch_add(1, Ordering::Relaxed);
    let id = format!("{id:#010x}");
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        tracing::error!(target: "vk::validation", ?kind, %id, %name, "{msg}");
    } else {
        tracing::warn!(target: "vk::validation", ?kind, %id, %name, "{msg}");
    }
    vk::FALSE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_zero_is_never_allowed() {
        assert!(!allowed(0));
    }
}

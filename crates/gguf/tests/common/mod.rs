//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The default model, from `models/` at the workspace root. Panics (failing the test)
/// with a hint when it is missing.
pub fn default_model() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "model {} not found: run `models/fetch` first",
        p.display()
    );
    p
}

//! The model description: what a GGUF file's metadata says about the decoder it holds
//! (architecture, hyper-parameters, the tensors the forward pass reads and their shapes).
//! One place, read by `engine` (the GPU graph) and `reference` (the CPU yardstick) alike,
//! so the two cannot disagree about what a model is. No GPU code, no arithmetic.
//!
//! [`family`]: what each architecture's graph does (llama, qwen2, qwen3, gemma3);
//! [`config`]: the hyper-parameters read from the metadata; [`layers`]: per-layer
//! attention options (sliding windows, per-layer RoPE base); [`tensors`]: the tensors the
//! forward pass reads, their names (spelled only there) and their shapes.
#![forbid(unsafe_code)]

pub mod config;
pub mod family;
pub mod layers;
pub mod tensors;
mod validate;

pub use config::Config;
pub use family::{Arch, FfnAct, RopeMode, ALL_ARCHS};
pub use layers::{LayerAttention, SlidingWindow};
pub use tensors::{LayerTensor, ModelTensor};
pub use validate::{KV_ELEMENT_BYTES, MAX_CONTEXT_LENGTH, MAX_RMS_EPS};

/// What is wrong with a file's description of its model: an unknown architecture, a
/// missing or meaningless key, a missing tensor or one of the wrong shape.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("unsupported architecture '{0}' (supported: llama, qwen2, qwen3, gemma3)")]
    UnsupportedArch(String),

    #[error("missing metadata key '{0}'")]
    MissingKey(String),

    #[error("metadata key '{key}': {reason}")]
    BadMetadata { key: String, reason: String },

    #[error("missing tensor '{0}'")]
    MissingTensor(String),

    #[error("tensor '{name}' has shape {found:?}, expected {expected} from the metadata")]
    TensorShape {
        name: String,
        expected: String,
        found: Vec<u64>,
    },
}

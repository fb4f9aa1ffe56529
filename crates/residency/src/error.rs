//! What can go wrong while making weights resident (the engine's error wraps it,
//! message unchanged: `engine::EngineError::Residency`).

use crate::{FileChanged, PlanError};

/// Everything that can go wrong in residency.
#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    /// A Vulkan runtime error.
    #[error(transparent)]
    Vk(#[from] vk::VkError),
    /// The shard planner rejected the layout.
    #[error("planning weight shards: {0}")]
    Plan(#[from] PlanError),
    /// `--weights import` could not import (the message says why).
    #[error("--weights import: {0}")]
    ImportFailed(String),
    /// An OS call (mmap, mlock, ...) failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A request this crate does not support (a fault name it does not know, ...).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The mapped model file was rewritten in place during the run.
    #[error(transparent)]
    FileChanged(#[from] FileChanged),
}

//! CPU reference for vkdecode: one plain f32 function per GPU kernel ([`kernels`]) and a
//! whole decoder forward pass built on them ([`forward()`], [`generate_greedy`]) for every
//! architecture the model description (`arch`) knows: llama (with Llama 3's
//! `rope_freqs`), qwen2, qwen3, gemma3.
//!
//! This crate is the yardstick the Vulkan decoder is measured against (docs/design.md):
//! every GPU kernel and whole forward pass is tested against it, so it is written to be
//! obviously right rather than fast: weights are dequantised to f32 at load, every step is
//! a named function, single-threaded. Its structure follows llama2.c's `run.c`. [`synthetic`] writes tiny random models with the
//! project's GGUF writer for whole-model tests of the GPU path.
#![forbid(unsafe_code)]

pub mod forward;
pub mod kernels;
pub mod model;
pub mod state;
pub mod synthetic;

pub use arch::{Arch, Config, ConfigError, FfnAct, RopeMode};
pub use forward::{forward, forward_layers, generate_greedy, generate_greedy_traced, logits};
pub use model::{Layer, Matrix, Model};
pub use state::State;

use gguf::GgmlType;

/// Everything that can go wrong in the reference: bad metadata or tensors, bad ids.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RefError {
    #[error(transparent)]
    Config(#[from] arch::ConfigError),

    #[error("{n} elements of {ty} do not fill whole blocks of {block_size}")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block_size: usize,
    },

    #[error("{what}: need {need} bytes, have {have}")]
    ShortData {
        what: String,
        need: usize,
        have: usize,
    },

    #[error("{what} has {found} elements, expected {expected}")]
    Length {
        what: &'static str,
        expected: usize,
        found: usize,
    },

    #[error("row {row} out of range: the table has {rows} rows")]
    RowOutOfRange { row: usize, rows: usize },

    #[error("token id {token} out of range: the vocabulary has {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },

    #[error("position {pos} is past the context of {ctx_len} positions")]
    ContextFull { pos: usize, ctx_len: usize },

    #[error(
        "a context of {ctx_len} positions does not fit: its KV cache would take {bytes} bytes ({reason})"
    )]
    ContextTooLarge {
        ctx_len: usize,
        /// Keys and values of every layer, f32.
        bytes: u128,
        reason: String,
    },

    #[error("the state was made for a different model configuration")]
    StateMismatch,

    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,

    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
}

/// Bytes taken by `n` elements of type `ty`; an error when `n` is not a whole number of
/// blocks.
pub(crate) fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, RefError> {
    ty.row_bytes(n as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or(RefError::NotBlockMultiple {
            ty,
            n,
            block_size: ty.block_size(),
        })
}

//! The engine's error type. Other modules add variants as they need them.

use residency::ResidencyError;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A Vulkan runtime error.
    #[error(transparent)]
    Vk(#[from] vk::VkError),
    /// A GGUF error.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// The weights could not be made resident (planning, import, copy, the file).
    #[error(transparent)]
    Residency(#[from] ResidencyError),
    /// A tensor needed by the engine is missing or has an unusable shape/type.
    #[error("tensor `{name}`: {why}")]
    Tensor {
        /// Tensor name.
        name: String,
        /// Why it is unusable.
        why: String,
    },
    /// Anything else the engine does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The model's metadata or tensors do not describe a model the engine can run.
    #[error("model: {0}")]
    Model(String),
    /// Bad input from the caller (empty prompt, token id outside the vocabulary, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// The logits held a NaN or an infinity, so no token can be chosen (broken weights
    /// or metadata: a NaN norm weight, a meaningless epsilon or rope base).
    #[error("the logits at position {pos} are not all finite (NaN or infinity): the model's weights or metadata are broken")]
    NonFiniteLogits {
        /// Position of the token whose logits these are.
        pos: usize,
    },
    /// The buffers for a context of `ctx_len` positions cannot be sized or allocated.
    #[error("a context of {ctx_len} positions: {why} (lower -c / ctx_len)")]
    ContextTooLarge {
        /// Positions asked for.
        ctx_len: usize,
        /// What does not fit, with the bytes it would need.
        why: String,
    },
    /// A dispatch would write past the end of a buffer (checked when it is recorded).
    #[error("internal: dispatch `{dispatch}` would write {need} bytes of `{binding}`, which holds {have}")]
    DispatchOutOfBounds {
        /// The dispatch (`blk.3.qkv`, `embed`, ...).
        dispatch: String,
        /// The binding written.
        binding: String,
        /// Bytes it would write up to.
        need: u64,
        /// Bytes bound.
        have: u64,
    },
    /// The KV cache cannot hold more tokens.
    #[error("context full: {n} more token(s) at position {pos} exceed the context of {ctx_len} positions (raise -c / ctx_len)")]
    ContextFull {
        /// Tokens already in the cache.
        pos: usize,
        /// Tokens asked for.
        n: usize,
        /// Positions the cache holds.
        ctx_len: usize,
    },
}

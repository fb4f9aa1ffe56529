//! The generation API's error type.

use crate::sampling::SampleError;
use crate::EngineError;

/// Everything that can stop a generation with an error (an interrupt is not an error:
/// it is [`super::StopReason::Cancelled`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// The Vulkan engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A backend built outside the engine failed (the CPU reference, or `--check`).
    #[error("{what}: {source}")]
    Backend {
        /// Which backend (`reference`).
        what: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The model's metadata does not describe a model we can run.
    #[error("reading the model's hyper-parameters: {0}")]
    Config(#[from] arch::ConfigError),
    /// Tokenizing the prompt or rendering the chat template failed.
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    /// The sampler found nothing to draw.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The forward pass produced NaN or infinite logits: the model (or its file) is broken.
    #[error("the model produced non-finite logits ({what}) at position {pos}: the weights or hyper-parameters are broken")]
    NonFiniteLogits {
        /// Position of the token whose logits these are.
        pos: usize,
        /// What was found (`NaN`, `+inf`, every logit -inf).
        what: &'static str,
    },
    /// The KV cache for the asked context does not fit.
    #[error("a context of {ctx_len} tokens does not fit: its KV cache needs {need} on {budget_what} ({budget}); use a smaller -c")]
    ContextTooLarge {
        /// Context asked for.
        ctx_len: u64,
        /// What the KV cache needs, as text (bytes, or "more than 2^64 bytes").
        need: String,
        /// What it was set against.
        budget_what: String,
        /// That budget, as text.
        budget: String,
    },
    /// The asked context is above what the model was trained on.
    #[error("-c {asked} is above the model's trained context of {trained} tokens; vkdecode refuses it (use -c {trained} or less, or -c 0 for the model's own)")]
    ContextAboveTrained {
        /// Context asked for.
        asked: usize,
        /// `<arch>.context_length`.
        trained: usize,
    },
    /// A check run between tokens (see [`crate::Generator::set_guard`]) failed, e.g. the
    /// model file changed while mapped.
    #[error(transparent)]
    Guard(Box<dyn std::error::Error + Send + Sync>),
    /// Bad input from the caller.
    #[error("{0}")]
    Input(String),
}

//! What generation is made of: the backends ([`Forward`]), loading ([`load`]) and context
//! sizing ([`fit`]), stop reasons, events, output with stop strings, errors. The
//! decisions live in ONE driver, [`crate::Slots`]; [`crate::Generator`] is its one-shot
//! face (prompt → chunked prefill → sampler → text pieces, stop conditions, timings).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = "models/SmolLM2-135M-Instruct.Q8_0.gguf";
//! let mut gen = engine::Generator::open(path, &engine::generate::LoadOptions::default())?;
//! let opts = engine::GenerateOptions { max_tokens: Some(16), ..Default::default() };
//! gen.generate_text("The capital of France is", &opts, &mut |e| {
//!     if let engine::Event::Text(t) = e { print!("{t}") }
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! # Ok(()) }
//! ```
//!
//! The forward pass is any [`Forward`]: the Vulkan [`crate::Session`], or a backend built
//! outside the engine (`cpu-backend`: the CPU reference, or both compared for `--check`).

mod chat;
mod error;
pub mod fit;
mod forward;
mod load;
mod output;

use std::time::Instant;

use tokenizer::Tokenizer;

pub use chat::chat_prompt_ids;
pub use error::GenerateError;
pub use fit::{CtxChoice, CtxRequest};
pub use forward::{check_finite, Forward};
pub use load::{load, BackendInfo, LoadOptions, Loaded};

use crate::sampling::SamplerOptions;
pub(crate) use output::{Output, Push};

/// Why a generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token.
    Eog,
    /// `max_tokens` reached.
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
    /// A stop string appeared.
    StopString,
    /// The cancel flag was set, or the callback asked to stop.
    Cancelled,
}

impl StopReason {
    /// The name used in stats (`n_predict` for `MaxTokens`, as the CLI always said).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eog => "eog",
            StopReason::MaxTokens => "n_predict",
            StopReason::ContextFull => "context_full",
            StopReason::StopString => "stop",
            StopReason::Cancelled => "interrupted",
        }
    }
}

/// What the generator tells its caller while it runs.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// A token was generated (its text follows in `Text` events, possibly later: a
    /// character split across tokens, or text that may begin a stop string, waits).
    Token(u32),
    /// Text ready to show.
    Text(&'a str),
    /// `--check`: the largest |gpu - reference| logit difference at generated token `step`.
    Check { step: usize, diff: f32 },
}

/// The sampler's options for a request: with `ignore_eos`, the end-of-generation tokens
/// are banned (a bias of `-inf`), as llama.cpp does, so generation goes on with the best
/// other token rather than past an end token whose text would show.
pub(crate) fn sampler_options(
    opts: &SamplerOptions,
    ignore_eos: bool,
    tok: &Tokenizer,
) -> SamplerOptions {
    let mut opts = opts.clone();
    if ignore_eos {
        for &e in tok.eog_ids() {
            opts.logit_bias.push((e, f32::NEG_INFINITY));
        }
    }
    opts
}

pub(crate) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

//! A generation request as the scheduler sees it, and what it sends back.

use std::time::Instant;

use engine::{SamplerOptions, TokenLogprob};
use tokio::sync::mpsc::UnboundedSender;

pub use crate::backend::Usage;

/// Why a request's generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token.
    Stop,
    /// A stop string (OpenAI's `stop` too; llama-server's `stop_type: "word"`).
    Word,
    /// `max_tokens` (or the context, which caps it) reached.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop | Finish::Word => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the engine thread sends a request's handler.
#[derive(Debug)]
pub enum JobEvent {
    /// Generated text ready to show (possibly empty: a token whose text is held back).
    Text(String),
    /// A prompt token's log-probability (completions with `echo` and `logprobs`), in
    /// prompt order, before any generated token.
    PromptLogprob(TokenLogprob),
    /// A token was kept, with its log-probability (requests that ask for them only; sent
    /// before the token's text).
    Logprob(TokenLogprob),
    /// The generation ended.
    Done {
        finish: Finish,
        usage: Usage,
        /// Time spent waiting in the queue.
        queued_ms: f64,
    },
    /// The generation failed (the message is for the client).
    Error(String),
}

/// One generation for the scheduler.
pub struct Job {
    /// Prompt token ids (already checked to fit the context).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (already capped by the context).
    pub max_tokens: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    pub sampler: SamplerOptions,
    /// Score the prompt's tokens with this many alternatives (`echo` with `logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// Where events go; a closed receiver (the client went away) cancels the job at the
    /// next step.
    pub events: UnboundedSender<JobEvent>,
    /// When the request was queued.
    pub queued_at: Instant,
}

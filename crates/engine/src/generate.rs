//! Text generation: prompt → tokens → prefill (in chunks, cancellable between them) →
//! sampler → a stream of text pieces, with stop conditions and timings.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = Arc::new(gguf::GgufFile::open("models/SmolLM2-135M-Instruct.Q8_0.gguf")?);
//! let tok = Arc::new(tokenizer::Tokenizer::from_gguf(file.gguf())?);
//! let loaded = engine::generate::load(&file, &engine::generate::LoadOptions::default())?;
//! let mut gen = engine::Generator::new(loaded.forward, tok);
//! let opts = engine::GenerateOptions { max_tokens: Some(16), ..Default::default() };
//! gen.generate_text("The capital of France is", &opts, &mut |e| {
//!     if let engine::Event::Text(t) = e { print!("{t}") }
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! # Ok(()) }
//! ```
//!
//! The forward pass is any [`Forward`]: the Vulkan [`crate::Session`], the CPU reference
//! (`reference`, used here only as a backend and for `--check`), or both compared.

mod chat;
mod error;
pub mod fit;
mod forward;
mod load;
mod output;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokenizer::Tokenizer;
use tracing::info_span;

pub use chat::chat_prompt_ids;
pub use error::GenerateError;
pub use fit::{CtxChoice, CtxRequest};
pub use forward::{check_finite, Checked, Forward, ReferenceForward};
pub use load::{load, BackendInfo, BackendKind, LoadOptions, Loaded};

use crate::sampling::{Sampler, SamplerOptions};
pub(crate) use output::{Output, Push};

/// What one generation does.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Most tokens to generate (`None`: until end of generation or a full context).
    pub max_tokens: Option<usize>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Stop when the generated text contains one of these (the text before it is kept).
    pub stop: Vec<String>,
    /// How each token is chosen.
    pub sampler: SamplerOptions,
    /// Set from elsewhere (a Ctrl-C handler, a server's disconnect) to stop at the next
    /// prefill chunk or token.
    pub cancel: Option<Arc<AtomicBool>>,
}

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

/// Figures of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Tokens generated (the end-of-generation token not counted).
    pub n_generated: usize,
    /// Prefill of the whole prompt, up to the first token's prediction.
    pub prefill_ms: f64,
    /// Time to first token (from the start of `generate`).
    pub ttft_ms: f64,
    /// Everything after the first token.
    pub decode_ms: f64,
    /// `--check`: the largest logit difference seen.
    pub max_check_diff: Option<f32>,
}

impl GenStats {
    /// Prompt tokens per second.
    pub fn prefill_tok_s(&self) -> f64 {
        self.n_prompt as f64 / (self.prefill_ms / 1e3).max(1e-9)
    }

    /// Tokens decoded after the first, per second.
    pub fn decode_tok_s(&self) -> f64 {
        match self.n_generated.saturating_sub(1) {
            0 => 0.0,
            n => n as f64 / (self.decode_ms / 1e3).max(1e-9),
        }
    }
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub ids: Vec<u32>,
    /// The generated text (without a stop string and what followed it).
    pub text: String,
    pub stop: StopReason,
    pub stats: GenStats,
}

/// A check the generator runs between prefill chunks and between tokens.
pub type Guard = Box<dyn FnMut() -> Result<(), Box<dyn std::error::Error + Send + Sync>> + Send>;

/// Generates text with a forward pass and the model's tokenizer.
pub struct Generator {
    forward: Box<dyn Forward>,
    tok: Arc<Tokenizer>,
    guard: Option<Guard>,
}

impl Generator {
    pub fn new(forward: Box<dyn Forward>, tok: Arc<Tokenizer>) -> Generator {
        Generator {
            forward,
            tok,
            guard: None,
        }
    }

    /// Runs `guard` between prefill chunks and between tokens; its error stops the
    /// generation ([`GenerateError::Guard`]). For checks such as "the mapped model file
    /// is unchanged" (one `fstat`).
    pub fn set_guard(&mut self, guard: Guard) {
        self.guard = Some(guard);
    }

    fn run_guard(&mut self) -> Result<(), GenerateError> {
        match &mut self.guard {
            Some(g) => g().map_err(GenerateError::Guard),
            None => Ok(()),
        }
    }

    /// The forward pass (counters, the Vulkan session's profile).
    pub fn forward(&self) -> &dyn Forward {
        &*self.forward
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// Tokenizes `prompt` (BOS as the metadata says; control-token text stays text) and
    /// generates from it.
    pub fn generate_text(
        &mut self,
        prompt: &str,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Result<Generation, GenerateError> {
        let ids = self.tok.encode(prompt, true, false)?;
        self.generate(&ids, opts, on_event)
    }

    /// Generates from `prompt` token ids, from position 0.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Result<Generation, GenerateError> {
        let _span = info_span!("generate", n_prompt = prompt.len()).entered();
        let ctx_len = self.forward.ctx_len();
        if prompt.is_empty() {
            return Err(GenerateError::Input(
                "the prompt tokenized to nothing".into(),
            ));
        }
        if prompt.len() >= ctx_len {
            return Err(GenerateError::Input(format!(
                "the prompt is {} tokens but the context holds {ctx_len}: raise -c or shorten the prompt",
                prompt.len()
            )));
        }
        let vocab = self.tok.vocab_size();
        if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::Input(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let cancelled = || {
            opts.cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::SeqCst))
        };
        let mut sampler = Sampler::new(sampler_options(&opts.sampler, opts.ignore_eos, &self.tok));
        for &id in prompt {
            sampler.accept(id);
        }
        let mut out = Output::new(&opts.stop);
        let mut stats = GenStats {
            n_prompt: prompt.len(),
            ..GenStats::default()
        };
        let finish = |out: Output, stop, stats| Generation {
            prompt_ids: prompt.to_vec(),
            ids: out.ids,
            text: out.text,
            stop,
            stats,
        };

        let start = Instant::now();
        self.forward.reset();
        for chunk in prompt.chunks(self.forward.chunk_len().max(1)) {
            if cancelled() {
                stats.prefill_ms = ms(start);
                return Ok(finish(out, StopReason::Cancelled, stats));
            }
            self.run_guard()?;
            self.forward.prefill(chunk)?;
        }
        let greedy = sampler.is_greedy() && !self.forward.wants_logits();
        let mut next = self.choose(&mut sampler, greedy, None)?;
        stats.prefill_ms = ms(start);
        stats.ttft_ms = stats.prefill_ms;

        let decode_start = Instant::now();
        let stop = loop {
            if let Some(diff) = self.forward.take_check_diff() {
                stats.max_check_diff = Some(stats.max_check_diff.unwrap_or(0f32).max(diff));
                let step = out.ids.len();
                if on_event(Event::Check { step, diff }).is_break() {
                    break StopReason::Cancelled;
                }
            }
            if self.tok.is_eog(next) && !opts.ignore_eos {
                break StopReason::Eog;
            }
            sampler.accept(next);
            if on_event(Event::Token(next)).is_break() {
                break StopReason::Cancelled;
            }
            match out.push(&self.tok, next, on_event) {
                Push::Continue => {}
                Push::Stop(reason) => break reason,
            }
            if opts.max_tokens.is_some_and(|m| out.ids.len() >= m) {
                break StopReason::MaxTokens;
            }
            if cancelled() {
                break StopReason::Cancelled;
            }
            if self.forward.pos() + 1 >= ctx_len {
                break StopReason::ContextFull;
            }
            self.run_guard()?;
            next = self.choose(&mut sampler, greedy, Some(next))?;
        };
        if stop != StopReason::StopString {
            out.flush(on_event);
        }
        stats.decode_ms = ms(decode_start);
        stats.n_generated = out.ids.len();
        Ok(finish(out, stop, stats))
    }

    /// The next token: after the prompt (`feed` is `None`) or after feeding `feed`.
    fn choose(
        &mut self,
        sampler: &mut Sampler,
        greedy: bool,
        feed: Option<u32>,
    ) -> Result<u32, GenerateError> {
        let pos = self.forward.pos();
        if greedy {
            let t = match feed {
                None => self.forward.last_argmax()?,
                Some(t) => self.forward.decode_argmax(t)?,
            };
            if !sampler.bans(t) {
                return Ok(t);
            }
            // a banned token won the argmax: the first maximum of the rest
            let logits = self.forward.last_logits()?;
            check_finite(logits, pos)?;
            return Ok(sampler.sample(logits)?);
        }
        let logits = match feed {
            None => self.forward.last_logits()?,
            Some(t) => self.forward.decode_logits(t)?,
        };
        check_finite(logits, pos)?;
        Ok(sampler.sample(logits)?)
    }
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

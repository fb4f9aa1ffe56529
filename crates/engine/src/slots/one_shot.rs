//! The one-shot face of the driver: [`Generator`] runs one request at a time, from
//! position 0, as ONE slot of [`Slots`] over any [`Forward`] (the Vulkan session, or a
//! backend built outside the engine), with a slot's error returned as the generation's
//! error. `vkdecode -p` (and so `bench`) goes through it.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokenizer::Tokenizer;
use tracing::info_span;

use super::{Request, SlotEvent, Slots, SlotsInfo};
use crate::generate::{load, Event, Forward, GenerateError, LoadOptions, StopReason};
use crate::sampling::SamplerOptions;

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

/// Generates text with a forward pass and the model's tokenizer (see the module docs).
pub struct Generator {
    slots: Slots,
    guard: Option<Guard>,
}

impl Generator {
    /// Opens the model file at `path` and loads it on the Vulkan device as `opts` asks
    /// ([`crate::generate::load`]), with the tokenizer its metadata describes.
    pub fn open(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Generator, GenerateError> {
        let file = Arc::new(gguf::GgufFile::open(path).map_err(crate::EngineError::from)?);
        let tok = Arc::new(Tokenizer::from_gguf(file.gguf())?);
        let loaded = load(&file, opts)?;
        Ok(Generator::new(Box::new(loaded.session), tok))
    }

    /// A generator over any forward pass, with the model's tokenizer.
    pub fn new(forward: Box<dyn Forward>, tok: Arc<Tokenizer>) -> Generator {
        let mut slots = Slots::from_forward(forward, tok, None, SlotsInfo::default());
        // one token per submit through the one-token pipelines, on any backend
        slots.set_batched(false);
        slots.set_strict(true);
        Generator { slots, guard: None }
    }

    /// Runs `guard` between prefill chunks and between tokens; its error stops the
    /// generation ([`GenerateError::Guard`]). For checks such as "the mapped model file
    /// is unchanged" (one `fstat`).
    pub fn set_guard(&mut self, guard: Guard) {
        self.guard = Some(guard);
    }

    /// The forward pass (counters, the Vulkan session's profile).
    pub fn forward(&self) -> &dyn Forward {
        self.slots.forward()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.slots.tokenizer()
    }

    /// Tokenizes `prompt` (BOS as the metadata says; control-token text stays text) and
    /// generates from it.
    pub fn generate_text(
        &mut self,
        prompt: &str,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Result<Generation, GenerateError> {
        let ids = self.slots.tokenize(prompt, true)?;
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
        self.slots.clear(0)?;
        self.slots.submit(
            0,
            Request {
                prompt: prompt.to_vec(),
                // at least the first token, as a one-shot run always generated
                max_tokens: opts.max_tokens.map(|m| m.max(1)),
                ignore_eos: opts.ignore_eos,
                stop: opts.stop.clone(),
                sampler: opts.sampler.clone(),
                ..Request::default()
            },
        )?;
        let mut max_check_diff: Option<f32> = None;
        let guard = &mut self.guard;
        let c = self.slots.finish(
            0,
            &mut || {
                if let Some(g) = guard {
                    g().map_err(GenerateError::Guard)?;
                }
                Ok(opts
                    .cancel
                    .as_ref()
                    .is_some_and(|c| c.load(Ordering::SeqCst)))
            },
            &mut |e| match e {
                SlotEvent::Token { id, .. } => on_event(Event::Token(id)),
                SlotEvent::Text { text, .. } => on_event(Event::Text(text)),
                SlotEvent::Check { step, diff, .. } => {
                    max_check_diff = Some(max_check_diff.unwrap_or(0f32).max(diff));
                    on_event(Event::Check { step, diff })
                }
                SlotEvent::PromptLogprob { .. } | SlotEvent::Done { .. } => {
                    ControlFlow::Continue(())
                }
            },
        )?;
        let stats = GenStats {
            n_prompt: prompt.len(),
            n_generated: c.ids.len(),
            prefill_ms: c.usage.ttft_ms,
            ttft_ms: c.usage.ttft_ms,
            decode_ms: c.usage.decode_ms,
            max_check_diff,
        };
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            ids: c.ids,
            text: c.text,
            stop: c.stop,
            stats,
        })
    }
}

//! The engine side of the server, behind one small trait: N slots (conversations, each
//! with its own KV cache and cached tokens) over one loaded model.
//!
//! The trait and its types follow the conversation API of the `slots` work
//! (`engine::Slots`: `pick_slot`, `submit(slot, Request)`, `cancel`, `step(on_event)`
//! with `SlotEvent::{Token, Text, Done}`), field for field, so that at merge the engine's
//! own `Slots` implements [`SlotEngine`] by delegation and these types become re-exports.
//! Until then [`crate::sessions::SessionSlots`] implements it on what the engine offers
//! in this branch: one engine session per slot, stepped in turn.

use engine::{GenerateError, SamplerOptions, StopReason};

/// One generation request for a slot.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// The whole prompt, as token ids (the part a slot already holds is not prefilled
    /// again).
    pub prompt: Vec<u32>,
    /// Most tokens to generate; `None` (or more than fits) stops at a full context.
    pub max_tokens: Option<usize>,
    /// Temperature, top-k, top-p, min-p, repetition penalty, seed.
    pub sampler: SamplerOptions,
    /// Stop when the text contains one of these (the text before it is kept).
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Prompt and generated token counts of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V the slot already held (not prefilled).
    pub reused_tokens: usize,
    /// Prompt tokens prefilled (`prompt_tokens - reused_tokens`).
    pub prefilled_tokens: usize,
    /// Tokens generated (an end-of-generation token not counted).
    pub generated_tokens: usize,
    /// From submit to the first token's prediction (waiting for other slots included).
    pub ttft_ms: f64,
    /// From the first token to the end.
    pub decode_ms: f64,
}

/// How a request ended.
#[derive(Clone, Debug)]
pub struct Completion {
    /// Why it stopped.
    pub stop: StopReason,
    /// The error that ended it, if one did.
    pub error: Option<String>,
    /// The generated ids (an end-of-generation token not included).
    pub ids: Vec<u32>,
    /// The generated text (without a stop string and what followed it).
    pub text: String,
    pub usage: Usage,
}

impl Completion {
    /// OpenAI's `finish_reason`: `stop` (end of generation, stop string), `length`
    /// (max_tokens, full context), `cancelled`, or `error`.
    pub fn finish_reason(&self) -> &'static str {
        if self.error.is_some() {
            return "error";
        }
        match self.stop {
            StopReason::Eog | StopReason::StopString => "stop",
            StopReason::MaxTokens | StopReason::ContextFull => "length",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// What a step tells its caller, per slot.
#[derive(Clone, Copy, Debug)]
pub enum SlotEvent<'a> {
    /// A token was kept (its text follows in `Text` events, possibly later).
    Token { slot: usize, id: u32 },
    /// Text ready to show.
    Text { slot: usize, text: &'a str },
    /// The request finished; the slot is idle again (its cache kept).
    Done {
        slot: usize,
        completion: &'a Completion,
    },
}

/// What [`SlotEngine::submit`] found in the slot's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Prompt tokens already in the slot (kept).
    pub reused: usize,
    /// Prompt tokens to prefill.
    pub to_prefill: usize,
}

/// What one [`SlotEngine::step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Prompt tokens prefilled in this step (all slots).
    pub prefilled: usize,
    /// Tokens decoded in this step (one per decoding slot).
    pub decoded: usize,
    /// Requests that finished in this step.
    pub finished: usize,
}

/// N conversations over one model.
///
/// A request's life: [`SlotEngine::pick_slot`], [`SlotEngine::submit`], then
/// [`SlotEngine::step`]s (each gives every busy slot one unit of work: a prompt chunk
/// while prefilling, else one token) until a `Done` event for its slot. A slot's results
/// do not depend on what runs beside it.
pub trait SlotEngine {
    /// How many slots there are (`--parallel`).
    fn n_slots(&self) -> usize;

    /// Positions each slot's KV cache holds (prompt + generated tokens).
    fn ctx_per_slot(&self) -> usize;

    /// Busy slots.
    fn busy(&self) -> usize;

    /// The idle slot that would reuse the most of `prompt`; `None` when all are busy.
    fn pick_slot(&self, prompt: &[u32]) -> Option<usize>;

    /// Starts `req` on idle slot `slot` (refused: busy slot, empty prompt, a prompt that
    /// leaves no room in the context, a token outside the vocabulary).
    fn submit(&mut self, slot: usize, req: Request) -> Result<Admission, GenerateError>;

    /// Asks slot `slot`'s request to stop: it is `Done` (cancelled) at the next step.
    fn cancel(&mut self, slot: usize);

    /// One unit of work for every busy slot; events through `on_event`. A failure inside
    /// one slot finishes that slot with the error in its [`Completion`]; an `Err` is a
    /// failure of the whole engine.
    fn step(
        &mut self,
        on_event: &mut dyn FnMut(SlotEvent<'_>),
    ) -> Result<StepReport, GenerateError>;
}

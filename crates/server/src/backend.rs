//! The engine side of the server, behind one small trait: N slots (independent sequences,
//! each with its own KV cache) over one loaded model.
//!
//! The scheduler ([`crate::scheduler`]) is written against [`SlotEngine`] only, so the
//! engine underneath can be swapped: today [`crate::sessions::SessionSlots`] (one engine
//! session per slot, stepped in turn); a batched engine that advances every active slot
//! in one submit implements the same calls.

use engine::{GenerateError, Sampler};

/// One slot's part of a decode step: feed `token` and choose the next one with `sampler`.
pub struct DecodeItem<'a> {
    /// Which slot.
    pub slot: usize,
    /// The token to feed at the slot's next position (the one chosen last step).
    pub token: u32,
    /// The slot's sampler (greedy samplers let the engine take the argmax on the GPU).
    pub sampler: &'a mut Sampler,
}

/// N independent sequences over one model.
///
/// A slot's life: [`SlotEngine::start`] (with the whole prompt), [`SlotEngine::prefill`]
/// of the prompt in chunks of at most [`SlotEngine::chunk_len`] tokens (the part the
/// slot already holds, as `start` says, skipped), [`SlotEngine::first_token`], then one
/// [`SlotEngine::decode`] per step until the scheduler stops feeding it. Calls for
/// different slots interleave freely; a slot's results do not depend on the others
/// (batch invariance).
pub trait SlotEngine {
    /// How many slots there are (`--parallel`).
    fn n_slots(&self) -> usize;

    /// Positions each slot's KV cache holds (prompt + generated tokens).
    fn ctx_len(&self) -> usize;

    /// Most prompt tokens one [`SlotEngine::prefill`] call should take: the scheduler
    /// runs decode steps of the other slots between chunks.
    fn chunk_len(&self) -> usize;

    /// Starts a new sequence for `prompt` in `slot` and returns how many of its leading
    /// tokens the slot already holds in its cache (prompt-prefix reuse: they are not
    /// prefilled again); 0 when nothing can be reused.
    fn start(&mut self, slot: usize, prompt: &[u32]) -> usize;

    /// How many leading tokens of `prompt` [`SlotEngine::start`] would reuse in `slot`
    /// (the scheduler gives a request the free slot that reuses most).
    fn reusable(&self, slot: usize, prompt: &[u32]) -> usize;

    /// Feeds prompt tokens at the slot's next positions.
    fn prefill(&mut self, slot: usize, tokens: &[u32]) -> Result<(), GenerateError>;

    /// The first generated token, after the whole prompt was fed.
    fn first_token(&mut self, slot: usize, sampler: &mut Sampler) -> Result<u32, GenerateError>;

    /// One decode step over `batch` (each slot at most once): every item's token is fed
    /// and its next token chosen. One result per item, in order; an error stops only
    /// that slot's request.
    fn decode(&mut self, batch: &mut [DecodeItem<'_>]) -> Vec<Result<u32, GenerateError>>;

    /// Tokens the slot holds in its cache.
    fn pos(&self, slot: usize) -> usize;
}

//! The engine side of the server, behind one small trait: N slots (conversations, each
//! with its own KV cache and cached tokens) over one loaded model. `engine::Slots`
//! implements it (below, by delegation); the scheduler and its tests see only the trait.

use engine::GenerateError;
pub use engine::{Admission, Completion, Request, SlotEvent, StepReport, Usage};

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

impl SlotEngine for engine::Slots {
    fn n_slots(&self) -> usize {
        engine::Slots::n_slots(self)
    }

    fn ctx_per_slot(&self) -> usize {
        engine::Slots::ctx_per_slot(self)
    }

    fn busy(&self) -> usize {
        engine::Slots::busy(self)
    }

    fn pick_slot(&self, prompt: &[u32]) -> Option<usize> {
        engine::Slots::pick_slot(self, prompt)
    }

    fn submit(&mut self, slot: usize, req: Request) -> Result<Admission, GenerateError> {
        engine::Slots::submit(self, slot, req)
    }

    fn cancel(&mut self, slot: usize) {
        engine::Slots::cancel(self, slot)
    }

    fn step(
        &mut self,
        on_event: &mut dyn FnMut(SlotEvent<'_>),
    ) -> Result<StepReport, GenerateError> {
        engine::Slots::step(self, on_event)
    }
}

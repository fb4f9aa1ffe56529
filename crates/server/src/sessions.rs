//! [`SlotEngine`] on what the engine offers today: one forward pass (an engine
//! [`Session`](engine::Session): its own KV cache, activations and command buffers) per
//! slot, all on one Vulkan context and one model file, stepped in turn on the engine
//! thread. Imported weights are the file's page-cache pages, so N sessions share one
//! copy of them; each session's KV cache is its own.
//!
//! Prompt-prefix reuse: a slot remembers the tokens its cache holds; a prompt that
//! extends them (the next turn of a chat) continues from there, and only the new tokens
//! are prefilled.

use std::sync::Arc;

use arch::Config;
use engine::generate::fit::{self, CtxRequest};
use engine::generate::{check_finite, Forward};
use engine::{GenerateError, Sampler, Session, SessionOptions};
use tracing::info_span;

use crate::backend::{DecodeItem, SlotEngine};

/// How to build the slots.
#[derive(Clone, Debug)]
pub struct SlotsOptions {
    /// How many slots (each a session with its own KV cache).
    pub n_slots: usize,
    /// Positions per slot.
    pub ctx: CtxRequest,
    /// Vulkan device index (`None`: the default device).
    pub device: Option<usize>,
    /// Session options (weights residency); `ctx_len` is replaced by the resolved context.
    pub session: SessionOptions,
}

/// What loading the slots built and cost.
#[derive(Clone, Debug)]
pub struct SlotsInfo {
    pub device: String,
    /// Where the weights live (`import(file)`, `copy`, ...).
    pub weights_path: String,
    /// Positions per slot.
    pub ctx_len: usize,
    /// Bytes of one slot's KV cache.
    pub kv_bytes_per_slot: u64,
    /// A line for the user when the context was chosen or capped.
    pub ctx_note: Option<String>,
    /// The whole start.
    pub load_ms: f64,
}

/// One slot: its forward pass and the tokens its cache holds.
struct Slot {
    forward: Box<dyn Forward>,
    cached: Vec<u32>,
}

/// N forward passes, one per slot.
pub struct SessionSlots {
    slots: Vec<Slot>,
    ctx_len: usize,
    chunk_len: usize,
}

impl SessionSlots {
    /// Slots over the given forward passes (all with the same context length).
    pub fn new(forwards: Vec<Box<dyn Forward>>) -> Result<SessionSlots, GenerateError> {
        let Some(first) = forwards.first() else {
            return Err(GenerateError::Input("at least one slot is needed".into()));
        };
        let ctx_len = first.ctx_len();
        let chunk_len = first.chunk_len().max(1);
        if forwards.iter().any(|f| f.ctx_len() != ctx_len) {
            return Err(GenerateError::Input(
                "every slot needs the same context length".into(),
            ));
        }
        Ok(SessionSlots {
            slots: forwards
                .into_iter()
                .map(|forward| Slot {
                    forward,
                    cached: Vec::new(),
                })
                .collect(),
            ctx_len,
            chunk_len,
        })
    }

    /// Loads `opts.n_slots` Vulkan sessions of `file` on one device. The context is
    /// resolved against the device's budget shared by all the slots' KV caches, so a
    /// `--parallel` whose caches do not fit is refused before anything large is
    /// allocated.
    pub fn load(
        file: &Arc<gguf::GgufFile>,
        opts: &SlotsOptions,
    ) -> Result<(SessionSlots, SlotsInfo), GenerateError> {
        let _span = info_span!("load_slots", n = opts.n_slots).entered();
        let start = std::time::Instant::now();
        if opts.n_slots == 0 {
            return Err(GenerateError::Input("--parallel must be at least 1".into()));
        }
        let cfg = Config::from_gguf(file.gguf())?;
        let ctx = vk::Context::new(&vk::ContextOptions {
            device_index: opts.device,
            ..Default::default()
        })
        .map_err(engine::EngineError::from)?;
        let mut budget = fit::vulkan_budget(ctx.caps(), file.bytes().len() as u64);
        let n = opts.n_slots as u64;
        budget.bytes /= n;
        budget.what = format!("{} shared by {n} slots", budget.what);
        let choice = fit::resolve(&cfg, opts.ctx, &budget)?;
        let session_opts = SessionOptions {
            ctx_len: choice.ctx_len,
            ..opts.session.clone()
        };
        let mut forwards: Vec<Box<dyn Forward>> = Vec::with_capacity(opts.n_slots);
        let mut weights_path = String::new();
        for _ in 0..opts.n_slots {
            let session = Session::new(ctx.clone(), file.clone(), &session_opts)?;
            weights_path = session.weights().report().path.clone();
            forwards.push(Box::new(session));
        }
        let slots = SessionSlots::new(forwards)?;
        let info = SlotsInfo {
            device: ctx.caps().name.clone(),
            weights_path,
            ctx_len: slots.ctx_len,
            kv_bytes_per_slot: fit::kv_cache_bytes(&cfg, slots.ctx_len as u64).unwrap_or(0),
            ctx_note: choice.note,
            load_ms: start.elapsed().as_secs_f64() * 1e3,
        };
        Ok((slots, info))
    }

    fn slot(&mut self, slot: usize) -> Result<&mut Slot, GenerateError> {
        let n = self.slots.len();
        self.slots
            .get_mut(slot)
            .ok_or_else(|| GenerateError::Input(format!("slot {slot} of {n}")))
    }

    /// Feeds `token` to `slot` and chooses the next one.
    fn decode_one(&mut self, item: &mut DecodeItem<'_>) -> Result<u32, GenerateError> {
        let slot = self.slot(item.slot)?;
        let pos = slot.forward.pos();
        let next = if item.sampler.is_greedy() && !slot.forward.wants_logits() {
            slot.forward.decode_argmax(item.token)
        } else {
            slot.forward.decode_logits(item.token).and_then(|logits| {
                check_finite(logits, pos)?;
                Ok(item.sampler.sample(logits)?)
            })
        };
        match next {
            Ok(t) => {
                slot.cached.push(item.token);
                Ok(t)
            }
            Err(e) => {
                forget(slot);
                Err(e)
            }
        }
    }
}

/// After an error the cache's contents are unknown: start the next request afresh.
fn forget(slot: &mut Slot) {
    slot.cached.clear();
    slot.forward.reset();
}

/// Leading tokens of `prompt` a cache holding `cached` can keep: all of `cached` when the
/// prompt extends it by at least one token (a cache cannot be cut back), else none.
fn extends(cached: &[u32], prompt: &[u32]) -> usize {
    if !cached.is_empty() && prompt.len() > cached.len() && prompt.starts_with(cached) {
        cached.len()
    } else {
        0
    }
}

impl SlotEngine for SessionSlots {
    fn n_slots(&self) -> usize {
        self.slots.len()
    }

    fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    fn chunk_len(&self) -> usize {
        self.chunk_len
    }

    fn reusable(&self, slot: usize, prompt: &[u32]) -> usize {
        self.slots
            .get(slot)
            .map_or(0, |s| extends(&s.cached, prompt))
    }

    fn start(&mut self, slot: usize, prompt: &[u32]) -> usize {
        let Some(s) = self.slots.get_mut(slot) else {
            return 0;
        };
        let keep = extends(&s.cached, prompt);
        if keep == 0 {
            forget(s);
        }
        keep
    }

    fn prefill(&mut self, slot: usize, tokens: &[u32]) -> Result<(), GenerateError> {
        let s = self.slot(slot)?;
        match s.forward.prefill(tokens) {
            Ok(()) => {
                s.cached.extend_from_slice(tokens);
                Ok(())
            }
            Err(e) => {
                forget(s);
                Err(e)
            }
        }
    }

    fn first_token(&mut self, slot: usize, sampler: &mut Sampler) -> Result<u32, GenerateError> {
        let s = self.slot(slot)?;
        let pos = s.forward.pos().saturating_sub(1);
        let next = if sampler.is_greedy() && !s.forward.wants_logits() {
            s.forward.last_argmax()
        } else {
            s.forward.last_logits().and_then(|logits| {
                check_finite(logits, pos)?;
                Ok(sampler.sample(logits)?)
            })
        };
        if next.is_err() {
            forget(s);
        }
        next
    }

    fn decode(&mut self, batch: &mut [DecodeItem<'_>]) -> Vec<Result<u32, GenerateError>> {
        batch.iter_mut().map(|item| self.decode_one(item)).collect()
    }

    fn pos(&self, slot: usize) -> usize {
        self.slots.get(slot).map_or(0, |s| s.forward.pos())
    }
}

#[cfg(test)]
mod tests {
    use super::extends;

    #[test]
    fn a_prompt_reuses_the_cache_only_when_it_extends_it() {
        assert_eq!(extends(&[1, 2, 3], &[1, 2, 3, 4, 5]), 3);
        // the same prompt again: the cache cannot be cut back to re-predict its end
        assert_eq!(extends(&[1, 2, 3], &[1, 2, 3]), 0);
        assert_eq!(extends(&[1, 2, 3], &[1, 2, 4, 5]), 0);
        assert_eq!(extends(&[], &[1, 2]), 0);
        assert_eq!(extends(&[1, 2, 3], &[1, 2]), 0);
    }
}

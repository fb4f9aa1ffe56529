//! [`SlotEngine`] on what the engine offers today: one forward pass (an engine
//! [`Session`](engine::Session): its own KV cache, activations and command buffers) per
//! slot, all on one Vulkan context and one model file, stepped in turn on the engine
//! thread. Imported weights are the file's page-cache pages, so N sessions share one
//! copy of them; each session's KV cache is its own.
//!
//! Prompt-prefix reuse: a slot remembers the tokens its cache holds; a prompt that
//! extends them (the next turn of a chat) continues from there, and only the new tokens
//! are prefilled (a session cannot cut its cache back, so a prompt that shares only part
//! of it starts afresh). A step gives every busy slot one unit of work: the next prompt
//! chunk while prefilling, else one token (each slot its own submit: no batched decode
//! here; that is the engine `Slots` work).

use std::sync::Arc;
use std::time::Instant;

use arch::Config;
use engine::generate::fit::{self, CtxRequest};
use engine::generate::{check_finite, Forward};
use engine::{GenerateError, Sampler, Session, SessionOptions, StopReason};
use tokenizer::Tokenizer;
use tracing::info_span;

use crate::backend::{Admission, Completion, Request, SlotEngine, SlotEvent, StepReport, Usage};
use crate::text::TextOut;

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

/// A request while it runs in a slot.
struct Job {
    req: Request,
    sampler: Sampler,
    text: TextOut,
    ids: Vec<u32>,
    /// Prompt tokens in the cache (the reused prefix, then each chunk fed).
    fed: usize,
    reused: usize,
    /// The token chosen last, fed at the next step.
    next: Option<u32>,
    cancel: bool,
    submitted: Instant,
    first_token: Option<Instant>,
}

/// One slot: its forward pass, the tokens its cache holds, its request.
struct Slot {
    forward: Box<dyn Forward>,
    cached: Vec<u32>,
    job: Option<Job>,
    last_used: u64,
}

/// N forward passes, one per slot.
pub struct SessionSlots {
    slots: Vec<Slot>,
    tok: Arc<Tokenizer>,
    ctx_len: usize,
    chunk_len: usize,
    requests: u64,
}

impl SessionSlots {
    /// Slots over the given forward passes (all with the same context length).
    pub fn new(
        forwards: Vec<Box<dyn Forward>>,
        tok: Arc<Tokenizer>,
    ) -> Result<SessionSlots, GenerateError> {
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
                    job: None,
                    last_used: 0,
                })
                .collect(),
            tok,
            ctx_len,
            chunk_len,
            requests: 0,
        })
    }

    /// Loads `opts.n_slots` Vulkan sessions of `file` on one device. The context is
    /// resolved against the device's budget shared by all the slots' KV caches, so a
    /// `--parallel` whose caches do not fit is refused before anything large is
    /// allocated.
    pub fn load(
        file: &Arc<gguf::GgufFile>,
        tok: Arc<Tokenizer>,
        opts: &SlotsOptions,
    ) -> Result<(SessionSlots, SlotsInfo), GenerateError> {
        let _span = info_span!("load_slots", n = opts.n_slots).entered();
        let start = Instant::now();
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
        let slots = SessionSlots::new(forwards, tok)?;
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

    /// Prompt tokens slot `slot` would reuse for `prompt`.
    pub fn reusable(&self, slot: usize, prompt: &[u32]) -> usize {
        self.slots
            .get(slot)
            .map_or(0, |s| extends(&s.cached, prompt))
    }

    /// The next prompt chunk of slot `i`; after the last one, the first token chosen.
    fn prefill_chunk(
        &mut self,
        i: usize,
        report: &mut StepReport,
    ) -> Result<Option<u32>, GenerateError> {
        let chunk_len = self.chunk_len;
        let slot = &mut self.slots[i];
        let job = slot.job.as_mut().expect("busy");
        let end = (job.fed + chunk_len).min(job.req.prompt.len());
        let chunk = &job.req.prompt[job.fed..end];
        slot.forward.prefill(chunk)?;
        slot.cached.extend_from_slice(chunk);
        report.prefilled += chunk.len();
        job.fed = end;
        if end < job.req.prompt.len() {
            return Ok(None);
        }
        let pos = slot.forward.pos().saturating_sub(1);
        let next = if job.sampler.is_greedy() && !slot.forward.wants_logits() {
            slot.forward.last_argmax()?
        } else {
            let logits = slot.forward.last_logits()?;
            check_finite(logits, pos)?;
            job.sampler.sample(logits)?
        };
        job.first_token = Some(Instant::now());
        Ok(Some(next))
    }

    /// Feeds slot `i` its chosen token and chooses the next.
    fn decode_one(&mut self, i: usize, report: &mut StepReport) -> Result<u32, GenerateError> {
        let slot = &mut self.slots[i];
        let job = slot.job.as_mut().expect("busy");
        let token = job
            .next
            .take()
            .expect("a decoding slot has a token to feed");
        let pos = slot.forward.pos();
        let next = if job.sampler.is_greedy() && !slot.forward.wants_logits() {
            slot.forward.decode_argmax(token)?
        } else {
            let logits = slot.forward.decode_logits(token)?;
            check_finite(logits, pos)?;
            job.sampler.sample(logits)?
        };
        slot.cached.push(token);
        report.decoded += 1;
        Ok(next)
    }

    /// Takes `next`, just chosen for slot `i`: `Some(stop)` ends the request.
    fn keep(
        &mut self,
        i: usize,
        next: u32,
        on_event: &mut dyn FnMut(SlotEvent<'_>),
    ) -> Option<StopReason> {
        let ctx_len = self.ctx_len;
        let slot = &mut self.slots[i];
        let pos = slot.forward.pos();
        let job = slot.job.as_mut().expect("busy");
        if self.tok.is_eog(next) && !job.req.ignore_eos {
            return Some(StopReason::Eog);
        }
        job.sampler.accept(next);
        job.ids.push(next);
        on_event(SlotEvent::Token { slot: i, id: next });
        let pushed = job.text.push(&self.tok, next);
        if !pushed.text.is_empty() {
            on_event(SlotEvent::Text {
                slot: i,
                text: &pushed.text,
            });
        }
        if pushed.stopped {
            return Some(StopReason::StopString);
        }
        if job.req.max_tokens.is_some_and(|m| job.ids.len() >= m) {
            return Some(StopReason::MaxTokens);
        }
        // the cache holds `pos` tokens; feeding `next` takes one more position
        if pos + 1 >= ctx_len {
            return Some(StopReason::ContextFull);
        }
        job.next = Some(next);
        None
    }

    /// Ends slot `i`'s request with a `Done` event.
    fn finish(
        &mut self,
        i: usize,
        stop: StopReason,
        error: Option<String>,
        report: &mut StepReport,
        on_event: &mut dyn FnMut(SlotEvent<'_>),
    ) {
        let slot = &mut self.slots[i];
        let mut job = slot.job.take().expect("busy");
        if error.is_some() {
            // what the cache holds after a failed step is unknown: start over
            forget(slot);
        }
        if stop != StopReason::StopString && error.is_none() {
            let rest = job.text.finish();
            if !rest.is_empty() {
                on_event(SlotEvent::Text {
                    slot: i,
                    text: &rest,
                });
            }
        }
        let now = Instant::now();
        let first = job.first_token.unwrap_or(now);
        let completion = Completion {
            stop,
            error,
            text: job.text.text().to_string(),
            usage: Usage {
                prompt_tokens: job.req.prompt.len(),
                reused_tokens: job.reused,
                prefilled_tokens: job.fed - job.reused,
                generated_tokens: job.ids.len(),
                ttft_ms: (first - job.submitted).as_secs_f64() * 1e3,
                decode_ms: (now - first).as_secs_f64() * 1e3,
            },
            ids: job.ids,
        };
        report.finished += 1;
        on_event(SlotEvent::Done {
            slot: i,
            completion: &completion,
        });
    }

    /// After slot `i`'s unit of work: go on, or finish.
    fn settle(
        &mut self,
        i: usize,
        outcome: Result<Option<StopReason>, GenerateError>,
        report: &mut StepReport,
        on_event: &mut dyn FnMut(SlotEvent<'_>),
    ) {
        match outcome {
            Ok(None) => {}
            Ok(Some(stop)) => self.finish(i, stop, None, report, on_event),
            Err(e) => self.finish(
                i,
                StopReason::Cancelled,
                Some(e.to_string()),
                report,
                on_event,
            ),
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

    fn ctx_per_slot(&self) -> usize {
        self.ctx_len
    }

    fn busy(&self) -> usize {
        self.slots.iter().filter(|s| s.job.is_some()).count()
    }

    fn pick_slot(&self, prompt: &[u32]) -> Option<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].job.is_none())
            .max_by_key(|&i| {
                (
                    self.reusable(i, prompt),
                    std::cmp::Reverse(self.slots[i].last_used),
                    std::cmp::Reverse(i),
                )
            })
    }

    fn submit(&mut self, slot: usize, req: Request) -> Result<Admission, GenerateError> {
        let n = self.slots.len();
        let ctx_len = self.ctx_len;
        let vocab = self.tok.vocab_size();
        let s = self.slots.get_mut(slot).ok_or_else(|| {
            GenerateError::Input(format!("slot {slot} does not exist ({n} slots)"))
        })?;
        if s.job.is_some() {
            return Err(GenerateError::Input(format!("slot {slot} is busy")));
        }
        if req.prompt.is_empty() {
            return Err(GenerateError::Input(
                "the prompt tokenized to nothing".into(),
            ));
        }
        if req.prompt.len() >= ctx_len {
            return Err(GenerateError::Input(format!(
                "the prompt is {} tokens but a slot's context holds {ctx_len}",
                req.prompt.len()
            )));
        }
        if req.max_tokens == Some(0) {
            return Err(GenerateError::Input("max_tokens must be at least 1".into()));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::Input(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let reused = extends(&s.cached, &req.prompt);
        if reused == 0 {
            forget(s);
        }
        self.requests += 1;
        s.last_used = self.requests;
        let mut sampler = Sampler::new(req.sampler.clone());
        for &id in &req.prompt {
            sampler.accept(id);
        }
        let to_prefill = req.prompt.len() - reused;
        s.job = Some(Job {
            text: TextOut::new(&req.stop),
            req,
            sampler,
            ids: Vec::new(),
            fed: reused,
            reused,
            next: None,
            cancel: false,
            submitted: Instant::now(),
            first_token: None,
        });
        Ok(Admission { reused, to_prefill })
    }

    fn cancel(&mut self, slot: usize) {
        if let Some(job) = self.slots.get_mut(slot).and_then(|s| s.job.as_mut()) {
            job.cancel = true;
        }
    }

    fn step(
        &mut self,
        on_event: &mut dyn FnMut(SlotEvent<'_>),
    ) -> Result<StepReport, GenerateError> {
        let mut report = StepReport::default();
        for i in 0..self.slots.len() {
            let Some(job) = &self.slots[i].job else {
                continue;
            };
            if job.cancel {
                self.finish(i, StopReason::Cancelled, None, &mut report, on_event);
                continue;
            }
            let outcome = if job.next.is_some() {
                self.decode_one(i, &mut report)
                    .map(|next| self.keep(i, next, on_event))
            } else {
                match self.prefill_chunk(i, &mut report) {
                    Ok(Some(next)) => Ok(self.keep(i, next, on_event)),
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                }
            };
            self.settle(i, outcome, &mut report, on_event);
        }
        Ok(report)
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

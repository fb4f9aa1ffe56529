//! Several conversations over one loaded model: the conversation API that
//! `vkdecode chat` and `vkdecode serve` drive.
//!
//! One [`Slots`] holds ONE forward pass ([`Forward`]), usually a [`Session`]: one mapping
//! (or copy) of the weights, one set of pipelines and descriptor sets, and a KV cache
//! with `ctx` rows per slot in one buffer per layer (slot `s` owns rows
//! `s·ctx..(s+1)·ctx`; the step buffer gives each token its position and cache row).
//! Each slot has its own position, its own cached token list and at most one request at
//! a time. This is the one generation driver: the one-shot [`crate::Generator`] is one
//! slot of it over any backend (the CPU reference and `--check` included).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = Arc::new(gguf::GgufFile::open("models/SmolLM2-135M-Instruct.Q8_0.gguf")?);
//! let mut slots = engine::Slots::load(&file, &engine::SlotsOptions { slots: 4, ..Default::default() })?;
//! let prompt = slots.tokenize("The capital of France is", true)?;
//! let slot = slots.pick_slot(&prompt).expect("an idle slot");
//! slots.submit(slot, engine::Request { prompt, max_tokens: Some(16), ..Default::default() })?;
//! while slots.busy() > 0 {
//!     slots.step(&mut |e| {
//!         if let engine::SlotEvent::Text { text, .. } = e { print!("{text}") }
//!     })?;
//! }
//! # Ok(()) }
//! ```
//!
//! **Prompt cache.** A slot keeps the K/V of every token it was fed and the list of those
//! tokens ([`Slots::cached`]). [`Slots::submit`] keeps the longest common prefix (LCP) of
//! that list and the new prompt, truncates the slot's position to it, and prefills only
//! the rest (at least the prompt's last token, whose logits choose the first new token).
//! [`Slots::pick_slot`] finds the idle slot with the longest common prefix. A prompt that
//! another *busy* slot holds or is prefilling (the answers of one request with `n` > 1,
//! requests sent together with one system prompt) is not prefilled twice: the new job
//! waits for that slot to hold the shared prefix, then its K/V rows are copied on the
//! device ([`Session::copy_prefix`]) and only the rest is fed. The counters
//! ([`Usage`], [`SlotCounters`]) say how many prompt tokens were prefilled vs reused.
//!
//! **Stepping.** [`Slots::step`] gives every busy slot one unit of work: the next chunk
//! (up to [`Session::prefill_chunk`](crate::Session::prefill_chunk) tokens) of its prompt, one submit per slot,
//! so a long prompt is prefilled in chunks between the other slots' tokens; then every
//! decoding slot's chosen token is fed in ONE submit ([`Session::decode_batch`]): the
//! slots' tokens are one batch, each with its own position and cache row in the step
//! buffer, so every layer's matmuls are a small matrix-matrix product over the slots and
//! the weights are read once per step whatever the concurrency, the output matrix of the
//! logits head included (one matmul over the slots' final hidden states, then one argmax
//! per slot on the GPU; only sampling slots read their logits back). Batch-invariant:
//! each token's rows are reduced in the same order at any batch size, so a slot's tokens
//! do not depend on what runs beside it (tested). With [`SlotsOptions::batched`] off, each
//! decoding slot is its own submit through the one-token pipelines instead, which is
//! how the one-shot [`crate::Generator`] decodes, and how a backend that cannot batch
//! (the reference, `--check`) always does.
//!
//! **Events.** A step reports, per slot, [`SlotEvent::Token`] (each token kept),
//! [`SlotEvent::Text`] (text ready to show: stop strings are held back while they may
//! still appear) and, once, [`SlotEvent::Done`] with the [`Completion`] (finish reason,
//! usage, whole text). After `Done` the slot is idle and keeps its cache.

mod job;
mod one_shot;
mod types;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use tokenizer::{ChatTemplate, Message, Tokenizer};
use tracing::info_span;

use crate::generate::{
    chat_prompt_ids, load, Event, Forward, GenerateError, LoadOptions, Loaded, StopReason,
};
use crate::sampling::TokenLogprob;
use crate::session::{Session, SessionOptions};
use job::Job;
pub use one_shot::{GenStats, GenerateOptions, Generation, Generator, Guard};
pub use types::{
    Admission, BatchKernel, Completion, Request, SlotCounters, SlotEvent, SlotsInfo, SlotsOptions,
    StepReport, Usage,
};

/// One slot: what its cache holds, and its request if it has one.
struct Slot {
    /// Tokens whose K/V are in this slot's rows `0..cached.len()` (its position).
    cached: Vec<u32>,
    job: Option<Job>,
    /// The request count when it was last submitted to, 0 if never (least recently used
    /// wins ties in [`Slots::pick_slot`]).
    last_used: u64,
}

/// Several conversations over one loaded model; see the module docs.
pub struct Slots {
    fwd: Box<dyn Forward>,
    tok: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    slots: Vec<Slot>,
    info: SlotsInfo,
    counters: SlotCounters,
    batched: bool,
    batch_kernel: BatchKernel,
    /// A slot's error (non-finite logits, a sampler with nothing to draw) is the step's
    /// `Err` rather than a finished request: the one-shot generator's way.
    strict: bool,
}

impl Slots {
    /// Loads `file` once with `opts.slots` KV caches of `opts.ctx` positions each
    /// ([`crate::generate::load`]: the context is resolved per slot against the device
    /// budget divided by the slots, and refused up front when it does not fit).
    pub fn load(file: &Arc<gguf::GgufFile>, opts: &SlotsOptions) -> Result<Slots, GenerateError> {
        let start = Instant::now();
        let n = opts.slots;
        let _span = info_span!("slots_load", slots = n).entered();
        if n == 0 {
            return Err(GenerateError::Input("at least 1 slot is needed".into()));
        }
        let tok = Arc::new(Tokenizer::from_gguf(file.gguf())?);
        let template = ChatTemplate::from_gguf(file.gguf())?;
        let load_opts = LoadOptions {
            device: opts.device,
            session: SessionOptions {
                slots: n,
                ..opts.session.clone()
            },
            ctx: opts.ctx,
            budget_cap: None,
        };
        let Loaded {
            mut session,
            info: loaded,
        } = load(file, &load_opts)?;
        if opts.batched {
            // warm the batched step's own pipelines (its head: lavapipe compiles a
            // pipeline on its first dispatch), then forget the throw-away token
            let mm = opts.batch_kernel == BatchKernel::MatrixMatrix;
            session.decode_batch(&[(0, 0)], false, mm)?;
            session.select_slot(0)?;
            session.reset();
        }
        let info = SlotsInfo {
            slots: loaded.slots,
            ctx_per_slot: loaded.ctx_len,
            kv_bytes_per_slot: loaded.kv_bytes / loaded.slots.max(1) as u64,
            kv_bytes: loaded.kv_bytes,
            device: loaded.device,
            weights_path: loaded.weights_path,
            kernels: loaded.kernels,
            kernels_why: loaded.kernels_why,
            device_bytes: loaded.device_bytes,
            ctx_note: loaded.ctx_note,
            load_ms: start.elapsed().as_secs_f64() * 1e3,
        };
        let mut slots = Slots::from_forward(Box::new(session), tok, template, info);
        slots.batched = opts.batched;
        slots.batch_kernel = opts.batch_kernel;
        Ok(slots)
    }

    /// Slots over an existing forward pass (one slot per backend slot), batched where
    /// the backend can batch.
    pub fn from_forward(
        fwd: Box<dyn Forward>,
        tok: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        info: SlotsInfo,
    ) -> Slots {
        let slots = (0..fwd.slots())
            .map(|_| Slot {
                cached: Vec::new(),
                job: None,
                last_used: 0,
            })
            .collect();
        Slots {
            fwd,
            tok,
            template,
            slots,
            info,
            counters: SlotCounters::default(),
            batched: true,
            batch_kernel: BatchKernel::MatrixMatrix,
            strict: false,
        }
    }

    /// Makes a slot's error (non-finite logits, a sampler with nothing to draw) the
    /// step's `Err`, after the slot is cleared, instead of a finished request with the
    /// error in its [`Completion`].
    pub(crate) fn set_strict(&mut self, strict: bool) {
        self.strict = strict;
    }

    /// Switches between the batched decode step and one submit per slot (see
    /// [`SlotsOptions::batched`]); for A/B runs.
    pub fn set_batched(&mut self, batched: bool) {
        self.batched = batched;
    }

    /// Switches the batched step's head between the matrix-matrix kernel over every
    /// slot's token (the default) and the one-token kernel once per token; for A/B runs.
    pub fn set_head_kernel(&mut self, kernel: BatchKernel) {
        if let Some(s) = self.fwd.batch_session() {
            s.set_batch_head(kernel == BatchKernel::MatrixMatrix);
        }
    }

    /// Switches the batched step's matmul kernel (see [`BatchKernel`]); for A/B runs.
    pub fn set_batch_kernel(&mut self, kernel: BatchKernel) {
        self.batch_kernel = kernel;
    }

    /// Sizes and paths, as loaded.
    pub fn info(&self) -> &SlotsInfo {
        &self.info
    }

    /// Number of slots.
    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Positions each slot holds.
    pub fn ctx_per_slot(&self) -> usize {
        self.fwd.ctx_len()
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    /// The model's chat template, if its file has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The Vulkan session underneath, if the backend has one (weights report, device
    /// counters, profiles).
    pub fn session(&self) -> Option<&Session> {
        self.fwd.session()
    }

    /// The forward pass underneath.
    pub fn forward(&self) -> &dyn Forward {
        &*self.fwd
    }

    /// Text to ids: BOS as the model's metadata says when `add_special`; special-token
    /// text stays plain text.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, GenerateError> {
        Ok(self.tok.encode(text, add_special, false)?)
    }

    /// Ids to text (control tokens render as nothing).
    pub fn detokenize(&self, ids: &[u32]) -> String {
        self.tok.detokenize(ids)
    }

    /// The ids of `messages` rendered by the model's chat template, with the assistant's
    /// generation prompt appended; an error when the model has no template.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>, GenerateError> {
        let template = self.template.as_ref().ok_or_else(|| {
            GenerateError::Input(
                "the model file has no chat template (tokenizer.chat_template)".into(),
            )
        })?;
        chat_prompt_ids(&self.tok, template, messages, false)
    }

    /// The tokens whose K/V slot `slot` holds (its position is their count).
    pub fn cached(&self, slot: usize) -> &[u32] {
        &self.slots[slot].cached
    }

    /// Whether slot `slot` has a request running.
    pub fn is_busy(&self, slot: usize) -> bool {
        self.slots[slot].job.is_some()
    }

    /// Slots with a request running.
    pub fn busy(&self) -> usize {
        self.slots.iter().filter(|s| s.job.is_some()).count()
    }

    /// Totals since load.
    pub fn counters(&self) -> SlotCounters {
        self.counters
    }

    /// The prompt tokens slot `slot` would reuse for `prompt` (see the module docs).
    pub fn reusable(&self, slot: usize, prompt: &[u32]) -> usize {
        let lcp = common_prefix(&self.slots[slot].cached, prompt);
        // the last prompt token is always fed: its logits choose the first new token
        lcp.min(prompt.len().saturating_sub(1))
    }

    /// The idle slot that would reuse the most of `prompt`; among equals, the least
    /// recently used. `None` when every slot is busy.
    pub fn pick_slot(&self, prompt: &[u32]) -> Option<usize> {
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

    /// Starts `req` on idle slot `slot`: keeps the cached prefix it shares with the
    /// prompt and queues the rest for prefill (the next [`Slots::step`]s run it).
    /// Refused: a busy or missing slot, an empty prompt, a prompt that leaves no room to
    /// generate in the slot's context, a token outside the vocabulary.
    pub fn submit(&mut self, slot: usize, req: Request) -> Result<Admission, GenerateError> {
        let n = self.slots.len();
        let s = self.slots.get(slot).ok_or_else(|| {
            GenerateError::Input(format!("slot {slot} does not exist ({n} slots)"))
        })?;
        if s.job.is_some() {
            return Err(GenerateError::Input(format!("slot {slot} is busy")));
        }
        let ctx_len = self.fwd.ctx_len();
        if req.prompt.is_empty() {
            return Err(GenerateError::Input(
                "the prompt tokenized to nothing".into(),
            ));
        }
        if req.prompt.len() >= ctx_len {
            let whose = if n == 1 { "the" } else { "a slot's" };
            return Err(GenerateError::Input(format!(
                "the prompt is {} tokens but {whose} context holds {ctx_len}: raise -c or shorten the prompt",
                req.prompt.len()
            )));
        }
        if req.max_tokens == Some(0) {
            return Err(GenerateError::Input("max_tokens must be at least 1".into()));
        }
        let vocab = self.tok.vocab_size();
        if let Some(&bad) = req.prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::Input(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let reused = match req.prompt_logprobs {
            // a scored prompt is fed whole: every token's logits are needed
            Some(_) => 0,
            None => self.reusable(slot, &req.prompt),
        };
        self.fwd.select_slot(slot)?;
        self.fwd.truncate(reused)?;
        let share = match req.prompt_logprobs {
            Some(_) => None,
            None => self.share_source(slot, &req.prompt, reused),
        };
        let s = &mut self.slots[slot];
        s.cached.truncate(reused);
        let to_prefill = req.prompt.len() - reused;
        self.counters.requests += 1;
        s.last_used = self.counters.requests;
        self.counters.prompt_tokens += req.prompt.len() as u64;
        self.counters.reused_tokens += reused as u64;
        let mut job = Job::new(req, reused, &self.tok, self.fwd.wants_logits());
        job.share = share;
        s.job = Some(job);
        Ok(Admission {
            reused,
            to_prefill,
            shared_from: share.map(|(from, _)| from),
        })
    }

    /// A busy slot that holds, or is prefilling, more of `prompt` than slot `slot` keeps
    /// (`own` tokens): that slot, and how many prompt tokens to copy from it once it holds
    /// them (never the last: its logits choose the first new token). This is how the
    /// answers of one request (`n` > 1), or requests sent together with one system
    /// prompt, share one prefill. An idle slot is no source: [`Slots::pick_slot`] would
    /// have given it the request. Among equals, the lowest slot wins.
    fn share_source(&self, slot: usize, prompt: &[u32], own: usize) -> Option<(usize, usize)> {
        let cap = prompt.len().saturating_sub(1);
        (0..self.slots.len())
            .filter(|&i| i != slot)
            .filter_map(|i| {
                let s = &self.slots[i];
                let job = s.job.as_ref()?;
                // a job that waits on a third slot is no source (no waiting in circles)
                let coming = match job.prefilling() && job.share.is_none() {
                    true => common_prefix(job.prompt(), prompt),
                    false => 0,
                };
                Some((i, common_prefix(&s.cached, prompt).max(coming).min(cap)))
            })
            .filter(|&(_, n)| n > own)
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
    }

    /// For slot `i`'s job, waiting to share a prompt prefix (see [`Slots::share_source`]):
    /// copies what the other slot holds once it holds all that was promised, or once it
    /// no longer prefills that prompt itself. False while it is still worth waiting.
    fn take_shared(&mut self, i: usize) -> Result<bool, GenerateError> {
        let job = self.slots[i].job.as_ref().expect("busy");
        let Some((from, want)) = job.share else {
            return Ok(true);
        };
        let prompt = job.prompt();
        let src = &self.slots[from];
        let have = common_prefix(&src.cached, prompt).min(want);
        let coming = (src.job.as_ref()).is_some_and(|j| {
            j.prefilling() && j.share.is_none() && common_prefix(j.prompt(), prompt) >= want
        });
        if have < want && coming {
            return Ok(false);
        }
        let slot = &mut self.slots[i];
        let own = slot.cached.len();
        let job = slot.job.as_mut().expect("busy");
        if have > own {
            self.fwd.copy_prefix(from, i, have)?;
            slot.cached = job.prompt()[..have].to_vec();
            self.counters.reused_tokens += (have - own) as u64;
            self.counters.shared_tokens += (have - own) as u64;
            job.shared(have);
        } else {
            job.share = None;
        }
        Ok(true)
    }

    /// Asks slot `slot`'s request to stop; it finishes ([`StopReason::Cancelled`]) at the
    /// next step. Nothing happens on an idle slot.
    pub fn cancel(&mut self, slot: usize) {
        if let Some(job) = self.slots.get_mut(slot).and_then(|s| s.job.as_mut()) {
            job.cancel = true;
        }
    }

    /// Forgets what idle slot `slot` holds (its next request prefills from scratch).
    pub fn clear(&mut self, slot: usize) -> Result<(), GenerateError> {
        if self.is_busy(slot) {
            return Err(GenerateError::Input(format!("slot {slot} is busy")));
        }
        self.fwd.select_slot(slot)?;
        self.fwd.reset();
        self.slots[slot].cached.clear();
        Ok(())
    }

    /// Gives every busy slot one unit of work and reports what happened through
    /// `on_event`: slots still prefilling get their next prompt chunk (one submit each);
    /// then every decoding slot is fed its chosen token: batched (the default, where the
    /// backend can), all of them in ONE submit ([`Session::decode_batch`]), else one
    /// submit per slot. A failure inside one slot (non-finite logits, a sampler with
    /// nothing to draw) finishes that slot with the error in its [`Completion`]; only a
    /// device failure is an `Err`.
    pub fn step(
        &mut self,
        on_event: &mut dyn FnMut(SlotEvent<'_>),
    ) -> Result<StepReport, GenerateError> {
        self.step_until(&mut |e| {
            on_event(e);
            ControlFlow::Continue(())
        })
    }

    /// [`Slots::step`] where `on_event` may break: the slot whose event it was stops
    /// ([`StopReason::Cancelled`]) before its next token is kept.
    fn step_until(
        &mut self,
        on_event: &mut dyn FnMut(SlotEvent<'_>) -> ControlFlow<()>,
    ) -> Result<StepReport, GenerateError> {
        let _span = info_span!("slots_step", busy = self.busy()).entered();
        self.counters.steps += 1;
        let mut report = StepReport::default();
        let mut decoding = Vec::new();
        for i in 0..self.slots.len() {
            let Some(job) = &self.slots[i].job else {
                continue;
            };
            if job.cancel {
                self.settle(
                    i,
                    Ok(ControlFlow::Break(StopReason::Cancelled)),
                    &mut report,
                    on_event,
                )?;
            } else if job.decoding() {
                decoding.push(i);
            } else if self.take_shared(i)? {
                self.fwd.select_slot(i)?;
                let slot = &mut self.slots[i];
                let job = slot.job.as_mut().expect("busy");
                let chunk = job.prefill_chunk(&mut *self.fwd, &mut slot.cached, &mut report);
                for lp in job.take_scored() {
                    let e = SlotEvent::PromptLogprob {
                        slot: i,
                        logprob: &lp,
                    };
                    if on_event(e).is_break() {
                        job.cancel = true;
                    }
                }
                let outcome = match chunk {
                    Ok(Some(next)) => {
                        let lp = job.take_logprob();
                        Ok(job.keep(&mut *self.fwd, &self.tok, next, &mut |e| {
                            forward_event(i, e, lp.as_ref(), on_event)
                        }))
                    }
                    Ok(None) => Ok(ControlFlow::Continue(())),
                    Err(e) => Err(e),
                };
                self.settle(i, outcome, &mut report, on_event)?;
            }
        }
        if decoding.is_empty() {
            return Ok(report);
        }
        let mm = self.batch_kernel == BatchKernel::MatrixMatrix;
        let batch = match self.batched {
            true => self.fwd.batch_session(),
            false => None,
        };
        let Some(session) = batch else {
            for i in decoding {
                self.fwd.select_slot(i)?;
                let slot = &mut self.slots[i];
                let job = slot.job.as_mut().expect("busy");
                let outcome = job
                    .decode_one(&mut *self.fwd, &mut slot.cached, &mut report)
                    .map(|next| {
                        let lp = job.take_logprob();
                        job.keep(&mut *self.fwd, &self.tok, next, &mut |e| {
                            forward_event(i, e, lp.as_ref(), on_event)
                        })
                    });
                self.settle(i, outcome, &mut report, on_event)?;
            }
            return Ok(report);
        };
        let mut items = Vec::with_capacity(decoding.len());
        let mut keep_logits = false;
        for &i in &decoding {
            let job = self.slots[i].job.as_ref().expect("busy");
            let token = job.to_feed().expect("a decoding slot has a token to feed");
            items.push((i, token));
            keep_logits |= !job.greedy() || job.has_bans();
        }
        session.decode_batch(&items, keep_logits, mm)?;
        let mut chosen = Vec::with_capacity(decoding.len());
        for (k, &i) in decoding.iter().enumerate() {
            let slot = &mut self.slots[i];
            let job = slot.job.as_mut().expect("busy");
            chosen.push(job.fed_token(&mut slot.cached, &mut report).and_then(|_| {
                let pos = slot.cached.len() - 1;
                let argmax = match job.greedy() {
                    true => Some(session.batch_argmax(k, i)?),
                    false => None,
                };
                if let Some(t) = argmax.filter(|&t| !job.bans(t)) {
                    Ok(t)
                } else {
                    let logits = session.batch_logits(k)?;
                    job.sample(logits, pos)
                }
            }));
        }
        for (i, chosen) in decoding.into_iter().zip(chosen) {
            self.fwd.select_slot(i)?;
            let job = self.slots[i].job.as_mut().expect("busy");
            let outcome = chosen.map(|next| {
                let lp = job.take_logprob();
                job.keep(&mut *self.fwd, &self.tok, next, &mut |e| {
                    forward_event(i, e, lp.as_ref(), on_event)
                })
            });
            self.settle(i, outcome, &mut report, on_event)?;
        }
        Ok(report)
    }

    /// After slot `i`'s unit of work: keep its job running, or finish it (a `Done`
    /// event). A device failure is returned, and in strict mode any error (the slot is
    /// cleared first); otherwise an error finishes the slot.
    fn settle(
        &mut self,
        i: usize,
        outcome: Result<ControlFlow<StopReason>, GenerateError>,
        report: &mut StepReport,
        on_event: &mut dyn FnMut(SlotEvent<'_>) -> ControlFlow<()>,
    ) -> Result<(), GenerateError> {
        let (stop, error) = match outcome {
            Ok(ControlFlow::Continue(())) => return Ok(()),
            Ok(ControlFlow::Break(stop)) => (stop, None),
            Err(GenerateError::Engine(e)) if is_device_failure(&e) => {
                return Err(GenerateError::Engine(e))
            }
            Err(e) => {
                // what the cache holds after a failed step is unknown: start over
                self.fwd.select_slot(i)?;
                self.fwd.reset();
                self.slots[i].cached.clear();
                if self.strict {
                    self.slots[i].job = None;
                    return Err(e);
                }
                (StopReason::Cancelled, Some(e.to_string()))
            }
        };
        let job = self.slots[i].job.take().expect("busy");
        let completion = job.finish(stop, error, &mut |e| forward_event(i, e, None, on_event));
        self.counters.prefilled_tokens += completion.usage.prefilled_tokens as u64;
        self.counters.generated_tokens += completion.usage.generated_tokens as u64;
        report.finished += 1;
        // the request is over: a break here has nothing left to stop
        let _ = on_event(SlotEvent::Done {
            slot: i,
            completion: &completion,
        });
        Ok(())
    }

    /// Steps until slot `slot`'s request (submitted) finishes, and returns its
    /// completion: a one-shot run and a chat turn. Before each step, `before_step` may
    /// ask the request to stop (`Ok(true)`: it ends cancelled at that step) or fail it
    /// (`Err`: the request is dropped unfinished and the slot cleared). `on_event` sees
    /// every busy slot's events; a break stops the slot whose event it was.
    pub fn finish(
        &mut self,
        slot: usize,
        before_step: &mut dyn FnMut() -> Result<bool, GenerateError>,
        on_event: &mut dyn FnMut(SlotEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Completion, GenerateError> {
        let mut done = None;
        while self.is_busy(slot) {
            match before_step() {
                Ok(true) => self.cancel(slot),
                Ok(false) => {}
                Err(e) => {
                    self.slots[slot].job = None;
                    self.clear(slot)?;
                    return Err(e);
                }
            }
            self.step_until(&mut |e| {
                if let SlotEvent::Done {
                    slot: s,
                    completion,
                } = e
                {
                    if s == slot {
                        done = Some(completion.clone());
                    }
                }
                on_event(e)
            })?;
        }
        done.ok_or_else(|| GenerateError::Input(format!("slot {slot} has no request")))
    }
}

/// A job's event of slot `slot`, passed on as a [`SlotEvent`] (a token with `logprob`,
/// the chosen token's when asked for).
fn forward_event(
    slot: usize,
    e: Event<'_>,
    logprob: Option<&TokenLogprob>,
    on_event: &mut dyn FnMut(SlotEvent<'_>) -> ControlFlow<()>,
) -> ControlFlow<()> {
    match e {
        Event::Token(id) => on_event(SlotEvent::Token { slot, id, logprob }),
        Event::Text(text) => on_event(SlotEvent::Text { slot, text }),
        Event::Check { step, diff } => on_event(SlotEvent::Check { slot, step, diff }),
    }
}

/// An engine error that leaves the device unusable (as opposed to one request's bad
/// input or broken logits).
fn is_device_failure(e: &crate::EngineError) -> bool {
    !matches!(
        e,
        crate::EngineError::Input(_)
            | crate::EngineError::NonFiniteLogits { .. }
            | crate::EngineError::ContextFull { .. }
    )
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_counts_equal_leading_ids() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[7], &[8]), 0);
    }
}

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

mod admit;
mod job;
mod one_shot;
mod step;
mod types;

use std::sync::Arc;
use std::time::Instant;

use tokenizer::{ChatTemplate, Message, Tokenizer};
use tracing::info_span;

use crate::generate::{chat_prompt_ids, load, Forward, GenerateError, LoadOptions, Loaded};
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
    pub(crate) fn from_forward(
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
    pub(crate) fn is_busy(&self, slot: usize) -> bool {
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

    /// Asks slot `slot`'s request to stop; it finishes ([`crate::StopReason::Cancelled`]) at the
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
}

//! The conversation API's values: options, sizes, requests, events, completions and
//! counters (see the parent module for how they are used).

use crate::generate::fit::CtxRequest;
use crate::generate::StopReason;
use crate::sampling::{SamplerOptions, TokenLogprob};
use crate::session::SessionOptions;

/// How [`super::Slots::load`] builds the slots.
#[derive(Clone, Debug)]
pub struct SlotsOptions {
    /// Conversations that can run at once (each with its own KV cache).
    pub slots: usize,
    /// The context of EACH slot (prompt + generated tokens). The KV cache budget is
    /// shared: `-c 0` gives each slot what fits of `budget / slots`.
    pub ctx: CtxRequest,
    /// Vulkan device index (`None`: the default device).
    pub device: Option<usize>,
    /// Weights residency and kernel options; `ctx_len` and `slots` are replaced.
    pub session: SessionOptions,
    /// Decode every decoding slot in ONE submit (the default; batch-invariant: a slot's
    /// tokens are the same whatever runs beside it). Off: one submit per slot through the
    /// one-token decode pipelines, exactly as the one-shot generator decodes (`vkdecode
    /// chat` uses this, so its answers equal `vkdecode -p`'s).
    pub batched: bool,
    /// The matmul kernel of the batched step (see [`BatchKernel`]).
    pub batch_kernel: BatchKernel,
}

/// Which matmul kernel the batched decode step runs for the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchKernel {
    /// The matrix-matrix (prefill) kernel over the slots' tokens: each weight chunk read
    /// once per 4 tokens.
    MatrixMatrix,
    /// The one-token (decode) kernel for every token of the batch, a workgroup row per
    /// token: the same reductions as a lone decode, so a slot's tokens equal the one-shot
    /// generator's; the weights are read once per token (one submit and one set of
    /// dispatches for all slots still).
    PerToken,
}

impl Default for SlotsOptions {
    fn default() -> Self {
        SlotsOptions {
            slots: 1,
            ctx: CtxRequest::Default(2048),
            device: None,
            session: SessionOptions::default(),
            batched: true,
            batch_kernel: BatchKernel::MatrixMatrix,
        }
    }
}

/// What was loaded, sized up front.
#[derive(Clone, Debug, Default)]
pub struct SlotsInfo {
    /// Slots.
    pub slots: usize,
    /// Positions each slot's KV cache holds.
    pub ctx_per_slot: usize,
    /// Bytes of one slot's KV cache (`2 · n_layers · ctx · kv_dim · 2`: f16).
    pub kv_bytes_per_slot: u64,
    /// Bytes of every slot's KV cache together.
    pub kv_bytes: u64,
    /// Device name.
    pub device: String,
    /// Where the weights live (`import`, `copy`).
    pub weights_path: String,
    /// The kernel profile run (`cpu`, `gpu`) and why (`kernels::Shapes::for_profile`).
    pub kernels: String,
    pub kernels_why: String,
    /// Bytes of device memory: the weights the device holds plus the KV caches.
    pub device_bytes: u64,
    /// A line for the user when the context was chosen or capped for them.
    pub ctx_note: Option<String>,
    /// The whole start: device, weights, pipelines, buffers.
    pub load_ms: f64,
}

/// One generation request for a slot.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// The whole prompt, as token ids (a chat's full history rendered by its template:
    /// the part a slot already holds is not prefilled again).
    pub prompt: Vec<u32>,
    /// Most tokens to generate; `None` (or more than fits) stops at a full context.
    pub max_tokens: Option<usize>,
    /// Temperature, top-k, top-p, min-p, repetition penalty, seed. Greedy
    /// (`SamplerOptions::greedy()`) takes the argmax on the GPU.
    pub sampler: SamplerOptions,
    /// Stop when the text contains one of these (the text before it is kept).
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Score the prompt: the log-probability of each prompt token after the first, with
    /// this many alternatives ([`SlotEvent::PromptLogprob`]). The prompt is then fed one
    /// token at a time, and none of it is reused from the slot's cache.
    pub prompt_logprobs: Option<usize>,
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
    /// The error that ended it, if one did (the slot's cache is dropped then).
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
    /// A token was kept (its text follows in `Text` events, possibly later), with its
    /// log-probability when the request's sampler asked for them.
    Token {
        slot: usize,
        id: u32,
        logprob: Option<&'a TokenLogprob>,
    },
    /// Text ready to show.
    Text { slot: usize, text: &'a str },
    /// A prompt token's log-probability given the tokens before it (requests with
    /// [`Request::prompt_logprobs`]), in prompt order, before any generated token.
    PromptLogprob {
        slot: usize,
        logprob: &'a TokenLogprob,
    },
    /// `--check`: the largest |gpu - reference| logit difference at generated token
    /// `step` (only a backend that compares, `cpu-backend`'s `Checked`, reports it).
    Check { slot: usize, step: usize, diff: f32 },
    /// The request finished; the slot is idle again (its cache kept).
    Done {
        slot: usize,
        completion: &'a Completion,
    },
}

/// What [`super::Slots::submit`] found in the slot's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Prompt tokens already in the slot (kept).
    pub reused: usize,
    /// Prompt tokens to prefill, unless another slot's copy covers some of them.
    pub to_prefill: usize,
    /// The slot whose cache will give this one more of the prompt than it holds (its
    /// rows are copied on the device once that slot has them), if any.
    pub shared_from: Option<usize>,
}

/// Totals over every request since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCounters {
    /// Requests submitted.
    pub requests: u64,
    /// Prompt tokens submitted.
    pub prompt_tokens: u64,
    /// Prompt tokens prefilled.
    pub prefilled_tokens: u64,
    /// Prompt tokens reused from a slot's cache (its own or, copied, another's).
    pub reused_tokens: u64,
    /// Of those, the tokens copied from another slot's cache.
    pub shared_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Steps run.
    pub steps: u64,
}

/// What one [`super::Slots::step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Prompt tokens prefilled in this step (all slots).
    pub prefilled: usize,
    /// Tokens decoded in this step (one per decoding slot).
    pub decoded: usize,
    /// Requests that finished in this step.
    pub finished: usize,
}

//! One slot's request while it runs: the prompt suffix still to prefill, the sampler, the
//! token chosen but not yet fed, and the output with its stop strings. Every generation
//! (a server's request, a chat turn, the one-shot [`crate::Generator`]) takes its
//! decisions here, one unit of work (a prompt chunk or a token) per
//! [`super::Slots::step`]; the step runs the forward pass (alone or batched) and hands
//! each chosen token to [`Job::keep`].

use std::ops::ControlFlow;
use std::time::Instant;

use tokenizer::Tokenizer;

use super::{Completion, Request, StepReport, Usage};
use crate::generate::{
    check_finite, ms, sampler_options, Event, Forward, GenerateError, Output, Push, StopReason,
};
use crate::sampling::{logprob_of, Sampler, TokenLogprob};

pub(super) struct Job {
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    ignore_eos: bool,
    /// Prompt tokens in the slot's cache (the reused prefix, then each chunk fed).
    fed: usize,
    reused: usize,
    sampler: Sampler,
    /// The sampler is greedy and the backend's argmax may stand for the logits (not so
    /// under `--check`, which compares every step's logits).
    greedy: bool,
    out: Output,
    /// The token chosen last, to be fed at the next step.
    next: Option<u32>,
    /// Set by [`super::Slots::cancel`]; seen at the next step.
    pub cancel: bool,
    submitted: Instant,
    first_token: Option<Instant>,
    /// Alternatives per scored prompt token, when the prompt is scored.
    prompt_logprobs: Option<usize>,
    /// Prompt tokens scored but not yet reported.
    scored: Vec<TokenLogprob>,
    /// Waiting for another slot to hold more of this prompt than this slot does:
    /// (that slot, the prompt tokens to copy from it once it holds them).
    pub share: Option<(usize, usize)>,
}

impl Job {
    pub fn new(req: Request, reused: usize, tok: &Tokenizer, wants_logits: bool) -> Job {
        let mut sampler = Sampler::new(sampler_options(&req.sampler, req.ignore_eos, tok));
        for &id in &req.prompt {
            sampler.accept(id);
        }
        Job {
            greedy: sampler.is_greedy() && !wants_logits,
            out: Output::new(&req.stop),
            prompt: req.prompt,
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
            fed: reused,
            reused,
            sampler,
            next: None,
            cancel: false,
            submitted: Instant::now(),
            first_token: None,
            prompt_logprobs: req.prompt_logprobs,
            scored: Vec::new(),
            share: None,
        }
    }

    /// The prompt this job answers.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Whether prompt tokens are still to be fed (nothing generated yet).
    pub fn prefilling(&self) -> bool {
        self.fed < self.prompt.len()
    }

    /// The slot's cache now holds the first `n` prompt tokens, copied from another slot
    /// (counted as reused, not prefilled).
    pub fn shared(&mut self, n: usize) {
        self.fed = n;
        self.reused = n;
        self.share = None;
    }

    /// The prompt tokens scored since the last call (see [`Request::prompt_logprobs`]).
    pub fn take_scored(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.scored)
    }

    /// Whether the prompt is in and a chosen token waits to be fed (a decode step).
    pub fn decoding(&self) -> bool {
        self.fed == self.prompt.len() && self.next.is_some()
    }

    pub fn greedy(&self) -> bool {
        self.greedy
    }

    /// Whether `token` is banned: a greedy argmax that picks it is replaced by a draw
    /// from the logits.
    pub fn bans(&self, token: u32) -> bool {
        self.sampler.bans(token)
    }

    pub fn has_bans(&self) -> bool {
        self.sampler.has_bans()
    }

    /// The token the next decode step feeds.
    pub fn to_feed(&self) -> Option<u32> {
        self.next
    }

    /// Prefills the next prompt chunk on `fwd` (whose current slot is this job's);
    /// after the last chunk, the first token chosen.
    pub fn prefill_chunk(
        &mut self,
        fwd: &mut dyn Forward,
        cached: &mut Vec<u32>,
        report: &mut StepReport,
    ) -> Result<Option<u32>, GenerateError> {
        // a scored prompt goes a token at a time: each token's logits score the next
        let step = match self.prompt_logprobs {
            Some(_) => 1,
            None => fwd.chunk_len().max(1),
        };
        let end = (self.fed + step).min(self.prompt.len());
        let chunk = &self.prompt[self.fed..end];
        fwd.prefill(chunk)?;
        cached.extend_from_slice(chunk);
        report.prefilled += chunk.len();
        self.fed = end;
        if let (Some(n), Some(&next)) = (self.prompt_logprobs, self.prompt.get(end)) {
            let pos = fwd.pos();
            let logits = fwd.last_logits()?;
            check_finite(logits, pos)?;
            self.scored.push(logprob_of(logits, next, n));
        }
        if end < self.prompt.len() {
            return Ok(None);
        }
        let argmax = match self.greedy() {
            true => Some(fwd.last_argmax()?),
            false => None,
        };
        let next = match argmax.filter(|&t| !self.bans(t)) {
            Some(t) => t,
            None => {
                let pos = fwd.pos();
                let logits = fwd.last_logits()?;
                self.sample(logits, pos)?
            }
        };
        Ok(Some(next))
    }

    /// Feeds the chosen token on `fwd` alone (one submit for this slot) and chooses
    /// the next.
    pub fn decode_one(
        &mut self,
        fwd: &mut dyn Forward,
        cached: &mut Vec<u32>,
        report: &mut StepReport,
    ) -> Result<u32, GenerateError> {
        let t = self.fed_token(cached, report)?;
        let pos = fwd.pos();
        if self.greedy() {
            let next = fwd.decode_argmax(t)?;
            if !self.bans(next) {
                return Ok(next);
            }
            // a banned token won the argmax: the first maximum of the rest
            let logits = fwd.last_logits()?;
            return self.sample(logits, pos);
        }
        let logits = fwd.decode_logits(t)?;
        self.sample(logits, pos)
    }

    /// Records that the chosen token was fed (by a batched step or [`Job::decode_one`]).
    pub fn fed_token(
        &mut self,
        cached: &mut Vec<u32>,
        report: &mut StepReport,
    ) -> Result<u32, GenerateError> {
        let t = self.next.take().ok_or_else(|| {
            GenerateError::Input("internal: a decoding slot has no token to feed".into())
        })?;
        cached.push(t);
        report.decoded += 1;
        Ok(t)
    }

    /// Draws the next token from `logits` (of the token at `pos`).
    pub fn sample(&mut self, logits: &[f32], pos: usize) -> Result<u32, GenerateError> {
        check_finite(logits, pos)?;
        Ok(self.sampler.sample(logits)?)
    }

    /// The log-probability of the token [`Job::sample`] chose last, when asked for.
    pub fn take_logprob(&mut self) -> Option<TokenLogprob> {
        self.sampler.take_logprob()
    }

    /// The stop conditions for a chosen token, in order; a token that does not stop the
    /// request is fed at the next step. `emit` breaking stops it ([`StopReason::Cancelled`]).
    pub fn keep(
        &mut self,
        fwd: &mut dyn Forward,
        tok: &Tokenizer,
        next: u32,
        emit: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> ControlFlow<StopReason> {
        self.first_token.get_or_insert_with(Instant::now);
        if let Some(diff) = fwd.take_check_diff() {
            let step = self.out.ids.len();
            if emit(Event::Check { step, diff }).is_break() {
                return ControlFlow::Break(StopReason::Cancelled);
            }
        }
        if tok.is_eog(next) && !self.ignore_eos {
            return ControlFlow::Break(StopReason::Eog);
        }
        self.sampler.accept(next);
        if emit(Event::Token(next)).is_break() {
            return ControlFlow::Break(StopReason::Cancelled);
        }
        if let Push::Stop(reason) = self.out.push(tok, next, emit) {
            return ControlFlow::Break(reason);
        }
        if self.max_tokens.is_some_and(|m| self.out.ids.len() >= m) {
            return ControlFlow::Break(StopReason::MaxTokens);
        }
        if self.cancel {
            return ControlFlow::Break(StopReason::Cancelled);
        }
        if fwd.pos() + 1 >= fwd.ctx_len() {
            return ControlFlow::Break(StopReason::ContextFull);
        }
        self.next = Some(next);
        ControlFlow::Continue(())
    }

    /// Ends the request: shows what text is left (unless a stop string cut it) and
    /// returns the completion.
    pub fn finish(
        mut self,
        stop: StopReason,
        error: Option<String>,
        emit: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Completion {
        if stop != StopReason::StopString {
            self.out.flush(emit);
        }
        let end = Instant::now();
        let first = self.first_token.unwrap_or(end);
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            reused_tokens: self.reused,
            prefilled_tokens: self.fed - self.reused,
            generated_tokens: self.out.ids.len(),
            ttft_ms: (first - self.submitted).as_secs_f64() * 1e3,
            decode_ms: ms(first),
        };
        Completion {
            stop,
            error,
            ids: std::mem::take(&mut self.out.ids),
            text: std::mem::take(&mut self.out.text),
            usage,
        }
    }
}

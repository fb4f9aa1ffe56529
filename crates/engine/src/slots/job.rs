//! One slot's request while it runs: the prompt suffix still to prefill, the sampler, the
//! token chosen but not yet fed, and the output with its stop strings. The same decisions
//! as [`crate::Generator::generate`], taken one unit of work (a prompt chunk or a token)
//! per [`super::Slots::step`].

use std::ops::ControlFlow;
use std::time::Instant;

use tokenizer::Tokenizer;

use super::{Completion, Request, StepReport, Usage};
use crate::generate::{check_finite, ms, Event, GenerateError, Output, Push, StopReason};
use crate::sampling::Sampler;
use crate::session::{Session, PREFILL_CHUNK};

pub(super) struct Job {
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    ignore_eos: bool,
    /// Prompt tokens in the slot's cache (the reused prefix, then each chunk fed).
    fed: usize,
    reused: usize,
    sampler: Sampler,
    out: Output,
    /// The token chosen last, to be fed at the next step.
    next: Option<u32>,
    /// Set by [`super::Slots::cancel`]; seen at the next step.
    pub cancel: bool,
    submitted: Instant,
    first_token: Option<Instant>,
}

impl Job {
    pub fn new(req: Request, reused: usize) -> Job {
        let mut sampler = Sampler::new(req.sampler);
        for &id in &req.prompt {
            sampler.accept(id);
        }
        Job {
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
        }
    }

    /// One unit of work on `session` (whose current slot is this job's): the next prompt
    /// chunk, or feeding the last chosen token; then the next token is chosen and checked
    /// against the stop conditions. `cached` is the slot's token list, kept in step with
    /// its cache. `Break` carries why the request is over.
    pub fn advance(
        &mut self,
        session: &mut Session,
        tok: &Tokenizer,
        cached: &mut Vec<u32>,
        report: &mut StepReport,
        emit: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<StopReason>, GenerateError> {
        if self.cancel {
            return Ok(ControlFlow::Break(StopReason::Cancelled));
        }
        let greedy = self.sampler.is_greedy();
        let next = if self.fed < self.prompt.len() {
            let end = (self.fed + PREFILL_CHUNK).min(self.prompt.len());
            let chunk = &self.prompt[self.fed..end];
            session.prefill(chunk)?;
            cached.extend_from_slice(chunk);
            report.prefilled += chunk.len();
            self.fed = end;
            if end < self.prompt.len() {
                return Ok(ControlFlow::Continue(()));
            }
            if greedy {
                session.last_argmax()?
            } else {
                let pos = session.pos();
                let logits = session.last_logits()?;
                check_finite(logits, pos)?;
                self.sampler.sample(logits)?
            }
        } else {
            let Some(t) = self.next.take() else {
                return Err(GenerateError::Input(
                    "internal: a decoding slot has no token to feed".into(),
                ));
            };
            let next = if greedy {
                session.decode_argmax(t)?
            } else {
                let pos = session.pos();
                let logits = session.decode_logits(t)?;
                check_finite(logits, pos)?;
                self.sampler.sample(logits)?
            };
            cached.push(t);
            report.decoded += 1;
            next
        };
        self.first_token.get_or_insert_with(Instant::now);
        Ok(self.keep(session, tok, next, emit))
    }

    /// The stop conditions for a chosen token, in the generator's order; a token that
    /// does not stop the request is fed at the next step.
    fn keep(
        &mut self,
        session: &Session,
        tok: &Tokenizer,
        next: u32,
        emit: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> ControlFlow<StopReason> {
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
        if session.pos() + 1 >= session.ctx_len() {
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

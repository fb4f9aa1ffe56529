//! One step over every busy slot: the next prompt chunk of each slot still prefilling,
//! then one token for every decoding slot (batched into one submit where the backend
//! can), and the end of each request that finished.

use std::ops::ControlFlow;

use tracing::info_span;

use super::{BatchKernel, Completion, SlotEvent, Slots, StepReport};
use crate::generate::{Event, GenerateError, StopReason};
use crate::sampling::TokenLogprob;

impl Slots {
    /// Gives every busy slot one unit of work and reports what happened through
    /// `on_event`: slots still prefilling get their next prompt chunk (one submit each);
    /// then every decoding slot is fed its chosen token: batched (the default, where the
    /// backend can), all of them in ONE submit ([`crate::Session::decode_batch`]), else one
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

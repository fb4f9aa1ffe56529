//! The engine thread: N slots, a bounded queue, chunked prefill between decode steps.
//!
//! The engine (Vulkan sessions, not async) lives on one dedicated thread; the HTTP side
//! talks to it through a bounded channel of [`Job`]s (the queue: a full channel is a
//! `503` with `Retry-After`) and gets [`JobEvent`]s back on a channel per job.
//!
//! Each turn of the loop: admit queued jobs into free slots (the free slot whose cache
//! the prompt extends most); drop the jobs whose client went away (their slot is free at
//! once); feed ONE prefill chunk of ONE slot still prefilling (oldest first), so a long
//! prompt delays the others by one chunk per step, not by its whole length; then one
//! decode step over every slot that has a token to feed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{GenerateError, Sampler};
use tokenizer::Tokenizer;
use tracing::{debug, warn};

use crate::backend::{DecodeItem, SlotEngine};
use crate::job::{Finish, Job, JobEvent, Usage};
use crate::metrics::Metrics;
use crate::text::TextOut;

/// How long an idle engine thread sleeps before looking at the shutdown flag again.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// The HTTP side's handle on the engine thread.
#[derive(Clone)]
pub struct Scheduler {
    queue: SyncSender<Job>,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue is full: try again later.
    Busy,
    /// The engine thread has stopped (shutdown, or it failed).
    Stopped,
}

impl Scheduler {
    /// Starts the engine thread. `build` runs ON that thread (engine sessions never
    /// cross threads) and its result is returned here once it is done: the scheduler
    /// and what `build` reported, or its error.
    pub fn spawn<E, I, B>(
        build: B,
        queue_len: usize,
        tok: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
    ) -> Result<(Scheduler, I, std::thread::JoinHandle<()>), GenerateError>
    where
        E: SlotEngine,
        I: Send + 'static,
        B: FnOnce() -> Result<(E, I), GenerateError> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(queue_len.max(1));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let cancel_all = Arc::new(AtomicBool::new(false));
        let thread = {
            let metrics = metrics.clone();
            let cancel_all = cancel_all.clone();
            std::thread::Builder::new()
                .name("vkdecode-engine".into())
                .spawn(move || match build() {
                    Ok((engine, info)) => {
                        let _ = ready_tx.send(Ok(info));
                        Loop::new(engine, tok, metrics, cancel_all).run(rx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                })
                .map_err(|e| GenerateError::Input(format!("starting the engine thread: {e}")))?
        };
        let info = match ready_rx.recv() {
            Ok(r) => r?,
            Err(_) => {
                return Err(GenerateError::Input(
                    "the engine thread stopped while loading".into(),
                ))
            }
        };
        let sched = Scheduler {
            queue: tx,
            metrics,
            cancel_all,
        };
        Ok((sched, info, thread))
    }

    /// Queues `job`, or says why not (the queue is full, the engine has stopped).
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        // counted before the send so the engine thread's decrement never underflows
        Metrics::add(&self.metrics.queue_len, 1);
        match self.queue.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queue_len.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    TrySendError::Full(_) => SubmitError::Busy,
                    TrySendError::Disconnected(_) => SubmitError::Stopped,
                })
            }
        }
    }

    /// Ends every running and queued job with an error at the next step (the end of a
    /// graceful shutdown's grace period).
    pub fn cancel_all(&self) {
        self.cancel_all.store(true, Ordering::SeqCst);
    }

    /// The flag [`Scheduler::cancel_all`] sets, for a timer that must not keep the queue
    /// open (the engine thread ends once every `Scheduler` is dropped).
    pub fn canceller(&self) -> Arc<AtomicBool> {
        self.cancel_all.clone()
    }
}

/// Where a running job is.
enum Phase {
    /// `done` of the prompt's tokens are in the cache.
    Prefill { done: usize },
    /// The next token to feed.
    Decode { token: u32 },
}

/// A job in a slot.
struct Running {
    job: Job,
    phase: Phase,
    sampler: Sampler,
    text: TextOut,
    generated: usize,
    cached: usize,
    admitted: Instant,
    first_token_at: Option<Instant>,
}

struct Loop<E: SlotEngine> {
    engine: E,
    tok: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
    slots: Vec<Option<Running>>,
    /// Slots in admission order, for prefill fairness.
    order: VecDeque<usize>,
}

impl<E: SlotEngine> Loop<E> {
    fn new(
        engine: E,
        tok: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
        cancel_all: Arc<AtomicBool>,
    ) -> Loop<E> {
        let n = engine.n_slots();
        Metrics::set(&metrics.slots_total, n as u64);
        Loop {
            engine,
            tok,
            metrics,
            cancel_all,
            slots: (0..n).map(|_| None).collect(),
            order: VecDeque::new(),
        }
    }

    fn busy(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Runs until the queue's sender is gone and no job is left.
    fn run(mut self, rx: Receiver<Job>) {
        let mut open = true;
        loop {
            if self.cancel_all.load(Ordering::SeqCst) {
                self.fail_everything(&rx, "the server is shutting down");
            }
            open &= self.admit(&rx);
            if self.busy() == 0 {
                if !open {
                    return;
                }
                match rx.recv_timeout(IDLE_POLL) {
                    Ok(job) => self.take(job),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
                continue;
            }
            self.drop_disconnected();
            self.prefill_one();
            self.decode_step();
            self.metrics.set_busy(self.busy() as u64);
        }
    }

    /// Moves queued jobs into free slots; false once the queue's sender is gone.
    fn admit(&mut self, rx: &Receiver<Job>) -> bool {
        while self.slots.iter().any(|s| s.is_none()) {
            match rx.try_recv() {
                Ok(job) => self.take(job),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        true
    }

    /// Starts `job` (just taken off the queue) in the free slot that reuses most.
    fn take(&mut self, job: Job) {
        self.metrics.queue_len.fetch_sub(1, Ordering::Relaxed);
        if job.events.is_closed() {
            Metrics::add(&self.metrics.requests_cancelled, 1);
            return;
        }
        let Some(slot) = (0..self.slots.len())
            .filter(|&i| self.slots[i].is_none())
            .max_by_key(|&i| (self.engine.reusable(i, &job.prompt), std::cmp::Reverse(i)))
        else {
            // admit() only takes a job when a slot is free
            let _ = job.events.send(JobEvent::Error("no free slot".into()));
            return;
        };
        let cached = self.engine.start(slot, &job.prompt);
        let mut sampler = Sampler::new(job.sampler.clone());
        for &id in &job.prompt {
            sampler.accept(id);
        }
        debug!(slot, n_prompt = job.prompt.len(), cached, "admitted");
        Metrics::add(&self.metrics.reused_tokens, cached as u64);
        self.slots[slot] = Some(Running {
            text: TextOut::new(&job.stop),
            job,
            phase: Phase::Prefill { done: cached },
            sampler,
            generated: 0,
            cached,
            admitted: Instant::now(),
            first_token_at: None,
        });
        self.order.push_back(slot);
        self.metrics.set_busy(self.busy() as u64);
    }

    /// Frees the slots whose client went away.
    fn drop_disconnected(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot]
                .as_ref()
                .is_some_and(|r| r.job.events.is_closed())
            {
                debug!(slot, "client gone: slot freed");
                let r = self.release(slot);
                Metrics::add(&self.metrics.requests_cancelled, 1);
                Metrics::add(&self.metrics.prompt_tokens, r.job.prompt.len() as u64);
            }
        }
    }

    fn release(&mut self, slot: usize) -> Running {
        self.order.retain(|&s| s != slot);
        let r = self.slots[slot].take().expect("release of a busy slot");
        self.metrics.set_busy(self.busy() as u64);
        r
    }

    /// One chunk of the oldest job still prefilling; its first token when the prompt is
    /// all in.
    fn prefill_one(&mut self) {
        let Some(slot) = self.order.iter().copied().find(|&s| {
            matches!(
                self.slots[s].as_ref().map(|r| &r.phase),
                Some(Phase::Prefill { .. })
            )
        }) else {
            return;
        };
        let chunk_len = self.engine.chunk_len();
        let r = self.slots[slot].as_mut().expect("busy slot");
        let Phase::Prefill { done } = r.phase else {
            return;
        };
        let start = Instant::now();
        let end = (done + chunk_len).min(r.job.prompt.len());
        let result = if done < end {
            self.engine.prefill(slot, &r.job.prompt[done..end])
        } else {
            Ok(())
        };
        let result = result.and_then(|()| {
            if end == r.job.prompt.len() {
                self.engine.first_token(slot, &mut r.sampler).map(Some)
            } else {
                Ok(None)
            }
        });
        Metrics::add(&self.metrics.prefill_ns, start.elapsed().as_nanos() as u64);
        Metrics::add(&self.metrics.prefilled_tokens, (end - done) as u64);
        r.phase = Phase::Prefill { done: end };
        match result {
            Ok(None) => {}
            Ok(Some(first)) => {
                r.first_token_at = Some(Instant::now());
                self.accept(slot, first);
            }
            Err(e) => self.fail(slot, &e),
        }
    }

    /// One decode step over every slot with a token to feed.
    fn decode_step(&mut self) {
        let mut slots = Vec::new();
        let mut items: Vec<DecodeItem<'_>> = Vec::new();
        for (i, r) in self.slots.iter_mut().enumerate() {
            if let Some(Running {
                phase: Phase::Decode { token },
                sampler,
                ..
            }) = r
            {
                slots.push(i);
                items.push(DecodeItem {
                    slot: i,
                    token: *token,
                    sampler,
                });
            }
        }
        if items.is_empty() {
            return;
        }
        let start = Instant::now();
        let results = self.engine.decode(&mut items);
        drop(items);
        Metrics::add(&self.metrics.decode_ns, start.elapsed().as_nanos() as u64);
        Metrics::add(&self.metrics.decode_tokens, slots.len() as u64);
        for (slot, result) in slots.into_iter().zip(results) {
            match result {
                Ok(next) => self.accept(slot, next),
                Err(e) => self.fail(slot, &e),
            }
        }
    }

    /// Takes `next`, just chosen for `slot`: ends the job or queues it for the next step.
    fn accept(&mut self, slot: usize, next: u32) {
        let ctx_len = self.engine.ctx_len();
        let pos = self.engine.pos(slot);
        let tok = self.tok.clone();
        let r = self.slots[slot].as_mut().expect("busy slot");
        if tok.is_eog(next) && !r.job.ignore_eos {
            return self.finish(slot, Finish::Stop, false);
        }
        r.sampler.accept(next);
        r.generated += 1;
        Metrics::add(&self.metrics.generated_tokens, 1);
        let pushed = r.text.push(&tok, next);
        if !pushed.text.is_empty() {
            let _ = r.job.events.send(JobEvent::Text(pushed.text));
        }
        if pushed.stopped {
            return self.finish(slot, Finish::Stop, true);
        }
        // the cache holds `pos` tokens; feeding `next` takes one more position
        if r.generated >= r.job.max_tokens || pos + 1 >= ctx_len {
            return self.finish(slot, Finish::Length, false);
        }
        r.phase = Phase::Decode { token: next };
    }

    fn finish(&mut self, slot: usize, finish: Finish, stopped_by_string: bool) {
        let mut r = self.release(slot);
        if !stopped_by_string {
            let rest = r.text.finish();
            if !rest.is_empty() {
                let _ = r.job.events.send(JobEvent::Text(rest));
            }
        }
        let now = Instant::now();
        let first = r.first_token_at.unwrap_or(now);
        let usage = Usage {
            prompt_tokens: r.job.prompt.len(),
            cached_tokens: r.cached,
            completion_tokens: r.generated,
            prefill_ms: ms(first - r.admitted),
            decode_ms: ms(now - first),
            queued_ms: ms(r.admitted - r.job.queued_at),
        };
        Metrics::add(&self.metrics.requests_finished, 1);
        Metrics::add(&self.metrics.prompt_tokens, usage.prompt_tokens as u64);
        let _ = r.job.events.send(JobEvent::Done { finish, usage });
    }

    fn fail(&mut self, slot: usize, err: &GenerateError) {
        warn!(slot, "generation failed: {err}");
        let r = self.release(slot);
        Metrics::add(&self.metrics.prompt_tokens, r.job.prompt.len() as u64);
        let _ = r.job.events.send(JobEvent::Error(err.to_string()));
    }

    fn fail_everything(&mut self, rx: &Receiver<Job>, why: &str) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                let r = self.release(slot);
                let _ = r.job.events.send(JobEvent::Error(why.into()));
            }
        }
        while let Ok(job) = rx.try_recv() {
            self.metrics.queue_len.fetch_sub(1, Ordering::Relaxed);
            let _ = job.events.send(JobEvent::Error(why.into()));
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

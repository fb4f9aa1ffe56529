//! The engine thread: N slots, a bounded queue, chunked prefill between decode steps.
//!
//! The engine (Vulkan sessions, not async) lives on one dedicated thread; the HTTP side
//! talks to it through a bounded channel of [`Job`]s (the queue: a full channel is a
//! `503` with `Retry-After`) and gets [`JobEvent`]s back on a channel per job.
//!
//! Each turn of the loop: admit queued jobs into idle slots (the engine picks the idle
//! slot whose cache the prompt shares most); cancel the requests whose client went away
//! (their slot is free after the next step); then one engine step, which gives every
//! busy slot one unit of work (a prompt chunk while prefilling, else one token), so a
//! long prompt is prefilled in chunks between the other slots' tokens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::GenerateError;
use tracing::{debug, warn};

use crate::backend::{Request, SlotEngine, SlotEvent};
use crate::job::{Finish, Job, JobEvent};
use crate::metrics::Metrics;

/// How long an idle engine thread sleeps before looking at the shutdown flag again.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// A check run before every engine step (the CLI's: the mapped model file is unchanged);
/// its error stops the engine: every request ends with it, and new ones get 503.
pub type Guard = Box<dyn FnMut() -> Result<(), String> + Send>;

/// The HTTP side's handle on the engine thread.
#[derive(Clone)]
pub struct Scheduler {
    queue: SyncSender<Job>,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
    /// Set when the engine thread stopped on a failure.
    stopped: Arc<AtomicBool>,
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
        metrics: Arc<Metrics>,
        guard: Option<Guard>,
    ) -> Result<(Scheduler, I, std::thread::JoinHandle<()>), GenerateError>
    where
        E: SlotEngine,
        I: Send + 'static,
        B: FnOnce() -> Result<(E, I), GenerateError> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(queue_len.max(1));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let cancel_all = Arc::new(AtomicBool::new(false));
        let stopped = Arc::new(AtomicBool::new(false));
        let thread = {
            let metrics = metrics.clone();
            let cancel_all = cancel_all.clone();
            let stopped = stopped.clone();
            std::thread::Builder::new()
                .name("vkdecode-engine".into())
                .spawn(move || match build() {
                    Ok((engine, info)) => {
                        let _ = ready_tx.send(Ok(info));
                        Loop::new(engine, metrics, cancel_all, guard, stopped).run(rx);
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
            stopped,
        };
        Ok((sched, info, thread))
    }

    /// Queues `job`, or says why not (the queue is full, the engine has stopped).
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        // a stopped engine thread may not have dropped its queue yet: a job sent now
        // would be dropped unanswered
        if self.engine_stopped() {
            return Err(SubmitError::Stopped);
        }
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

    /// Whether the engine thread stopped on a failure (a lost device, the model file
    /// changed): `/health` says so.
    pub fn engine_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The flag [`Scheduler::cancel_all`] sets, for a timer that must not keep the queue
    /// open (the engine thread ends once every `Scheduler` is dropped).
    pub fn canceller(&self) -> Arc<AtomicBool> {
        self.cancel_all.clone()
    }
}

/// A request in a slot, as the HTTP side sees it.
struct Running {
    job: Job,
    admitted: Instant,
    /// Cancelled by the scheduler: the message its client gets (none: the client is gone).
    cancelled_because: Option<&'static str>,
}

struct Loop<E: SlotEngine> {
    engine: E,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
    guard: Option<Guard>,
    stopped: Arc<AtomicBool>,
    slots: Vec<Option<Running>>,
}

impl<E: SlotEngine> Loop<E> {
    fn new(
        engine: E,
        metrics: Arc<Metrics>,
        cancel_all: Arc<AtomicBool>,
        guard: Option<Guard>,
        stopped: Arc<AtomicBool>,
    ) -> Loop<E> {
        let n = engine.n_slots();
        Metrics::set(&metrics.slots_total, n as u64);
        metrics.set_busy((0..n).map(|_| false));
        Loop {
            engine,
            metrics,
            cancel_all,
            guard,
            stopped,
            slots: (0..n).map(|_| None).collect(),
        }
    }

    /// Runs until the queue's sender is gone and no job is left.
    fn run(mut self, rx: Receiver<Job>) {
        let mut open = true;
        loop {
            if self.cancel_all.load(Ordering::SeqCst) {
                self.cancel_everything(&rx, "the server is shutting down");
            }
            open &= self.admit(&rx);
            if self.engine.busy() == 0 {
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
            self.cancel_disconnected();
            let checked = match &mut self.guard {
                Some(g) => g(),
                None => Ok(()),
            };
            if let Err(e) = checked
                .map_err(|e| e.to_string())
                .and_then(|()| self.step().map_err(|e| e.to_string()))
            {
                // the engine as a whole failed (a lost device, the model file changed):
                // every request ends, and the thread stops (new requests get 503).
                // Marked stopped before any request hears of it, so a client that reads
                // its error and then asks /health is already told 503.
                warn!("the engine stopped: {e}");
                self.stopped.store(true, Ordering::SeqCst);
                let msg = format!("the engine stopped: {e}");
                for r in self.slots.iter_mut().filter_map(Option::take) {
                    let _ = r.job.events.send(JobEvent::Error(msg.clone()));
                }
                self.fail_queue(&rx, &msg);
                return;
            }
            self.metrics
                .set_busy(self.slots.iter().map(Option::is_some));
        }
    }

    /// Moves queued jobs into idle slots; false once the queue's sender is gone.
    fn admit(&mut self, rx: &Receiver<Job>) -> bool {
        while self.engine.busy() < self.engine.n_slots() {
            match rx.try_recv() {
                Ok(job) => self.take(job),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        true
    }

    /// Submits `job` (just taken off the queue) to the idle slot the engine picks.
    fn take(&mut self, mut job: Job) {
        self.metrics.queue_len.fetch_sub(1, Ordering::Relaxed);
        if job.events.is_closed() {
            Metrics::add(&self.metrics.requests_cancelled, 1);
            return;
        }
        let Some(slot) = self.engine.pick_slot(&job.prompt) else {
            // admit() only takes a job when a slot is idle
            let _ = job.events.send(JobEvent::Error("no idle slot".into()));
            return;
        };
        let req = Request {
            prompt: std::mem::take(&mut job.prompt),
            max_tokens: Some(job.max_tokens),
            sampler: job.sampler.clone(),
            stop: std::mem::take(&mut job.stop),
            ignore_eos: job.ignore_eos,
            prompt_logprobs: job.prompt_logprobs,
        };
        match self.engine.submit(slot, req) {
            Ok(adm) => {
                debug!(
                    slot,
                    reused = adm.reused,
                    to_prefill = adm.to_prefill,
                    "admitted"
                );
                self.slots[slot] = Some(Running {
                    job,
                    admitted: Instant::now(),
                    cancelled_because: None,
                });
                self.metrics
                    .set_busy(self.slots.iter().map(Option::is_some));
            }
            Err(e) => {
                let _ = job.events.send(JobEvent::Error(e.to_string()));
            }
        }
    }

    /// Cancels the requests whose client went away (their slots are idle after the next
    /// step).
    fn cancel_disconnected(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot]
                .as_ref()
                .is_some_and(|r| r.job.events.is_closed())
            {
                debug!(slot, "client gone: cancelling");
                self.engine.cancel(slot);
            }
        }
    }

    /// One engine step; its events go to their requests' channels.
    fn step(&mut self) -> Result<(), GenerateError> {
        let start = Instant::now();
        let slots = &mut self.slots;
        let metrics = &self.metrics;
        let report = self.engine.step(&mut |e| match e {
            SlotEvent::Token { slot, logprob, .. } => {
                Metrics::add(&metrics.generated_tokens, 1);
                if let (Some(lp), Some(r)) = (logprob, &slots[slot]) {
                    let _ = r.job.events.send(JobEvent::Logprob(lp.clone()));
                }
            }
            SlotEvent::PromptLogprob { slot, logprob } => {
                if let Some(r) = &slots[slot] {
                    let _ = r.job.events.send(JobEvent::PromptLogprob(logprob.clone()));
                }
            }
            SlotEvent::Text { slot, text } => {
                if let Some(r) = &slots[slot] {
                    let _ = r.job.events.send(JobEvent::Text(text.to_string()));
                }
            }
            SlotEvent::Check { .. } => {}
            SlotEvent::Done { slot, completion } => {
                let Some(r) = slots[slot].take() else {
                    return;
                };
                // the gauge drops before the answer goes out (a client that reads
                // /metrics right after its answer sees its slot free)
                metrics.set_busy(slots.iter().map(Option::is_some));
                let u = &completion.usage;
                Metrics::add(&metrics.prompt_tokens, u.prompt_tokens as u64);
                Metrics::add(&metrics.reused_tokens, u.reused_tokens as u64);
                let event = match (completion.finish_reason(), &completion.error) {
                    (_, Some(err)) => {
                        warn!(slot, "generation failed: {err}");
                        JobEvent::Error(err.clone())
                    }
                    ("cancelled", None) => {
                        Metrics::add(&metrics.requests_cancelled, 1);
                        match r.cancelled_because {
                            Some(why) => JobEvent::Error(why.into()),
                            None => return,
                        }
                    }
                    (reason, None) => {
                        Metrics::add(&metrics.requests_finished, 1);
                        JobEvent::Done {
                            finish: match (reason, completion.stop) {
                                ("length", _) => Finish::Length,
                                (_, engine::StopReason::StopString) => Finish::Word,
                                _ => Finish::Stop,
                            },
                            usage: *u,
                            queued_ms: ms(r.admitted - r.job.queued_at),
                        }
                    }
                };
                let _ = r.job.events.send(event);
            }
        })?;
        let ns = start.elapsed().as_nanos() as u64;
        Metrics::add(&self.metrics.prefilled_tokens, report.prefilled as u64);
        Metrics::add(&self.metrics.decode_tokens, report.decoded as u64);
        // a step that did only one kind of work times that kind; mixed steps are
        // counted apart, so both rates are measured, not apportioned
        match (report.prefilled > 0, report.decoded > 0) {
            (true, false) => {
                Metrics::add(&self.metrics.prefill_ns, ns);
                Metrics::add(&self.metrics.prefill_only_tokens, report.prefilled as u64);
            }
            (false, true) => {
                Metrics::add(&self.metrics.decode_ns, ns);
                Metrics::add(&self.metrics.decode_only_tokens, report.decoded as u64);
            }
            (true, true) => Metrics::add(&self.metrics.mixed_ns, ns),
            (false, false) => {}
        }
        Ok(())
    }

    fn cancel_everything(&mut self, rx: &Receiver<Job>, why: &'static str) {
        for slot in 0..self.slots.len() {
            if let Some(r) = &mut self.slots[slot] {
                if r.cancelled_because.is_none() {
                    r.cancelled_because = Some(why);
                    self.engine.cancel(slot);
                }
            }
        }
        self.fail_queue(rx, why);
    }

    fn fail_queue(&mut self, rx: &Receiver<Job>, why: &str) {
        while let Ok(job) = rx.try_recv() {
            self.metrics.queue_len.fetch_sub(1, Ordering::Relaxed);
            let _ = job.events.send(JobEvent::Error(why.into()));
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Admission, StepReport};
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    /// One slot that takes any prompt and never finishes: steps only spin the loop.
    struct NeverDone {
        busy: bool,
    }

    impl SlotEngine for NeverDone {
        fn n_slots(&self) -> usize {
            1
        }
        fn ctx_per_slot(&self) -> usize {
            64
        }
        fn busy(&self) -> usize {
            usize::from(self.busy)
        }
        fn pick_slot(&self, _: &[u32]) -> Option<usize> {
            (!self.busy).then_some(0)
        }
        fn submit(&mut self, _: usize, req: Request) -> Result<Admission, GenerateError> {
            self.busy = true;
            Ok(Admission {
                reused: 0,
                to_prefill: req.prompt.len(),
                shared_from: None,
            })
        }
        fn cancel(&mut self, _: usize) {
            self.busy = false;
        }
        fn step(&mut self, _: &mut dyn FnMut(SlotEvent<'_>)) -> Result<StepReport, GenerateError> {
            std::thread::yield_now();
            Ok(StepReport::default())
        }
    }

    fn job() -> (Job, UnboundedReceiver<JobEvent>) {
        let (events, rx) = unbounded_channel();
        let job = Job {
            prompt: vec![1, 2, 3],
            max_tokens: 4,
            stop: Vec::new(),
            ignore_eos: false,
            sampler: Default::default(),
            prompt_logprobs: None,
            events,
            queued_at: Instant::now(),
        };
        (job, rx)
    }

    /// A client told that the engine stopped finds /health and new requests refused at
    /// once: the stop is marked before the first request hears of it (CI once saw a 200
    /// from /health right after the 503 that reported a rewritten model file).
    #[test]
    fn a_failed_guard_is_marked_stopped_before_any_request_hears_of_it() {
        const QUEUED: usize = 4000;
        let armed = Arc::new(AtomicBool::new(false));
        let guard: Guard = {
            let armed = armed.clone();
            Box::new(move || match armed.load(Ordering::SeqCst) {
                true => Err("the model file changed while mapped".into()),
                false => Ok(()),
            })
        };
        let (sched, (), thread) = Scheduler::spawn(
            || Ok((NeverDone { busy: false }, ())),
            QUEUED + 1,
            Arc::new(Metrics::default()),
            Some(guard),
        )
        .unwrap();
        let (running, mut running_rx) = job();
        sched.submit(running).unwrap();
        // the running job is admitted; the rest wait in the queue, and are told after it
        while sched.metrics.queue_len.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        let queued: Vec<_> = (0..QUEUED)
            .map(|_| {
                let (j, rx) = job();
                sched.submit(j).unwrap();
                rx
            })
            .collect();
        armed.store(true, Ordering::SeqCst);

        match running_rx.blocking_recv() {
            Some(JobEvent::Error(e)) => assert!(e.contains("changed while mapped"), "{e}"),
            other => panic!("the running job got {other:?}"),
        }
        assert!(
            sched.engine_stopped(),
            "told the client before marking the stop"
        );
        let (late, mut late_rx) = job();
        assert_eq!(sched.submit(late), Err(SubmitError::Stopped));
        assert!(late_rx.try_recv().is_err(), "a refused job gets no event");

        thread.join().unwrap();
        for mut rx in queued {
            match rx.try_recv() {
                Ok(JobEvent::Error(e)) => assert!(e.contains("engine stopped"), "{e}"),
                other => panic!("a queued job got {other:?}"),
            }
        }
    }
}

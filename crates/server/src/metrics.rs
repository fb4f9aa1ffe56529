//! The server's counters, shared by the HTTP side and the engine thread, and their
//! Prometheus text exposition (`GET /metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters and gauges; every field is updated with relaxed atomics (each is a figure on
/// its own, read for a scrape).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Generation requests accepted into the queue.
    pub requests: AtomicU64,
    /// Requests answered with an error status (4xx, 5xx), before or after queueing.
    pub requests_failed: AtomicU64,
    /// Requests refused because the queue was full.
    pub requests_rejected_busy: AtomicU64,
    /// Requests whose client went away before the end.
    pub requests_cancelled: AtomicU64,
    /// Requests that ran to a finish (stop or length).
    pub requests_finished: AtomicU64,
    /// Prompt tokens of finished or cancelled requests (reused ones included).
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens actually prefilled (reused cache positions not counted).
    pub prefilled_tokens: AtomicU64,
    /// Prompt tokens taken from a slot's cache instead of prefilled.
    pub reused_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Time of the engine steps that only prefilled, in nanoseconds.
    pub prefill_ns: AtomicU64,
    /// Prompt tokens of those steps.
    pub prefill_only_tokens: AtomicU64,
    /// Time of the engine steps that only decoded, in nanoseconds.
    pub decode_ns: AtomicU64,
    /// Tokens of those steps.
    pub decode_only_tokens: AtomicU64,
    /// Time of the steps that did both (a prompt chunk beside other slots' tokens).
    pub mixed_ns: AtomicU64,
    /// Tokens produced by decode steps (every active slot's token of a step).
    pub decode_tokens: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_len: AtomicU64,
    /// Slots running a request.
    pub slots_busy: AtomicU64,
    /// The most slots busy at once since the start.
    pub slots_busy_peak: AtomicU64,
    /// Slots in all.
    pub slots_total: AtomicU64,
    /// Generation requests that asked for log-probabilities.
    pub logprob_requests: AtomicU64,
    /// Generation requests held to a grammar (`response_format`, `json_schema`,
    /// `grammar`, a forced tool call).
    pub constrained_requests: AtomicU64,
    /// Which slots run a request (for `/slots`), set with the busy gauge.
    pub slot_busy: std::sync::Mutex<Vec<bool>>,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Ordering::Relaxed);
    }

    /// Sets which slots are busy, the busy-slot gauge and its peak.
    pub fn set_busy(&self, busy: impl Iterator<Item = bool>) {
        let busy: Vec<bool> = busy.collect();
        let n = busy.iter().filter(|&&b| b).count() as u64;
        if let Ok(mut s) = self.slot_busy.lock() {
            *s = busy;
        }
        Self::set(&self.slots_busy, n);
        self.slots_busy_peak.fetch_max(n, Ordering::Relaxed);
    }

    /// Whether each slot runs a request now.
    pub fn slot_busy(&self) -> Vec<bool> {
        self.slot_busy.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Ordering::Relaxed)
    }

    /// Prompt tokens per second over the steps that only prefilled, since the start.
    pub fn prefill_tok_s(&self) -> f64 {
        per_second(
            Self::get(&self.prefill_only_tokens),
            Self::get(&self.prefill_ns),
        )
    }

    /// Tokens per second over the steps that only decoded (all slots together), since
    /// the start.
    pub fn decode_tok_s(&self) -> f64 {
        per_second(
            Self::get(&self.decode_only_tokens),
            Self::get(&self.decode_ns),
        )
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let g = Self::get;
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP vkdecode_{name} {help}");
            let _ = writeln!(out, "# TYPE vkdecode_{name} {kind}");
            let _ = writeln!(out, "vkdecode_{name} {value}");
        };
        let rows: [(&str, &str, &str, String); 22] = [
            ("requests_total", "counter", "Generation requests accepted into the queue.", g(&self.requests).to_string()),
            ("requests_failed_total", "counter", "Requests answered with an error status.", g(&self.requests_failed).to_string()),
            ("requests_rejected_busy_total", "counter", "Requests refused because the queue was full.", g(&self.requests_rejected_busy).to_string()),
            ("requests_cancelled_total", "counter", "Requests whose client disconnected before the end.", g(&self.requests_cancelled).to_string()),
            ("requests_finished_total", "counter", "Requests that ran to a finish (stop or length).", g(&self.requests_finished).to_string()),
            ("prompt_tokens_total", "counter", "Prompt tokens of requests run (reused ones included).", g(&self.prompt_tokens).to_string()),
            ("prefilled_tokens_total", "counter", "Prompt tokens prefilled (cache reuse not counted).", g(&self.prefilled_tokens).to_string()),
            ("reused_prompt_tokens_total", "counter", "Prompt tokens taken from a slot's cache.", g(&self.reused_tokens).to_string()),
            ("generated_tokens_total", "counter", "Tokens generated.", g(&self.generated_tokens).to_string()),
            ("prefill_seconds_total", "counter", "Time of the engine steps that only prefilled.", secs(g(&self.prefill_ns))),
            ("decode_seconds_total", "counter", "Time of the engine steps that only decoded.", secs(g(&self.decode_ns))),
            ("mixed_seconds_total", "counter", "Time of the engine steps that prefilled and decoded.", secs(g(&self.mixed_ns))),
            ("decode_only_tokens_total", "counter", "Tokens of the steps that only decoded.", g(&self.decode_only_tokens).to_string()),
            ("prefill_tokens_per_second", "gauge", "Prompt tokens per second over the steps that only prefilled, since the start.", format!("{:.3}", self.prefill_tok_s())),
            ("decode_tokens_per_second", "gauge", "Tokens per second over the steps that only decoded, all slots together, since the start.", format!("{:.3}", self.decode_tok_s())),
            ("queue_length", "gauge", "Requests waiting for a slot.", g(&self.queue_len).to_string()),
            ("slots_busy", "gauge", "Slots running a request.", g(&self.slots_busy).to_string()),
            ("slots_busy_peak", "gauge", "The most slots busy at once since the start.", g(&self.slots_busy_peak).to_string()),
            ("slots_total", "gauge", "Slots (--parallel).", g(&self.slots_total).to_string()),
            ("decode_tokens_total", "counter", "Tokens produced by decode steps.", g(&self.decode_tokens).to_string()),
            ("logprob_requests_total", "counter", "Generation requests that asked for log-probabilities.", g(&self.logprob_requests).to_string()),
            ("constrained_requests_total", "counter", "Generation requests held to a grammar (response_format, json_schema, grammar, a forced tool call).", g(&self.constrained_requests).to_string()),
        ];
        for (name, kind, help, value) in rows {
            metric(name, kind, help, value);
        }
        out
    }
}

fn per_second(n: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        n as f64 / (ns as f64 / 1e9)
    }
}

fn secs(ns: u64) -> String {
    format!("{:.6}", ns as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_help_type_and_value_for_each_metric() {
        let m = Metrics::default();
        Metrics::add(&m.generated_tokens, 7);
        Metrics::add(&m.decode_only_tokens, 10);
        Metrics::add(&m.decode_ns, 2_000_000_000);
        let text = m.render();
        assert!(text.contains(
            "# TYPE vkdecode_generated_tokens_total counter\nvkdecode_generated_tokens_total 7\n"
        ));
        assert!(text.contains("vkdecode_decode_tokens_per_second 5.000\n"));
        assert!(text.contains("vkdecode_prefill_tokens_per_second 0.000\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.split_once(' ').unwrap();
            assert!(name.starts_with("vkdecode_"), "{line}");
            value.parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
        }
    }
}

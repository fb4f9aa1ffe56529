//! Aggregate decode speed of `engine::Slots`: one slot alone, then N slots decoding
//! together, for each arm (batched step with the matrix-matrix kernel and the batched
//! head, the same with the head once per token, the batched step with the one-token
//! kernel, one submit per slot), arms alternating `SLOTS_ROUNDS` times (default 1;
//! medians), in one process on one loaded model. Not a test: figures for the README.
//!
//! `cargo run --release -p engine --example slots_throughput -- MODEL.gguf [N] [TOKENS]`
//! (`SLOTS_PROFILE=1`: also the per-kernel GPU time of the last batched step, 1 slot
//! and N slots, from timestamp queries).
//!
//! The slots run on a worker thread, as a server runs them (so `Slots` must be `Send`).

use std::sync::Arc;
use std::time::Instant;

use engine::{BatchKernel, Request, SamplerOptions, SlotEvent, Slots, SlotsOptions};

/// Decode tok/s of `prompts` run together (greedy, `tokens` each, end of generation
/// ignored), timed from the step after the last prefill to the end.
fn decode_tok_s(s: &mut Slots, prompts: &[Vec<u32>], tokens: usize) -> f64 {
    for (slot, p) in prompts.iter().enumerate() {
        s.clear(slot).unwrap();
        let req = Request {
            prompt: p.clone(),
            max_tokens: Some(tokens),
            sampler: SamplerOptions::greedy(),
            ignore_eos: true,
            ..Default::default()
        };
        s.submit(slot, req).unwrap();
    }
    let mut decoded = 0;
    let mut start = None;
    while s.busy() > 0 {
        let r = s.step(&mut |_: SlotEvent<'_>| {}).unwrap();
        if r.prefilled > 0 {
            // the clock starts after the last step that prefilled
            start = Some(Instant::now());
            decoded = 0;
        } else {
            decoded += r.decoded;
        }
    }
    let secs = start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    decoded as f64 / secs.max(1e-9)
}

/// The per-kernel GPU time of one batched step.
fn print_profile(what: &str, rows: Option<&[engine::KernelTime]>) {
    let Some(rows) = rows else {
        return;
    };
    let total: u64 = rows.iter().map(|r| r.ns).sum();
    println!("last step, {what}: {:.2} ms GPU", total as f64 / 1e6);
    for r in rows {
        println!(
            "  {:14} {:4} dispatches {:8.2} ms {:5.1}%",
            r.name,
            r.dispatches,
            r.ns as f64 / 1e6,
            100.0 * r.ns as f64 / total.max(1) as f64
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .expect("usage: slots_throughput MODEL.gguf [N] [TOKENS]");
    let n: usize = args.get(2).map_or(4, |a| a.parse().unwrap());
    let tokens: usize = args.get(3).map_or(32, |a| a.parse().unwrap());
    let file = Arc::new(gguf::GgufFile::open(model).unwrap());
    let profile = std::env::var("SLOTS_PROFILE").is_ok_and(|v| v == "1");
    let mut opts = SlotsOptions {
        slots: n,
        ctx: engine::generate::CtxRequest::Exact(256),
        ..Default::default()
    };
    opts.session.profile = profile;
    let mut s = Slots::load(&file, &opts).unwrap();
    let worker = std::thread::spawn(move || {
        let topics = [
            "France", "the sea", "a robot", "music", "winter", "bread", "a cat", "rain",
        ];
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                let text = format!("Tell me about {}.", topics[i % topics.len()]);
                s.tokenize(&text, false).unwrap()
            })
            .collect();
        let arms = [
            (
                "batched, matrix-matrix, GEMM head",
                true,
                BatchKernel::MatrixMatrix,
                BatchKernel::MatrixMatrix,
            ),
            (
                "batched, matrix-matrix, per-token head",
                true,
                BatchKernel::MatrixMatrix,
                BatchKernel::PerToken,
            ),
            (
                "batched step, one-token kernel",
                true,
                BatchKernel::PerToken,
                BatchKernel::PerToken,
            ),
            (
                "one submit per slot",
                false,
                BatchKernel::MatrixMatrix,
                BatchKernel::MatrixMatrix,
            ),
        ];
        let rounds: usize = std::env::var("SLOTS_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        // arms alternate, `rounds` times (the machine's speed drifts); medians reported
        let mut runs: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); arms.len()];
        for _ in 0..rounds {
            for (k, &(name, batched, kernel, head)) in arms.iter().enumerate() {
                s.set_batched(batched);
                s.set_batch_kernel(kernel);
                s.set_head_kernel(head);
                let one = decode_tok_s(&mut s, &prompts[..1], tokens);
                let prof_one = s.session().and_then(|s| s.profile_last_batch());
                let all = decode_tok_s(&mut s, &prompts, tokens);
                let prof_all = s.session().and_then(|s| s.profile_last_batch());
                if profile && batched {
                    for (k, p) in [(1, prof_one), (n, prof_all)] {
                        print_profile(&format!("{name}, {k} slot(s)"), p.as_deref());
                    }
                }
                runs[k].0.push(one);
                runs[k].1.push(all);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut rows: Vec<(&str, f64, f64)> = Vec::new();
        for (k, (mut one, mut all)) in runs.into_iter().enumerate() {
            rows.push((arms[k].0, median(&mut one), median(&mut all)));
        }
        rows
    });
    let rows = worker.join().unwrap();
    println!("{n} slots, {tokens} tokens each: decode tok/s of all slots together");
    for (name, one, all) in rows {
        println!(
            "  {name:36} 1 slot {one:7.1}, {n} slots {all:7.1} ({:.2}x)",
            all / one
        );
    }
}

//! Aggregate decode speed of `engine::Slots`: one slot alone, then N slots decoding
//! together, batched (one submit per step), then both again with one submit per slot,
//! in one process on one loaded model. Not a test: figures for the README / issue 15.
//!
//! `cargo run --release -p engine --example slots_throughput -- MODEL.gguf [N] [TOKENS]`
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .expect("usage: slots_throughput MODEL.gguf [N] [TOKENS]");
    let n: usize = args.get(2).map_or(4, |a| a.parse().unwrap());
    let tokens: usize = args.get(3).map_or(32, |a| a.parse().unwrap());
    let file = Arc::new(gguf::GgufFile::open(model).unwrap());
    let opts = SlotsOptions {
        slots: n,
        ctx: engine::generate::CtxRequest::Exact(256),
        ..Default::default()
    };
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
        let mut rows = Vec::new();
        for (name, batched, kernel) in [
            (
                "batched step, matrix-matrix kernel",
                true,
                BatchKernel::MatrixMatrix,
            ),
            (
                "batched step, one-token kernel",
                true,
                BatchKernel::PerToken,
            ),
            ("one submit per slot", false, BatchKernel::MatrixMatrix),
        ] {
            s.set_batched(batched);
            s.set_batch_kernel(kernel);
            let one = decode_tok_s(&mut s, &prompts[..1], tokens);
            let all = decode_tok_s(&mut s, &prompts, tokens);
            rows.push((name, one, all));
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

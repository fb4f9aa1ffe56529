//! Decode benchmark on the default model (not a test): load, prefill, then greedy decode,
//! timed after each fence; with VKDECODE_BENCH_PROFILE=1 the GPU timestamps of the last
//! token, summed per kind of dispatch.
//!
//! `cargo bench -p engine --bench decode` with, optionally,
//! VKDECODE_BENCH_MODEL=path (default models/SmolLM2-135M-Instruct.Q8_0.gguf),
//! VKDECODE_BENCH_WEIGHTS=auto|import|copy, VKDECODE_BENCH_TOKENS=64,
//! VKDECODE_BENCH_SYNC=1 (host wait after every layer), VKDECODE_BENCH_PROFILE=1.
//! LP_NUM_THREADS (lavapipe's worker threads) must be set in the environment before start.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use engine::{Session, SessionOptions, WeightsMode};

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let model = env("VKDECODE_BENCH_MODEL").unwrap_or_else(|| {
        format!(
            "{}/../../models/SmolLM2-135M-Instruct.Q8_0.gguf",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let mode: WeightsMode = env("VKDECODE_BENCH_WEIGHTS")
        .map_or(WeightsMode::Auto, |m| m.parse().expect("weights mode"));
    let n: usize = env("VKDECODE_BENCH_TOKENS").map_or(64, |v| v.parse().expect("token count"));
    let profile = env("VKDECODE_BENCH_PROFILE").is_some_and(|v| v == "1");
    let sync = env("VKDECODE_BENCH_SYNC").is_some_and(|v| v == "1");

    let t0 = Instant::now();
    let ctx = vk::Context::new(&vk::ContextOptions::default()).expect("Vulkan context");
    let file = Arc::new(
        gguf::GgufFile::open(&model).unwrap_or_else(|e| panic!("{model}: {e} (run models/fetch)")),
    );
    let mut opts = SessionOptions {
        ctx_len: 256,
        sync_each_layer: sync,
        profile,
        ..SessionOptions::default()
    };
    opts.weights.mode = mode;
    let mut s = Session::new(ctx, file, &opts).expect("session");
    let load = t0.elapsed();

    let prompt = [504u32, 3575, 282, 4649, 314]; // "The capital of France is"
    let t1 = Instant::now();
    s.prefill(&prompt).expect("prefill");
    let mut tok = s.last_argmax().expect("argmax");
    let ttft = t1.elapsed();
    let mut ids = vec![tok];
    let t2 = Instant::now();
    for _ in 1..n {
        tok = s.decode_argmax(tok).expect("decode");
        ids.push(tok);
    }
    let dt = t2.elapsed();
    let tps = (n - 1) as f64 / dt.as_secs_f64();
    println!(
        "model {model}\nweights {} ({})\nload {:.0} ms, time to first token {:.1} ms, decode {} tokens in {:.1} ms: {tps:.1} tok/s (sync_each_layer={sync}, LP_NUM_THREADS={})",
        mode,
        s.weights().report().path,
        load.as_secs_f64() * 1e3,
        ttft.as_secs_f64() * 1e3,
        n - 1,
        dt.as_secs_f64() * 1e3,
        env("LP_NUM_THREADS").unwrap_or_else(|| "default".into()),
    );
    println!("ids {ids:?}");
    if let Some(p) = s.profile_last_token() {
        let mut by_kind: BTreeMap<String, (u64, usize)> = BTreeMap::new();
        let total: u64 = p.iter().map(|k| k.ns).sum();
        for k in &p {
            let kind = k
                .name
                .rsplit('.')
                .next()
                .unwrap_or(&k.name)
                .split('#')
                .next()
                .unwrap_or("")
                .to_string();
            let e = by_kind.entry(kind).or_default();
            e.0 += k.ns;
            e.1 += k.dispatches as usize;
        }
        println!(
            "GPU time of the last token: {:.2} ms in {} dispatches",
            total as f64 / 1e6,
            p.iter().map(|k| k.dispatches).sum::<u32>()
        );
        for (kind, (ns, count)) in by_kind {
            println!(
                "  {kind:<12} {count:>4} x  {:>8.3} ms  {:>5.1}%",
                ns as f64 / 1e6,
                100.0 * ns as f64 / total as f64
            );
        }
    }
}

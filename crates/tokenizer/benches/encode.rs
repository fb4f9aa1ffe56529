//! Encoding speed on the default model's tokenizer (was a timing assertion in
//! tests/smollm.rs: a 2 KB prompt in about 2 ms on a 2-core machine).
//!
//! `cargo bench -p tokenizer --bench encode`

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tokenizer::Tokenizer;

fn encode_2kb(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let file = gguf::GgufFile::open(&path).expect("the default model (run models/fetch)");
    let tok = Tokenizer::from_gguf(file.gguf()).expect("build the tokenizer");
    let unit = "The quick brown fox jumps over the lazy dog 1234, naïve café — 東京 🎉\n\tfn main() { println!(\"hi\"); }\n";
    let text: String = unit.repeat(2048 / unit.len() + 1);
    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("smollm_2kb", |b| {
        b.iter(|| tok.encode(&text, false, false).expect("encode"))
    });
    g.finish();
}

criterion_group!(benches, encode_2kb);
criterion_main!(benches);

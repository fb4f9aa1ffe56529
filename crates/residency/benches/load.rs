//! criterion: `Weights::load` of the default Q8_0 model (4096-aligned), imported from the
//! page cache versus copied through the staging ring into device buffers.
//!
//! The file is opened (mapped) once; each iteration is one `Weights::load` and its drop
//! (the drop is outside the timed region). The page cache is warm: this measures what
//! the GPU side costs, not the disk (see `vkdecode bench --cold` for that).
//!
//! `cargo bench -p residency --bench load [-- --quick]`. Needs
//! models/SmolLM2-135M-Instruct.Q8_0.gguf (run models/fetch). No Vulkan device: fails,
//! unless VKDECODE_ALLOW_NO_GPU=1 (then it prints a note and returns).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use residency::{ResidencyOptions, Weights, WeightsMode};
use vk::{Context, ContextOptions};

fn load(c: &mut Criterion) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q8_0.gguf");
    assert!(
        path.exists(),
        "{} is missing: run models/fetch (it downloads and converts the default model)",
        path.display()
    );
    let ctx = match Context::new(&ContextOptions {
        device_index: None,
        validate: false,
    }) {
        Ok(c) => c,
        Err(e) if std::env::var("VKDECODE_ALLOW_NO_GPU").is_ok_and(|v| v == "1") => {
            eprintln!("note: no Vulkan device ({e}); skipping (VKDECODE_ALLOW_NO_GPU=1)");
            return;
        }
        Err(e) => panic!("no usable Vulkan device: {e} (set VKDECODE_ALLOW_NO_GPU=1 to skip)"),
    };
    let file = Arc::new(
        gguf::GgufFile::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run models/fetch)", path.display())),
    );
    // warm the page cache so that both arms read it from memory
    let sum = file
        .bytes()
        .chunks(4096)
        .fold(0u64, |s, p| s.wrapping_add(u64::from(p[0])));
    std::hint::black_box(sum);

    let mut group = c.benchmark_group("load");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for mode in [WeightsMode::Import, WeightsMode::Copy] {
        let opts = ResidencyOptions {
            mode,
            ..ResidencyOptions::default()
        };
        let probe = Weights::load(&ctx, Arc::clone(&file), &opts).expect("Weights::load");
        let path_taken = probe.report().path.to_string();
        drop(probe);
        eprintln!("load/{mode}: residency path {path_taken}");
        group.bench_function(format!("{mode}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let w = Weights::load(&ctx, Arc::clone(&file), &opts).expect("Weights::load");
                    total += t.elapsed();
                    drop(w);
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group!(benches, load);
criterion_main!(benches);

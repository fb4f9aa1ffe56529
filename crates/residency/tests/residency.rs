//! Acceptance tests of weight residency on the default model: the GPU reads
//! every tensor's bytes identically through import and copy, equal to the CPU checksum
//! of the file, for the Q8_0 (4096-aligned) and Q4_1 (32-byte aligned) files and with
//! a 1 MiB cap; every fallback is forced and checked. Validation on, zero messages.

use std::path::PathBuf;
use std::sync::Arc;

use gguf::GgufFile;
use residency::Faults;
use residency::{ResidencyOptions, Weights, WeightsMode};
use vk::Context;

fn model(name: &str) -> Arc<GgufFile> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run models/fetch",
        path.display()
    );
    Arc::new(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn ctx() -> Option<Arc<Context>> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("warn")
        .try_init();
    vk::testing::validating_context()
}

fn opts(mode: WeightsMode, cap: Option<u64>) -> ResidencyOptions {
    ResidencyOptions {
        mode,
        import_cap: cap,
        mlock: false,
    }
}

/// Loads `file` with `mode`, checks the path taken and that the GPU checksum of every
/// tensor equals the CPU checksum of its file bytes; returns the weights.
fn load_and_check(
    ctx: &Arc<Context>,
    file: &Arc<GgufFile>,
    o: &ResidencyOptions,
    faults: Faults,
    path: &str,
) -> Weights {
    let w = Weights::load_with_faults(ctx, Arc::clone(file), o, faults).unwrap();
    assert_eq!(w.report().path, path, "report: {:#?}", w.report());
    let gpu = w.gpu_checksums().unwrap();
    let cpu = w.cpu_checksums();
    assert_eq!(gpu.len(), file.gguf().tensors.len());
    for (t, (g, c)) in file.gguf().tensors.iter().zip(gpu.iter().zip(&cpu)) {
        assert_eq!(g, c, "tensor {} ({path})", t.name);
    }
    // Sanity: the checksums are not all equal (they depend on the bytes).
    assert!(cpu.windows(2).any(|p| p[0] != p[1]));
    w
}

fn import_equals_copy(name: &str, cap: Option<u64>) -> (Weights, Weights) {
    let ctx = ctx().expect("device");
    let file = model(name);
    let imp = load_and_check(
        &ctx,
        &file,
        &opts(WeightsMode::Import, cap),
        Faults::default(),
        "import(file)",
    );
    let cp = load_and_check(
        &ctx,
        &file,
        &opts(WeightsMode::Copy, cap),
        Faults::default(),
        "copy",
    );
    assert_eq!(imp.gpu_checksums().unwrap(), cp.gpu_checksums().unwrap());
    eprintln!(
        "{name} cap {cap:?}: import {:.1} ms ({} shards), copy {:.1} ms, {} of {} bytes resident at load",
        imp.report().load_ms,
        imp.plan().shards.len(),
        cp.report().load_ms,
        imp.report().file_resident_bytes,
        imp.report().model_bytes
    );
    assert_eq!(imp.report().device_bytes, 0);
    assert!(imp.report().imported_bytes >= file.bytes().len() as u64 - file.gguf().data_offset);
    assert!(cp.report().device_bytes >= file.bytes().len() as u64 - file.gguf().data_offset);
    assert_eq!(cp.report().imported_bytes, 0);
    assert_eq!(ctx.validation_errors(), 0);
    (imp, cp)
}

#[test]
fn q8_0_import_equals_copy_equals_cpu() {
    if ctx().is_none() {
        return;
    }
    let (imp, _) = import_equals_copy("SmolLM2-135M-Instruct.Q8_0.gguf", None);
    assert_eq!(imp.report().alignment, 4096);
    // The whole model fits one shard of the 2 GiB lavapipe cap.
    assert_eq!(imp.plan().shards.len(), 1);
}

#[test]
fn q4_1_import_equals_copy_equals_cpu() {
    if ctx().is_none() {
        return;
    }
    let file = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        file.gguf().alignment,
        32,
        "the original file has 32-byte tensor alignment"
    );
    import_equals_copy("SmolLM2-135M-Instruct.Q4_1.gguf", None);
}

#[test]
fn one_mib_cap_gives_many_shards_and_row_ranges() {
    let Some(ctx) = ctx() else { return };
    let (imp, cp) = import_equals_copy("SmolLM2-135M-Instruct.Q8_0.gguf", Some(1 << 20));
    assert!(
        imp.plan().shards.len() > 100,
        "{} shards",
        imp.plan().shards.len()
    );
    assert!(imp.plan().shards.iter().all(|s| s.len <= 1 << 20));
    // token_embd (49152 x 576 Q8_0, ~30 MB) is bound as row ranges.
    let emb = imp.view("token_embd.weight").unwrap();
    assert!(emb.parts.len() > 20, "{} parts", emb.parts.len());
    assert_eq!(emb.parts.iter().map(|p| p.n_rows).sum::<u64>(), 49152);
    let align = ctx.caps().min_storage_buffer_offset_alignment;
    for v in imp.views().iter().chain(cp.views()) {
        for p in &v.parts {
            assert_eq!(p.binding.offset % align, 0);
            assert_eq!(p.byte_offset % 4, 0);
            assert!(p.binding.range <= ctx.caps().max_storage_buffer_range);
        }
    }
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn refused_file_pages_fall_back_to_anonymous_memory() {
    let Some(ctx) = ctx() else { return };
    let file = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let faults = Faults {
        import_file: true,
        import_anon: false,
    };
    for mode in [WeightsMode::Auto, WeightsMode::Import] {
        let w = load_and_check(
            &ctx,
            &file,
            &opts(mode, Some(16 << 20)),
            faults,
            "import(anon)",
        );
        let r = w.report();
        assert!(r.reason.contains("import-file"), "{}", r.reason);
        assert!(r.anon_bytes >= file.bytes().len() as u64 - file.gguf().data_offset);
        assert!(r
            .shards
            .iter()
            .all(|s| s.path == "import(anon)" && s.note.is_some()));
    }
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn refused_anonymous_memory_falls_back_to_copy_under_auto_and_fails_import() {
    let Some(ctx) = ctx() else { return };
    let file = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let both = Faults {
        import_file: true,
        import_anon: true,
    };
    let w = load_and_check(&ctx, &file, &opts(WeightsMode::Auto, None), both, "copy");
    assert!(
        w.report().reason.contains("import-anon"),
        "{}",
        w.report().reason
    );
    assert!(w.report().device_bytes > 0);
    let err = Weights::load_with_faults(
        &ctx,
        Arc::clone(&file),
        &opts(WeightsMode::Import, None),
        both,
    )
    .err()
    .expect("strict import must fail");
    let msg = err.to_string();
    assert!(msg.starts_with("--weights import:"), "{msg}");
    assert!(
        msg.contains("import-file") && msg.contains("import-anon"),
        "{msg}"
    );
    // Only anonymous memory refused: file import still works.
    let anon_only = Faults {
        import_file: false,
        import_anon: true,
    };
    load_and_check(
        &ctx,
        &file,
        &opts(WeightsMode::Auto, None),
        anon_only,
        "import(file)",
    );
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn auto_imports_on_this_device_and_reports_why() {
    let Some(ctx) = ctx() else { return };
    let file = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let want = residency::auto_decision(ctx.caps());
    let path = if want.mode == WeightsMode::Import {
        "import(file)"
    } else {
        "copy"
    };
    let w = load_and_check(
        &ctx,
        &file,
        &opts(WeightsMode::Auto, None),
        Faults::default(),
        path,
    );
    assert!(
        w.report().reason.starts_with("auto: "),
        "{}",
        w.report().reason
    );
    assert_eq!(w.report().mode, WeightsMode::Auto);
    let json = serde_json::to_value(w.report()).unwrap();
    assert_eq!(json["mode"], "auto");
    assert_eq!(json["model_bytes"], file.bytes().len() as u64);
    assert!(w.report().file_resident_bytes <= file.bytes().len() as u64);
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn mlock_pins_or_says_why() {
    let Some(ctx) = ctx() else { return };
    let file = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let o = ResidencyOptions {
        mode: WeightsMode::Import,
        import_cap: None,
        mlock: true,
    };
    match Weights::load_with_faults(&ctx, file, &o, Faults::default()) {
        Ok(w) => assert!(w.report().mlocked),
        Err(e) => assert!(e.to_string().contains("ulimit -l"), "{e}"),
    }
    assert_eq!(ctx.validation_errors(), 0);
}

#[test]
fn weights_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Weights>();
}

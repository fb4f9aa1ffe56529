//! The memory split that proves import holds the weights once: after loading the Q8_0
//! model and having a shader read every weight byte,
//! - import: private memory (RssAnon + RssShmem) grew by < 5% of the model size and
//!   RssFile covers >= 95% of it;
//! - copy:   private memory grew by >= 95% of the model size.
//!
//! Private memory is the sum because drivers differ in where device memory lives: Mesa
//! 22's lavapipe allocates it anonymously (RssAnon), Mesa 25's from a memfd (RssShmem).
//!
//! Each arm runs in a fresh child process (this test binary re-executed with
//! VKDECODE_MEM_ARM set, running the ignored `child_arm` test) so arms don't share pages.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use gguf::GgufFile;
use residency::{MemStats, ResidencyOptions, Weights, WeightsMode};
use vk::{Context, ContextOptions};

const MODEL: &str = "SmolLM2-135M-Instruct.Q8_0.gguf";
const WARM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    assert!(p.exists(), "{} is missing: run models/fetch", p.display());
    p
}

/// Result line printed by the child: `MEMARM <arm> <model bytes> <before> <after> <path>`.
struct Arm {
    model_bytes: u64,
    before: MemStats,
    after: MemStats,
    path: String,
}

fn run_arm(arm: &str, extra_env: &[(&str, &str)]) -> Option<Arm> {
    if Context::new(&ContextOptions {
        device_index: None,
        validate: false,
    })
    .is_err()
    {
        if std::env::var("VKDECODE_ALLOW_NO_GPU").is_ok_and(|v| v == "1") {
            eprintln!("skipping: no Vulkan device");
            return None;
        }
        panic!("no usable Vulkan device (set VKDECODE_ALLOW_NO_GPU=1 to skip)");
    }
    model_path(MODEL);
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        "child_arm",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("VKDECODE_MEM_ARM", arm)
    .env("VKDECODE_VALIDATE", "1")
    .env_remove("VKDECODE_FAULT");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child `{arm}` failed:\n{stdout}\n{stderr}"
    );
    // libtest may print "test child_arm ... " before the line.
    let line = stdout
        .lines()
        .find_map(|l| l.find("MEMARM ").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("child printed no MEMARM line:\n{stdout}\n{stderr}"));
    let f: Vec<&str> = line.splitn(6, ' ').collect();
    let parse = |s: &str| -> MemStats {
        let v: Vec<u64> = s.split(',').map(|x| x.parse().unwrap()).collect();
        MemStats {
            rss_anon_kb: v[0],
            rss_file_kb: v[1],
            pss_kb: v[2],
            rss_shmem_kb: v[3],
            ..Default::default()
        }
    };
    let a = Arm {
        model_bytes: f[2].parse().unwrap(),
        before: parse(f[3]),
        after: parse(f[4]),
        path: f[5].to_string(),
    };
    eprintln!(
        "{arm}: model {} KiB, RssAnon {} -> {} KiB, RssShmem {} -> {} KiB, RssFile {} -> {} KiB, Pss {} -> {} KiB, path {}",
        a.model_bytes / 1024,
        a.before.rss_anon_kb,
        a.after.rss_anon_kb,
        a.before.rss_shmem_kb,
        a.after.rss_shmem_kb,
        a.before.rss_file_kb,
        a.after.rss_file_kb,
        a.before.pss_kb,
        a.after.pss_kb,
        a.path
    );
    Some(a)
}

#[test]
fn import_keeps_weights_out_of_anonymous_memory() {
    let Some(a) = run_arm("import", &[]) else {
        return;
    };
    assert_eq!(a.path, "import(file)");
    let model_kb = a.model_bytes / 1024;
    let private_growth = a.after.private_kb().saturating_sub(a.before.private_kb());
    assert!(
        private_growth * 20 < model_kb,
        "RssAnon + RssShmem grew {private_growth} KiB, >= 5% of {model_kb} KiB"
    );
    // The GPU's reads fault the file's pages into this process: RssFile grows by the model.
    let file_growth = a.after.rss_file_kb.saturating_sub(a.before.rss_file_kb);
    assert!(
        file_growth * 100 >= model_kb * 95,
        "RssFile grew {file_growth} KiB, < 95% of {model_kb} KiB"
    );
}

#[test]
fn copy_puts_weights_in_anonymous_memory() {
    let Some(a) = run_arm("copy", &[]) else {
        return;
    };
    assert_eq!(a.path, "copy");
    let model_kb = a.model_bytes / 1024;
    let private_growth = a.after.private_kb().saturating_sub(a.before.private_kb());
    assert!(
        private_growth * 100 >= model_kb * 95,
        "RssAnon + RssShmem grew {private_growth} KiB, < 95% of {model_kb} KiB"
    );
}

#[test]
fn fault_env_forces_the_anonymous_import() {
    // VKDECODE_FAULT is read by Weights::load from the environment.
    let Some(a) = run_arm("auto", &[("VKDECODE_FAULT", "import-file")]) else {
        return;
    };
    assert_eq!(a.path, "import(anon)");
    let model_kb = a.model_bytes / 1024;
    let private_growth = a.after.private_kb().saturating_sub(a.before.private_kb());
    // One copy in anonymous memory (the file pages read once into it).
    assert!(
        private_growth * 100 >= model_kb * 90,
        "RssAnon + RssShmem grew {private_growth} KiB for an anonymous copy"
    );
}

/// The child side; does nothing unless started by `run_arm`.
#[test]
#[ignore = "child process of the memory tests"]
fn child_arm() {
    let Ok(arm) = std::env::var("VKDECODE_MEM_ARM") else {
        return;
    };
    let mode: WeightsMode = arm.parse().unwrap();
    let ctx = Context::new(&ContextOptions::default()).unwrap();
    assert!(ctx.validating());
    // Warm-up on another file: JIT-compiles the checksum kernel and grows the
    // allocator/driver state, so the measured window holds only the model's load.
    {
        let warm = Arc::new(GgufFile::open(model_path(WARM)).unwrap());
        let o = ResidencyOptions {
            mode: WeightsMode::Import,
            import_cap: None,
            mlock: false,
        };
        let w = Weights::load_with_faults(&ctx, warm, &o, Default::default()).unwrap();
        w.gpu_checksums().unwrap();
    }
    let file = Arc::new(GgufFile::open(model_path(MODEL)).unwrap());
    let before = MemStats::read().unwrap();
    let o = ResidencyOptions {
        mode,
        import_cap: None,
        mlock: false,
    };
    let w = Weights::load(&ctx, Arc::clone(&file), &o).unwrap();
    let gpu = w.gpu_checksums().unwrap(); // a shader reads every weight byte
    let after = MemStats::read().unwrap();
    // Checked after measuring: the CPU pass itself touches every file page.
    assert_eq!(gpu, w.cpu_checksums());
    assert_eq!(ctx.validation_errors(), 0);
    let s = |m: &MemStats| {
        format!(
            "{},{},{},{}",
            m.rss_anon_kb, m.rss_file_kb, m.pss_kb, m.rss_shmem_kb
        )
    };
    println!(
        "MEMARM {arm} {} {} {} {}",
        file.bytes().len(),
        s(&before),
        s(&after),
        w.report().path
    );
}

//! `--procs N`: a count of decoders that the available memory cannot hold is refused
//! before anything starts, naming the figures (N processes at once used to be started
//! whatever N was, until memory ran out).
//!
//! One decoder's memory, besides the model file's pages (mapped and imported, shared by
//! every process, so not counted): the driver and runtime ([`DRIVER_BYTES`]), its K/V
//! cache for the prompt and the decoded tokens, and for an arm that copies the weights
//! (copy, and auto, which may copy) a private copy of every tensor. The reference backend
//! holds f32 weights instead of a driver. The sum times N must fit `MemAvailable`.

use anyhow::{bail, Result};

use super::{child, Args, Arm, Mode};

/// Host memory of one Vulkan decoder besides its weights and K/V cache: a floor measured
/// on lavapipe (llvmpipe, LLVM 15) as one run's RssAnon: 61,136 KiB for a 2-layer,
/// dim-64 synthetic model (copy arm, 4.5 KiB of K/V cache), 86,068 KiB for SmolLM2-135M
/// Q8_0 (import arm, 720 KiB of K/V cache, larger activations and logits). A driver of a
/// discrete GPU keeps less of this in host memory, so the figure only refuses counts
/// that fit nowhere.
pub const DRIVER_BYTES: u64 = 60 << 20;

/// The memory one decoder of this benchmark needs, and what it is made of.
struct PerProcess {
    driver: u64,
    kv: u64,
    weights: u64,
    weights_what: &'static str,
}

impl PerProcess {
    fn total(&self) -> u64 {
        self.driver
            .saturating_add(self.kv)
            .saturating_add(self.weights)
    }
}

fn per_process(file: &gguf::GgufFile, args: &Args, arms: &[Arm]) -> PerProcess {
    let g = file.gguf();
    let ctx = args.prompt_tokens.saturating_add(args.decode_tokens);
    // a model the engine refuses is reported by the first child, with its reason
    let kv = arch::Config::from_gguf(g)
        .ok()
        .and_then(|c| c.kv_cache_bytes(ctx as u64))
        .unwrap_or(0);
    let sum = |f: &dyn Fn(&gguf::TensorInfo) -> u64| {
        g.tensors.iter().map(f).fold(0u64, u64::saturating_add)
    };
    if args.backend.as_deref() == Some("reference") {
        return PerProcess {
            driver: 0,
            kv,
            weights: sum(&|t| t.n_elements().saturating_mul(4)),
            weights_what: "the weights as f32 (reference backend)",
        };
    }
    let copies = arms
        .iter()
        .any(|a| matches!(a.mode, Mode::Copy | Mode::Auto));
    PerProcess {
        driver: DRIVER_BYTES,
        kv,
        weights: if copies { sum(&|t| t.n_bytes()) } else { 0 },
        weights_what: if copies {
            "a copy of the weights (copy or auto arm)"
        } else {
            "no weights (imported, shared)"
        },
    }
}

/// Refuses `--procs n` when n decoders need more than `MemAvailable`.
pub fn check_procs(file: &gguf::GgufFile, args: &Args, arms: &[Arm], n: usize) -> Result<()> {
    // Without /proc/meminfo there is nothing to compare with: the runs will tell.
    let Some(available_kb) = child::mem_available_kb() else {
        return Ok(());
    };
    let per = per_process(file, args, arms);
    let need = per.total().saturating_mul(n as u64);
    let available = available_kb.saturating_mul(1024);
    if need > available {
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
        let mut parts = vec![
            format!("{} of driver and runtime", mib(per.driver)),
            format!("{} of K/V cache", mib(per.kv)),
        ];
        if per.weights > 0 {
            parts.push(format!("{} for {}", mib(per.weights), per.weights_what));
        }
        bail!(
            "--procs {n}: {n} decoders at once need about {} ({} each: {}), but \
             MemAvailable is {}; the model file's pages are shared and not counted",
            mib(need),
            mib(per.total()),
            parts.join(", "),
            mib(available)
        );
    }
    Ok(())
}

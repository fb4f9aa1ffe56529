//! How many positions the KV cache may hold: the asked context checked, with checked
//! arithmetic, against what the model was trained on and what the device (or, for the
//! reference, the host's available RAM) can hold. `-c 0` takes the model's context,
//! capped to what fits.

use arch::Config;

use crate::generate::GenerateError;

/// The context a caller asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtxRequest {
    /// `-c 0`: the model's trained context, capped to what fits (the cap is said aloud).
    Model,
    /// A default size: taken as is, or the model's context if that is smaller.
    Default(usize),
    /// Exactly this many positions: refused if above the trained context or if it does
    /// not fit.
    Exact(usize),
}

/// The memory a KV cache may take, and the largest single buffer (one layer's keys).
#[derive(Clone, Debug)]
pub struct Budget {
    /// Bytes the whole KV cache may take.
    pub bytes: u64,
    /// Largest single KV buffer (one layer's keys, `ctx · kv_dim · 2`); `u64::MAX` when
    /// the backend has no such limit.
    pub max_buffer: u64,
    /// What `bytes` was taken from, for messages.
    pub what: String,
}

/// The resolved context: its size and, when it differs from what was asked, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtxChoice {
    /// Positions the KV cache holds.
    pub ctx_len: usize,
    /// A line for the user when the size was capped or chosen for them.
    pub note: Option<String>,
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub(crate) fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The budget on a Vulkan device: its largest device-local heap (and, on unified memory,
/// the host's available RAM), less the model file; one layer's buffer within the device's
/// storage-buffer range and allocation size.
pub(crate) fn vulkan_budget(caps: &vk::Capabilities, model_bytes: u64) -> Budget {
    let heap = caps
        .memory_heaps
        .iter()
        .filter(|h| h.device_local)
        .map(|h| h.size)
        .max()
        .unwrap_or(0);
    let mut what = format!("the device's largest heap ({})", human(heap));
    let mut total = heap;
    if caps.unified_memory {
        if let Some(avail) = mem_available() {
            if avail < total {
                total = avail;
                what = format!("the available RAM ({})", human(avail));
            }
        }
    }
    let max_buffer = [
        caps.max_storage_buffer_range,
        caps.max_memory_allocation_size,
        caps.max_buffer_size.unwrap_or(u64::MAX),
    ]
    .into_iter()
    .min()
    .unwrap_or(u64::MAX);
    Budget {
        bytes: total.saturating_sub(model_bytes),
        max_buffer,
        what: format!("{what} less the model file ({})", human(model_bytes)),
    }
}

/// The budget of the CPU reference: the host's available RAM less its f32 weights.
pub fn host_budget(weights_f32_bytes: u64) -> Budget {
    let avail = mem_available().unwrap_or(u64::MAX);
    Budget {
        bytes: avail.saturating_sub(weights_f32_bytes),
        max_buffer: u64::MAX,
        what: format!(
            "the available RAM ({}) less the f32 weights ({})",
            human(avail),
            human(weights_f32_bytes)
        ),
    }
}

/// Resolves `req` for `cfg` within `budget`.
pub fn resolve(cfg: &Config, req: CtxRequest, budget: &Budget) -> Result<CtxChoice, GenerateError> {
    let trained = cfg.context_length;
    let per_token = cfg.kv_cache_bytes(1).unwrap_or(u64::MAX).max(1);
    let per_layer_token = cfg.kv_layer_bytes(1).unwrap_or(u64::MAX).max(1);
    // The most positions that fit: half the budget (the rest is for activations, the
    // page cache and everything else), and one layer's buffer within the device's range.
    let fit = (budget.bytes / 2 / per_token).min(budget.max_buffer / per_layer_token);
    let fit = usize::try_from(fit).unwrap_or(usize::MAX);
    let (ctx_len, note) = match req {
        CtxRequest::Model => {
            if trained == 0 {
                return Err(GenerateError::Input(format!(
                    "-c 0: the model's {}.context_length is 0; give a context size with -c",
                    cfg.arch.name()
                )));
            }
            if trained <= fit {
                let note = format!("-c 0: using the model's trained context of {trained} tokens");
                (trained, Some(note))
            } else {
                if fit == 0 {
                    return Err(too_large(cfg, trained as u64, budget));
                }
                let note = format!(
                    "-c 0: the model's context of {trained} tokens does not fit ({} of KV cache); capped to {fit} tokens ({} within {})",
                    need_text(cfg, trained as u64),
                    human(cfg.kv_cache_bytes(fit as u64).unwrap_or(u64::MAX)),
                    budget.what
                );
                (fit, Some(note))
            }
        }
        CtxRequest::Default(n) => {
            let n = n.min(trained);
            if n == 0 {
                return Err(GenerateError::Input(format!(
                    "the model's {}.context_length is 0: it cannot hold a prompt",
                    cfg.arch.name()
                )));
            }
            (n, None)
        }
        CtxRequest::Exact(n) => {
            if n > trained {
                return Err(GenerateError::ContextAboveTrained { asked: n, trained });
            }
            (n, None)
        }
    };
    let need = cfg.kv_cache_bytes(ctx_len as u64);
    let layer = cfg.kv_layer_bytes(ctx_len as u64);
    match (need, layer) {
        (Some(need), Some(layer)) if need <= budget.bytes && layer <= budget.max_buffer => {
            Ok(CtxChoice { ctx_len, note })
        }
        _ => Err(too_large(cfg, ctx_len as u64, budget)),
    }
}

fn too_large(cfg: &Config, ctx_len: u64, budget: &Budget) -> GenerateError {
    let need = cfg.kv_cache_bytes(ctx_len);
    let layer = cfg.kv_layer_bytes(ctx_len).unwrap_or(u64::MAX);
    let (budget_what, budget_text) = match need {
        Some(n) if n <= budget.bytes && layer > budget.max_buffer => (
            format!(
                "the device's largest buffer, one layer's keys taking {}",
                human(layer)
            ),
            human(budget.max_buffer),
        ),
        _ => (budget.what.clone(), human(budget.bytes)),
    };
    GenerateError::ContextTooLarge {
        ctx_len,
        need: need_text(cfg, ctx_len),
        budget_what,
        budget: budget_text,
    }
}

fn need_text(cfg: &Config, ctx_len: u64) -> String {
    match cfg.kv_cache_bytes(ctx_len) {
        Some(n) => format!("{n} bytes ({})", human(n)),
        None => "more than 2^64 bytes".into(),
    }
}

/// Bytes for people: `377.5 MiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm(context_length: usize) -> Config {
        Config {
            arch: arch::Arch::Llama,
            n_layers: 30,
            dim: 576,
            hidden_dim: 1536,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            vocab_size: 49152,
            context_length,
            rms_eps: 1e-5,
            rope_base: 1e5,
            rope_scale: 1.0,
            rope_mode: arch::RopeMode::Normal,
            rope_freqs: false,
            tied_output: true,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            ffn_act: arch::FfnAct::Silu,
            embd_scale: 1.0,
            attn_scale: 0.125,
            final_logit_softcap: None,
            sliding_window: None,
        }
    }

    fn budget(bytes: u64) -> Budget {
        Budget {
            bytes,
            max_buffer: 128 << 20,
            what: "test".into(),
        }
    }

    #[test]
    fn a_context_that_does_not_fit_is_refused_naming_its_bytes() {
        let cfg = smollm(1 << 58);
        let e = resolve(&cfg, CtxRequest::Exact(1 << 58), &budget(1 << 30)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("288230376151711744") && msg.contains("2^64"),
            "{msg}"
        );
        let e = resolve(&cfg, CtxRequest::Exact(100_000), &budget(1 << 30)).unwrap_err();
        assert!(e.to_string().contains("2304000000 bytes"), "{e}");
    }

    #[test]
    fn ctx_zero_takes_the_model_context_capped_to_what_fits() {
        let c = resolve(&smollm(8192), CtxRequest::Model, &budget(1 << 30)).unwrap();
        assert_eq!(c.ctx_len, 8192);
        assert!(c.note.unwrap().contains("8192"));
        let c = resolve(&smollm(1 << 58), CtxRequest::Model, &budget(1 << 30)).unwrap();
        // half of 1 GiB over 23040 bytes per position
        assert_eq!(c.ctx_len, (1u64 << 29) as usize / 23040);
        assert!(c.note.unwrap().contains("capped"));
        assert!(resolve(&smollm(0), CtxRequest::Model, &budget(1 << 30)).is_err());
    }

    #[test]
    fn above_the_trained_context_is_refused_and_the_default_is_capped() {
        let e = resolve(&smollm(8192), CtxRequest::Exact(9000), &budget(1 << 30)).unwrap_err();
        assert!(e.to_string().contains("trained context of 8192"), "{e}");
        let c = resolve(&smollm(128), CtxRequest::Default(2048), &budget(1 << 30)).unwrap();
        assert_eq!(c.ctx_len, 128);
    }

    #[test]
    fn one_layer_beyond_the_buffer_range_is_refused() {
        // 349526 positions · 384 bytes > 128 MiB, though the whole cache fits the budget
        let e = resolve(
            &smollm(1 << 20),
            CtxRequest::Exact(349_526),
            &budget(1 << 40),
        )
        .unwrap_err();
        assert!(e.to_string().contains("largest buffer"), "{e}");
    }

    #[test]
    fn mem_available_parses() {
        let t = "MemTotal: 100 kB\nMemAvailable:   24080772 kB\n";
        assert_eq!(parse_mem_available(t), Some(24080772 * 1024));
    }
}

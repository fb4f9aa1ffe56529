//! Per-kernel GPU time of a profiled decode token: the dispatch names the recorder
//! gives, timestamp queries after every dispatch, and the weight bytes each matvec reads,
//! summed per kernel (`vkdecode bench --profile`, [`crate::Session::profile_last_token`]).

use vk::{CommandBuffer, QueryPool};

/// The recorder's profiling state: the timestamp pool and the names of the dispatches
/// timed so far (`None`: not profiling).
pub(crate) type Timestamps<'a> = Option<(&'a QueryPool, &'a mut Vec<String>)>;

/// Resets the timestamp queries and writes the first one.
pub(crate) fn begin(cmd: &mut CommandBuffer, ts: &mut Timestamps<'_>) {
    if let Some((pool, names)) = ts.as_mut() {
        names.clear();
        cmd.reset_queries(pool, 0, pool.count());
        cmd.timestamp(pool, 0);
    }
}

/// A timestamp after the dispatch just recorded, named `name()`, while queries are left.
pub(crate) fn mark(
    cmd: &mut CommandBuffer,
    ts: &mut Timestamps<'_>,
    name: impl FnOnce() -> String,
) {
    if let Some((pool, names)) = ts.as_mut() {
        if (names.len() as u32) + 1 < pool.count() {
            names.push(name());
            cmd.timestamp(pool, names.len() as u32);
        }
    }
}

/// GPU time of one kernel in the last profiled decode token, summed over its dispatches
/// (all layers, and every part of a split weight), from timestamp queries.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The dispatch's name without its layer and part: `embed`, `qkv`, `attention`,
    /// `attn_output`, `gate_up`, `ffn_down`, `logits`, `argmax`.
    pub name: String,
    /// Dispatches of this kernel in the token.
    pub dispatches: u32,
    /// GPU time of those dispatches, summed.
    pub ns: u64,
    /// Weight bytes those dispatches read (the matvecs; `None` for other kernels).
    pub bytes: Option<u64>,
}

impl KernelTime {
    /// Weight bytes read per second, in GB/s (10^9 bytes), for the matvecs.
    pub fn gb_per_s(&self) -> Option<f64> {
        self.bytes
            .filter(|_| self.ns > 0)
            .map(|b| b as f64 / self.ns as f64)
    }
}

/// The kernel a dispatch name belongs to: `blk.3.gate_up` → `gate_up`, `logits#1` → `logits`.
fn kernel_of(dispatch: &str) -> &str {
    let name = dispatch.split('#').next().unwrap_or(dispatch);
    match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        Some((layer, rest)) if layer.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => name,
    }
}

/// Sums dispatch times per kernel. `ts[0]` is the timestamp before the first dispatch and
/// `ts[i + 1]` the one after dispatch `i`.
pub(crate) fn per_kernel(names: &[String], bytes: &[Option<u64>], ts: &[u64]) -> Vec<KernelTime> {
    let mut rows: Vec<KernelTime> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let (Some(&t0), Some(&t1)) = (ts.get(i), ts.get(i + 1)) else {
            break;
        };
        let kernel = kernel_of(name);
        let b = bytes.get(i).copied().flatten();
        let ns = t1.saturating_sub(t0);
        match rows.iter_mut().find(|r| r.name == kernel) {
            Some(r) => {
                r.dispatches += 1;
                r.ns += ns;
                r.bytes = match (r.bytes, b) {
                    (None, None) => None,
                    (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
                };
            }
            None => rows.push(KernelTime {
                name: kernel.to_string(),
                dispatches: 1,
                ns,
                bytes: b,
            }),
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::{kernel_of, per_kernel, KernelTime};

    #[test]
    fn dispatch_names_map_to_kernels() {
        assert_eq!(kernel_of("blk.0.qkv"), "qkv");
        assert_eq!(kernel_of("blk.29.attention"), "attention");
        assert_eq!(kernel_of("blk.12.gate_up#1"), "gate_up");
        assert_eq!(kernel_of("logits#0"), "logits");
        assert_eq!(kernel_of("embed"), "embed");
        assert_eq!(kernel_of("blk.x.qkv"), "blk.x.qkv");
    }

    #[test]
    fn times_and_weight_bytes_are_summed_per_kernel_in_first_seen_order() {
        let names: Vec<String> = [
            "embed",
            "blk.0.qkv",
            "blk.0.attention",
            "blk.1.qkv",
            "blk.1.attention",
            "logits#0",
            "logits#1",
            "argmax",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let bytes = [
            None,
            Some(1000),
            None,
            Some(1000),
            None,
            Some(3000),
            Some(500),
            None,
        ];
        let ts = [10, 20, 50, 60, 100, 130, 1130, 1630, 1631];
        let rows = per_kernel(&names, &bytes, &ts);
        let want = |name: &str, dispatches, ns, bytes| KernelTime {
            name: name.into(),
            dispatches,
            ns,
            bytes,
        };
        assert_eq!(
            rows,
            vec![
                want("embed", 1, 10, None),
                want("qkv", 2, 30 + 40, Some(2000)),
                want("attention", 2, 10 + 30, None),
                want("logits", 2, 1000 + 500, Some(3500)),
                want("argmax", 1, 1, None),
            ]
        );
        let total: u64 = rows.iter().map(|r| r.ns).sum();
        assert_eq!(total, 1631 - 10, "the rows cover the token");
        assert_eq!(rows[3].gb_per_s(), Some(3500.0 / 1500.0));
        assert_eq!(rows[0].gb_per_s(), None);
        // fewer timestamps than names (a full query pool): the rest is left out
        assert_eq!(per_kernel(&names, &bytes, &ts[..3]).len(), 2);
    }

    /// A profiled decode token of a tiny synthetic model: one row per kernel in dispatch
    /// order, a dispatch per layer, and the weight bytes of each matvec equal to the
    /// bytes of the tensors it reads (the logits read the tied embedding or `output`).
    #[test]
    fn profiled_token_counts_dispatches_and_weight_bytes_per_kernel() {
        use crate::{Session, SessionOptions};
        use std::sync::Arc;
        let ctx = match vk::Context::new(&vk::ContextOptions {
            device_index: None,
            validate: false,
        }) {
            Ok(c) => c,
            Err(e) if std::env::var("VKDECODE_ALLOW_NO_GPU").is_ok_and(|v| v == "1") => {
                eprintln!("skipping: no Vulkan device ({e})");
                return;
            }
            Err(e) => panic!("no usable Vulkan device: {e} (set VKDECODE_ALLOW_NO_GPU=1 to skip)"),
        };
        let n_layers = 3;
        let ty = gguf::GgmlType::Q8_0;
        let bytes = reference::synthetic::tiny_llama(7, n_layers, 64, 4, 2, 128, 320, ty);
        let path =
            std::env::temp_dir().join(format!("vkdecode-profile-{}.gguf", std::process::id()));
        std::fs::write(&path, &bytes).expect("writing the tiny model");
        let file = Arc::new(gguf::GgufFile::open(&path).expect("tiny model"));
        let _ = std::fs::remove_file(&path);
        let cfg = arch::Config::from_gguf(file.gguf()).expect("tiny model config");
        let size = |name: &str| file.gguf().tensor(name).expect(name).n_bytes();
        let tensor_bytes = |ts: &[arch::LayerTensor]| -> u64 {
            (0..n_layers)
                .flat_map(|l| ts.iter().map(move |t| t.name(l)))
                .map(|name| size(&name))
                .sum()
        };
        use arch::LayerTensor::*;
        let want_bytes = [
            ("qkv", tensor_bytes(&[AttnQ, AttnK, AttnV])),
            ("attn_output", tensor_bytes(&[AttnOutput])),
            ("gate_up", tensor_bytes(&[FfnGate, FfnUp])),
            ("ffn_down", tensor_bytes(&[FfnDown])),
            ("logits", size(cfg.output_tensor().name())),
        ];
        let opts = SessionOptions {
            ctx_len: 16,
            profile: true,
            ..SessionOptions::default()
        };
        let mut s = Session::new(ctx, Arc::clone(&file), &opts).expect("session");
        s.prefill(&[1, 2]).expect("prefill");
        s.decode_argmax(3).expect("decode");
        let rows = s.profile_last_token().expect("a profile");
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "embed",
                "qkv",
                "attention",
                "attn_output",
                "gate_up",
                "ffn_down",
                "logits",
                "argmax"
            ]
        );
        for r in &rows {
            let want_dispatches = match r.name.as_str() {
                "embed" | "argmax" | "logits" => 1,
                _ => n_layers as u32,
            };
            assert_eq!(r.dispatches, want_dispatches, "{}", r.name);
            let want = want_bytes
                .iter()
                .find(|(n, _)| *n == r.name)
                .map(|&(_, b)| b);
            assert_eq!(r.bytes, want, "weight bytes of {}", r.name);
        }
        assert!(
            rows.iter().map(|r| r.ns).sum::<u64>() > 0,
            "the token took no GPU time: {rows:?}"
        );
    }
}

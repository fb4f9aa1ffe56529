//! The benchmark's summary: per arm median/min/max of every figure, pairwise ratios
//! between arms, the `--procs` figures (printed by `table`, kept by `json`).

use std::collections::BTreeMap;

use super::stats::{pair_differences, pair_ratio_spread, spread, Spread};
use super::{Arm, Bench, GroupRecord, RunRecord};

/// How a figure is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Ms,
    TokS,
    Kib,
    Bytes,
    Ratio,
}

/// One per-run figure: its JSON key and how to label it.
pub struct Figure {
    pub key: &'static str,
    pub label: &'static str,
    pub unit: Unit,
}

/// The per-run figures, in table order.
pub const FIGURES: &[Figure] = &[
    Figure {
        key: "load_ms",
        label: "load ms",
        unit: Unit::Ms,
    },
    // Only when the child reports it (the residency part of the load: map + import, or
    // staging copy; the rest is Vulkan start-up and pipeline compilation).
    Figure {
        key: "weights_load_ms",
        label: "  of which weights ms",
        unit: Unit::Ms,
    },
    Figure {
        key: "ttft_ms",
        label: "time to first token ms",
        unit: Unit::Ms,
    },
    Figure {
        key: "prefill_tok_s",
        label: "prefill tok/s",
        unit: Unit::TokS,
    },
    Figure {
        key: "decode_tok_s",
        label: "decode tok/s",
        unit: Unit::TokS,
    },
    // Per run: prefill tok/s over decode tok/s (prefill should run several times faster than decode).
    Figure {
        key: "prefill_over_decode",
        label: "prefill/decode tok/s",
        unit: Unit::Ratio,
    },
    Figure {
        key: "rss_anon_kb",
        label: "RssAnon MiB",
        unit: Unit::Kib,
    },
    // Mesa 25's lavapipe keeps device memory in a memfd: a copy shows up here, not in
    // RssAnon (a private copy is RssAnon + RssShmem on any driver)
    Figure {
        key: "rss_shmem_kb",
        label: "RssShmem MiB",
        unit: Unit::Kib,
    },
    Figure {
        key: "rss_file_kb",
        label: "RssFile MiB",
        unit: Unit::Kib,
    },
    Figure {
        key: "pss_kb",
        label: "Pss MiB",
        unit: Unit::Kib,
    },
    Figure {
        key: "peak_rss_kb",
        label: "peak RSS (VmHWM) MiB",
        unit: Unit::Kib,
    },
    Figure {
        key: "device_bytes",
        label: "device memory MiB",
        unit: Unit::Bytes,
    },
    Figure {
        key: "file_resident_bytes",
        label: "model file resident MiB",
        unit: Unit::Bytes,
    },
    Figure {
        key: "file_resident_at_start_bytes",
        label: "resident at start MiB",
        unit: Unit::Bytes,
    },
];

/// The figures of one group of `--procs N` runs.
pub const GROUP_FIGURES: &[Figure] = &[
    Figure {
        key: "sum_pss_kb",
        label: "sum of Pss MiB",
        unit: Unit::Kib,
    },
    Figure {
        key: "mem_available_drop_kb",
        label: "MemAvailable drop MiB",
        unit: Unit::Kib,
    },
];

impl Unit {
    pub fn show(self, v: f64) -> String {
        match self {
            Unit::Ms => format!("{v:.1}"),
            Unit::TokS => format!("{v:.2}"),
            Unit::Kib => format!("{:.1}", v / 1024.0),
            Unit::Bytes => format!("{:.1}", v / (1024.0 * 1024.0)),
            Unit::Ratio => format!("{v:.2}"),
        }
    }
}

/// The value of a per-run figure, if the run succeeded and reported it.
pub fn run_value(r: &RunRecord, key: &str) -> Option<f64> {
    let stats = r.child.stats.as_ref().ok()?;
    match key {
        "peak_rss_kb" => stats.get("vm_hwm_kb")?.as_f64(),
        "file_resident_at_start_bytes" => r.residency_at_start.map(|x| x.resident_bytes as f64),
        "prefill_over_decode" => {
            let d = stats.get("decode_tok_s")?.as_f64()?;
            (d > 0.0).then_some(stats.get("prefill_tok_s")?.as_f64()? / d)
        }
        _ => stats.get(key)?.as_f64(),
    }
}

/// A group's figures: sum of Pss over its processes (only when every one reported), and
/// the drop in MemAvailable while they were all loaded.
pub fn group_value(g: &GroupRecord, runs: &[RunRecord], key: &str) -> Option<f64> {
    match key {
        "sum_pss_kb" => {
            let members: Vec<&RunRecord> = runs.iter().filter(|r| r.seq == g.seq).collect();
            if members.len() != g.procs {
                return None;
            }
            members.iter().map(|r| run_value(r, "pss_kb")).sum()
        }
        "mem_available_drop_kb" => {
            Some(g.mem_available_before_kb? as f64 - g.mem_available_loaded_kb? as f64)
        }
        _ => None,
    }
}

/// The summary of one N (the whole A/B without --procs).
pub struct ProcsSummary {
    pub n: usize,
    /// Per arm, per figure key (per-run and group figures alike).
    pub arms: Vec<BTreeMap<&'static str, Spread>>,
    /// Per arm: runs that failed, and how many of those the bench or a signal killed.
    pub failures: Vec<(usize, usize)>,
    /// (numerator arm, denominator arm, per figure key the pairwise-ratio spread).
    pub ratios: Vec<(usize, usize, BTreeMap<&'static str, Spread>)>,
    /// The same pairs, per figure key the spread of the pairwise differences.
    pub differences: Vec<(usize, usize, BTreeMap<&'static str, Spread>)>,
}

/// Summaries for every N run.
pub struct Summary {
    pub by_procs: Vec<ProcsSummary>,
}

/// Which arm pairs get ratios: every arm against `copy` (the baseline; the first arm when
/// there is no copy arm), and an ablation arm against the arm of its mode.
pub fn ratio_pairs(arms: &[Arm]) -> Vec<(usize, usize)> {
    let base = arms.iter().position(|a| a.name == "copy").unwrap_or(0);
    let mut pairs = Vec::new();
    for (i, a) in arms.iter().enumerate() {
        if i != base {
            pairs.push((i, base));
        }
        if a.sync_each_layer {
            if let Some(j) = arms
                .iter()
                .position(|b| b.mode == a.mode && !b.sync_each_layer)
            {
                if j != base {
                    pairs.push((i, j));
                }
            }
        }
    }
    pairs
}

impl Summary {
    pub fn new(b: &Bench) -> Summary {
        let by_procs = b.procs.iter().map(|&n| ProcsSummary::of(b, n)).collect();
        Summary { by_procs }
    }
}

/// Per figure key: its values' spread, or the spread of the pairwise ratios or
/// differences of two arms' values.
type Figures = BTreeMap<&'static str, Spread>;

impl ProcsSummary {
    /// The runs and groups of `n` processes at once.
    fn of(b: &Bench, n: usize) -> ProcsSummary {
        let sel = Selection { b, n };
        let keys = sel.figure_keys();
        let arms = (0..b.arms.len())
            .map(|arm| {
                keys.iter()
                    .filter_map(|&(key, group)| {
                        let values: Vec<f64> = sel
                            .keyed(arm, key, group)
                            .into_iter()
                            .map(|(_, v)| v)
                            .collect();
                        Some((key, spread(&values)?))
                    })
                    .collect()
            })
            .collect();
        let failures = (0..b.arms.len()).map(|arm| sel.failures(arm)).collect();
        // A drop in MemAvailable can be negative (noise): compared by difference only.
        let ratio_keys: Vec<_> = keys
            .iter()
            .copied()
            .filter(|&(key, _)| key != "mem_available_drop_kb")
            .collect();
        let ratios = sel.pairwise(&ratio_keys, |x, y| pair_ratio_spread(x, y));
        let differences = sel.pairwise(&keys, |x, y| spread(&pair_differences(x, y)));
        ProcsSummary {
            n,
            arms,
            failures,
            ratios,
            differences,
        }
    }
}

/// The records of one N.
struct Selection<'b> {
    b: &'b Bench,
    n: usize,
}

/// A figure's values keyed by (repetition, process), so two arms pair up.
type Keyed = Vec<((usize, usize), f64)>;

impl Selection<'_> {
    fn runs_of(&self, arm: usize) -> impl Iterator<Item = &RunRecord> {
        let n = self.n;
        self.b
            .runs
            .iter()
            .filter(move |r| r.arm == arm && r.procs == n)
    }

    /// Every figure's key, and whether it is a group figure (with `--procs`).
    fn figure_keys(&self) -> Vec<(&'static str, bool)> {
        FIGURES
            .iter()
            .map(|f| (f.key, false))
            .chain(
                GROUP_FIGURES
                    .iter()
                    .filter(|_| self.b.grouped)
                    .map(|f| (f.key, true)),
            )
            .collect()
    }

    /// One arm's values of figure `key`: per run, or per group.
    fn keyed(&self, arm: usize, key: &str, group: bool) -> Keyed {
        if group {
            let n = self.n;
            self.b
                .groups
                .iter()
                .filter(|g| g.arm == arm && g.procs == n)
                .filter_map(|g| Some(((g.repetition, 0), group_value(g, &self.b.runs, key)?)))
                .collect()
        } else {
            self.runs_of(arm)
                .filter_map(|r| Some(((r.repetition, r.process), run_value(r, key)?)))
                .collect()
        }
    }

    /// The arm's failed runs, and how many of those the bench or a signal killed.
    fn failures(&self, arm: usize) -> (usize, usize) {
        let failed: Vec<&RunRecord> = self
            .runs_of(arm)
            .filter(|r| r.child.stats.is_err())
            .collect();
        let killed = failed
            .iter()
            .filter(|r| {
                r.child
                    .stats
                    .as_ref()
                    .err()
                    .is_some_and(|f| f.killed_by_bench || f.signal.is_some())
            })
            .count();
        (failed.len(), killed)
    }

    /// For every arm pair of [`ratio_pairs`], `compare` of the two arms' values of each key.
    fn pairwise(
        &self,
        keys: &[(&'static str, bool)],
        compare: impl Fn(&Keyed, &Keyed) -> Option<Spread>,
    ) -> Vec<(usize, usize, Figures)> {
        ratio_pairs(&self.b.arms)
            .into_iter()
            .map(|(a, d)| {
                let figures = keys
                    .iter()
                    .filter_map(|&(key, group)| {
                        Some((
                            key,
                            compare(&self.keyed(a, key, group), &self.keyed(d, key, group))?,
                        ))
                    })
                    .collect();
                (a, d, figures)
            })
            .collect()
    }
}

/// One line on stderr after each group.
pub fn progress_line(arm: &Arm, g: &GroupRecord, runs: &[RunRecord], grouped: bool) -> String {
    let mut parts = vec![format!("{} (repetition {}", arm.name, g.repetition + 1)];
    if grouped {
        parts[0].push_str(&format!(", {} processes)", g.procs));
    } else {
        parts[0].push(')');
    }
    for r in runs {
        match &r.child.stats {
            Ok(_) => parts.push(format!(
                "load {} ms, decode {} tok/s, RssAnon {} MiB",
                run_value(r, "load_ms").map_or("?".into(), |v| format!("{v:.0}")),
                run_value(r, "decode_tok_s").map_or("?".into(), |v| format!("{v:.2}")),
                run_value(r, "rss_anon_kb").map_or("?".into(), |v| format!("{:.1}", v / 1024.0)),
            )),
            Err(f) => parts.push(format!(
                "FAILED: {}\n    stderr: {}",
                f.reason,
                f.stderr_tail.trim_end().replace('\n', "\n    stderr: ")
            )),
        }
    }
    if grouped {
        if let Some(d) = group_value(g, runs, "mem_available_drop_kb") {
            parts.push(format!("MemAvailable drop {:.1} MiB", d / 1024.0));
        }
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::super::child::{ChildResult, Failure};
    use super::super::json::to_json;
    use super::super::{plan_arms, Args, Bench, GroupRecord, Mode, RunRecord};
    use super::*;
    use clap::Parser;
    use serde_json::{json, Value};

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    fn ok(decode: f64, pss_kb: f64, anon_kb: f64) -> ChildResult {
        ChildResult {
            pid: 1,
            wall_ms: 1.0,
            stats: Ok(
                json!({"decode_tok_s": decode, "pss_kb": pss_kb, "rss_anon_kb": anon_kb,
                "vm_hwm_kb": 2.0 * pss_kb, "device": "dev", "weights_path": "some path"}),
            ),
            stderr_tail: String::new(),
        }
    }

    fn failed() -> ChildResult {
        ChildResult {
            pid: 2,
            wall_ms: 1.0,
            stats: Err(Failure {
                reason: "killed by signal 9".into(),
                exit_code: None,
                signal: Some(9),
                killed_by_bench: false,
                stderr_tail: "oom".into(),
            }),
            stderr_tail: "oom".into(),
        }
    }

    /// Two arms, --procs 2, three repetitions; copy's third group loses a process.
    fn bench() -> Bench {
        let args = Wrap::parse_from(["x", "-m", "m.gguf", "-r", "3", "--procs", "2"]).args;
        let arms = plan_arms(&[Mode::Import, Mode::Copy], false);
        // (decode tok/s per process, Pss KiB per process) per repetition and arm.
        let import = [
            [(10.0, 100.0), (12.0, 100.0)],
            [(20.0, 100.0), (20.0, 100.0)],
            [(9.0, 100.0), (9.0, 100.0)],
        ];
        let copy = [
            [(5.0, 400.0), (6.0, 400.0)],
            [(40.0, 400.0), (10.0, 400.0)],
            [(3.0, 400.0), (0.0, 0.0)],
        ];
        let mut runs = Vec::new();
        let mut groups = Vec::new();
        let mut seq = 0;
        for rep in 0..3 {
            for (arm, table) in [(0, &import), (1, &copy)] {
                for (process, &(d, p)) in table[rep].iter().enumerate() {
                    let child = if arm == 1 && rep == 2 && process == 1 {
                        failed()
                    } else {
                        ok(d, p, p / 2.0)
                    };
                    runs.push(RunRecord {
                        arm,
                        procs: 2,
                        repetition: rep,
                        process,
                        seq,
                        evicted: false,
                        residency_at_start: None,
                        child,
                    });
                }
                groups.push(GroupRecord {
                    arm,
                    procs: 2,
                    repetition: rep,
                    seq,
                    mem_available_before_kb: Some(10_000),
                    mem_available_loaded_kb: Some(10_000 - if arm == 0 { 50 } else { 800 }),
                    all_reached_barrier: !(arm == 1 && rep == 2),
                });
                seq += 1;
            }
        }
        Bench {
            args,
            arms,
            model: "m.gguf".into(),
            file_size: 4096,
            alignment: 32,
            prompt_source: "test".into(),
            runs,
            groups,
            procs: vec![2],
            grouped: true,
            interrupted: false,
        }
    }

    #[test]
    fn summary_pairs_processes_and_groups_by_repetition() {
        let b = bench();
        let s = Summary::new(&b);
        assert_eq!(s.by_procs.len(), 1);
        let p = &s.by_procs[0];
        // Per-process decode tok/s pairs: 10/5, 12/6, 20/40, 20/10, 9/3 (the failed one
        // has no pair): 2, 2, 0.5, 2, 3 -> median 2.
        let (a, d, r) = &p.ratios[0];
        assert_eq!((*a, *d), (0, 1));
        assert_eq!(r["decode_tok_s"].median, 2.0);
        assert_eq!(r["decode_tok_s"].n, 5);
        // Sum of Pss only over complete groups: 200 vs 800 twice.
        assert_eq!(p.arms[0]["sum_pss_kb"].median, 200.0);
        assert_eq!(p.arms[1]["sum_pss_kb"].n, 2);
        assert_eq!(r["sum_pss_kb"].median, 0.25);
        let (_, _, diff) = &p.differences[0];
        assert_eq!(diff["sum_pss_kb"].median, -600.0);
        assert_eq!(diff["mem_available_drop_kb"].median, -750.0);
        assert!(
            !r.contains_key("mem_available_drop_kb"),
            "no ratio of drops"
        );
        assert_eq!(p.failures, vec![(0, 0), (1, 1)]);
        // Per arm decode tok/s: copy has 5 values 5, 6, 40, 10, 3 -> median 6.
        assert_eq!(p.arms[1]["decode_tok_s"].median, 6.0);
        assert_eq!(
            (p.arms[1]["decode_tok_s"].min, p.arms[1]["decode_tok_s"].max),
            (3.0, 40.0)
        );
        assert_eq!(p.arms[0]["peak_rss_kb"].median, 200.0);
    }

    #[test]
    fn json_keeps_every_run_and_failure() {
        let b = bench();
        let j = to_json(&b, &Summary::new(&b));
        assert_eq!(
            j["arms"]["import"]["runs"].as_array().map(Vec::len),
            Some(6)
        );
        assert_eq!(j["arms"]["copy"]["runs"].as_array().map(Vec::len), Some(5));
        let fail = &j["arms"]["copy"]["failures"][0];
        assert_eq!(fail["signal"], 9);
        assert_eq!(fail["stderr_tail"], "oom");
        assert_eq!(fail["bench"]["repetition"], 2);
        let run = &j["arms"]["import"]["runs"][0];
        assert_eq!(run["peak_rss_kb"], 200.0);
        assert_eq!(run["bench"]["arm"], "import");
        assert_eq!(j["arms"]["copy"]["groups"][2]["sum_pss_kb"], Value::Null);
        assert_eq!(
            j["arms"]["copy"]["groups"][0]["mem_available_drop_kb"],
            800.0
        );
        assert_eq!(
            j["summary"]["ratios"]["import/copy"]["decode_tok_s"]["median"],
            2.0
        );
        assert_eq!(j["summary"]["procs"][0]["procs"], 2);
        assert_eq!(j["device"], "dev");
        assert_eq!(j["weights_path"]["copy"], "some path");
        assert_eq!(
            (j["file_size"].as_u64(), j["alignment"].as_u64()),
            (Some(4096), Some(32))
        );
        let t = super::super::table::table(&b, &Summary::new(&b));
        assert!(
            t.contains("import/copy") && t.contains("sum of Pss MiB"),
            "{t}"
        );
        assert!(
            t.contains("1 (1)"),
            "copy's failure is counted in the table:\n{t}"
        );
    }

    #[test]
    fn ratio_pairs_use_copy_as_baseline_and_the_ablation_against_its_mode() {
        let arms = plan_arms(&[Mode::Import, Mode::Copy, Mode::Auto], true);
        // import, copy, auto, import+sync
        assert_eq!(ratio_pairs(&arms), vec![(0, 1), (2, 1), (3, 1), (3, 0)]);
        let arms = plan_arms(&[Mode::Auto, Mode::Import], false);
        assert_eq!(ratio_pairs(&arms), vec![(1, 0)]);
    }
}

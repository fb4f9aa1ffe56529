//! The benchmark kept as JSON: every run, the per-arm summary, the `--procs` figures
//! and what it ran on (`vkdecode bench --json FILE`).

use serde_json::{json, Map, Value};

use super::report::{group_value, run_value, ProcsSummary, Summary};
use super::stats::Spread;
use super::{Arm, Bench, GroupRecord, RunRecord};

fn spread_json(s: &Spread) -> Value {
    json!({"median": s.median, "min": s.min, "max": s.max, "n": s.n})
}

fn procs_summary_json(b: &Bench, p: &ProcsSummary) -> Value {
    let mut arms = Map::new();
    for (i, arm) in b.arms.iter().enumerate() {
        let mut m: Map<String, Value> = p.arms[i]
            .iter()
            .map(|(k, s)| (k.to_string(), spread_json(s)))
            .collect();
        if b.grouped {
            if let Some(s) = p.arms[i].get("decode_tok_s") {
                m.insert("per_process_decode_tok_s".into(), spread_json(s));
            }
        }
        m.insert("failures".into(), json!(p.failures[i].0));
        m.insert("killed".into(), json!(p.failures[i].1));
        arms.insert(arm.name.clone(), Value::Object(m));
    }
    let mut ratios = Map::new();
    for (a, d, figs) in &p.ratios {
        ratios.insert(
            format!("{}/{}", b.arms[*a].name, b.arms[*d].name),
            Value::Object(
                figs.iter()
                    .map(|(k, s)| (k.to_string(), spread_json(s)))
                    .collect(),
            ),
        );
    }
    let mut differences = Map::new();
    for (a, d, figs) in &p.differences {
        differences.insert(
            format!("{}-{}", b.arms[*a].name, b.arms[*d].name),
            Value::Object(
                figs.iter()
                    .map(|(k, s)| (k.to_string(), spread_json(s)))
                    .collect(),
            ),
        );
    }
    json!({"procs": p.n, "arms": arms, "ratios": ratios, "differences": differences})
}

/// A run as JSON: the child's `--stats-json` object, plus `peak_rss_kb` and a `bench`
/// object saying where it sat in the schedule; a failed run says why instead.
pub fn run_json(b: &Bench, r: &RunRecord) -> Value {
    let mut bench = json!({
        "arm": b.arms[r.arm].name,
        "procs": r.procs,
        "repetition": r.repetition,
        "process": r.process,
        "seq": r.seq,
        "pid": r.child.pid,
        "wall_ms": r.child.wall_ms,
        "evicted_before": r.evicted,
    });
    if let Some(res) = r.residency_at_start {
        bench["file_resident_at_start_bytes"] = json!(res.resident_bytes);
        bench["file_resident_at_start_fraction"] = json!(res.fraction());
    }
    match &r.child.stats {
        Ok(stats) => {
            let mut v = stats.clone();
            v["peak_rss_kb"] = stats.get("vm_hwm_kb").cloned().unwrap_or(Value::Null);
            v["bench"] = bench;
            v
        }
        Err(f) => json!({
            "failed": true,
            "reason": f.reason,
            "exit_code": f.exit_code,
            "signal": f.signal,
            "killed_by_bench": f.killed_by_bench,
            "stderr_tail": f.stderr_tail,
            "bench": bench,
        }),
    }
}

pub fn first_stat(b: &Bench, arm: Option<usize>, keys: &[&str]) -> Value {
    b.runs
        .iter()
        .filter(|r| arm.is_none() || arm == Some(r.arm))
        .filter_map(|r| r.child.stats.as_ref().ok())
        .find_map(|s| {
            keys.iter()
                .find_map(|k| s.get(*k).filter(|v| !v.is_null()).cloned())
        })
        .unwrap_or(Value::Null)
}

/// The whole benchmark as JSON (see benches/README.md).
pub fn to_json(b: &Bench, summary: &Summary) -> Value {
    let arms: Map<String, Value> = b
        .arms
        .iter()
        .enumerate()
        .map(|(i, arm)| (arm.name.clone(), arm_json(b, i, arm)))
        .collect();
    let weights_path: Map<String, Value> = b
        .arms
        .iter()
        .enumerate()
        .map(|(i, a)| (a.name.clone(), first_stat(b, Some(i), &["weights_path"])))
        .collect();
    json!({
        "arms": arms,
        "speed": speed_json(b, summary),
        "device": first_stat(b, None, &["device"]),
        "driver": first_stat(b, None, &["driver", "driver_info", "driver_name"]),
        "kernels": first_stat(b, None, &["kernels"]),
        "backend": first_stat(b, None, &["backend"]),
        "model": b.model.display().to_string(),
        "file_size": b.file_size,
        "alignment": b.alignment,
        "weights_path": weights_path,
        "config": {
            "modes": b.arms.iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
            "repetitions": b.args.repetitions,
            "prompt_tokens": b.args.prompt_tokens,
            "decode_tokens": b.args.decode_tokens,
            "prompt": b.prompt_source,
            "procs": if b.grouped { json!(b.procs) } else { Value::Null },
            "cold": b.args.cold,
            "schedule": "arms alternate within each repetition; each run a fresh process",
        },
        "interrupted": b.interrupted,
        "summary": summary_json(b, summary),
    })
}

/// Arm `i`: its mode, its runs and failed runs, and with `--procs` its groups.
fn arm_json(b: &Bench, i: usize, arm: &Arm) -> Value {
    let (runs, failures): (Vec<&RunRecord>, Vec<&RunRecord>) = b
        .runs
        .iter()
        .filter(|r| r.arm == i)
        .partition(|r| r.child.stats.is_ok());
    let runs: Vec<Value> = runs.into_iter().map(|r| run_json(b, r)).collect();
    let failures: Vec<Value> = failures.into_iter().map(|r| run_json(b, r)).collect();
    let mut a = json!({
        "mode": arm.mode.as_str(),
        "sync_each_layer": arm.sync_each_layer,
        "runs": runs,
        "failures": failures,
    });
    if b.grouped {
        a["groups"] = b
            .groups
            .iter()
            .filter(|g| g.arm == i)
            .map(|g| group_json(b, g))
            .collect();
    }
    a
}

/// One group of N processes: MemAvailable around it, the sum of Pss, each decode speed.
fn group_json(b: &Bench, g: &GroupRecord) -> Value {
    json!({
        "procs": g.procs,
        "repetition": g.repetition,
        "seq": g.seq,
        "mem_available_before_kb": g.mem_available_before_kb,
        "mem_available_loaded_kb": g.mem_available_loaded_kb,
        "mem_available_drop_kb": group_value(g, &b.runs, "mem_available_drop_kb"),
        "sum_pss_kb": group_value(g, &b.runs, "sum_pss_kb"),
        "all_reached_barrier": g.all_reached_barrier,
        "failed": b.runs.iter().filter(|r| r.seq == g.seq && r.child.stats.is_err()).count(),
        "per_process_decode_tok_s": b
            .runs
            .iter()
            .filter(|r| r.seq == g.seq)
            .map(|r| run_value(r, "decode_tok_s"))
            .collect::<Vec<_>>(),
    })
}

/// The first N's arms, ratios and differences, and with `--procs` every N's.
fn summary_json(b: &Bench, summary: &Summary) -> Value {
    let first = summary.by_procs.first().map(|p| procs_summary_json(b, p));
    let part = |k: &str| first.as_ref().map_or(Value::Null, |p| p[k].clone());
    let mut out = json!({
        "arms": part("arms"),
        "ratios": part("ratios"),
        "differences": part("differences"),
    });
    if b.grouped {
        out["procs"] = summary
            .by_procs
            .iter()
            .map(|p| procs_summary_json(b, p))
            .collect();
    }
    out
}

/// The speed figures by themselves, per arm: medians over the runs of time to first
/// token, prefill and decode tok/s, and of the per-run prefill/decode ratio.
fn speed_json(b: &Bench, summary: &Summary) -> Map<String, Value> {
    let first = summary.by_procs.first();
    b.arms
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let med = |k: &str| {
                first
                    .and_then(|p| p.arms[i].get(k))
                    .map_or(Value::Null, |s| json!(s.median))
            };
            (
                a.name.clone(),
                json!({
                    "prompt_tokens": b.args.prompt_tokens,
                    "ttft_ms": med("ttft_ms"),
                    "prefill_tok_s": med("prefill_tok_s"),
                    "decode_tok_s": med("decode_tok_s"),
                    "prefill_over_decode": med("prefill_over_decode"),
                }),
            )
        })
        .collect()
}

//! `vkdecode bench` end to end, with the children on the CPU reference backend (the
//! harness is what is tested here: scheduling, the barrier, eviction, the JSON, the
//! plot, failures) on a tiny synthetic model written by `reference::synthetic`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{q8, signal, Tag, TAG_ENV};

use serde_json::Value;

/// Every key a child's `--stats-json` object carries (see `vkdecode --help`, run.rs).
const RUN_KEYS: &[&str] = &[
    "backend",
    "model",
    "model_bytes",
    "device",
    "weights_mode",
    "weights_path",
    "kernels",
    "kernels_why",
    "device_bytes",
    "kv_bytes",
    "load_ms",
    "ttft_ms",
    "prefill_ms",
    "decode_ms",
    "prefill_tok_s",
    "decode_tok_s",
    "n_prompt",
    "n_generated",
    "stop_reason",
    "ctx_len",
    "temp",
    "seed",
    "prompt_ids",
    "generated_ids",
    "text",
    "rss_anon_kb",
    "rss_file_kb",
    "rss_shmem_kb",
    "pss_kb",
    "private_clean_kb",
    "private_dirty_kb",
    "shared_clean_kb",
    "vm_hwm_kb",
    "file_resident_bytes",
    "peak_rss_kb",
];

/// A scratch dir for one test, on the target dir's disk (tmpfs pages cannot be evicted).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench_cli-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the scratch dir");
    dir
}

/// Writes a tiny llama (2 layers, dim 64, vocab 320, Q8_0) and flushes it to disk.
fn tiny_model(dir: &Path) -> PathBuf {
    let bytes = reference::synthetic::tiny_llama(7, 2, 64, 4, 2, 128, 320, gguf::GgmlType::Q8_0);
    let path = dir.join("tiny.gguf");
    let mut f = std::fs::File::create(&path).expect("creating the model");
    f.write_all(&bytes).expect("writing the model");
    // Dirty pages cannot be evicted: --cold needs them on disk.
    f.sync_all().expect("syncing the model");
    path
}

fn bench(model: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .arg("bench")
        .arg("-m")
        .arg(model)
        .args([
            "--backend",
            "reference",
            "-p",
            "6",
            "-n",
            "3",
            "--timeout",
            "120",
        ])
        .args(extra)
        .output()
        .expect("running vkdecode bench")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "vkdecode bench failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the --json file exists");
    serde_json::from_str(&text).expect("the --json file is JSON")
}

fn runs<'a>(j: &'a Value, arm: &str) -> &'a Vec<Value> {
    j["arms"][arm]["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("arms.{arm}.runs is an array in {j}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is a number"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

#[test]
fn ab_json_keeps_every_run_arms_alternate_and_ratios_are_pairwise() {
    let dir = scratch("ab");
    let model = tiny_model(&dir);
    let json = dir.join("ab.json");
    let out = bench(
        &model,
        &[
            "-r",
            "3",
            "--modes",
            "import,copy",
            "--sync-each-layer",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let stdout = ok(&out);
    assert!(
        stdout.contains("import/copy") && stdout.contains("decode tok/s"),
        "{stdout}"
    );

    let j = read_json(&json);
    assert_eq!(
        j["file_size"].as_u64(),
        Some(std::fs::metadata(&model).unwrap().len())
    );
    assert_eq!(j["alignment"].as_u64(), Some(32));
    assert_eq!(j["model"].as_str(), model.to_str());
    assert!(
        j["device"].is_string(),
        "device from the children's stats: {}",
        j["device"]
    );
    assert!(
        j["driver"].as_str().is_some_and(|d| !d.is_empty()),
        "the driver's name and version: {}",
        j["driver"]
    );
    assert_eq!(
        j["kernels"], "reference",
        "the reference runs no GPU kernels"
    );
    for arm in ["import", "copy", "import+sync"] {
        assert!(
            j["weights_path"][arm].is_string(),
            "weights_path.{arm} in {}",
            j["weights_path"]
        );
        let runs = runs(&j, arm);
        assert_eq!(runs.len(), 3, "three repetitions of {arm}");
        for r in runs {
            for key in RUN_KEYS {
                assert!(r.get(*key).is_some(), "{arm} run lacks {key}: {r}");
            }
            assert_eq!(r["peak_rss_kb"], r["vm_hwm_kb"]);
            assert!(f(&r["peak_rss_kb"]) > 0.0);
            assert_eq!(r["n_prompt"], 6);
            assert_eq!(r["n_generated"], 3, "--ignore-eos keeps every run to -n");
        }
    }
    // Same prompt and (greedy) same tokens in every run.
    let first = &runs(&j, "import")[0];
    for arm in ["import", "copy", "import+sync"] {
        for r in runs(&j, arm) {
            assert_eq!(r["prompt_ids"], first["prompt_ids"]);
            assert_eq!(r["generated_ids"], first["generated_ids"]);
        }
    }
    // A B C A B C ...: a run's place in the schedule is 3 * repetition + arm.
    for (a, arm) in ["import", "copy", "import+sync"].iter().enumerate() {
        let seqs: Vec<u64> = runs(&j, arm)
            .iter()
            .map(|r| r["bench"]["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(
            seqs,
            vec![a as u64, 3 + a as u64, 6 + a as u64],
            "{arm} ran out of turn"
        );
    }
    // The summary's ratio is the median of run-by-run ratios, recomputed here.
    for key in [
        "load_ms",
        "decode_tok_s",
        "prefill_tok_s",
        "peak_rss_kb",
        "pss_kb",
    ] {
        let by_rep = |arm: &str| -> Vec<(u64, f64)> {
            runs(&j, arm)
                .iter()
                .map(|r| (r["bench"]["repetition"].as_u64().unwrap(), f(&r[key])))
                .collect()
        };
        let (a, b) = (by_rep("import"), by_rep("copy"));
        let ratios: Vec<f64> = a
            .iter()
            .map(|(rep, x)| x / b.iter().find(|(r, _)| r == rep).unwrap().1)
            .collect();
        let got = f(&j["summary"]["ratios"]["import/copy"][key]["median"]);
        let want = median(ratios);
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{key}: summary {got}, pairs give {want}"
        );
        let spread = &j["summary"]["arms"]["copy"][key];
        let values: Vec<f64> = b.iter().map(|(_, v)| *v).collect();
        assert_eq!(f(&spread["median"]), median(values.clone()), "{key}");
        assert_eq!(
            f(&spread["min"]),
            values.iter().copied().fold(f64::INFINITY, f64::min)
        );
        assert_eq!(
            f(&spread["max"]),
            values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        );
    }
    assert!(j["summary"]["ratios"]["import+sync/import"]["decode_tok_s"]["median"].is_number());
    assert!(j["summary"]["differences"]["import-copy"]["rss_anon_kb"]["median"].is_number());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn procs_meet_at_the_barrier_and_report_shared_memory() {
    let dir = scratch("procs");
    let model = tiny_model(&dir);
    let json = dir.join("procs.json");
    let stdout = ok(&bench(
        &model,
        &["-r", "1", "--procs", "2", "--json", json.to_str().unwrap()],
    ));
    assert!(
        stdout.contains("--procs 2") && stdout.contains("sum of Pss"),
        "{stdout}"
    );
    let j = read_json(&json);
    for arm in ["import", "copy"] {
        let runs = runs(&j, arm);
        assert_eq!(runs.len(), 2, "two processes of {arm}");
        let pids: Vec<u64> = runs
            .iter()
            .map(|r| r["bench"]["pid"].as_u64().unwrap())
            .collect();
        assert_ne!(pids[0], pids[1]);
        let g = &j["arms"][arm]["groups"][0];
        assert_eq!(g["all_reached_barrier"], true, "{g}");
        assert_eq!(g["failed"], 0);
        assert!(
            g["mem_available_before_kb"].is_u64() && g["mem_available_loaded_kb"].is_u64(),
            "{g}"
        );
        let sum: f64 = runs.iter().map(|r| f(&r["pss_kb"])).sum();
        assert_eq!(f(&g["sum_pss_kb"]), sum, "sum of Pss over the group");
        assert_eq!(
            g["per_process_decode_tok_s"].as_array().map(Vec::len),
            Some(2)
        );
        let s = &j["summary"]["procs"][0];
        assert_eq!(s["procs"], 2);
        assert_eq!(f(&s["arms"][arm]["sum_pss_kb"]["median"]), sum);
        assert_eq!(s["arms"][arm]["failures"], 0);
        assert!(s["arms"][arm]["per_process_decode_tok_s"]["median"].is_number());
        assert!(s["arms"][arm]["mem_available_drop_kb"]["median"].is_number());
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn on_tmpfs(path: &Path) -> bool {
    let canon = path.canonicalize().unwrap_or_default();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best = (0, false);
    for line in mounts.lines() {
        let v: Vec<&str> = line.split_whitespace().collect();
        if v.len() > 2 && canon.starts_with(v[1]) && v[1].len() >= best.0 {
            best = (v[1].len(), v[2] == "tmpfs" || v[2] == "ramfs");
        }
    }
    best.1
}

#[test]
fn cold_evicts_before_each_run_and_plot_writes_an_svg() {
    let dir = scratch("cold");
    let model = tiny_model(&dir);
    let json = dir.join("cold.json");
    let svg = dir.join("ab.svg");
    let out = bench(
        &model,
        &[
            "-r",
            "2",
            "--cold",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("evicted"),
        "--cold says so"
    );
    let j = read_json(&json);
    assert_eq!(j["config"]["cold"], true);
    for arm in ["import", "copy"] {
        for r in runs(&j, arm) {
            assert_eq!(r["bench"]["evicted_before"], true);
            let frac = f(&r["bench"]["file_resident_at_start_fraction"]);
            if !on_tmpfs(&model) {
                assert!(
                    frac < 0.5,
                    "{frac} of the model still resident after eviction"
                );
            }
            // The child read the model: it is resident by the time it measured.
            assert!(f(&r["file_resident_bytes"]) > 0.0);
        }
    }
    let text = std::fs::read_to_string(&svg).expect("the SVG exists");
    assert!(
        text.trim_start().starts_with("<svg"),
        "{}",
        &text[..text.len().min(200)]
    );
    assert!(text.trim_end().ends_with("</svg>"));
    for needle in [
        "decode tok/s",
        "memory per process",
        "RssAnon",
        ">\nimport\n<",
        ">\ncopy\n<",
        "<rect",
    ] {
        assert!(text.contains(needle), "the plot lacks {needle:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn procs_plot_has_pss_versus_n() {
    let dir = scratch("procs-plot");
    let model = tiny_model(&dir);
    let svg = dir.join("procs.svg");
    ok(&bench(
        &model,
        &["-r", "1", "--procs", "1,2", "--plot", svg.to_str().unwrap()],
    ));
    let text = std::fs::read_to_string(&svg).expect("the SVG exists");
    assert!(
        text.contains("sum of Pss over N processes"),
        "no Pss-vs-N panel"
    );
    assert!(text.contains("<polyline"), "no line series");
    std::fs::remove_dir_all(&dir).ok();
}

/// The speed figures by themselves: time to first token, prefill and decode
/// tok/s and their ratio, per arm, in the table, the JSON (`speed` and the summary) and
/// the plot; a long prompt is exactly `-p` tokens (the text repeated).
#[test]
fn long_prompt_reports_time_to_first_token_and_prefill_apart_from_decode() {
    let dir = scratch("speed");
    let model = tiny_model(&dir);
    let json = dir.join("speed.json");
    let svg = dir.join("speed.svg");
    // bench() fixes -p 6: the same arguments with a 100-token prompt
    let out = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .arg("bench")
        .arg("-m")
        .arg(&model)
        .args(["--backend", "reference", "-p", "100", "-n", "3", "-r", "2"])
        .args(["--timeout", "120", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("running vkdecode bench");
    let stdout = ok(&out);
    for label in [
        "time to first token ms",
        "prefill tok/s",
        "decode tok/s",
        "prefill/decode tok/s",
    ] {
        assert!(stdout.contains(label), "no {label:?} row in\n{stdout}");
    }
    let j = read_json(&json);
    assert_eq!(j["config"]["prompt_tokens"], 100);
    for arm in ["import", "copy"] {
        let rs = runs(&j, arm);
        for r in rs {
            assert_eq!(r["n_prompt"], 100, "exactly -p tokens: {r}");
            assert_eq!(r["prompt_ids"].as_array().map(Vec::len), Some(100));
        }
        let v = &j["speed"][arm];
        assert_eq!(v["prompt_tokens"], 100, "{v}");
        for key in [
            "ttft_ms",
            "prefill_tok_s",
            "decode_tok_s",
            "prefill_over_decode",
        ] {
            let x = f(&v[key]);
            assert!(x.is_finite() && x > 0.0, "speed.{arm}.{key} = {x}");
            assert_eq!(
                j["summary"]["arms"][arm][key]["median"], v[key],
                "speed.{arm}.{key} is the summary's median"
            );
        }
        // the medians of what the runs reported, and the ratio per run
        let med = |k: &str| median(rs.iter().map(|r| f(&r[k])).collect());
        for key in ["ttft_ms", "prefill_tok_s", "decode_tok_s"] {
            let (got, want) = (f(&v[key]), med(key));
            assert!((got - want).abs() <= 1e-9 * want, "{key}: {got} vs {want}");
        }
        let ratio = median(
            rs.iter()
                .map(|r| f(&r["prefill_tok_s"]) / f(&r["decode_tok_s"]))
                .collect(),
        );
        assert!((f(&v["prefill_over_decode"]) - ratio).abs() <= 1e-9 * ratio);
        // time to first token covers the prefill of the whole prompt
        for r in rs {
            assert!(f(&r["ttft_ms"]) >= f(&r["prefill_ms"]) * 0.999, "{r}");
        }
    }
    let text = std::fs::read_to_string(&svg).expect("the SVG exists");
    for caption in [
        "decode tok/s",
        "prefill tok/s, 100-token prompt",
        "time to first token ms",
    ] {
        assert!(text.contains(caption), "no {caption:?} panel in the SVG");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_failing_child_is_reported_with_its_stderr_not_a_panic() {
    let dir = scratch("fail");
    let model = tiny_model(&dir);
    let json = dir.join("fail.json");
    let out = bench(
        &model,
        &[
            "-r",
            "1",
            "--procs",
            "2",
            "--child-arg=--no-such-flag",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "failed runs make the bench fail:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("FAILED: exited with status 2"), "{stderr}");
    assert!(
        stderr.contains("--no-such-flag"),
        "the child's stderr tail is shown:\n{stderr}"
    );
    assert!(stderr.contains("4 of 4 runs failed"), "{stderr}");
    let j = read_json(&json);
    for arm in ["import", "copy"] {
        assert_eq!(runs(&j, arm).len(), 0);
        let failures = j["arms"][arm]["failures"]
            .as_array()
            .expect("failures array");
        assert_eq!(failures.len(), 2);
        assert_eq!(failures[0]["exit_code"], 2);
        assert!(failures[0]["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("--no-such-flag"));
        assert_eq!(j["summary"]["arms"][arm]["failures"], 2);
        assert_eq!(j["arms"][arm]["groups"][0]["all_reached_barrier"], false);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let dir = scratch("args");
    let missing = dir.join("missing.gguf");
    let out = bench(&missing, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing.gguf"), "{stderr}");
    let model = tiny_model(&dir);
    for (args, msg) in [
        (&["-r", "0"][..], "repetitions"),
        (&["--procs", "0"][..], "--procs"),
    ] {
        let out = bench(&model, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(msg) && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The same harness with the real engine: children on Vulkan (lavapipe in CI), one run
/// per arm, `--profile`, and `--kernels gpu`. Fails without a Vulkan device unless
/// VKDECODE_ALLOW_NO_GPU=1.
#[test]
fn vulkan_children_report_the_residency_path_taken() {
    let dir = scratch("vulkan");
    let model = tiny_model(&dir);
    let json = dir.join("vk.json");
    let out = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .arg("bench")
        .arg("-m")
        .arg(&model)
        .args([
            "-r",
            "1",
            "-p",
            "4",
            "-n",
            "2",
            "--timeout",
            "300",
            "--profile",
            "--kernels",
            "gpu",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("running vkdecode bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success()
        && stderr.contains("starting Vulkan")
        && std::env::var("VKDECODE_ALLOW_NO_GPU").as_deref() == Ok("1")
    {
        eprintln!("note: no Vulkan device, skipping (VKDECODE_ALLOW_NO_GPU=1):\n{stderr}");
        return;
    }
    let stdout = ok(&out);
    // --profile: one more child per mode, its per-kernel tables printed after the A/B:
    // the last prefill chunk (the whole 4-token prompt), then one decode token, each
    // naming the dispatches it timed.
    for mode in ["import", "copy"] {
        let head = format!(
            "per-kernel GPU time of the last prefill chunk and of one decode token, {mode}:"
        );
        let section = stdout
            .split(&head)
            .nth(1)
            .unwrap_or_else(|| panic!("no {head:?} in\n{stdout}\nstderr:\n{stderr}"));
        let lines: Vec<&str> = section.lines().skip(1).collect();
        assert_eq!(
            lines.first().copied(),
            Some("profile: the last prefill chunk (4 tokens)"),
            "{mode}: the prefill profile is missing:\n{section}"
        );
        let dec = lines
            .iter()
            .position(|l| *l == "profile: one decode token")
            .unwrap_or_else(|| panic!("{mode}: no decode profile:\n{section}"));
        for (what, table) in [("prefill", &lines[1..dec]), ("decode", &lines[dec + 1..])] {
            assert!(
                table.first().is_some_and(|l| l.starts_with("kernel")),
                "{mode} {what}: no table header:\n{section}"
            );
            for kernel in ["qkv", "attention", "gate_up", "ffn_down", "logits"] {
                assert!(
                    table.iter().any(|l| l.starts_with(kernel)),
                    "{mode} {what}: no {kernel} row:\n{section}"
                );
            }
            let total = table
                .iter()
                .find(|l| l.starts_with("total"))
                .unwrap_or_else(|| panic!("{mode} {what}: no total:\n{section}"));
            let ms: f64 = total.split_whitespace().nth(2).unwrap().parse().unwrap();
            assert!(ms > 0.0, "{mode} {what}: {total}");
        }
    }
    let j = read_json(&json);
    assert_eq!(j["backend"], "vulkan");
    assert!(j["device"].is_string());
    let import = &runs(&j, "import")[0];
    let copy = &runs(&j, "copy")[0];
    // --kernels reaches every child, and the JSON records the profile and the driver
    assert_eq!(j["kernels"], "gpu", "{}", j["kernels"]);
    for r in [import, copy] {
        assert_eq!(r["kernels"], "gpu", "{}", r["kernels_why"]);
        assert!(
            r["kernels_why"]
                .as_str()
                .is_some_and(|w| w.starts_with("asked for")),
            "{}",
            r["kernels_why"]
        );
    }
    assert!(
        j["driver"].as_str().is_some_and(|d| !d.trim().is_empty()),
        "the driver's name and version: {}",
        j["driver"]
    );
    assert!(
        j["weights_path"]["import"]
            .as_str()
            .unwrap_or("")
            .starts_with("import"),
        "{}",
        j["weights_path"]
    );
    assert_eq!(j["weights_path"]["copy"], "copy");
    // device_bytes counts the KV cache too
    assert!(f(&import["kv_bytes"]) > 0.0, "{import}");
    assert_eq!(
        import["device_bytes"], import["kv_bytes"],
        "import allocates no device memory for weights, only the KV cache"
    );
    assert!(
        f(&copy["device_bytes"]) > f(&copy["kv_bytes"]),
        "copy holds the weights in device memory"
    );
    // Greedy decoding does not depend on where the weights live.
    assert_eq!(import["generated_ids"], copy["generated_ids"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Entries left in `dir`, waiting up to `limit` for it to empty.
fn left_in(dir: &Path, limit: Duration) -> Vec<PathBuf> {
    let start = Instant::now();
    loop {
        let left: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        if left.is_empty() || start.elapsed() > limit {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGINT already stopped the bench and its children (they share its process group, so
/// a terminal's Ctrl-C reaches them all) and removed its temp dir. SIGTERM and SIGHUP
/// (`kill`, `timeout`, a closed terminal) and SIGKILL reach the bench alone: they used to
/// leave its decoders running and its temp dir behind. Now within 2 s of any of them
/// (and of `timeout`) no process of the bench is left and the temp dir is gone.
#[test]
fn a_signal_to_the_bench_leaves_no_child_and_no_temp_dir() {
    let model = q8();
    for sig in ["TERM", "HUP", "KILL", "timeout"] {
        let tmp = scratch(&format!("signal-{sig}"));
        let tag = Tag::new(&format!("bench-{sig}"));
        let mut cmd = if sig == "timeout" {
            let mut c = Command::new("timeout");
            c.arg("8").arg(env!("CARGO_BIN_EXE_vkdecode"));
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        };
        let mut child = cmd
            .arg("bench")
            .arg("-m")
            .arg(&model)
            .args(["--modes", "import", "-r", "2", "-p", "16", "-n", "1000"])
            .env("TMPDIR", &tmp)
            .env(TAG_ENV, &tag.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("running vkdecode bench");
        // wait until a decoder runs, and a little longer (it loads the model)
        let start = Instant::now();
        while !tag
            .processes()
            .iter()
            .any(|(_, cmd)| cmd.contains("--stats-json"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{sig}: no child decoder within a minute"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(1500));
        if sig != "timeout" {
            assert!(signal(child.id(), sig));
        }
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{sig}: the bench still runs"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let ended = Instant::now();
        let left = tag.wait_gone(Duration::from_secs(2));
        assert!(left.is_empty(), "{sig}: {status}: still running: {left:?}");
        let files = left_in(&tmp, Duration::from_secs(2).saturating_sub(ended.elapsed()));
        assert!(files.is_empty(), "{sig}: {status}: left behind: {files:?}");
        match sig {
            "TERM" => assert_eq!(status.code(), Some(143), "{status}"),
            "HUP" => assert_eq!(status.code(), Some(129), "{status}"),
            "timeout" => assert_eq!(status.code(), Some(124), "{status}"),
            _ => {}
        }
        std::fs::remove_dir_all(&tmp).ok();
    }
}

/// `--procs N` started N decoders whatever N was (`--procs 1000000` forks until memory
/// runs out). A count that the available memory cannot hold is now refused before any
/// child starts, naming the figures.
#[test]
fn procs_beyond_the_available_memory_are_refused_up_front() {
    let dir = scratch("procs-mem");
    let model = tiny_model(&dir);
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let tag = Tag::new("bench-procs");
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .arg("bench")
        .arg("-m")
        .arg(&model)
        .args(["--backend", "reference", "-p", "6", "-n", "3", "-r", "1"])
        .args(["--procs", "1,1000000"])
        .env("TMPDIR", &tmp)
        .env(TAG_ENV, &tag.0)
        .output()
        .expect("running vkdecode bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--procs 1000000") && stderr.contains("MemAvailable"),
        "{stderr}"
    );
    assert!(!stderr.contains("[1/"), "no run may start: {stderr}");
    assert!(start.elapsed() < Duration::from_secs(20), "{stderr}");
    assert!(left_in(&tmp, Duration::ZERO).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}

/// `--json` and `--plot` paths were opened only after every run had finished, so a typo
/// in the path threw the whole benchmark away. They are checked before the first run.
#[test]
fn unwritable_output_paths_are_refused_before_any_run() {
    let dir = scratch("outputs");
    let model = tiny_model(&dir);
    let missing = dir.join("no-such-dir").join("out.json");
    for (flag, path) in [
        ("--json", missing.clone()),
        ("--plot", missing.with_extension("svg")),
        ("--json", dir.clone()),
        ("--plot", dir.clone()),
    ] {
        let out = bench(&model, &["-r", "1", flag, path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {path:?}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(path.to_str().unwrap()),
            "{flag} {path:?}: {stderr}"
        );
        assert!(
            !stderr.contains("[1/"),
            "{flag} {path:?}: a run started first: {stderr}"
        );
    }
    // a FIFO that nothing reads: checking it blocked for ever before the first run (the
    // test's own `timeout` bounds a regression)
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for flag in ["--json", "--plot"] {
        let out = Command::new("timeout")
            .arg("60")
            .arg(env!("CARGO_BIN_EXE_vkdecode"))
            .arg("bench")
            .arg("-m")
            .arg(&model)
            .args(["--backend", "reference", "-p", "6", "-n", "3", "-r", "1"])
            .arg(flag)
            .arg(&fifo)
            .stdin(Stdio::null())
            .output()
            .expect("running vkdecode bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} FIFO: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("FIFO that nothing reads"),
            "{flag} FIFO: {stderr}"
        );
        assert!(
            !stderr.contains("[1/"),
            "{flag} FIFO: a run started: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

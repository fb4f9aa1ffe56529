//! The main command end to end, as a user runs it: `vkdecode -m model.gguf -p "..."`,
//! on both backends, its stats, and its answers to bad input; plus `info` and
//! `inspect --plan`, which report what the residency layer decides on this device.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{collect, signal, wait_for, Tag, TAG_ENV};

use serde_json::Value;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn model(name: &str) -> PathBuf {
    let path = models().join(name);
    assert!(
        path.exists(),
        "{} is missing: run models/fetch to download the default model",
        path.display()
    );
    path
}

fn q8() -> PathBuf {
    model("SmolLM2-135M-Instruct.Q8_0.gguf")
}

fn vkdecode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .args(args)
        .output()
        .expect("run vkdecode")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "vkdecode failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

fn fails_with(out: &Output, needle: &str) {
    assert!(!out.status.success(), "expected a failure, got success");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle),
        "stderr should mention {needle:?}, got: {err}"
    );
    assert!(
        !err.contains("panicked"),
        "a panic is never an answer: {err}"
    );
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("stats file written");
    serde_json::from_str(&text).expect("stats file is JSON")
}

/// llama.cpp's greedy continuation of "The capital of France is" on the Q8_0 file:
/// " Paris.\n\nThe answer is: 2018-01-22 12:12:53." then EOS.
const PARIS: [u64; 29] = [
    7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33, 40, 29, 32, 33, 29, 34, 34, 216, 33,
    34, 42, 33, 34, 42, 37, 35, 30,
];

#[test]
fn vulkan_greedy_decode_prints_paris_and_its_stats() {
    let dir = tempdir();
    let stats = dir.join("stats.json");
    let out = vkdecode(&[
        "-m",
        q8().to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "32",
        "--temp",
        "0",
        "--stats-json",
        stats.to_str().unwrap(),
    ]);
    let text = ok(&out);
    assert_eq!(text, " Paris.\n\nThe answer is: 2018-01-22 12:12:53.\n");
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "device:",
        "weights: auto -> import(file)",
        "decode:",
        "RssAnon",
    ] {
        assert!(
            err.contains(needle),
            "stats on stderr lack {needle:?}: {err}"
        );
    }

    let s = read_json(&stats);
    for key in [
        "backend",
        "device",
        "weights_mode",
        "weights_path",
        "model_bytes",
        "load_ms",
        "rss_anon_kb",
        "rss_file_kb",
        "pss_kb",
        "device_bytes",
        "file_resident_bytes",
        "ttft_ms",
        "prefill_tok_s",
        "decode_tok_s",
        "prompt_ids",
        "generated_ids",
        "text",
    ] {
        assert!(s.get(key).is_some(), "--stats-json lacks {key}: {s}");
    }
    assert_eq!(s["backend"], "vulkan");
    assert_eq!(s["weights_mode"], "auto");
    assert_eq!(s["weights_path"], "import(file)");
    assert_eq!(s["stop_reason"], "eog");
    assert_eq!(
        s["prompt_ids"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    assert_eq!(s["generated_ids"], serde_json::json!(PARIS));
    assert_eq!(
        s["model_bytes"].as_u64(),
        Some(q8().metadata().unwrap().len())
    );
    assert!(s["decode_tok_s"].as_f64().unwrap() > 0.0);
    // Condition 2 of docs/design.md ("The three conditions"): with greedy sampling the
    // host reads back one u32 per token.
    let n_tokens = PARIS.len() as u64 + 1;
    assert_eq!(s["bytes_read_back"].as_u64(), Some(4 * n_tokens), "{s}");
}

#[test]
fn reference_backend_prints_paris() {
    let out = vkdecode(&[
        "-m",
        q8().to_str().unwrap(),
        "-p",
        "The capital of France is",
        "--backend",
        "reference",
        "-n",
        "32",
    ]);
    let text = ok(&out);
    assert_eq!(text, " Paris.\n\nThe answer is: 2018-01-22 12:12:53.\n");
}

#[test]
fn copy_and_import_give_the_same_tokens_and_check_agrees() {
    let dir = tempdir();
    let mut generated = Vec::new();
    for weights in ["import", "copy"] {
        let stats = dir.join(format!("{weights}.json"));
        let out = vkdecode(&[
            "-m",
            q8().to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "8",
            "--temp",
            "0",
            "--check",
            "--weights",
            weights,
            "--stats-json",
            stats.to_str().unwrap(),
        ]);
        ok(&out);
        let s = read_json(&stats);
        assert_eq!(s["weights_mode"], weights);
        let expected_path = if weights == "copy" {
            "copy"
        } else {
            "import(file)"
        };
        assert_eq!(s["weights_path"], expected_path);
        // --check runs the f32 reference beside the GPU: the logits agree closely.
        let diff = s["check_max_logit_diff"].as_f64().unwrap();
        assert!(diff < 0.05, "GPU vs reference logits differ by {diff}");
        generated.push(s["generated_ids"].clone());
    }
    assert_eq!(generated[0], generated[1]);
}

#[test]
fn sampling_is_reproducible_with_a_seed() {
    let run = |seed: &str| {
        let out = vkdecode(&[
            "-m",
            q8().to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "12",
            "--seed",
            seed,
            "--temp",
            "1.0",
        ]);
        ok(&out)
    };
    assert_eq!(run("7"), run("7"));
}

#[test]
fn chat_template_is_applied() {
    let dir = tempdir();
    let stats = dir.join("chat.json");
    let out = vkdecode(&[
        "-m",
        q8().to_str().unwrap(),
        "--chat",
        "--system",
        "You are terse.",
        "-p",
        "Hi",
        "-n",
        "4",
        "--temp",
        "0",
        "--stats-json",
        stats.to_str().unwrap(),
    ]);
    ok(&out);
    let s = read_json(&stats);
    let ids: Vec<u64> = s["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    // <|im_start|>system ... <|im_end|> ... <|im_start|>assistant\n
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2, "{ids:?}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let q8 = q8();
    let m = q8.to_str().unwrap();
    fails_with(&vkdecode(&["-m", m, "-p", ""]), "prompt is empty");
    fails_with(&vkdecode(&["-p", "hello"]), "no model given");
    fails_with(&vkdecode(&["-m", m]), "no prompt given");
    fails_with(
        &vkdecode(&["-m", "/nonexistent/model.gguf", "-p", "x"]),
        "/nonexistent/model.gguf",
    );
    let long = "word ".repeat(100);
    fails_with(&vkdecode(&["-m", m, "-p", &long, "-c", "16"]), "raise -c");
    fails_with(&vkdecode(&["-m", m, "-p", "x", "-n", "0"]), "-n must be");
    fails_with(
        &vkdecode(&["-m", m, "-p", "x", "--import-cap", "12 parsecs"]),
        "size",
    );
    // A file that is not GGUF.
    let dir = tempdir();
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"not a model at all").unwrap();
    fails_with(
        &vkdecode(&["-m", junk.to_str().unwrap(), "-p", "x"]),
        "junk.gguf",
    );
}

/// A grammar file holds the output to it: a bullet list from `grammars/list.gbnf` where
/// the free answer is prose, an arithmetic expression from `grammars/arithmetic.gbnf`;
/// a grammar that does not compile is refused with its line and column, before loading.
#[test]
fn a_grammar_file_holds_the_output() {
    let grammars = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../grammars");
    let m = q8();
    let m = m.to_str().unwrap();
    let prompt = "Name three fruits.";
    let free = ok(&vkdecode(&[
        "-m", m, "-p", prompt, "--chat", "-n", "40", "--temp", "0",
    ]));
    assert!(
        !free.starts_with("- "),
        "the free answer is already a list: {free:?}"
    );
    let list = grammars.join("list.gbnf");
    let held = ok(&vkdecode(&[
        "-m",
        m,
        "-p",
        prompt,
        "--chat",
        "-n",
        "40",
        "--temp",
        "0",
        "--grammar-file",
        list.to_str().unwrap(),
    ]));
    let lines: Vec<&str> = held.trim_end_matches('\n').split('\n').collect();
    assert!(!lines.is_empty() && lines.len() <= 10, "{held:?}");
    for l in &lines {
        assert!(l.starts_with("- ") && l.len() > 2, "{held:?}");
    }
    // sampled, too: whatever the seed, an expression
    let arith = grammars.join("arithmetic.gbnf");
    for seed in ["1", "2", "3"] {
        let out = ok(&vkdecode(&[
            "-m",
            m,
            "-p",
            "What is six times seven? Write it as a sum.",
            "--chat",
            "-n",
            "12",
            "--temp",
            "1.0",
            "--seed",
            seed,
            "--grammar-file",
            arith.to_str().unwrap(),
        ]));
        let expr = out.trim_end_matches('\n');
        assert!(
            !expr.is_empty()
                && expr
                    .chars()
                    .all(|c| c.is_ascii_digit() || " +-*/()".contains(c)),
            "seed {seed}: {out:?}"
        );
    }
    let dir = tempdir();
    let bad = dir.join("bad.gbnf");
    std::fs::write(&bad, "root ::= item\nitem ::= \"a\" | [z-a]\n").unwrap();
    let out = vkdecode(&["-m", m, "-p", "x", "--grammar-file", bad.to_str().unwrap()]);
    fails_with(&out, "line 2, column 18: empty character range");
    let out = vkdecode(&[
        "-m",
        m,
        "-p",
        "x",
        "--json-schema",
        r#"{"type": "string", "format": "email"}"#,
    ]);
    fails_with(&out, "unsupported keyword `format`");
}

/// `--ignore-eos` bans the end-of-generation tokens, as llama.cpp does: the answer goes
/// on with the best other token, and no `<|im_end|>` text lands in it (it did when the
/// end token was sampled and skipped).
#[test]
fn ignore_eos_bans_the_end_tokens() {
    let dir = tempdir();
    let stats = dir.join("stats.json");
    let m = q8();
    // the text, and the tokens generated
    let run = |extra: &[&str]| {
        let mut args = vec![
            "-m",
            m.to_str().unwrap(),
            "--chat",
            "-p",
            "Say hi.",
            "-n",
            "40",
            "--temp",
            "0",
            "--stats-json",
            stats.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = ok(&vkdecode(&args));
        (out, read_json(&stats)["n_generated"].as_u64().unwrap())
    };
    let (out, n) = run(&["--ignore-eos"]);
    assert!(
        !out.contains("<|im_end|>") && !out.contains("<|im_start|>"),
        "{out:?}"
    );
    assert_eq!(n, 40, "{out:?}");
    // without it, the same prompt ends early
    let (out, n) = run(&[]);
    assert!(
        n < 40,
        "the model did not end by itself ({n} tokens): the test shows nothing: {out:?}"
    );
}

#[test]
fn context_full_stops_with_a_message() {
    let out = vkdecode(&[
        "-m",
        q8().to_str().unwrap(),
        "-p",
        "Once upon a time",
        "-n",
        "-1",
        "-c",
        "12",
        "--temp",
        "0",
        "--ignore-eos",
    ]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("context of 12 tokens is full"), "{err}");
}

#[test]
fn info_reports_the_extension_and_auto_import() {
    let out = vkdecode(&["info"]);
    let text = ok(&out);
    assert!(text.contains("VK_EXT_external_memory_host"), "{text}");
    assert!(text.contains("4096"), "{text}");
    assert!(text.contains("auto"), "{text}");
    assert!(text.contains("import"), "{text}");
    // the kernel profile `auto` picks, and why: lavapipe is a CPU device
    assert!(
        text.lines()
            .any(|l| l.starts_with("kernels: cpu (auto: a CPU device")),
        "{text}"
    );
    let text = ok(&vkdecode(&["info", "--kernels", "gpu"]));
    assert!(
        text.lines()
            .any(|l| l.starts_with("kernels: gpu (asked for")),
        "{text}"
    );
}

/// `--kernels` takes auto, cpu or gpu; anything else is refused before loading, naming
/// the choices.
#[test]
fn an_unknown_kernel_profile_is_refused() {
    let out = vkdecode(&[
        "-m",
        q8().to_str().unwrap(),
        "-p",
        "Hi",
        "--kernels",
        "fast",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auto, cpu or gpu"), "{err}");
}

/// `--ubatch-size 2`: the prompt is prefilled two tokens a submission (one fence wait
/// each: `host_waits` counts them) and the greedy text is still llama.cpp's; 0 is refused
/// by the parser.
#[test]
fn a_small_ubatch_gives_the_same_text() {
    let dir = tempdir();
    let model = q8();
    let run = |ub: Option<&str>| {
        let stats = dir.join(format!("{}.json", ub.unwrap_or("default")));
        let mut args = vec![
            "-m",
            model.to_str().unwrap(),
            "-p",
            "The capital of France is",
            "-n",
            "32",
            "--temp",
            "0",
            "--stats-json",
            stats.to_str().unwrap(),
        ];
        if let Some(ub) = ub {
            args.extend(["--ubatch-size", ub]);
        }
        let out = vkdecode(&args);
        (out, stats)
    };
    let (out, stats) = run(None);
    ok(&out);
    let whole = read_json(&stats);
    let (out, stats) = run(Some("2"));
    let text = ok(&out);
    assert_eq!(text, " Paris.\n\nThe answer is: 2018-01-22 12:12:53.\n");
    let pairs = read_json(&stats);
    let n = whole["n_prompt"].as_u64().unwrap();
    assert!(n > 2, "a prompt of {n} tokens takes one chunk either way");
    assert_eq!(
        pairs["host_waits"].as_u64().unwrap(),
        whole["host_waits"].as_u64().unwrap() + n.div_ceil(2) - 1,
        "{n} prompt tokens two at a time"
    );
    assert_eq!(pairs["generated_ids"], whole["generated_ids"]);
    let (out, _) = run(Some("0"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ubatch-size"), "{err}");
}

#[test]
fn inspect_plan_covers_every_tensor() {
    let out = vkdecode(&[
        "inspect",
        q8().to_str().unwrap(),
        "--plan",
        "--import-cap",
        "1MiB",
    ]);
    let text = ok(&out);
    assert!(text.to_lowercase().contains("shard"), "{text}");
}

/// A fresh directory under the target dir, removed by nobody (cargo clean does).
fn tempdir() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vkdecode-run-cli-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts `vkdecode` on a long generation (wrapped in `wrapper`, e.g. `timeout 4`), tagged
/// so that every process it starts can be found; without a wrapper, waits until the text
/// has begun, or (`early`) only until the worker exists (it is then loading the model).
fn start_long_run(tag: &Tag, wrapper: &[&str], early: bool) -> std::process::Child {
    let bin = env!("CARGO_BIN_EXE_vkdecode");
    let (program, mut args): (&str, Vec<&str>) = match wrapper.split_first() {
        Some((first, rest)) => (first, rest.iter().copied().chain([bin]).collect()),
        None => (bin, Vec::new()),
    };
    let model = q8();
    args.extend(["-m", model.to_str().unwrap()]);
    args.extend(["-p", "Once upon a time", "-n", "1000", "--temp", "0"]);
    let mut child = Command::new(program)
        .args(&args)
        .env(TAG_ENV, &tag.0)
        // the worker is what is tested: never let an inherited setting skip it
        .env_remove("VKDECODE_WORKER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vkdecode");
    let stdout = collect(child.stdout.take().unwrap());
    if early {
        // the worker once it is exec'd: between fork and exec the child still carries the
        // parent's environment, and while exec replaces it its environ cannot be read, so
        // a count of two tagged processes can be seen and lost again
        let start = Instant::now();
        while !tag.processes().iter().any(|&(pid, _)| is_worker(pid)) {
            assert!(start.elapsed() < Duration::from_secs(30), "no worker");
            std::thread::sleep(Duration::from_millis(5));
        }
    } else if wrapper.is_empty() {
        wait_for("the text to begin", &stdout, |s| s.len() >= 20);
    }
    child
}

/// Whether process `pid` is a worker: `VKDECODE_WORKER=1` in its environment, which the
/// main command gives the worker it starts.
fn is_worker(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == b"VKDECODE_WORKER=1"))
}

/// Waits (bounded) for `child` to exit.
fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(start.elapsed() < limit, "still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The main command runs its generation in a worker process (so that a model file
/// truncated mid-run is reported by name). SIGTERM, SIGHUP or SIGKILL of the `vkdecode`
/// the user started used to leave that worker running, reparented to init and still
/// writing to stdout; `timeout` and Python's `Popen.terminate()` send SIGTERM. Now the
/// signal is passed on (or the worker dies with its parent) and within 2 s no process of
/// the run is left; the parent leaves with 128 + the signal. Each signal is sent while
/// the text is being written, and again just after the worker starts (while it loads).
#[test]
fn a_signal_to_the_main_command_leaves_no_worker() {
    for (sig, early) in [
        ("TERM", false),
        ("HUP", false),
        ("KILL", false),
        ("TERM", true),
        ("HUP", true),
        ("KILL", true),
    ] {
        let tag = Tag::new(&format!("run-{sig}"));
        let mut child = start_long_run(&tag, &[], early);
        let before = tag.processes();
        assert!(
            before.len() >= 2,
            "{sig} (early: {early}): expected the parent and its worker: {before:?}"
        );
        assert!(signal(child.id(), sig));
        let sent = Instant::now();
        let status = wait_exit(&mut child, Duration::from_secs(10));
        let left = tag.wait_gone(Duration::from_secs(2));
        assert!(
            left.is_empty(),
            "{sig} (early: {early}): {:?} after the signal, these are still running: {left:?}",
            sent.elapsed()
        );
        match sig {
            "KILL" => assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9)
            ),
            "TERM" => assert_eq!(status.code(), Some(143), "{status}"),
            _ => assert_eq!(status.code(), Some(129), "{status}"),
        }
    }
    // `timeout` sends SIGTERM to the process it started, whatever that is doing.
    let tag = Tag::new("run-timeout");
    let mut child = start_long_run(&tag, &["timeout", "4"], false);
    let status = wait_exit(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(124), "timeout: {status}");
    let left = tag.wait_gone(Duration::from_secs(2));
    assert!(left.is_empty(), "after timeout: {left:?}");
}

//! Process hygiene of every subcommand, one table: the main command, chat, serve, bench
//! and convert, each sent SIGTERM, SIGHUP, SIGKILL or stopped by `timeout` while it
//! works (decoding, answering, serving a stream, running its decoders, writing its
//! output). Within 2 s of the signal no process it started is left (every process carries
//! a tag in its environment, found in /proc whoever adopted it), its temp dir (TMPDIR
//! points into the case's own directory) is empty, and convert's output directory holds
//! no partial file.
//!
//! `timeout` is driven by SIGALRM: coreutils `timeout` takes it as its timer running out,
//! so the case reaches the same stage every time instead of guessing a duration.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{collect, q8, signal, wait_for, writes_into, Tag, TempDir, TAG_ENV};

#[derive(Clone, Copy, Debug)]
enum Sub {
    Main,
    Chat,
    Serve,
    Bench,
    Convert,
}

const SUBCOMMANDS: [Sub; 5] = [Sub::Main, Sub::Chat, Sub::Serve, Sub::Bench, Sub::Convert];
const SIGNALS: [&str; 4] = ["TERM", "HUP", "KILL", "timeout"];

/// What a case keeps alive while it runs: a chat's stdin, a server's streaming client.
enum Held {
    Nothing,
    Stdin(#[allow(dead_code)] std::process::ChildStdin),
    Client(#[allow(dead_code)] std::net::TcpStream),
}

fn args(sub: Sub, model: &Path, work: &Path) -> Vec<String> {
    let m = model.to_str().unwrap().to_string();
    let words: &[&str] = match sub {
        Sub::Main => &["-p", "Once upon a time", "-n", "1000", "--temp", "0", "-m"],
        Sub::Chat => &["chat", "--temp", "0", "-n", "400", "-c", "1024", "-m"],
        Sub::Serve => &["serve", "--port", "0", "-c", "1024", "-m"],
        Sub::Bench => &[
            "bench", "--modes", "import", "-r", "2", "-p", "16", "-n", "1000", "-m",
        ],
        Sub::Convert => &["convert", "--type", "f32"],
    };
    let mut v: Vec<String> = words.iter().map(|s| s.to_string()).collect();
    v.push(m);
    if let Sub::Convert = sub {
        v.push(work.join("out.gguf").to_str().unwrap().to_string());
    }
    v
}

/// Waits until `sub`, started as `child` (its pid `pid`; behind `timeout` the two
/// differ), is in the middle of its work.
fn wait_busy(sub: Sub, child: &mut Child, tag: &Tag, work: &Path) -> Held {
    let stdout = collect(child.stdout.take().unwrap());
    let stderr = collect(child.stderr.take().unwrap());
    let start = Instant::now();
    let poll = |what: &str, cond: &dyn Fn() -> bool| {
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{sub:?}: waited a minute for {what}: {}",
                stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    match sub {
        Sub::Main => {
            wait_for("the text to begin", &stdout, |s| s.len() >= 20);
            Held::Nothing
        }
        Sub::Chat => {
            let mut stdin = child.stdin.take().unwrap();
            stdin
                .write_all(b"Write a very long essay about the history of Rome.\n")
                .unwrap();
            wait_for("the answer to begin", &stdout, |s| s.len() >= 20);
            Held::Stdin(stdin)
        }
        Sub::Serve => {
            wait_for("the server to listen", &stderr, |s| {
                s.contains("listening on http://")
            });
            let log = stderr.lock().unwrap().clone();
            let addr = log
                .split("listening on http://")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .unwrap()
                .to_string();
            let mut c = std::net::TcpStream::connect(&addr).unwrap();
            let body = r#"{"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": true}"#;
            write!(
                c,
                "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            // the first token has been streamed: the completion is running
            c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("data: ") {
                let n = c.read(&mut buf).unwrap();
                assert!(
                    n > 0,
                    "serve closed the stream: {:?}",
                    String::from_utf8_lossy(&got)
                );
                got.extend_from_slice(&buf[..n]);
            }
            Held::Client(c)
        }
        Sub::Bench => {
            // a decoder has the model mapped: it is loading or running
            let model = q8().file_name().unwrap().to_string_lossy().to_string();
            poll("a decoder with the model mapped", &|| {
                tag.processes().iter().any(|(pid, cmd)| {
                    cmd.contains("--stats-json")
                        && std::fs::read_to_string(format!("/proc/{pid}/maps"))
                            .is_ok_and(|m| m.contains(&model))
                })
            });
            Held::Nothing
        }
        Sub::Convert => {
            poll("convert to open its output", &|| {
                tag.processes()
                    .iter()
                    .any(|(pid, cmd)| cmd.contains("convert") && writes_into(*pid, work))
            });
            Held::Nothing
        }
    }
}

/// Files and directories left under `dir`, after waiting up to `limit` for it to empty.
fn left_in(dir: &Path, limit: Duration) -> Vec<String> {
    let start = Instant::now();
    loop {
        let left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        if left.is_empty() || start.elapsed() >= limit {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: still running 10 s after the signal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run_case(sub: Sub, sig: &str) {
    let what = format!("{sub:?} {sig}");
    let tag = Tag::new(&format!("signals-{sub:?}-{sig}"));
    let tmp = TempDir::new(&format!("signals-tmp-{sub:?}-{sig}"));
    let work = TempDir::new(&format!("signals-out-{sub:?}-{sig}"));
    let bin = env!("CARGO_BIN_EXE_vkdecode");
    let mut cmd = if sig == "timeout" {
        let mut c = Command::new("timeout");
        c.arg("600").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    let mut child = cmd
        .args(args(sub, &q8(), &work.0))
        .env(TAG_ENV, &tag.0)
        .env("TMPDIR", &tmp.0)
        .env_remove("VKDECODE_WORKER")
        .env_remove("VKDECODE_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: starting: {e}"));
    let held = wait_busy(sub, &mut child, &tag, &work.0);
    assert!(
        child.try_wait().unwrap().is_none(),
        "{what}: ended before the signal"
    );
    // `timeout` takes SIGALRM as its time running out
    assert!(signal(
        child.id(),
        if sig == "timeout" { "ALRM" } else { sig }
    ));
    let sent = Instant::now();
    let status = wait_exit(&mut child, &what);
    let within = |d: Duration| d.saturating_sub(sent.elapsed());
    let procs = tag.wait_gone(within(Duration::from_secs(2)));
    assert!(
        procs.is_empty(),
        "{what}: {status}: still running: {procs:?}"
    );
    let files = left_in(&tmp.0, within(Duration::from_secs(2)));
    assert!(
        files.is_empty(),
        "{what}: {status}: left in TMPDIR: {files:?}"
    );
    let outputs = left_in(&work.0, Duration::ZERO);
    assert!(
        outputs.is_empty(),
        "{what}: {status}: left beside the output: {outputs:?}"
    );
    drop(held);
    // the signal's own end, or the status a shell gives it (128 + n) after cleaning up;
    // serve shuts down as asked (its clients are not waited for): status 0
    use std::os::unix::process::ExitStatusExt;
    let by = |n: i32| status.code() == Some(128 + n) || status.signal() == Some(n);
    let served = matches!(sub, Sub::Serve) && status.success();
    let ok = match sig {
        "KILL" => status.signal() == Some(9),
        "timeout" => status.code() == Some(124),
        "TERM" => by(15) || served,
        _ => by(1) || served,
    };
    assert!(ok, "{what}: {status}");
}

#[test]
fn every_subcommand_under_every_signal_leaves_no_process_and_no_temp_file() {
    for sub in SUBCOMMANDS {
        for sig in SIGNALS {
            let t = Instant::now();
            run_case(sub, sig);
            eprintln!("{sub:?} {sig}: {:?}", t.elapsed());
        }
    }
}

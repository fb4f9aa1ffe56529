//! Shared by the `vkdecode serve` tests: a real server started on the default model on a
//! free port (`--port 0`, the bound address read from its stderr), a minimal HTTP/1.1
//! client over `std::net::TcpStream` (so a test controls every byte, and can hang up
//! mid-stream), and the CLI's greedy output for comparison.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn q8() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q8_0.gguf");
    assert!(
        path.exists(),
        "{} is missing: run models/fetch to download the default model",
        path.display()
    );
    path
}

/// A running `vkdecode serve`, killed on drop.
pub struct Server {
    child: Option<Child>,
    pub addr: String,
    /// `--api-key`, sent by [`Server::metric`].
    pub key: Option<String>,
    /// Every stderr line so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `vkdecode serve -m <default model> --port 0 ARGS` and waits until it listens.
    pub fn start(args: &[&str]) -> Server {
        Server::start_on(&q8(), args)
    }

    /// Starts `vkdecode serve -m MODEL --port 0 ARGS` and waits until it listens.
    pub fn start_on(model: &std::path::Path, args: &[&str]) -> Server {
        Server::launch(model, args, &Launch::default())
    }

    /// Starts `vkdecode serve -m <default model> --port 0 ARGS` as `how` says.
    pub fn start_with(args: &[&str], how: &Launch) -> Server {
        Server::launch(&q8(), args, how)
    }

    fn launch(model: &std::path::Path, args: &[&str], how: &Launch) -> Server {
        let mut child = serve_command(model, args, how)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vkdecode serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel::<String>();
        let stderr = child.stderr.take().unwrap();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            });
        }
        let addr = wait_listening(&rx, &mut child, &log);
        let key = args
            .iter()
            .position(|&a| a == "--api-key")
            .map(|i| args[i + 1].to_string())
            .or_else(|| {
                how.env
                    .iter()
                    .find(|(k, _)| *k == "VKDECODE_API_KEY")
                    .map(|(_, v)| v.to_string())
            });
        Server {
            child: Some(child),
            addr,
            key,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn stderr(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Sends SIGTERM and waits (at most 120 s) for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success(), "kill -TERM {pid}");
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "the server did not exit within 120 s of SIGTERM:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).expect("connect to the server");
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        s
    }

    /// One request (`Connection: close`) and its whole answer.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let mut s = self.connect();
        s.write_all(&request_bytes(method, path, headers, body))
            .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read the answer");
        Resp::parse(&raw)
    }

    /// Sends `bytes` as they are (a whole request, `Connection: close`) and reads the
    /// whole answer.
    pub fn raw(&self, bytes: &[u8]) -> Resp {
        let mut s = self.connect();
        s.write_all(bytes).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read the answer");
        Resp::parse(&raw)
    }

    pub fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        self.request("POST", path, &[], body.to_string().as_bytes())
    }

    pub fn post_raw(&self, path: &str, body: &str) -> Resp {
        self.request("POST", path, &[], body.as_bytes())
    }

    /// A greedy completion's text.
    pub fn complete(&self, prompt: &str, max_tokens: usize) -> String {
        let r = self.post(
            "/v1/completions",
            &serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    }

    /// One metric's value from /metrics.
    pub fn metric(&self, name: &str) -> f64 {
        let bearer = self.key.as_ref().map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = bearer
            .iter()
            .map(|b| ("Authorization", b.as_str()))
            .collect();
        let m = self.request("GET", "/metrics", &headers, b"");
        assert_eq!(m.status, 200);
        m.text()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{}", m.text()))
            .parse()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a test server is started with beyond its arguments.
#[derive(Default)]
pub struct Launch<'a> {
    /// Environment variables to set (`VKDECODE_API_KEY` is removed unless set here).
    pub env: &'a [(&'a str, &'a str)],
    /// A descriptor limit (`ulimit -n`) for the server alone.
    pub nofile: Option<u64>,
}

/// `vkdecode serve -m MODEL --port 0 ARGS`, through `sh -c 'ulimit -n N; exec ...'` when
/// `how` limits descriptors.
fn serve_command(model: &std::path::Path, args: &[&str], how: &Launch) -> Command {
    let bin = env!("CARGO_BIN_EXE_vkdecode");
    let mut cmd = match how.nofile {
        Some(n) => {
            let mut c = Command::new("sh");
            c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\""), bin]);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("serve")
        .arg("-m")
        .arg(model)
        .args(["--port", "0"])
        .args(args)
        .env_remove("VKDECODE_API_KEY");
    for (k, v) in how.env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `vkdecode serve -m <default model> --port 0 ARGS`, which must refuse to start:
/// its exit status and stderr. Panics (killing it) if it listens instead, or if it runs
/// for more than 300 s.
pub fn refused(args: &[&str], how: &Launch) -> (ExitStatus, String) {
    let child = serve_command(&q8(), args, how)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vkdecode serve");
    let mut s = Server {
        child: Some(child),
        addr: String::new(),
        key: None,
        log: Arc::new(Mutex::new(Vec::new())),
    };
    let stderr = s.child.as_mut().unwrap().stderr.take().unwrap();
    let log = s.log.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            log.lock().unwrap().push(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = s.child.as_mut().unwrap().try_wait().unwrap() {
            s.child = None;
            let _ = reader.join();
            return (status, s.stderr());
        }
        let err = s.stderr();
        assert!(
            !err.contains("listening on"),
            "vkdecode serve {args:?} started instead of refusing:\n{err}"
        );
        assert!(
            Instant::now() < deadline,
            "vkdecode serve {args:?} neither refused nor listened in 300 s:\n{err}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The resident memory of process `pid`, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

fn wait_listening(rx: &Receiver<String>, child: &mut Child, log: &Mutex<Vec<String>>) -> String {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(addr) = line.split("listening on http://").nth(1) {
                    return addr.trim().to_string();
                }
            }
            Err(_) => {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!(
                        "vkdecode serve exited ({status}) before listening:\n{}",
                        log.lock().unwrap().join("\n")
                    );
                }
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("vkdecode serve did not listen within 600 s");
        }
    }
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if !body.is_empty() || method == "POST" {
        head.push_str("Content-Type: application/json\r\n");
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn parse(raw: &[u8]) -> Resp {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let rest = &raw[end + 4..];
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_vec()
        };
        Resp {
            status,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {}", self.text()))
    }

    /// The OpenAI error object, checked for its shape.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].as_str().is_some(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }

    /// The `data:` payloads of a server-sent-events body.
    pub fn events(&self) -> Vec<String> {
        sse_events(&self.text())
    }
}

pub fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
        .collect()
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&rest[..nl]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = nl + 2;
        let end = (start + size).min(rest.len());
        out.extend_from_slice(&rest[start..end]);
        rest = &rest[(end + 2).min(rest.len())..];
    }
}

/// `vkdecode -m <default model> -p PROMPT -n N --temp 0 [extra]`: the generated text
/// (stdout without the newline the CLI ends with).
pub fn cli_greedy(prompt: &str, n: usize, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_vkdecode"))
        .arg("-m")
        .arg(q8())
        .args(["-p", prompt, "-n", &n.to_string(), "--temp", "0"])
        .args(extra)
        .output()
        .expect("run vkdecode");
    assert!(
        out.status.success(),
        "vkdecode failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

/// The test venv's python (`scripts/setup` makes `.venv-test` with the `openai`
/// package); `None` (after a note) when it is missing and `VKDECODE_ALLOW_NO_VENV=1`.
pub fn venv_python() -> Option<PathBuf> {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python");
    if py.exists() {
        return Some(py);
    }
    if std::env::var("VKDECODE_ALLOW_NO_VENV").is_ok_and(|v| v == "1") {
        eprintln!(
            "note: {} is missing; skipping (VKDECODE_ALLOW_NO_VENV=1)",
            py.display()
        );
        return None;
    }
    panic!(
        "{} is missing: run scripts/setup (it makes the test venv with the openai package), \
         or set VKDECODE_ALLOW_NO_VENV=1 to skip this test",
        py.display()
    );
}

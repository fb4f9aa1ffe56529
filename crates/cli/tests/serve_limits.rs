//! `vkdecode serve` against slow, idle, half-closed and too many clients: a header has a
//! deadline (not a per-read timeout), a body has one, an idle keep-alive connection is
//! closed, a half-closed client still gets its answer, SIGTERM does not wait for stalled
//! clients, and thousands of idle and slow sockets neither lock a fresh client out nor
//! grow the server's memory without bound. Loopback only; every count and wait bounded.

mod serve_common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;
use serve_common::{refused, request_bytes, rss_kib, Launch, Resp, Server};

/// Reads until the server closes the connection or `within` passes: whether it closed,
/// and what it sent.
fn closed_within(c: &mut TcpStream, within: Duration) -> (bool, Vec<u8>) {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        c.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        match c.read(&mut buf) {
            Ok(0) => return (true, seen),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return (true, seen),
        }
    }
    (false, seen)
}

#[test]
fn a_half_closed_client_still_gets_its_answer() {
    let s = Server::start(&["-c", "128"]);
    let bodies = [
        json!({"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}),
        json!({"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0, "stream": true}),
    ];
    for body in bodies {
        let mut c = s.connect();
        c.write_all(&request_bytes(
            "POST",
            "/v1/completions",
            &[],
            body.to_string().as_bytes(),
        ))
        .unwrap();
        // the request is complete: say so, as `nc -N` or a shell's `exec 3>&-` does
        c.shutdown(Shutdown::Write).unwrap();
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).unwrap();
        assert!(!raw.is_empty(), "no answer at all to {body}");
        let r = Resp::parse(&raw);
        assert_eq!(r.status, 200, "{}", r.text());
        if body["stream"] == true {
            assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
        } else {
            assert_eq!(r.json()["usage"]["completion_tokens"], 2, "{}", r.text());
        }
    }
}

#[test]
fn a_header_trickled_a_byte_at_a_time_is_cut_at_its_deadline() {
    let s = Server::start(&["-c", "128", "--header-timeout", "2"]);
    let mut c = s.connect();
    let start = Instant::now();
    let head = format!(
        "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: {}",
        "a".repeat(200)
    );
    // one byte per 100 ms read wait: each read is well inside any per-read timeout
    let mut closed = false;
    for b in head.bytes().take(100) {
        if c.write_all(&[b]).is_err() {
            closed = true;
            break;
        }
        if closed_within(&mut c, Duration::from_millis(100)).0 {
            closed = true;
            break;
        }
    }
    let took = start.elapsed();
    assert!(closed, "a header trickled for {took:?} is still being read");
    assert!(took < Duration::from_secs(6), "cut only after {took:?}");
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn idle_connections_are_closed_after_their_timeouts() {
    let s = Server::start(&["-c", "128", "--idle-timeout", "1", "--header-timeout", "1"]);
    // a connection that never sends a byte: the header deadline runs from the connect
    let mut silent = s.connect();
    // a keep-alive connection after its answer
    let mut kept = s.connect();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let (closed, seen) = closed_within(&mut kept, Duration::from_secs(8));
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        closed,
        "an idle keep-alive connection is still open after 8 s"
    );
    let (closed, seen) = closed_within(&mut silent, Duration::from_secs(4));
    assert!(closed, "a silent connection is still open");
    assert!(seen.is_empty() || String::from_utf8_lossy(&seen).contains("408"));
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn a_stalled_body_gets_408() {
    let s = Server::start(&["-c", "128", "--body-timeout", "1"]);
    let mut c = s.connect();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ",
    )
    .unwrap();
    let (closed, seen) = closed_within(&mut c, Duration::from_secs(8));
    assert!(
        closed,
        "a stalled body still holds its connection after 8 s"
    );
    let r = Resp::parse(&seen);
    assert_eq!(r.status, 408, "{}", r.text());
    r.error();
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn sigterm_does_not_wait_for_stalled_clients() {
    let mut s = Server::start(&["-c", "128"]);
    let silent = s.connect();
    let mut partial = s.connect();
    partial
        .write_all(b"GET /health HTTP/1.1\r\nHost: loc")
        .unwrap();
    let mut kept = s.connect();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 1024];
    assert!(kept.read(&mut buf).unwrap() > 0);
    let mut body = s.connect();
    body.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro",
    )
    .unwrap();
    // every connection is in the server's hands before the signal
    assert_eq!(s.get("/health").status, 200);
    let start = Instant::now();
    let status = s.terminate();
    let took = start.elapsed();
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    // the default header, body and idle timeouts (10 s and more) and the grace are
    // not waited for
    assert!(took < Duration::from_secs(5), "SIGTERM took {took:?}");
    drop((silent, partial, kept, body));
}

#[test]
fn past_max_connections_with_every_one_busy_a_new_one_gets_503() {
    let s = Server::start(&["-c", "128", "--max-connections", "2", "--body-timeout", "3"]);
    // two requests in progress: their bodies are being read (the server asked for them
    // with 100 Continue) and never come
    let busy = |s: &Server| {
        let mut c = s.connect();
        c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 64];
        let n = c.read(&mut buf).unwrap();
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(text.starts_with("HTTP/1.1 100"), "{text}");
        c
    };
    let first = busy(&s);
    let second = busy(&s);
    let r = s.get("/health");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.text().contains("--max-connections"), "{}", r.text());
    // once their bodies are overdue they are answered 408 and closed, and room is back
    drop((first, second));
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.get("/health").status != 200 {
        assert!(
            Instant::now() < deadline,
            "still refused after the requests ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Raises this process's soft descriptor limit to `want` (or the hard limit).
fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read the one rlimit struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

#[test]
fn two_thousand_idle_and_two_hundred_slow_sockets_lock_no_one_out() {
    raise_nofile(8192);
    // the server gets a common default descriptor limit: with no cap it runs out of them
    // at about a thousand sockets
    let s = Server::start_with(
        &["-c", "128"],
        &Launch {
            nofile: Some(1024),
            ..Launch::default()
        },
    );
    assert_eq!(s.get("/health").status, 200);
    let rss_before = rss_kib(s.pid());
    let start = Instant::now();
    let mut held = Vec::with_capacity(2200);
    let sock: std::net::SocketAddr = s.addr.parse().unwrap();
    let connect = |i: usize| {
        TcpStream::connect_timeout(&sock, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connection {i}: the server no longer accepts: {e}"))
    };
    for i in 0..2000 {
        held.push(connect(i));
    }
    for i in 0..200 {
        let mut c = connect(2000 + i);
        let _ = c.write_all(
            format!("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-{i}: ").as_bytes(),
        );
        held.push(c);
    }
    // a fresh client is answered within seconds, its health and a completion (a read
    // waits 30 s at most)
    let addr = s.addr.clone();
    let fresh = |what: &str, bytes: Vec<u8>| {
        let t = Instant::now();
        let mut c = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{what}: cannot connect under load: {e}"));
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(&bytes).unwrap();
        let mut raw = Vec::new();
        let _ = c.read_to_end(&mut raw);
        let took = t.elapsed();
        assert!(!raw.is_empty(), "{what}: no answer in {took:?} under load");
        let r = Resp::parse(&raw);
        assert_eq!(r.status, 200, "{what}: {}", r.text());
        assert!(took < Duration::from_secs(20), "{what} took {took:?}");
        took
    };
    let health = fresh("/health", request_bytes("GET", "/health", &[], b""));
    let completion = fresh(
        "a completion",
        request_bytes(
            "POST",
            "/v1/completions",
            &[],
            br#"{"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}"#,
        ),
    );
    let rss_after = rss_kib(s.pid());
    eprintln!(
        "2200 sockets in {:?}: /health in {health:?}, a completion in {completion:?}, RSS {rss_before} -> {rss_after} KiB",
        start.elapsed()
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} to {rss_after} KiB"
    );
    drop(held);
}

#[test]
fn limits_the_server_cannot_keep_are_refused_at_start() {
    let (status, err) = refused(
        &["--max-connections", "5000"],
        &Launch {
            nofile: Some(1024),
            ..Launch::default()
        },
    );
    assert!(!status.success());
    assert!(
        err.contains("--max-connections") && err.contains("ulimit -n"),
        "{err}"
    );
    for (flag, value) in [
        ("--max-connections", "0"),
        ("--header-timeout", "0"),
        ("--body-timeout", "-1"),
        ("--idle-timeout", "nan"),
    ] {
        let arg = format!("{flag}={value}");
        let (status, err) = refused(&[&arg], &Launch::default());
        assert!(!status.success());
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}

#[test]
fn a_huge_request_head_is_refused_not_buffered() {
    let s = Server::start(&["-c", "128"]);
    let mut c = s.connect();
    let head = format!(
        "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    // the server may close before taking all of it
    let _ = c.write_all(head.as_bytes());
    let (closed, seen) = closed_within(&mut c, Duration::from_secs(10));
    assert!(closed, "a 200 KB head holds its connection");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "{text}"
    );
    assert_eq!(s.get("/health").status, 200);
}

/// Kills the child on drop.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_unwritable_stderr_does_not_stop_the_server() {
    // a port that was free a moment ago (stderr, where the bound port is printed, is the
    // thing under test)
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let mut child = Kill(
        std::process::Command::new(env!("CARGO_BIN_EXE_vkdecode"))
            .arg("serve")
            .arg("-m")
            .arg(serve_common::q8())
            .args(["--port", &port.to_string(), "-c", "128"])
            .env_remove("VKDECODE_API_KEY")
            .stdout(std::process::Stdio::null())
            .stderr(full)
            .spawn()
            .unwrap(),
    );
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("serve with 2>/dev/full exited: {status}");
        }
        if let Ok(mut c) = TcpStream::connect(&addr) {
            c.write_all(&request_bytes("GET", "/health", &[], b""))
                .unwrap();
            let mut raw = Vec::new();
            let _ = c.read_to_end(&mut raw);
            if !raw.is_empty() {
                assert_eq!(Resp::parse(&raw).status, 200);
                break;
            }
        }
        assert!(Instant::now() < deadline, "serve never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
}

//! `vkdecode serve` over raw HTTP: every error case answers its documented status in
//! OpenAI's error shape and the server keeps serving; a client that hangs up mid-stream
//! or while it waits for a whole answer frees its slot; a full queue is a 503 with Retry-After; SIGTERM lets an in-flight
//! request finish and exits 0. Runs the real server on the default model.

mod serve_common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::json;
use serve_common::{request_bytes, sse_events, Resp, Server};

const KEY: &str = "sekrit-key";

fn auth() -> [(&'static str, &'static str); 1] {
    [("Authorization", "Bearer sekrit-key")]
}

fn post(s: &Server, path: &str, body: &str) -> Resp {
    s.request("POST", path, &auth(), body.as_bytes())
}

/// Still serving: health is ok and a tiny greedy completion works.
fn assert_serving(s: &Server, after: &str) {
    let h = s.get("/health");
    assert_eq!(h.status, 200, "after {after}: {}", h.text());
    let r = post(
        s,
        "/v1/completions",
        r#"{"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}"#,
    );
    assert_eq!(r.status, 200, "after {after}: {}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 2, "after {after}");
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn errors_have_their_status_and_the_server_keeps_serving() {
    let s = Server::start(&[
        "--parallel",
        "1",
        "--queue",
        "1",
        "--max-body",
        "4096",
        "--api-key",
        KEY,
        "-c",
        "256",
    ]);
    assert_serving(&s, "start");

    // 401: no key, a wrong key; /health needs none
    let r = s.post_raw("/v1/completions", r#"{"prompt": "hi"}"#);
    assert_eq!(r.status, 401);
    assert_eq!(r.error()["type"], "authentication_error");
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer wrong")],
        br#"{"prompt": "hi"}"#,
    );
    assert_eq!(r.status, 401);
    assert_eq!(s.request("GET", "/v1/models", &[], b"").status, 401);
    assert_serving(&s, "401s");

    // 400: malformed JSON, wrong types, out-of-range values
    let bad: &[(&str, &str, Option<&str>)] = &[
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}"#,
            None,
        ),
        ("/v1/chat/completions", "not json at all", None),
        ("/v1/chat/completions", r#"{"messages": "hi"}"#, None),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}"#,
            None,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}"#,
            None,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}"#,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}"#,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": -1}"#,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "top_p": 7}"#,
            Some("top_p"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "top_k": -1}"#,
            Some("top_k"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": []}"#,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#,
            Some("messages"),
        ),
        ("/v1/completions", r#"{"prompt": 42}"#, None),
        ("/v1/completions", r#"{"prompt": "hi", "n": 17}"#, Some("n")),
        ("/v1/completions", r#"{"prompt": [999999]}"#, Some("prompt")),
        ("/v1/completions", r#"{"prompt": ""}"#, Some("prompt")),
        ("/tokenize", r#"{"content": 5}"#, None),
        ("/detokenize", r#"{"tokens": [99999999]}"#, Some("tokens")),
    ];
    for (path, body, param) in bad {
        let r = post(&s, path, body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text());
        let e = r.error();
        assert_eq!(e["type"], "invalid_request_error", "{body}");
        if let Some(p) = param {
            assert_eq!(e["param"], *p, "{body}");
        }
    }
    // a prompt longer than the context (256 here)
    let long = "word ".repeat(400);
    let r = post(&s, "/v1/completions", &json!({"prompt": long}).to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error()["code"], "context_length_exceeded");
    assert_serving(&s, "400s");

    // a huge max_tokens is capped by the context, not refused: it ends with "length"
    // once the 256-position context is full
    let r = post(
        &s,
        "/v1/completions",
        r#"{"prompt": "Count: 1, 2, 3,", "max_tokens": 1000000000000, "temperature": 0, "ignore_eos": true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let used = v["usage"]["prompt_tokens"].as_u64().unwrap()
        + v["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(
        used, 256,
        "prompt + generated fill the context exactly: {v}"
    );

    // 404: an unknown model, an unknown route; 405: a wrong method
    let r = post(
        &s,
        "/v1/chat/completions",
        r#"{"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.error()["code"], "model_not_found");
    let r = s.request("GET", "/v1/nothing", &auth(), b"");
    assert_eq!(r.status, 404);
    r.error();
    let r = s.request("GET", "/v1/completions", &auth(), b"");
    assert_eq!(r.status, 405);
    r.error();

    // 413: over --max-body, by Content-Length and by a chunked body without one
    let big = json!({"prompt": "x".repeat(5000)}).to_string();
    let r = post(&s, "/v1/completions", &big);
    assert_eq!(r.status, 413, "{}", r.text());
    r.error();
    let mut c = s.connect();
    let head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nAuthorization: Bearer sekrit-key\r\nTransfer-Encoding: chunked\r\n\r\n";
    c.write_all(head.as_bytes()).unwrap();
    for _ in 0..3 {
        let part = "y".repeat(2000);
        let _ = c.write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes());
    }
    let _ = c.write_all(b"0\r\n\r\n");
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let r = Resp::parse(&raw);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_serving(&s, "404/405/413");

    // the model's own name is accepted; /v1/models lists it
    let models = s.request("GET", "/v1/models", &auth(), b"").json();
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(id, "SmolLM2-135M-Instruct.Q8_0");
    let r = post(
        &s,
        "/v1/chat/completions",
        &json!({"model": id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // tokenize / detokenize round trip
    let t = post(&s, "/tokenize", r#"{"content": "Hello world"}"#).json();
    let ids = t["tokens"].clone();
    assert!(ids.as_array().is_some_and(|a| !a.is_empty()), "{t}");
    let d = post(&s, "/detokenize", &json!({ "tokens": ids }).to_string()).json();
    assert_eq!(d["content"], "Hello world");

    // the busy path: one slot running a long stream, one request queued, the next one 503
    let mut running = s.connect();
    running
        .write_all(&request_bytes(
            "POST",
            "/v1/completions",
            &auth(),
            br#"{"prompt": "Once upon a time", "max_tokens": 240, "temperature": 0, "ignore_eos": true, "stream": true}"#,
        ))
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = running.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert_eq!(s.metric("vkdecode_slots_busy"), 1.0);
    let addr = s.addr.clone();
    let queued = std::thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(&request_bytes(
            "POST",
            "/v1/completions",
            &auth(),
            br#"{"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}"#,
        ))
        .unwrap();
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).unwrap();
        Resp::parse(&raw)
    });
    wait_for("the second request to be queued", || {
        s.metric("vkdecode_queue_length") == 1.0
    });
    let r = post(
        &s,
        "/v1/completions",
        r#"{"prompt": "hi", "max_tokens": 1}"#,
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.error()["type"], "unavailable_error");

    // the streaming client hangs up: its slot is freed at the next step and the queued
    // request runs
    let cancelled_before = s.metric("vkdecode_requests_cancelled_total");
    drop(running);
    let r = queued.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    assert_eq!(
        s.metric("vkdecode_requests_cancelled_total"),
        cancelled_before + 1.0
    );
    let generated = s.metric("vkdecode_generated_tokens_total");
    assert!(generated > 0.0);
    assert_serving(&s, "the disconnect");
    assert_eq!(s.metric("vkdecode_slots_busy"), 0.0);
    assert_eq!(s.metric("vkdecode_queue_length"), 0.0);
}

/// A client that hangs up while it waits for a NON-streaming answer is cancelled like a
/// streaming one: its slot is freed at a next step, not after its last token. On the
/// OpenAI route and on llama-server's own `/completion` alike.
#[test]
fn a_client_gone_before_its_whole_answer_frees_its_slot() {
    let s = Server::start(&["--parallel", "1", "-c", "512"]);
    for (path, body) in [
        (
            "/v1/completions",
            &br#"{"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": true}"#[..],
        ),
        (
            "/completion",
            &br#"{"prompt": "Once upon a time", "n_predict": 400, "temperature": 0, "ignore_eos": true}"#[..],
        ),
    ] {
        let generated = s.metric("vkdecode_generated_tokens_total");
        let mut c = s.connect();
        c.write_all(&request_bytes("POST", path, &[], body)).unwrap();
        wait_for("the request to generate", || {
            s.metric("vkdecode_generated_tokens_total") >= generated + 2.0
        });
        let cancelled = s.metric("vkdecode_requests_cancelled_total");
        let finished = s.metric("vkdecode_requests_finished_total");
        drop(c);
        wait_for("the slot to be freed", || {
            s.metric("vkdecode_slots_busy") == 0.0
        });
        assert_eq!(
            s.metric("vkdecode_requests_cancelled_total"),
            cancelled + 1.0,
            "{path}: the request was not cancelled"
        );
        assert_eq!(s.metric("vkdecode_requests_finished_total"), finished);
        assert!(
            s.metric("vkdecode_generated_tokens_total") < generated + 400.0,
            "{path}: the request ran to its end"
        );
        assert_serving(&s, "the disconnect");
    }
}

#[test]
fn streams_end_with_done_and_carry_the_whole_text() {
    let s = Server::start(&["--parallel", "1", "-c", "512"]);
    let body = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        assert_eq!(v["object"], "text_completion");
        if let Some(c) = v["choices"].get(0) {
            text.push_str(c["text"].as_str().unwrap());
            if !c["finish_reason"].is_null() {
                finish = Some(c["finish_reason"].clone());
            }
        }
        if !v["usage"].is_null() {
            usage = Some(v["usage"].clone());
        }
    }
    let whole = s.complete("The capital of France is", 12);
    assert_eq!(text, whole, "streamed and whole answers agree");
    assert!(finish.is_some());
    assert_eq!(usage.unwrap()["completion_tokens"], 12);

    // chat: the role first, then deltas, then a finish
    let body = json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5, "temperature": 0, "stream": true});
    let events = s.post("/v1/chat/completions", &body).events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let first: serde_json::Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(!last["choices"][0]["finish_reason"].is_null(), "{last}");
}

#[test]
fn sigterm_lets_the_running_request_finish_then_exits_0() {
    // a grace long enough for the request to finish on a loaded machine (the default
    // 10 s is not: a lone slot can decode 2-3 tok/s under load here)
    let mut s = Server::start(&["--parallel", "1", "-c", "256", "--shutdown-grace", "300"]);
    let mut c = s.connect();
    c.write_all(&request_bytes(
        "POST",
        "/v1/completions",
        &[],
        br#"{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stream": true}"#,
    ))
    .unwrap();
    // wait for the first text, then ask the server to stop
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    let addr = s.addr.clone();
    let status = s.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "exit status; stderr:\n{}",
        s.stderr()
    );
    // the in-flight stream was finished, not cut
    c.read_to_end(&mut seen).unwrap();
    let text = String::from_utf8_lossy(&seen).into_owned();
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    let events = sse_events(&String::from_utf8_lossy(&serve_common_dechunk(
        body.as_bytes(),
    )));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    let finish = events
        .iter()
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        .find_map(|v| {
            v["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string)
        });
    assert_eq!(finish.as_deref(), Some("length"));
    // and it no longer accepts connections
    assert!(std::net::TcpStream::connect(addr).is_err());
}

fn serve_common_dechunk(raw: &[u8]) -> Vec<u8> {
    let mut full = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    full.extend_from_slice(raw);
    Resp::parse(&full).body
}

#[test]
fn a_second_chat_turn_prefills_only_its_new_tokens() {
    let s = Server::start(&["--parallel", "2", "-c", "512"]);
    let first = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24, "temperature": 0});
    let r = s.post("/v1/chat/completions", &first);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let turn1 = v["usage"].clone();
    let finish1 = v["choices"][0]["finish_reason"].clone();
    assert_eq!(turn1["prompt_tokens_details"]["cached_tokens"], 0);

    let second = json!({"messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And of Italy?"},
    ], "max_tokens": 8, "temperature": 0});
    let r = s.post("/v1/chat/completions", &second);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let reused = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt2 = v["usage"]["prompt_tokens"].as_u64().unwrap();
    // the slot holds turn 1's prompt and every generated token it fed (all but the
    // last one generated, when turn 1 ended on max_tokens)
    let p1 = turn1["prompt_tokens"].as_u64().unwrap();
    let g1 = turn1["completion_tokens"].as_u64().unwrap();
    assert!(
        reused >= p1 + g1 - 1 && reused <= p1 + g1,
        "reused {reused} of turn 1's {p1} + {g1} ({finish1})"
    );
    assert_eq!(
        v["timings"]["prompt_n"].as_u64().unwrap(),
        prompt2 - reused,
        "only the new tokens were prefilled"
    );
    assert_eq!(
        s.metric("vkdecode_reused_prompt_tokens_total"),
        reused as f64
    );
}

#[test]
fn a_model_file_rewritten_in_place_stops_the_engine_with_a_reason() {
    // a copy in a temporary directory: the shared model file is never touched
    let dir = std::env::temp_dir().join(format!("vkdecode-serve-stamp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("model.gguf");
    std::fs::copy(serve_common::q8(), &model).unwrap();
    let s = Server::start_on(&model, &["--parallel", "1", "-c", "256"]);
    assert!(!s.complete("The capital of France is", 2).is_empty());
    // the file is "rewritten": same bytes, a new modification time
    let f = std::fs::File::options().write(true).open(&model).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    drop(f);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.error()["message"]
            .as_str()
            .unwrap()
            .contains("changed while mapped"),
        "{}",
        r.text()
    );
    // the server still answers, saying why it cannot generate
    assert_eq!(s.get("/health").status, 503);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

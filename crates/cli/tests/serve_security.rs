//! Who may drive `vkdecode serve`, and what it refuses to pretend: the API key is never
//! empty, may come from the environment and takes the Bearer scheme in any case; a
//! request from a web page (a foreign Host as DNS rebinding sends, a body that is not
//! JSON, another site's Origin) never runs a completion; CORS headers only where
//! `--cors-origin` asks for them; parameters the server does not implement are refused by
//! name; start-up errors name their flag. Runs the real server on the default model.

mod serve_common;

use serde_json::json;
use serve_common::{refused, Launch, Resp, Server};

/// A request with every header given here (no Host unless `host` is one).
fn send(
    s: &Server,
    method: &str,
    path: &str,
    host: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if let Some(h) = host {
        head.push_str(&format!("Host: {h}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    head.push_str(body);
    s.raw(head.as_bytes())
}

const JSON: (&str, &str) = ("Content-Type", "application/json");
const COMPLETION: &str =
    r#"{"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}"#;
const CHAT: &str =
    r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}"#;

fn no_cors_headers(r: &Resp, what: &str) {
    let cors: Vec<_> = r
        .headers
        .iter()
        .filter(|(k, _)| k.starts_with("access-control-"))
        .collect();
    assert!(cors.is_empty(), "{what}: CORS headers {cors:?}");
}

/// A completion POSTed with a JSON body and a loopback Host, from a page of `origin`
/// (none: no Origin header).
fn post_from(s: &Server, path: &str, origin: Option<&str>) -> Resp {
    let body = if path == "/v1/chat/completions" {
        CHAT
    } else {
        COMPLETION
    };
    let mut headers = vec![JSON];
    headers.extend(origin.map(|o| ("Origin", o)));
    send(s, "POST", path, Some("localhost"), &headers, body)
}

/// The CORS preflight a browser sends before a POST from `origin` with `headers`.
fn preflight(s: &Server, path: &str, origin: &str, headers: &str) -> Resp {
    send(
        s,
        "OPTIONS",
        path,
        Some("localhost"),
        &[
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", headers),
        ],
        "",
    )
}

/// A POST from a page of `origin`, which the server does not let in, to every route
/// that takes one: 403 without CORS headers.
fn assert_origin_refused(s: &Server, origin: &str) {
    for path in ["/v1/completions", "/v1/chat/completions", "/tokenize"] {
        let r = post_from(s, path, Some(origin));
        assert_eq!(r.status, 403, "Origin {origin} {path}: {}", r.text());
        no_cors_headers(&r, origin);
    }
}

#[test]
fn an_empty_api_key_is_refused_at_start() {
    let (status, err) = refused(&["--api-key", ""], &Launch::default());
    assert!(!status.success());
    assert!(err.contains("--api-key"), "{err}");
    let (status, err) = refused(
        &[],
        &Launch {
            env: &[("VKDECODE_API_KEY", "")],
            ..Launch::default()
        },
    );
    assert!(!status.success());
    assert!(err.contains("VKDECODE_API_KEY"), "{err}");
}

#[test]
fn the_key_comes_from_the_environment_and_the_bearer_scheme_has_any_case() {
    let s = Server::start_with(
        &["-c", "128"],
        &Launch {
            env: &[("VKDECODE_API_KEY", "env-key")],
            ..Launch::default()
        },
    );
    assert_eq!(s.request("GET", "/v1/models", &[], b"").status, 401);
    for wrong in [
        "Bearer wrong",
        "Bearer env-ke",
        "Bearer env-keyy",
        "Basic env-key",
        "Bearerenv-key",
        "env-key",
    ] {
        let r = s.request("GET", "/v1/models", &[("Authorization", wrong)], b"");
        assert_eq!(r.status, 401, "{wrong}");
    }
    for right in [
        "Bearer env-key",
        "bearer env-key",
        "BEARER env-key",
        "bEaReR   env-key",
    ] {
        let r = s.request("GET", "/v1/models", &[("Authorization", right)], b"");
        assert_eq!(r.status, 200, "{right}: {}", r.text());
    }
    // /health needs no key
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn a_context_too_small_names_the_flag_and_the_fix() {
    let (status, err) = refused(&["-c", "1"], &Launch::default());
    assert!(!status.success());
    assert!(err.contains("--ctx-size"), "{err}");
    assert!(err.contains("at least 2"), "{err}");
}

#[test]
fn a_non_loopback_host_without_a_key_is_warned_about() {
    // 192.0.2.1 is a documentation address no interface here has: the bind fails after
    // the warning, so nothing is ever exposed beyond loopback
    let (status, err) = refused(&["--host", "192.0.2.1"], &Launch::default());
    assert!(!status.success());
    assert!(err.contains("WARNING"), "{err}");
    assert!(err.contains("--api-key"), "{err}");
    let (_, err) = refused(
        &["--host", "192.0.2.1", "--api-key", "k"],
        &Launch::default(),
    );
    assert!(!err.contains("WARNING"), "{err}");
}

#[test]
fn page_style_requests_never_run_a_completion() {
    let s = Server::start(&["-c", "128", "--allowed-hosts", "Box.lan,other.lan"]);
    let port = s.addr.rsplit(':').next().unwrap().to_string();
    let requests = s.metric("vkdecode_requests_total");
    let tokens = s.metric("vkdecode_generated_tokens_total");

    // DNS rebinding: a foreign Host is refused on every route
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "box.lan.evil.example",
    ] {
        for (method, path, body) in [
            ("POST", "/v1/completions", COMPLETION),
            ("GET", "/health", ""),
            ("GET", "/v1/models", ""),
        ] {
            let r = send(&s, method, path, Some(host), &[JSON], body);
            assert_eq!(r.status, 403, "Host {host} {path}: {}", r.text());
            assert!(r.error()["message"]
                .as_str()
                .unwrap()
                .contains("--allowed-hosts"));
            no_cors_headers(&r, host);
        }
    }
    // a body that is not JSON: what a form or fetch(no-cors) from a page sends
    for ct in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = ct.iter().map(|c| ("Content-Type", *c)).collect();
        for path in ["/v1/completions", "/v1/chat/completions", "/tokenize"] {
            let r = send(&s, "POST", path, Some("localhost"), &headers, COMPLETION);
            assert_eq!(r.status, 415, "{ct:?} {path}: {}", r.text());
            r.error();
        }
    }
    // another site's Origin, preflight or not
    for origin in [
        "http://evil.example",
        "null",
        "http://localhost.evil.example",
    ] {
        assert_origin_refused(&s, origin);
        let r = preflight(&s, "/v1/completions", origin, "content-type");
        no_cors_headers(&r, origin);
    }
    assert_eq!(s.metric("vkdecode_requests_total"), requests);
    assert_eq!(s.metric("vkdecode_generated_tokens_total"), tokens);

    // what the server itself is called: loopback names, the bound address, the list
    for host in [
        "localhost".to_string(),
        "LocalHost".to_string(),
        format!("localhost:{port}"),
        "127.0.0.1".to_string(),
        s.addr.clone(),
        "[::1]".to_string(),
        format!("[::1]:{port}"),
        "box.lan".to_string(),
        "other.lan:80".to_string(),
    ] {
        let r = send(&s, "GET", "/health", Some(&host), &[], "");
        assert_eq!(r.status, 200, "Host {host}: {}", r.text());
        no_cors_headers(&r, &host);
    }
    // JSON with its parameters is JSON; a request with neither Host nor Origin (HTTP/1.0
    // style tools) is not a page's
    for ct in ["application/json; charset=utf-8", "Application/JSON"] {
        let r = send(
            &s,
            "POST",
            "/v1/completions",
            Some("localhost"),
            &[("Content-Type", ct)],
            COMPLETION,
        );
        assert_eq!(r.status, 200, "{ct}: {}", r.text());
        no_cors_headers(&r, ct);
    }
    let r = send(&s, "POST", "/v1/completions", None, &[JSON], COMPLETION);
    assert_eq!(r.status, 200, "no Host: {}", r.text());
    assert_eq!(s.metric("vkdecode_requests_total"), requests + 3.0);
}

#[test]
fn cors_headers_only_for_the_origins_given() {
    let s = Server::start(&[
        "-c",
        "128",
        "--cors-origin",
        "http://app.example,https://ui.example:8443",
    ]);
    let requests = s.metric("vkdecode_requests_total");
    for origin in ["http://app.example", "https://ui.example:8443"] {
        let r = preflight(
            &s,
            "/v1/chat/completions",
            origin,
            "authorization, content-type",
        );
        assert_eq!(r.status, 204, "preflight from {origin}: {}", r.text());
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
        let methods = r.header("access-control-allow-methods").unwrap_or("");
        assert!(methods.contains("POST"), "{methods}");
        let allowed = r
            .header("access-control-allow-headers")
            .unwrap_or("")
            .to_ascii_lowercase();
        assert!(
            allowed.contains("authorization") && allowed.contains("content-type"),
            "{allowed}"
        );
        let r = post_from(&s, "/v1/completions", Some(origin));
        assert_eq!(r.status, 200, "{origin}: {}", r.text());
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
        assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
    }
    for origin in [
        "http://evil.example",
        "http://app.example:81",
        "https://app.example",
    ] {
        assert_origin_refused(&s, origin);
    }
    // a request without an Origin gets no CORS headers either
    let r = post_from(&s, "/v1/completions", None);
    assert_eq!(r.status, 200);
    no_cors_headers(&r, "no Origin");
    assert_eq!(s.metric("vkdecode_requests_total"), requests + 3.0);
}

#[test]
fn unimplemented_parameters_are_refused_by_name() {
    let s = Server::start(&["-c", "128"]);
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        s.post("/v1/chat/completions", &body)
    };
    let complete = |extra: serde_json::Value| {
        let mut body = json!({"prompt": "Hi", "max_tokens": 1, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        s.post("/v1/completions", &body)
    };
    let requests = s.metric("vkdecode_requests_total");
    // unimplemented, or implemented and out of range
    for (param, value) in [
        ("logprobs", json!(3)),
        ("top_logprobs", json!(21)),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "not a name"}}]),
        ),
        // a schema keyword the grammar does not enforce
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}),
        ),
        ("grammar", json!("root ::= undefined-rule")),
        ("presence_penalty", json!(2.5)),
        ("frequency_penalty", json!(-3)),
    ] {
        let r = chat(json!({ param: value }));
        assert_eq!(r.status, 400, "chat {param}: {}", r.text());
        let e = r.error();
        assert_eq!(e["param"], param, "{e}");
        assert!(e["message"].as_str().unwrap().contains(param), "{e}");
    }
    for (param, value) in [
        ("logprobs", json!(6)),
        ("best_of", json!(3)),
        ("presence_penalty", json!(3)),
        ("frequency_penalty", json!(2.1)),
    ] {
        let r = complete(json!({ param: value }));
        assert_eq!(r.status, 400, "completions {param}: {}", r.text());
        assert_eq!(r.error()["param"], param);
    }
    assert_eq!(s.metric("vkdecode_requests_total"), requests);
    // their default values are what the server does anyway
    let r = chat(json!({
        "logprobs": false, "top_logprobs": null, "tools": [], "response_format": {"type": "text"},
        "presence_penalty": 0, "frequency_penalty": 0.0,
    }));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = complete(json!({"logprobs": null, "echo": false, "presence_penalty": 0.0}));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_prompt_over_the_context_names_the_field_it_came_in() {
    let s = Server::start(&["-c", "64"]);
    let long = "word ".repeat(200);
    let r = s.post("/v1/completions", &json!({"prompt": long}));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = r.error();
    assert_eq!(e["code"], "context_length_exceeded");
    assert_eq!(e["param"], "prompt", "{e}");
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error()["param"], "messages");
}

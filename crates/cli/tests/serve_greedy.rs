//! `vkdecode serve` gives the CLI's greedy output, token for token, and a request's
//! output does not depend on what runs beside it: 8 concurrent requests with different
//! prompts each equal the same prompt run alone.

mod serve_common;

use serde_json::json;
use serve_common::{cli_greedy, Server};

const N: usize = 16;

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at a temperature of",
    "My favourite season is autumn because",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
];

/// A greedy completion: its text and token count.
fn complete(s: &Server, prompt: &str) -> (String, u64) {
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn greedy_output_equals_the_cli_and_is_batch_invariant() {
    let s = Server::start(&["--parallel", "8", "-c", "256"]);

    // alone, one after another
    let alone: Vec<(String, u64)> = PROMPTS.iter().map(|p| complete(&s, p)).collect();
    for (p, (_, n)) in PROMPTS.iter().zip(&alone) {
        assert_eq!(*n, N as u64, "{p}");
    }

    // the CLI, same prompts, same file: the same text
    for (p, (text, _)) in PROMPTS.iter().zip(&alone).take(3) {
        let cli = cli_greedy(p, N, &["--ignore-eos", "-c", "256"]);
        assert_eq!(&cli, text, "server and CLI differ for {p:?}");
    }
    // chat: the CLI's --chat against /v1/chat/completions
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": N, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let chat = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let cli = cli_greedy(
        "What is the capital of France?",
        N,
        &["--chat", "-c", "256"],
    );
    assert_eq!(cli, chat, "chat: server and CLI differ");

    // all 8 at once: every one the same as alone
    let together: Vec<(String, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let s = &s;
                scope.spawn(move || complete(s, p))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((p, a), t) in PROMPTS.iter().zip(&alone).zip(&together) {
        assert_eq!(a, t, "{p:?}: alone and concurrent differ");
    }
    // they did run side by side, and no slot is left busy
    assert!(s.metric("vkdecode_slots_busy_peak") >= 2.0);
    assert_eq!(s.metric("vkdecode_slots_busy"), 0.0);
    assert_eq!(s.metric("vkdecode_requests_finished_total"), 17.0);
}

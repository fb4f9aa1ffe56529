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

/// llama-server's own surface, as its clients use it: `/completion` (whole and streamed,
/// `n_probs`, a stop word), `/props`, `/slots`, `/apply-template`, the un-prefixed
/// OpenAI routes, and the server flags `--seed`, `-n` and `--chat-template-file`.
#[test]
fn llama_server_routes_and_flags() {
    let dir = std::env::temp_dir().join(format!("vkdecode-llama-routes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let template_file = dir.join("template.jinja");
    let template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
    std::fs::write(&template_file, template).unwrap();
    let s = Server::start(&[
        "--parallel",
        "2",
        "-c",
        "256",
        "--seed",
        "5",
        "-n",
        "6",
        "--chat-template-file",
        template_file.to_str().unwrap(),
    ]);
    let prompt = "The capital of France is";
    let want = cli_greedy(prompt, 8, &[]);

    // /completion: llama-server's names in and out
    let r = s.post(
        "/completion",
        &json!({"prompt": prompt, "n_predict": 8, "temperature": 0, "n_probs": 2, "cache_prompt": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["content"], want.as_str(), "{v}");
    assert_eq!(v["tokens_predicted"], 8);
    assert_eq!(
        (v["stop"].as_bool(), v["stop_type"].as_str()),
        (Some(true), Some("limit"))
    );
    assert_eq!(v["has_new_line"], want.contains('\n'), "{v}");
    let settings = &v["generation_settings"];
    assert_eq!(
        (
            &settings["n_predict"],
            &settings["temperature"],
            &settings["n_probs"]
        ),
        (&json!(8), &json!(0.0), &json!(2)),
        "{v}"
    );
    assert_eq!(settings["logit_bias"], json!([]), "{v}");
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 8);
    for p in probs {
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2, "{p}");
        assert_eq!(
            top[0]["id"], p["id"],
            "greedy: the chosen token is the best"
        );
        assert!(p["logprob"].as_f64().unwrap() <= 0.0);
    }
    // streamed: the same text, then a last object with the summary
    let r = s.post(
        "/completion",
        &json!({"prompt": prompt, "n_predict": 8, "temperature": 0, "stream": true, "ignore_eos": true}),
    );
    let events: Vec<serde_json::Value> = r
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(last["tokens_predicted"], 8);
    assert_eq!(last["has_new_line"], want.contains('\n'), "{last}");
    assert_eq!(last["generation_settings"]["stream"], true, "{last}");
    // ignore_eos bans every end-of-generation token, listed as llama-server does
    let banned = last["generation_settings"]["logit_bias"]
        .as_array()
        .unwrap();
    assert!(!banned.is_empty(), "{last}");
    assert!(
        banned
            .iter()
            .all(|b| b["bias"].is_null() && b["token"].is_u64()),
        "{last}"
    );
    let text: String = events
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, want);
    // a stop word, token ids as the prompt
    let ids = s.post("/tokenize", &json!({"content": prompt})).json()["tokens"].clone();
    let cut = want.trim_start().chars().take(3).collect::<String>();
    let r = s.post(
        "/completion",
        &json!({"prompt": ids, "n_predict": 8, "temperature": 0, "stop": [cut]}),
    );
    let v = r.json();
    assert_eq!(
        (v["stop_type"].as_str(), v["stopping_word"].as_str()),
        (Some("word"), Some(cut.as_str())),
        "{v}"
    );
    assert!(want.starts_with(v["content"].as_str().unwrap()), "{v}");
    assert_eq!(
        s.post("/completion", &json!({"prompt": "x", "n_predict": 0}))
            .status,
        400
    );
    assert_eq!(s.post("/completion", &json!({"n_predict": 3})).status, 400);

    // -n is the default length; --seed makes unseeded sampling reproducible
    let r = s.post(
        "/completions",
        &json!({"prompt": "Once upon a time", "temperature": 1.0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    assert_eq!(a["usage"]["completion_tokens"], 6, "{a}");
    let fingerprint = a["system_fingerprint"].as_str().unwrap_or_default();
    assert!(fingerprint.starts_with("vkdecode-"), "{a}");
    // /metrics says when the server started, as llama-server's header does
    let started: u64 = (s.get("/metrics").header("process-start-time-unix"))
        .and_then(|t| t.parse().ok())
        .expect("a Process-Start-Time-Unix header on /metrics");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(started <= now && now - started < 3600, "{started} vs {now}");
    let b = s
        .post(
            "/completions",
            &json!({"prompt": "Once upon a time", "temperature": 1.0}),
        )
        .json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    // the template from the file renders /apply-template and /chat/completions
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let r = s.post("/apply-template", &json!({"messages": msgs}));
    assert_eq!(
        r.json()["prompt"],
        "[user] Hi\n[assistant] ",
        "{}",
        r.text()
    );
    let r = s.post(
        "/apply-template",
        &json!({"messages": msgs, "add_generation_prompt": false}),
    );
    assert_eq!(r.json()["prompt"], "[user] Hi\n", "{}", r.text());
    let r = s.post(
        "/chat/completions",
        &json!({"messages": msgs, "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "chat.completion");

    // /props and /slots describe the server; /models is /v1/models
    let p = s.get("/props").json();
    assert_eq!(p["total_slots"], 2, "{p}");
    assert_eq!(p["default_generation_settings"]["n_ctx"], 256);
    assert_eq!(p["default_generation_settings"]["params"]["n_predict"], 6);
    assert_eq!(p["chat_template"], template);
    let slots = s.get("/slots").json();
    assert_eq!(slots.as_array().unwrap().len(), 2, "{slots}");
    assert!(slots
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["is_processing"] == false && x["n_ctx"] == 256));
    assert_eq!(s.get("/models").json(), s.get("/v1/models").json());
    let _ = std::fs::remove_dir_all(&dir);
}

//! `POST /v1/chat/completions` and `POST /v1/completions`: check the request, queue a
//! job, and answer with one JSON object or a stream of server-sent events ending in
//! `data: [DONE]`.
//!
//! A client that ends its side of the connection after its request has either
//! half-closed (and reads on) or gone away; only a write tells which. So from then on
//! the answer sends something every second: a whole answer its head and a space (JSON
//! allows it before the object), a stream an SSE comment. A gone client fails the
//! write, its connection closes and its job is cancelled; a half-closed one gets the
//! whole answer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{json, Value};
use tokenizer::Message;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::conn::PeerEof;
use crate::error::ApiError;
use crate::http::AppState;
use crate::job::{Finish, Job, JobEvent, Usage};
use crate::metrics::Metrics;
use crate::params::{cap_max_tokens, ChatRequest, Checked, CompletionRequest, Prompt};
use crate::scheduler::SubmitError;

/// Which endpoint: they differ only in the shape of their answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    peer: Option<Extension<PeerEof>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let run = async {
        let req: ChatRequest = st.read_json(&headers, body).await?;
        st.check_model(req.model.as_deref())?;
        let checked = req.sampling.check(fresh_seed())?;
        if req.messages.is_empty() {
            return Err(ApiError::bad_param("messages", "messages is empty"));
        }
        let mut messages = Vec::with_capacity(req.messages.len());
        for m in &req.messages {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" => m.role.clone(),
                "developer" => "system".to_string(),
                other => {
                    return Err(ApiError::bad_param(
                        "messages",
                        format!("unsupported message role {other:?} (system, user, assistant)"),
                    ))
                }
            };
            messages.push(Message::new(role, m.text()?));
        }
        let template = st.template.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                "the model has no chat template (tokenizer.chat_template): use /v1/completions",
            )
        })?;
        let ids = engine::generate::chat_prompt_ids(&st.tok, template, &messages, false)
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
        Ok::<_, ApiError>((ids, checked))
    };
    match run.await {
        Ok((ids, checked)) => generate(&st, Kind::Chat, ids, checked, peer.map(|p| p.0)).await,
        Err(e) => e.into_response(),
    }
}

pub async fn completions(
    State(st): State<Arc<AppState>>,
    peer: Option<Extension<PeerEof>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let run = async {
        let req: CompletionRequest = st.read_json(&headers, body).await?;
        st.check_model(req.model.as_deref())?;
        let checked = req.sampling.check(fresh_seed())?;
        let ids = match &req.prompt {
            Prompt::Text(t) => encode(&st, t)?,
            Prompt::Texts(v) if v.len() == 1 => encode(&st, &v[0])?,
            Prompt::Texts(v) => {
                return Err(ApiError::bad_param(
                    "prompt",
                    format!("one prompt per request is supported (got {})", v.len()),
                ))
            }
            Prompt::Ids(ids) => {
                st.check_token_ids(ids, "prompt")?;
                ids.clone()
            }
        };
        if ids.is_empty() {
            return Err(ApiError::bad_param("prompt", "the prompt is empty"));
        }
        Ok::<_, ApiError>((ids, checked))
    };
    match run.await {
        Ok((ids, checked)) => {
            generate(&st, Kind::Completion, ids, checked, peer.map(|p| p.0)).await
        }
        Err(e) => e.into_response(),
    }
}

/// The prompt as the CLI's `-p` tokenizes it: BOS as the model says, special-token text
/// kept as plain text.
fn encode(st: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    st.tok
        .encode(text, true, false)
        .map_err(|e| ApiError::bad_param("prompt", e.to_string()))
}

/// A seed for requests that give none.
fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Queues the job and answers.
async fn generate(
    st: &Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    c: Checked,
    peer: Option<PeerEof>,
) -> Response {
    let field = match kind {
        Kind::Chat => "messages",
        Kind::Completion => "prompt",
    };
    let max_tokens = match cap_max_tokens(c.max_tokens, prompt.len(), st.opts.ctx_len, field) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        stop: c.stop.clone(),
        ignore_eos: c.ignore_eos,
        sampler: c.sampler.clone(),
        events: tx,
        queued_at: std::time::Instant::now(),
    };
    match st.scheduler.submit(job) {
        Ok(()) => Metrics::add(&st.metrics.requests, 1),
        Err(SubmitError::Busy) => {
            Metrics::add(&st.metrics.requests_rejected_busy, 1);
            return ApiError::busy(st.opts.queue).into_response();
        }
        Err(SubmitError::Stopped) => {
            return ApiError::unavailable(
                "the engine has stopped (the server is shutting down, or failed: see its log)",
            )
            .into_response()
        }
    }
    let head = Head {
        id: format!(
            "{}-{}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            st.next_id()
        ),
        created: crate::http::unix_now(),
        model: st.opts.model_id.clone(),
        kind,
    };
    if c.stream {
        stream_answer(head, rx, c.include_usage, peer)
    } else {
        whole_answer(head, rx, peer).await
    }
}

/// The fields every answer object of a request repeats.
#[derive(Clone)]
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// One answer object with `choices` (and `usage` when given).
    fn wrap(&self, chunk: bool, choices: Value, usage: Option<(&Usage, f64)>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some((u, queued_ms)) = usage {
            v["usage"] = usage_json(u);
            v["timings"] = json!({
                "queued_ms": queued_ms,
                "prompt_ms": u.ttft_ms,
                "predicted_ms": u.decode_ms,
                "prompt_n": u.prefilled_tokens,
                "cache_n": u.reused_tokens,
                "predicted_n": u.generated_tokens,
            });
        }
        v
    }

    /// A choice carrying `text` (a message, a delta, or a completion's text).
    fn choice(&self, chunk: bool, text: Option<&str>, finish: Option<Finish>) -> Value {
        let finish = finish.map(Finish::as_str);
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text.unwrap_or("")},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => json!({
                "index": 0,
                "delta": match text { Some(t) => json!({"content": t}), None => json!({}) },
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Completion, _) => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        }
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.generated_tokens,
        "total_tokens": u.prompt_tokens + u.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": u.reused_tokens},
    })
}

/// How often an answer writes to a client that has ended its side, to find out whether
/// it is still there.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Resolves a probe period after the client ended its side (never without one).
async fn probe_due(peer: Option<&PeerEof>) {
    match peer {
        Some(p) => {
            p.ended().await;
            tokio::time::sleep(PROBE_EVERY).await;
        }
        None => std::future::pending().await,
    }
}

/// Waits for the end and answers with one object (or, once the client has ended its
/// side, with [`probed_answer`]).
async fn whole_answer(
    head: Head,
    mut rx: UnboundedReceiver<JobEvent>,
    peer: Option<PeerEof>,
) -> Response {
    let mut text = String::new();
    let probe = probe_due(peer.as_ref());
    tokio::pin!(probe);
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            _ = &mut probe => return probed_answer(head, rx, text),
        };
        match event {
            Some(JobEvent::Text(t)) => text.push_str(&t),
            Some(JobEvent::Done {
                finish,
                usage,
                queued_ms,
            }) => {
                let choice = head.choice(false, Some(&text), Some(finish));
                let body = head.wrap(false, json!([choice]), Some((&usage, queued_ms)));
                return (StatusCode::OK, axum::Json(body)).into_response();
            }
            Some(JobEvent::Error(msg)) => return error_for(msg).into_response(),
            None => return dropped().into_response(),
        }
    }
}

/// A whole answer whose head goes out before its end: a space now and every probe
/// period, then the object (or the error object, under the 200 already sent).
fn probed_answer(head: Head, rx: UnboundedReceiver<JobEvent>, text: String) -> Response {
    struct Late {
        head: Head,
        rx: UnboundedReceiver<JobEvent>,
        text: String,
        started: bool,
    }
    let late = Late {
        head,
        rx,
        text,
        started: false,
    };
    let body = stream::unfold(Some(late), |late| async move {
        let mut s = late?;
        if !s.started {
            s.started = true;
            return Some((Ok::<_, std::convert::Infallible>(" ".to_string()), Some(s)));
        }
        let tick = tokio::time::sleep(PROBE_EVERY);
        tokio::pin!(tick);
        loop {
            let event = tokio::select! {
                event = s.rx.recv() => event,
                _ = &mut tick => return Some((Ok(" ".to_string()), Some(s))),
            };
            let last = match event {
                Some(JobEvent::Text(t)) => {
                    s.text.push_str(&t);
                    continue;
                }
                Some(JobEvent::Done {
                    finish,
                    usage,
                    queued_ms,
                }) => {
                    let choice = s.head.choice(false, Some(&s.text), Some(finish));
                    s.head
                        .wrap(false, json!([choice]), Some((&usage, queued_ms)))
                }
                Some(JobEvent::Error(msg)) => error_for(msg).body(),
                None => dropped().body(),
            };
            return Some((Ok(last.to_string()), None));
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::internal("building the answer").into_response())
}

/// A job's channel closed unanswered: the engine thread ended (it drops its queue when it
/// stops), so the service is unavailable rather than broken by this request.
fn dropped() -> ApiError {
    ApiError::unavailable("the engine stopped before answering (see the server's log)")
}

/// A failure the engine reported: shutting down is a 503, the rest a 500.
fn error_for(msg: String) -> ApiError {
    if msg.contains("shutting down") || msg.contains("engine stopped") {
        ApiError::unavailable(msg)
    } else {
        ApiError::internal(msg)
    }
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// Where a stream is.
struct Streaming {
    head: Head,
    rx: UnboundedReceiver<JobEvent>,
    peer: Option<PeerEof>,
    include_usage: bool,
    /// The chat stream's first chunk (the assistant role) is still to send.
    role_sent: bool,
    ended: bool,
}

/// Answers with server-sent events: one chunk per piece of text, a last chunk with the
/// `finish_reason` (and, with `stream_options.include_usage`, one with the usage), then
/// `data: [DONE]`. An engine failure mid-stream is an `error` event, and the stream ends.
/// A client that goes away drops the receiver; the engine frees its slot at the next step.
fn stream_answer(
    head: Head,
    rx: UnboundedReceiver<JobEvent>,
    include_usage: bool,
    peer: Option<PeerEof>,
) -> Response {
    let state = Streaming {
        role_sent: head.kind != Kind::Chat,
        head,
        rx,
        peer,
        include_usage,
        ended: false,
    };
    let events = stream::unfold(state, |mut s| async move {
        if s.ended {
            return None;
        }
        if !s.role_sent {
            s.role_sent = true;
            let choice = json!({
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            });
            let out = sse(&s.head.wrap(true, json!([choice]), None));
            return Some((Ok::<_, std::convert::Infallible>(out), s));
        }
        let out = loop {
            let event = tokio::select! {
                event = s.rx.recv() => event,
                // a comment line, which SSE clients skip
                _ = probe_due(s.peer.as_ref()) => break ": probe\n\n".to_string(),
            };
            match event {
                Some(JobEvent::Text(t)) if t.is_empty() => continue,
                Some(JobEvent::Text(t)) => {
                    let choice = s.head.choice(true, Some(&t), None);
                    break sse(&s.head.wrap(true, json!([choice]), None));
                }
                Some(JobEvent::Done {
                    finish,
                    usage,
                    queued_ms,
                }) => {
                    s.ended = true;
                    let text = match s.head.kind {
                        Kind::Chat => None,
                        Kind::Completion => Some(""),
                    };
                    let choice = s.head.choice(true, text, Some(finish));
                    let mut out = sse(&s.head.wrap(true, json!([choice]), None));
                    if s.include_usage {
                        out.push_str(&sse(&s.head.wrap(
                            true,
                            json!([]),
                            Some((&usage, queued_ms)),
                        )));
                    }
                    out.push_str("data: [DONE]\n\n");
                    break out;
                }
                Some(JobEvent::Error(msg)) => {
                    s.ended = true;
                    break sse(&error_for(msg).body());
                }
                None => {
                    s.ended = true;
                    break sse(&dropped().body());
                }
            }
        };
        Some((Ok(out), s))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| ApiError::internal("building the stream").into_response())
}

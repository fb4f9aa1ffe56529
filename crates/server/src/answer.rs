//! A generation request's answer, built from its jobs' events: one JSON object, or a
//! stream of server-sent events ending in `data: [DONE]`, in chat's or completions'
//! shape (with log-probabilities, an echoed prompt, or a tool call when asked).
//!
//! A client that ends its side of the connection after its request has either
//! half-closed (and reads on) or gone away; only a write tells which. So from then on
//! the answer sends something: a whole answer its head and a space (JSON allows it
//! before the object) at once, another 100 ms later and then every second; a stream an
//! SSE comment every second between its events. A gone client fails the
//! write, its connection closes and its job is cancelled; a half-closed one gets the
//! whole answer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::TokenLogprob;
use futures_util::stream;
use serde_json::{json, Value};
use tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::conn::PeerEof;
use crate::error::ApiError;
use crate::job::{Finish, JobEvent, Usage};
use crate::logprobs::{self, CompletionLogprobs};
use crate::params::Checked;
use crate::state::AppState;
use crate::tools::{Call, Tools};

/// Which endpoint: they differ only in the shape of their answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// How a request's answer is shaped.
pub(crate) struct Shape {
    pub kind: Kind,
    /// Completions with `echo`: the prompt's text, which starts each choice's text.
    pub echo: Option<String>,
    /// Chat with tools: an answer that is a call becomes `tool_calls`.
    pub tools: Option<Tools>,
}

/// Answers a request whose jobs are queued: `rx` carries their events, tagged with the
/// choice's index.
pub(crate) async fn respond(
    st: &Arc<AppState>,
    out: Shape,
    prompt: &[u32],
    c: &Checked,
    rx: Events,
    peer: Option<PeerEof>,
) -> Response {
    let Shape { kind, echo, tools } = out;
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
        created: crate::state::unix_now(),
        model: st.opts.model_id.clone(),
        kind,
    };
    let answer = Answer {
        head,
        tok: st.tok.clone(),
        logprobs: c.sampler.logprobs.is_some(),
        choices: (0..c.n)
            .map(|_| match (&echo, c.sampler.logprobs) {
                // the echoed prompt's tokens come first in the logprobs: the first with
                // nothing to predict it, the others as they are scored
                (Some(_), Some(_)) => Choice {
                    scored: vec![(prompt[0], None)],
                    ..Choice::default()
                },
                (Some(e), None) => Choice {
                    offset: e.chars().count(),
                    ..Choice::default()
                },
                (None, _) => Choice::default(),
            })
            .collect(),
        echo,
        tools,
        finished: 0,
    };
    if c.stream {
        stream_answer(answer, rx, c.include_usage, peer)
    } else {
        whole_answer(collect(answer, rx), peer).await
    }
}

/// The events of a request's choices, tagged with the choice's index.
pub(crate) type Events = UnboundedReceiver<(usize, JobEvent)>;

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
            // the build that answered: the same request with the same seed on the same
            // fingerprint gives the same text
            "system_fingerprint": concat!("vkdecode-", env!("CARGO_PKG_VERSION")),
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

    /// Choice `index` carrying `text` (a message, a delta, or a completion's text).
    fn choice(
        &self,
        chunk: bool,
        index: usize,
        text: Option<&str>,
        logprobs: Value,
        finish: Option<Finish>,
    ) -> Value {
        let finish = finish.map(Finish::as_str);
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": index,
                "message": {"role": "assistant", "content": text.unwrap_or("")},
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => json!({
                "index": index,
                "delta": match text { Some(t) => json!({"content": t}), None => json!({}) },
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Completion, _) => json!({
                "index": index,
                "text": text.unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }
}

impl Head {
    /// Choice `index` carrying a tool call: a message (or a delta) with `tool_calls` and
    /// no content, `finish_reason: "tool_calls"` (in the whole answer; a stream sends it
    /// in the next chunk).
    fn call_choice(&self, chunk: bool, index: usize, call: &Call, logprobs: Value) -> Value {
        let mut tool_call = json!({
            "id": format!("call_{}_{index}", self.id),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        });
        if chunk {
            tool_call["index"] = json!(0);
            json!({
                "index": index,
                "delta": {"role": "assistant", "content": null, "tool_calls": [tool_call]},
                "logprobs": logprobs,
                "finish_reason": null,
            })
        } else {
            json!({
                "index": index,
                "message": {"role": "assistant", "content": null, "tool_calls": [tool_call]},
                "logprobs": logprobs,
                "finish_reason": "tool_calls",
            })
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

/// One choice's answer so far.
#[derive(Default)]
struct Choice {
    text: String,
    /// Log-probabilities not yet sent (a stream), or all of them (a whole answer).
    lps: Vec<TokenLogprob>,
    /// Completions: the character offset of the next token in the answer's text.
    offset: usize,
    /// Completions with `echo` and `logprobs`: the prompt's tokens not yet sent, with
    /// their log-probabilities (`None` for the first).
    scored: Vec<(u32, Option<TokenLogprob>)>,
    done: Option<(Finish, Usage, f64)>,
}

/// A request's answer, built from its choices' events.
struct Answer {
    head: Head,
    tok: Arc<Tokenizer>,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    choices: Vec<Choice>,
    /// Completions with `echo`: the prompt's text, which starts each choice's text.
    echo: Option<String>,
    /// Chat with tools: the text is held back and, when it is a call, sent as one.
    tools: Option<Tools>,
    /// Choices done.
    finished: usize,
}

impl Answer {
    /// Records an event of choice `i`; an engine error ends the whole answer.
    fn take(&mut self, i: usize, event: JobEvent) -> Result<(), ApiError> {
        let c = &mut self.choices[i];
        match event {
            JobEvent::Text(t) => c.text.push_str(&t),
            JobEvent::Logprob(lp) => c.lps.push(lp),
            JobEvent::PromptLogprob(lp) => c.scored.push((lp.token, Some(lp))),
            JobEvent::Done {
                finish,
                usage,
                queued_ms,
            } => {
                c.done = Some((finish, usage, queued_ms));
                self.finished += 1;
            }
            JobEvent::Error(msg) => return Err(error_for(msg)),
        }
        Ok(())
    }

    fn all_done(&self) -> bool {
        self.finished == self.choices.len()
    }

    /// Choice `i`'s pending log-probabilities in the answer's shape (`null` when the
    /// request asked for none); they are sent.
    fn drain_logprobs(&mut self, i: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let c = &mut self.choices[i];
        let lps = std::mem::take(&mut c.lps);
        match self.head.kind {
            Kind::Chat => logprobs::chat(&self.tok, &lps),
            Kind::Completion => {
                let mut cols = CompletionLogprobs::default();
                for (id, lp) in std::mem::take(&mut c.scored) {
                    c.offset = cols.push(&self.tok, id, lp.as_ref(), c.offset);
                }
                for lp in &lps {
                    c.offset = cols.push(&self.tok, lp.token, Some(lp), c.offset);
                }
                cols.take()
            }
        }
    }

    /// The usage of all choices together: the prompt counted once, generated tokens
    /// summed; times are the slowest choice's.
    fn usage(&self) -> (Usage, f64) {
        let mut all = self.choices.iter().filter_map(|c| c.done.as_ref());
        let Some(&(_, mut u, mut queued)) = all.next() else {
            return (Usage::default(), 0.0);
        };
        for &(_, v, q) in all {
            u.generated_tokens += v.generated_tokens;
            u.prefilled_tokens += v.prefilled_tokens;
            u.decode_ms = u.decode_ms.max(v.decode_ms);
            u.ttft_ms = u.ttft_ms.max(v.ttft_ms);
            queued = queued.max(q);
        }
        (u, queued)
    }

    /// The whole answer's object.
    fn whole(&mut self) -> Value {
        let mut choices = Vec::with_capacity(self.choices.len());
        for i in 0..self.choices.len() {
            let logprobs = self.drain_logprobs(i);
            let c = &self.choices[i];
            let text = match &self.echo {
                Some(e) => format!("{e}{}", c.text),
                None => c.text.clone(),
            };
            let finish = c.done.as_ref().map(|d| d.0);
            match self.tools.as_ref().and_then(|t| t.parse_call(&c.text)) {
                Some(call) => choices.push(self.head.call_choice(false, i, &call, logprobs)),
                None => choices.push(self.head.choice(false, i, Some(&text), logprobs, finish)),
            }
        }
        let (u, queued) = self.usage();
        self.head
            .wrap(false, Value::Array(choices), Some((&u, queued)))
    }
}

/// How often an answer writes to a client that has ended its side, to find out whether
/// it is still there.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// When a whole answer probes the second time: a client that is gone answers the first
/// write with a reset within a round trip, and the write after it fails, so its job is
/// cancelled a moment after it hung up (llama-server's own test looks 2 s later).
const PROBE_SECOND: Duration = Duration::from_millis(100);

/// Resolves `after` the client ended its side (never without one).
async fn probe_due(peer: Option<&PeerEof>, after: Duration) {
    match peer {
        Some(p) => {
            p.ended().await;
            tokio::time::sleep(after).await;
        }
        None => std::future::pending().await,
    }
}

/// The whole answer of a request's choices: the object once every choice is done.
async fn collect(mut answer: Answer, mut rx: Events) -> Result<Value, ApiError> {
    loop {
        let Some((i, event)) = rx.recv().await else {
            return Err(dropped());
        };
        answer.take(i, event)?;
        if answer.all_done() {
            return Ok(answer.whole());
        }
    }
}

/// Answers with the one object `finish` resolves to (or its error). Once the client has
/// ended its side, the head goes out at once with a space, then a space after
/// [`PROBE_SECOND`] and every [`PROBE_EVERY`], then the object (or the error object,
/// under the 200 already sent): a gone client fails a write, which drops `finish` and so
/// cancels its job.
pub(crate) async fn whole_answer<F>(finish: F, peer: Option<PeerEof>) -> Response
where
    F: std::future::Future<Output = Result<Value, ApiError>> + Send + 'static,
{
    let mut finish = Box::pin(finish);
    tokio::select! {
        done = &mut finish => {
            return match done {
                Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
                Err(e) => e.into_response(),
            };
        }
        _ = probe_due(peer.as_ref(), Duration::ZERO) => {}
    }
    // the state: the answer's future and how many probes went out
    let body = stream::unfold(Some((finish, 0u32)), |state| async move {
        let (mut finish, probes) = state?;
        if probes == 0 {
            return Some((
                Ok::<_, std::convert::Infallible>(" ".to_string()),
                Some((finish, 1)),
            ));
        }
        let wait = if probes == 1 {
            PROBE_SECOND
        } else {
            PROBE_EVERY
        };
        tokio::select! {
            done = &mut finish => {
                let last = done.unwrap_or_else(|e| e.body());
                Some((Ok(last.to_string()), None))
            }
            _ = tokio::time::sleep(wait) => Some((Ok(" ".to_string()), Some((finish, probes + 1)))),
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
    answer: Answer,
    rx: Events,
    peer: Option<PeerEof>,
    include_usage: bool,
    /// The first chunks (chat: each choice's assistant role; completions with `echo`: the
    /// prompt) are still to send.
    opened: bool,
    ended: bool,
}

/// Answers with server-sent events: one chunk per piece of text of a choice (with the
/// log-probabilities of its tokens when asked for), a chunk with each choice's
/// `finish_reason` (and, with `stream_options.include_usage`, one with the usage of all),
/// then `data: [DONE]`. An engine failure mid-stream is an `error` event, and the stream
/// ends. A client that goes away drops the receiver; the engine frees its slots at the
/// next step.
fn stream_answer(
    answer: Answer,
    rx: Events,
    include_usage: bool,
    peer: Option<PeerEof>,
) -> Response {
    let state = Streaming {
        opened: answer.head.kind != Kind::Chat && answer.echo.is_none(),
        answer,
        rx,
        peer,
        include_usage,
        ended: false,
    };
    let events = stream::unfold(state, |mut s| async move {
        if s.ended {
            return None;
        }
        let a = &mut s.answer;
        if !s.opened {
            s.opened = true;
            let choices: Vec<Value> = (0..a.choices.len())
                .map(|i| match &a.echo {
                    Some(e) => a.head.choice(true, i, Some(e), Value::Null, None),
                    None => json!({
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": null,
                        "finish_reason": null,
                    }),
                })
                .collect();
            let out = sse(&a.head.wrap(true, Value::Array(choices), None));
            return Some((Ok::<_, std::convert::Infallible>(out), s));
        }
        let out = loop {
            let event = tokio::select! {
                event = s.rx.recv() => event,
                // a comment line, which SSE clients skip
                _ = probe_due(s.peer.as_ref(), PROBE_EVERY) => break ": probe\n\n".to_string(),
            };
            let a = &mut s.answer;
            match event {
                Some((_, JobEvent::Text(t))) if t.is_empty() => continue,
                Some((i, JobEvent::Text(t))) if a.tools.is_some() => {
                    // held back until the end: the text may turn out to be a call
                    a.choices[i].text.push_str(&t);
                    continue;
                }
                Some((i, JobEvent::Text(t))) => {
                    let logprobs = a.drain_logprobs(i);
                    let choice = a.head.choice(true, i, Some(&t), logprobs, None);
                    break sse(&a.head.wrap(true, json!([choice]), None));
                }
                Some((i, JobEvent::Logprob(lp))) => {
                    a.choices[i].lps.push(lp);
                    continue;
                }
                Some((i, JobEvent::PromptLogprob(lp))) => {
                    a.choices[i].scored.push((lp.token, Some(lp)));
                    continue;
                }
                Some((i, done @ JobEvent::Done { .. })) => {
                    let JobEvent::Done { finish, .. } = done else {
                        unreachable!("matched above")
                    };
                    let _ = a.take(i, done);
                    let text = match a.head.kind {
                        Kind::Chat => None,
                        Kind::Completion => Some(""),
                    };
                    let logprobs = if a.choices[i].lps.is_empty() && a.choices[i].scored.is_empty()
                    {
                        Value::Null
                    } else {
                        a.drain_logprobs(i)
                    };
                    let mut out = String::new();
                    let mut finish = finish.as_str();
                    if let Some(t) = &a.tools {
                        // the held-back text, or the call it is
                        let held = std::mem::take(&mut a.choices[i].text);
                        let first = match t.parse_call(&held) {
                            Some(call) => {
                                finish = "tool_calls";
                                Some(a.head.call_choice(true, i, &call, logprobs.clone()))
                            }
                            None if held.is_empty() => None,
                            None => {
                                Some(a.head.choice(true, i, Some(&held), logprobs.clone(), None))
                            }
                        };
                        if let Some(first) = first {
                            out.push_str(&sse(&a.head.wrap(true, json!([first]), None)));
                        }
                    }
                    let mut choice = a.head.choice(true, i, text, Value::Null, None);
                    choice["finish_reason"] = json!(finish);
                    if a.tools.is_none() {
                        choice["logprobs"] = logprobs;
                    }
                    out.push_str(&sse(&a.head.wrap(true, json!([choice]), None)));
                    if !a.all_done() {
                        break out;
                    }
                    s.ended = true;
                    if s.include_usage {
                        let (u, queued) = a.usage();
                        out.push_str(&sse(&a.head.wrap(true, json!([]), Some((&u, queued)))));
                    }
                    out.push_str("data: [DONE]\n\n");
                    break out;
                }
                Some((_, JobEvent::Error(msg))) => {
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
    sse_response(Body::from_stream(events))
}

/// A `text/event-stream` answer with `body`.
pub(crate) fn sse_response(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| ApiError::internal("building the stream").into_response())
}

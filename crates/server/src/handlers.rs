//! `POST /v1/chat/completions` and `POST /v1/completions`: check the request, queue a
//! job per choice (`n`), and answer with one JSON object or a stream of server-sent
//! events ending in `data: [DONE]`.
//!
//! `n > 1` runs its choices as separate jobs: each takes its own slot (or waits in the
//! queue for one) and batches with the others in the engine's decode steps. The prompt
//! is prefilled once: the engine gives the other choices' slots a device copy of the
//! first one's K/V rows (see `engine::Slots::submit`), so each feeds only the prompt's
//! last token. Choice `i` samples with seed `seed + i`.
//!
//! The answer's shapes, and how a half-closed client is told from a gone one: `answer`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokenizer::Message;
use tokio::sync::mpsc::unbounded_channel;

use crate::answer::{self, Kind, Shape};
use crate::conn::PeerEof;
use crate::constrain;
use crate::error::ApiError;
use crate::job::Job;
use crate::metrics::Metrics;
use crate::params::{
    cap_max_tokens, ChatMessage, ChatRequest, Checked, CompletionRequest, Endpoint, Prompt,
};
use crate::scheduler::SubmitError;
use crate::state::AppState;
use crate::tools::{self, Tools};

pub async fn chat(
    State(st): State<Arc<AppState>>,
    peer: Option<Extension<PeerEof>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let run = async {
        let (req, text): (ChatRequest, _) = st.read_json_and_text(&headers, body).await?;
        st.check_model(req.model.as_deref())?;
        let mut checked =
            req.sampling
                .check(st.default_seed(), Endpoint::Chat, st.tok.vocab_size())?;
        checked.sampler.grammar = constrain::from_body(&st, &text)?;
        let tools = Tools::from_body(&text)?;
        if let Some(schema) = tools.as_ref().and_then(Tools::call_schema) {
            if checked.sampler.grammar.is_some() {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "a required tool call and response_format (or grammar) cannot both hold the answer",
                ));
            }
            checked.sampler.grammar = Some(constrain::from_schema(&st, &schema, "tools")?);
        }
        if req.messages.is_empty() {
            return Err(ApiError::bad_param("messages", "messages is empty"));
        }
        let messages = chat_messages(&req.messages, tools.as_ref())?;
        let template = st.template.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                "the model has no chat template (tokenizer.chat_template): use /v1/completions",
            )
        })?;
        let ids = engine::generate::chat_prompt_ids(&st.tok, template, &messages, false)
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
        Ok::<_, ApiError>((ids, checked, tools))
    };
    match run.await {
        Ok((ids, checked, tools)) => {
            let out = Shape {
                kind: Kind::Chat,
                echo: None,
                tools,
            };
            generate(&st, out, ids, checked, peer.map(|p| p.0)).await
        }
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
        let (req, text): (CompletionRequest, _) = st.read_json_and_text(&headers, body).await?;
        st.check_model(req.model.as_deref())?;
        let mut checked = req.sampling.check(
            st.default_seed(),
            Endpoint::Completions,
            st.tok.vocab_size(),
        )?;
        checked.sampler.grammar = constrain::from_body(&st, &text)?;
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
        let echo = checked.echo.then(|| match &req.prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Texts(v) => v[0].clone(),
            Prompt::Ids(ids) => st.tok.decode(ids),
        });
        Ok::<_, ApiError>((ids, checked, echo))
    };
    match run.await {
        Ok((ids, checked, echo)) => {
            let out = Shape {
                kind: Kind::Completion,
                echo,
                tools: None,
            };
            generate(&st, out, ids, checked, peer.map(|p| p.0)).await
        }
        Err(e) => e.into_response(),
    }
}

/// The request's messages as the template renders them: roles checked, earlier tool
/// calls and their results written in the generic format of [`crate::tools`], the tools
/// described in the system message.
fn chat_messages(msgs: &[ChatMessage], tools: Option<&Tools>) -> Result<Vec<Message>, ApiError> {
    let mut messages = Vec::with_capacity(msgs.len() + 1);
    for m in msgs {
        let text = m.text()?;
        let message = match m.role.as_str() {
            "system" | "user" => Message::new(m.role.clone(), text),
            "developer" => Message::new("system", text),
            "assistant" => {
                let mut parts: Vec<String> = Vec::new();
                if !text.is_empty() {
                    parts.push(text);
                }
                for c in m.tool_calls.iter().flatten() {
                    parts.push(tools::render_call(&c.function.name, &c.function.arguments));
                }
                Message::new("assistant", parts.join("\n"))
            }
            "tool" => {
                let id = m.tool_call_id.as_deref().unwrap_or("");
                let name = msgs
                    .iter()
                    .flat_map(|p| p.tool_calls.iter().flatten())
                    .find(|c| c.id.as_deref() == Some(id))
                    .map_or("a function", |c| c.function.name.as_str());
                Message::new("user", format!("Result of {name} ({id}): {text}"))
            }
            other => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!(
                    "unsupported message role {other:?} (system, developer, user, assistant, tool)"
                ),
                ))
            }
        };
        messages.push(message);
    }
    if let Some(t) = tools {
        let text = t.system_text();
        match messages.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{text}", first.content);
            }
            _ => messages.insert(0, Message::new("system", text)),
        }
    }
    Ok(messages)
}

/// The prompt as the CLI's `-p` tokenizes it: BOS as the model says, special-token text
/// kept as plain text.
fn encode(st: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    st.tok
        .encode(text, true, false)
        .map_err(|e| ApiError::bad_param("prompt", e.to_string()))
}

/// `POST /apply-template` (llama-server's): the prompt text the chat template makes of
/// `messages` (and `tools`), as `/v1/chat/completions` would run it.
pub async fn apply_template(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    #[derive(serde::Deserialize)]
    struct Req {
        messages: Vec<ChatMessage>,
        /// End with the assistant's turn opened (llama-server's default: true).
        add_generation_prompt: Option<bool>,
    }
    let run = async {
        let (req, text): (Req, _) = st.read_json_and_text(&headers, body).await?;
        let tools = Tools::from_body(&text)?;
        let messages = chat_messages(&req.messages, tools.as_ref())?;
        let template = st.template.as_ref().ok_or_else(|| {
            ApiError::bad_request("the model has no chat template (tokenizer.chat_template)")
        })?;
        let piece = |id: Option<u32>| id.and_then(|i| st.tok.piece(i)).unwrap_or("").to_string();
        let prompt = template
            .render(
                &messages,
                req.add_generation_prompt.unwrap_or(true),
                &piece(st.tok.bos()),
                &piece(st.tok.eos()),
            )
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
        Ok::<_, ApiError>(axum::Json(json!({ "prompt": prompt })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// Queues one job per choice and answers. Each job's events are forwarded, tagged with
/// the choice's index, into one channel; a forwarder ends (dropping its job's channel,
/// which cancels the job) when the answer stops listening.
async fn generate(
    st: &Arc<AppState>,
    out: Shape,
    prompt: Vec<u32>,
    c: Checked,
    peer: Option<PeerEof>,
) -> Response {
    let field = match out.kind {
        Kind::Chat => "messages",
        Kind::Completion => "prompt",
    };
    let asked = c.max_tokens.or(st.opts.n_predict);
    let max_tokens = match cap_max_tokens(asked, prompt.len(), st.opts.ctx_len, field) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = unbounded_channel();
    for i in 0..c.n {
        let (job_tx, mut job_rx) = unbounded_channel();
        let mut sampler = c.sampler.clone();
        sampler.seed = sampler.seed.wrapping_add(i as u64);
        let job = Job {
            prompt: prompt.clone(),
            max_tokens,
            stop: c.stop.clone(),
            ignore_eos: c.ignore_eos,
            // echo with logprobs: the prompt's tokens are scored too
            prompt_logprobs: c.sampler.logprobs.filter(|_| out.echo.is_some()),
            sampler,
            events: job_tx,
            queued_at: std::time::Instant::now(),
        };
        if let Err(e) = submit(st, job) {
            return e.into_response();
        }
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = job_rx.recv() => {
                        let Some(e) = event else { break };
                        if tx.send((i, e)).is_err() {
                            break;
                        }
                    }
                    _ = tx.closed() => break,
                }
            }
        });
    }
    drop(tx);
    if c.sampler.logprobs.is_some() {
        Metrics::add(&st.metrics.logprob_requests, 1);
    }
    if c.sampler.grammar.is_some() {
        Metrics::add(&st.metrics.constrained_requests, 1);
    }
    answer::respond(st, out, &prompt, &c, rx, peer).await
}

/// Queues `job`, counting it; a full queue is a 503 with `Retry-After`, a stopped engine
/// a 503 saying so.
pub(crate) fn submit(st: &AppState, job: Job) -> Result<(), ApiError> {
    match st.scheduler.submit(job) {
        Ok(()) => {
            Metrics::add(&st.metrics.requests, 1);
            Ok(())
        }
        Err(SubmitError::Busy) => {
            Metrics::add(&st.metrics.requests_rejected_busy, 1);
            Err(ApiError::busy(st.opts.queue))
        }
        Err(SubmitError::Stopped) => Err(ApiError::unavailable(
            "the engine has stopped (the server is shutting down, or failed: see its log)",
        )),
    }
}

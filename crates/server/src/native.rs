//! llama-server's own `POST /completion`, so that clients written for it work unchanged.
//!
//! The request takes llama-server's names: `prompt` (a string, token ids, or a list of
//! one of them), `n_predict` (-1 or absent: the server's `-n`, else until the end),
//! `n_probs` (log-probabilities of the chosen token and this many alternatives, 0 to 20),
//! `grammar`, `json_schema`, `cache_prompt` (accepted; the slots always reuse a cached
//! prefix), `stream`, and the sampling fields both APIs share (`temperature`, `top_k`,
//! `top_p`, `min_p`, `seed`, `stop`, `ignore_eos`, `repeat_penalty`, `repeat_last_n`,
//! `presence_penalty`, `frequency_penalty`; `logit_bias` as `[[id, bias], ...]` or an
//! object, `false` for a bias of -inf). The answer is llama-server's: `content`,
//! `tokens_predicted`, `tokens_evaluated`, `stop`, `stop_type` (`eos`, `word`, `limit`),
//! `stopping_word`, `truncated`, `has_new_line`, `timings`, `generation_settings` (the
//! request's settings as run), and `completion_probabilities` with `n_probs`; a stream sends `data: {"content": ..., "stop": false}` per piece and a last
//! object with `stop: true` and the summary.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::conn::PeerEof;
use crate::constrain;
use crate::error::ApiError;
use crate::job::{Finish, Job, JobEvent, Usage};
use crate::metrics::Metrics;
use crate::params::{cap_max_tokens, Checked, Endpoint, Sampling};
use crate::state::AppState;

/// Most alternatives `n_probs` may ask for.
const MAX_N_PROBS: i64 = 20;

/// The fields only llama-server's `/completion` has; the rest is [`Sampling`].
#[derive(Deserialize)]
struct Native {
    prompt: Option<Value>,
    n_predict: Option<i64>,
    n_probs: Option<i64>,
    logit_bias: Option<Value>,
    #[serde(flatten)]
    sampling: Value,
}

/// `POST /completion`.
pub async fn completion(
    State(st): State<Arc<AppState>>,
    peer: Option<Extension<PeerEof>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let run = async {
        let (req, text): (Native, _) = st.read_json_and_text(&headers, body).await?;
        let (ids, checked) = check(&st, &req, &text)?;
        Ok::<_, ApiError>((ids, checked))
    };
    let (ids, checked) = match run.await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let max_tokens = match cap_max_tokens(
        checked.max_tokens.or(st.opts.n_predict),
        ids.len(),
        st.opts.ctx_len,
        "prompt",
    ) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt: ids.clone(),
        max_tokens,
        stop: checked.stop.clone(),
        ignore_eos: checked.ignore_eos,
        sampler: checked.sampler.clone(),
        prompt_logprobs: None,
        events: tx,
        queued_at: Instant::now(),
    };
    if let Err(e) = crate::handlers::submit(&st, job) {
        return e.into_response();
    }
    if checked.sampler.logprobs.is_some() {
        Metrics::add(&st.metrics.logprob_requests, 1);
    }
    if checked.sampler.grammar.is_some() {
        Metrics::add(&st.metrics.constrained_requests, 1);
    }
    let o = &checked.sampler;
    // as llama-server lists them: the request's biases, and under `ignore_eos` each
    // end-of-generation token banned (a bias of -inf, which JSON writes as null)
    let bias =
        |token: u32, bias: f32| json!({"token": token, "bias": bias.is_finite().then_some(bias)});
    let mut logit_bias: Vec<Value> = o.logit_bias.iter().map(|&(t, b)| bias(t, b)).collect();
    if checked.ignore_eos {
        logit_bias.extend(st.tok.eog_ids().iter().map(|&t| bias(t, f32::NEG_INFINITY)));
    }
    let settings = json!({
        "n_predict": max_tokens,
        "seed": o.seed,
        "temperature": o.temperature,
        "top_k": o.top_k,
        "top_p": o.top_p,
        "min_p": o.min_p,
        "repeat_penalty": o.repeat_penalty,
        "repeat_last_n": o.repeat_last_n,
        "presence_penalty": o.presence_penalty,
        "frequency_penalty": o.frequency_penalty,
        "n_probs": o.logprobs.unwrap_or(0),
        "logit_bias": logit_bias,
        "ignore_eos": checked.ignore_eos,
        "stop": checked.stop,
        "stream": checked.stream,
    });
    let answer = Native1 {
        st: st.clone(),
        stop_words: checked.stop.clone(),
        n_probs: checked.sampler.logprobs.is_some(),
        content: String::new(),
        new_line: false,
        probs: Vec::new(),
        settings,
    };
    if checked.stream {
        stream_answer(answer, rx)
    } else {
        crate::answer::whole_answer(collect(answer, rx), peer.map(|p| p.0)).await
    }
}

/// The request in the OpenAI names [`Sampling`] checks, plus the prompt.
fn check(st: &AppState, req: &Native, text: &[u8]) -> Result<(Vec<u32>, Checked), ApiError> {
    let mut fields: Map<String, Value> = match &req.sampling {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    // llama-server's names for what both APIs have; what OpenAI's check would refuse
    // under its own meaning (logprobs, n, echo) is not llama-server's to give here
    for k in [
        "logprobs",
        "top_logprobs",
        "echo",
        "n",
        "max_tokens",
        "max_completion_tokens",
    ] {
        fields.remove(k);
    }
    let sampling: Sampling = serde_json::from_value(Value::Object(fields))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let seed = st.default_seed();
    let mut checked = sampling.check(seed, Endpoint::Completions, st.tok.vocab_size())?;
    checked.max_tokens = match req.n_predict {
        None | Some(-1) => None,
        Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => {
            return Err(ApiError::bad_param(
                "n_predict",
                format!("n_predict must be -1 (no limit) or at least 1 (got {n})"),
            ))
        }
    };
    checked.sampler.logprobs = match req.n_probs {
        None | Some(0) => None,
        Some(n) if (1..=MAX_N_PROBS).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::bad_param(
                "n_probs",
                format!("n_probs must be 0 to {MAX_N_PROBS} (got {n})"),
            ))
        }
    };
    checked.sampler.logit_bias = logit_bias(st, req.logit_bias.as_ref())?;
    checked.sampler.grammar = constrain::from_body(st, text)?;
    let ids = prompt_ids(st, req.prompt.as_ref())?;
    Ok((ids, checked))
}

/// llama-server's `logit_bias`: `[[id or text, bias or false], ...]` or `{"id": bias}`;
/// `false` bans the token.
fn logit_bias(st: &AppState, v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad_param("logit_bias", m);
    let bias_of = |b: &Value| match b {
        Value::Bool(false) => Ok(f32::NEG_INFINITY),
        Value::Number(n) => n
            .as_f64()
            .filter(|b| b.is_finite())
            .map(|b| b as f32)
            .ok_or_else(|| bad(format!("bias {n} is not a finite number"))),
        other => Err(bad(format!("bias {other} is not a number or false"))),
    };
    let ids_of = |t: &Value| -> Result<Vec<u32>, ApiError> {
        match t {
            Value::Number(n) => n
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .filter(|&i| (i as usize) < st.tok.vocab_size())
                .map(|i| vec![i])
                .ok_or_else(|| bad(format!("token {n} is outside the vocabulary"))),
            Value::String(s) => st
                .tok
                .encode(s, false, false)
                .map_err(|e| bad(e.to_string())),
            other => Err(bad(format!("{other} is not a token id or a string"))),
        }
    };
    let mut out = Vec::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Array(pairs)) => {
            for p in pairs {
                let Some([t, b]) = p.as_array().map(Vec::as_slice) else {
                    return Err(bad(format!("{p} is not a [token, bias] pair")));
                };
                let b = bias_of(b)?;
                out.extend(ids_of(t)?.into_iter().map(|i| (i, b)));
            }
        }
        Some(Value::Object(m)) => {
            for (k, b) in m {
                let id = k
                    .parse::<u64>()
                    .map(Value::from)
                    .unwrap_or_else(|_| Value::from(k.as_str()));
                let b = bias_of(b)?;
                out.extend(ids_of(&id)?.into_iter().map(|i| (i, b)));
            }
        }
        Some(other) => return Err(bad(format!("{other} is not a list or an object"))),
    }
    Ok(out)
}

/// `prompt`: text (BOS as the model says), token ids, or a list of one of them.
fn prompt_ids(st: &AppState, p: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let bad = |m: &str| ApiError::bad_param("prompt", m);
    let ids = match p {
        None | Some(Value::Null) => return Err(bad("prompt is missing")),
        Some(Value::String(s)) => st
            .tok
            .encode(s, true, false)
            .map_err(|e| ApiError::bad_param("prompt", e.to_string()))?,
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            let ids: Vec<u32> = items
                .iter()
                .filter_map(Value::as_u64)
                .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
                .collect();
            st.check_token_ids(&ids, "prompt")?;
            ids
        }
        Some(Value::Array(items)) if items.len() == 1 => return prompt_ids(st, items.first()),
        Some(Value::Array(_)) => {
            return Err(bad(
                "one prompt per request (a string, or token ids) is supported",
            ))
        }
        Some(_) => return Err(bad("prompt must be a string or token ids")),
    };
    if ids.is_empty() {
        return Err(bad("the prompt is empty"));
    }
    Ok(ids)
}

/// The answer so far.
struct Native1 {
    st: Arc<AppState>,
    stop_words: Vec<String>,
    n_probs: bool,
    content: String,
    /// Whether the answer's text so far holds a line break (`has_new_line`).
    new_line: bool,
    probs: Vec<engine::TokenLogprob>,
    /// The request's settings as run (`generation_settings`).
    settings: Value,
}

impl Native1 {
    fn probs_json(&self, lps: &[engine::TokenLogprob]) -> Value {
        let tok = &self.st.tok;
        let entry = |id: u32, lp: f32| {
            json!({
                "id": id,
                "token": String::from_utf8_lossy(tok.token_bytes_ref(id)),
                "bytes": tok.token_bytes_ref(id),
                "logprob": lp,
            })
        };
        lps.iter()
            .map(|lp| {
                let mut e = entry(lp.token, lp.logprob);
                e["top_logprobs"] = lp
                    .top
                    .iter()
                    .map(|&(t, l)| entry(t, l))
                    .collect::<Vec<_>>()
                    .into();
                e
            })
            .collect::<Vec<_>>()
            .into()
    }

    /// The last object: the summary (with the whole content unless streamed).
    fn summary(&self, content: &str, finish: Finish, u: &Usage) -> Value {
        let stop_type = match finish {
            Finish::Stop => "eos",
            Finish::Word => "word",
            Finish::Length => "limit",
        };
        let stopping_word = match finish {
            Finish::Word => self
                .stop_words
                .iter()
                .find(|w| !w.is_empty())
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        };
        let per = |n: usize, ms: f64| {
            if n == 0 {
                (0.0, 0.0)
            } else {
                (ms / n as f64, n as f64 * 1e3 / ms.max(1e-9))
            }
        };
        let (p_tok, p_sec) = per(u.prefilled_tokens, u.ttft_ms);
        let (g_tok, g_sec) = per(u.generated_tokens, u.decode_ms);
        let mut v = json!({
            "index": 0,
            "content": content,
            "tokens": [],
            "id_slot": -1,
            "stop": true,
            "model": self.st.opts.model_id,
            "tokens_predicted": u.generated_tokens,
            "tokens_evaluated": u.prompt_tokens,
            "tokens_cached": u.reused_tokens,
            "stop_type": stop_type,
            "stopped_eos": finish == Finish::Stop,
            "stopped_word": finish == Finish::Word,
            "stopped_limit": finish == Finish::Length,
            "stopping_word": stopping_word,
            "truncated": false,
            "has_new_line": self.new_line,
            "generation_settings": self.settings,
            "timings": {
                "cache_n": u.reused_tokens,
                "prompt_n": u.prefilled_tokens,
                "prompt_ms": u.ttft_ms,
                "prompt_per_token_ms": p_tok,
                "prompt_per_second": p_sec,
                "predicted_n": u.generated_tokens,
                "predicted_ms": u.decode_ms,
                "predicted_per_token_ms": g_tok,
                "predicted_per_second": g_sec,
            },
        });
        if self.n_probs {
            v["completion_probabilities"] = self.probs_json(&self.probs);
        }
        v
    }
}

/// The summary with the whole content, once the job is done.
async fn collect(mut a: Native1, mut rx: UnboundedReceiver<JobEvent>) -> Result<Value, ApiError> {
    while let Some(event) = rx.recv().await {
        match event {
            JobEvent::Text(t) => {
                a.new_line |= t.contains('\n');
                a.content.push_str(&t);
            }
            JobEvent::Logprob(lp) => a.probs.push(lp),
            JobEvent::PromptLogprob(_) => {}
            JobEvent::Done { finish, usage, .. } => {
                return Ok(a.summary(&a.content, finish, &usage))
            }
            JobEvent::Error(msg) => return Err(ApiError::internal(msg)),
        }
    }
    Err(ApiError::unavailable(
        "the engine stopped before answering (see the server's log)",
    ))
}

/// Server-sent events: a `{"content": piece, "stop": false}` per piece of text (with its
/// tokens' `completion_probabilities` under `n_probs`), then the summary with
/// `stop: true`.
fn stream_answer(a: Native1, rx: UnboundedReceiver<JobEvent>) -> Response {
    let events = stream::unfold(Some((a, rx)), |state| async move {
        let (mut a, mut rx) = state?;
        loop {
            let out = match rx.recv().await {
                Some(JobEvent::Text(t)) if t.is_empty() => continue,
                Some(JobEvent::Text(t)) => {
                    a.new_line |= t.contains('\n');
                    let mut v = json!({"index": 0, "content": t, "tokens": [], "stop": false, "id_slot": -1});
                    if a.n_probs {
                        v["completion_probabilities"] = a.probs_json(&a.probs);
                        a.probs.clear();
                    }
                    format!("data: {v}\n\n")
                }
                Some(JobEvent::Logprob(lp)) => {
                    a.probs.push(lp);
                    continue;
                }
                Some(JobEvent::PromptLogprob(_)) => continue,
                Some(JobEvent::Done { finish, usage, .. }) => {
                    let v = a.summary("", finish, &usage);
                    return Some((
                        Ok::<_, std::convert::Infallible>(format!("data: {v}\n\n")),
                        None,
                    ));
                }
                Some(JobEvent::Error(msg)) => {
                    let v = ApiError::internal(msg).body();
                    return Some((Ok(format!("error: {v}\n\n")), None));
                }
                None => return None,
            };
            return Some((Ok(out), Some((a, rx))));
        }
    });
    crate::answer::sse_response(Body::from_stream(events))
}

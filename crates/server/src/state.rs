//! What every handler shares: the server's options, the scheduler, the tokenizer and
//! template, the metrics; and reading a request body within its limits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use serde::de::DeserializeOwned;
use tokenizer::{ChatTemplate, Tokenizer};

use crate::conn::ConnLimits;
use crate::error::ApiError;
use crate::guard::Access;
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;

/// Limits and identity of the server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The model's name in `/v1/models` and the `model` field requests must match.
    pub model_id: String,
    /// Other names a request's `model` may use (the file name, the path given).
    pub model_aliases: Vec<String>,
    /// A bearer token every route but `/health` requires.
    pub api_key: Option<String>,
    /// Largest request body, bytes (413 above).
    pub max_body: usize,
    /// Requests that may wait for a slot (503 with `Retry-After` beyond).
    pub queue: usize,
    /// Positions each slot holds.
    pub ctx_len: usize,
    /// Slots.
    pub n_slots: usize,
    /// After SIGTERM, how long in-flight requests may run before they are cancelled.
    pub shutdown_grace: Duration,
    /// Who may reach the server (Host, Origin).
    pub access: Access,
    /// Connection deadlines and cap.
    pub limits: ConnLimits,
    /// The seed of requests that give none (`--seed`; `None`: from the clock).
    pub seed: Option<u64>,
    /// The `max_tokens` of requests that give none (`-n`; `None`: until the end or a
    /// full context).
    pub n_predict: Option<usize>,
    /// The model file, as given (`/props`).
    pub model_path: String,
}

/// What every handler sees.
pub struct AppState {
    pub opts: ServerOptions,
    pub scheduler: Scheduler,
    pub tok: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub metrics: Arc<Metrics>,
    /// Unix time the server started (`created` fields).
    pub started: u64,
    /// Set when a shutdown began: `/health` says so.
    pub shutting_down: AtomicBool,
    next_id: AtomicU64,
    /// The vocabulary as grammars mask it, built at the first constrained request.
    grammar_vocab: OnceLock<Arc<grammar::Vocab>>,
}

impl AppState {
    pub fn new(
        opts: ServerOptions,
        scheduler: Scheduler,
        tok: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        metrics: Arc<Metrics>,
    ) -> AppState {
        AppState {
            opts,
            scheduler,
            tok,
            template,
            metrics,
            started: unix_now(),
            shutting_down: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            grammar_vocab: OnceLock::new(),
        }
    }

    /// The seed of a request that gives none: `--seed`, or the clock.
    pub fn default_seed(&self) -> u64 {
        self.opts.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        })
    }

    /// The tokenizer's vocabulary as the grammar matcher reads it (built once).
    pub fn grammar_vocab(&self) -> Arc<grammar::Vocab> {
        self.grammar_vocab
            .get_or_init(|| Arc::new(engine::grammar_vocab(&self.tok)))
            .clone()
    }

    /// A fresh number for response ids.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A request's `model` must name this server's model (absent is taken as it).
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m)
                if m == self.opts.model_id || self.opts.model_aliases.iter().any(|a| a == m) =>
            {
                Ok(())
            }
            Some(m) => Err(ApiError {
                param: Some("model"),
                ..ApiError::not_found(
                    format!(
                        "the model {m:?} does not exist: this server serves {:?} (see /v1/models)",
                        self.opts.model_id
                    ),
                    Some("model_not_found"),
                )
            }),
        }
    }

    /// A POST body read within the size limit and the body deadline, parsed as JSON.
    pub async fn read_json<T: DeserializeOwned>(
        &self,
        headers: &axum::http::HeaderMap,
        body: Body,
    ) -> Result<T, ApiError> {
        Ok(self.read_json_and_text(headers, body).await?.0)
    }

    /// [`AppState::read_json`], with the body's bytes (for what must be read from the
    /// text itself, such as a JSON schema's key order).
    pub async fn read_json_and_text<T: DeserializeOwned>(
        &self,
        headers: &axum::http::HeaderMap,
        body: Body,
    ) -> Result<(T, Vec<u8>), ApiError> {
        let bytes = read_body(
            body,
            headers,
            self.opts.max_body,
            self.opts.limits.body_timeout,
        )
        .await?;
        Ok((parse_json(&bytes)?, bytes))
    }

    /// Every id of `ids` must be in the vocabulary (a 400 naming `param` otherwise).
    pub fn check_token_ids(&self, ids: &[u32], param: &'static str) -> Result<(), ApiError> {
        let vocab = self.tok.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(bad) => Err(ApiError::bad_param(
                param,
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            )),
            None => Ok(()),
        }
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The body, at most `limit` bytes (413 beyond; a `Content-Length` over the limit is
/// refused before reading), all of it within `deadline` (408 otherwise).
pub async fn read_body(
    body: Body,
    headers: &axum::http::HeaderMap,
    limit: usize,
    deadline: Duration,
) -> Result<Vec<u8>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let read = tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await;
    let Ok(read) = read else {
        return Err(ApiError::timeout(format!(
            "the request body did not arrive within {} s (--body-timeout)",
            deadline.as_secs_f64()
        )));
    };
    match read {
        Ok(b) => Ok(b.to_vec()),
        Err(e) => {
            let over = std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
                e.source()
            })
            .any(|e| e.to_string().contains("length limit"));
            Err(if over {
                ApiError::too_large(limit)
            } else {
                ApiError::bad_request(format!("reading the request body: {e}"))
            })
        }
    }
}

/// Parses a JSON body, a malformed one or a wrong type being a 400 that says where.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the request body is not valid JSON"
        } else {
            "the request body does not match the API"
        };
        ApiError::bad_request(format!("{what}: {e}"))
    })
}

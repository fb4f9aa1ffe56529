//! The HTTP side: the router, the shared state, the API-key check, body reading with a
//! size limit and a deadline, graceful shutdown.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use tokenizer::{ChatTemplate, Tokenizer};

use crate::conn::ConnLimits;
use crate::error::ApiError;
use crate::guard::Access;
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::{guard, handlers, native, page, status, tokens};

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

/// Every route.
pub fn router(state: Arc<AppState>) -> Router {
    status::started_unix();
    let api = Router::new()
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/models", get(status::models))
        // llama-server's un-prefixed names and its own routes
        .route("/chat/completions", post(handlers::chat))
        .route("/completions", post(handlers::completions))
        .route("/completion", post(native::completion))
        .route("/models", get(status::models))
        .route("/props", get(status::props))
        .route("/slots", get(status::slots))
        .route("/apply-template", post(handlers::apply_template))
        .route("/metrics", get(status::metrics))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/", get(page::chat_page))
        .route("/health", get(status::health))
        .merge(api)
        .fallback(|| async {
            ApiError::not_found("no such route (see / for the chat page, /v1/models, /v1/chat/completions, /v1/completions, /completion, /props, /slots, /apply-template, /health, /metrics, /tokenize, /detokenize)", None)
        })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(middleware::from_fn_with_state(state.clone(), guard::access))
        .layer(middleware::from_fn_with_state(state.clone(), count_failures))
        .with_state(state)
}

/// `Authorization: Bearer KEY` when the server has `--api-key` (the scheme in any case,
/// as RFC 9110 says).
async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.opts.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Counts error answers for `/metrics`.
async fn count_failures(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if resp.status().is_client_error() || resp.status().is_server_error() {
        Metrics::add(&st.metrics.requests_failed, 1);
    }
    resp
}

/// The token of a `Bearer` credential.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once([' ', '\t'])?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Compares `given` with `key` in a time that depends on the key's length only: neither
/// the key's bytes nor its length are leaked by when the answer comes.
fn same(given: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != key.len());
    for (i, k) in key.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ k;
    }
    std::hint::black_box(diff) == 0
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

/// Serves on `listener` until `shutdown` resolves; then stops accepting, closes the
/// connections with no request running, lets in-flight requests run for the grace
/// period, cancels what is left and returns once every connection is closed (those whose
/// clients do not take their answer a few seconds later).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let grace = state.opts.shutdown_grace;
    let limits = state.opts.limits;
    let canceller = state.scheduler.canceller();
    let st = state.clone();
    drop(state);
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections; in-flight requests have {grace:?}");
        st.shutting_down.store(true, Ordering::SeqCst);
        drop(st);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            canceller.store(true, Ordering::SeqCst);
        });
    };
    crate::conn::serve_connections(listener, app, limits, signal, grace + DRAIN_AFTER_GRACE).await
}

/// How long answers cancelled at the end of the grace period have to reach their
/// clients before their connections are dropped: a client that reads takes its last
/// event at once, and one that does not must not hold the exit past 2 s of the signal
/// (with the default 1 s grace).
const DRAIN_AFTER_GRACE: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_has_any_case() {
        assert_eq!(bearer("Bearer k"), Some("k"));
        assert_eq!(bearer("bearer k"), Some("k"));
        assert_eq!(bearer("BEARER   k "), Some("k"));
        assert_eq!(bearer("Basic k"), None);
        assert_eq!(bearer("Bearerk"), None);
        assert_eq!(bearer("k"), None);
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same(b"key", b"key"));
        assert!(!same(b"ke", b"key"));
        assert!(!same(b"keyy", b"key"));
        assert!(!same(b"kez", b"key"));
        assert!(!same(b"", b"key"));
    }
}

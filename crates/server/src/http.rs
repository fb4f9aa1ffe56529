//! The HTTP side: the router, the API-key check, graceful shutdown. What the handlers
//! share is in `state`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::{guard, handlers, native, page, status, tokens};

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
        .layer(middleware::from_fn_with_state(
            Arc::new(state.opts.access.clone()),
            guard::access,
        ))
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

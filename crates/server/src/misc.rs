//! The small routes: `/health`, `/v1/models`, `/metrics`, `/tokenize`, `/detokenize`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::error::ApiError;
use crate::http::{parse_json, read_body, AppState};
use crate::metrics::Metrics;

/// `GET /health`: 200 while serving, 503 once a shutdown began or the engine stopped.
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    let busy = Metrics::get(&st.metrics.slots_busy);
    let total = st.opts.n_slots as u64;
    let body = |status: &str| {
        axum::Json(json!({
            "status": status,
            "slots_idle": total.saturating_sub(busy),
            "slots_processing": busy,
            "queue_length": Metrics::get(&st.metrics.queue_len),
        }))
    };
    if st.scheduler.engine_stopped() {
        (StatusCode::SERVICE_UNAVAILABLE, body("engine stopped")).into_response()
    } else if st.shutting_down.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, body("shutting down")).into_response()
    } else {
        (StatusCode::OK, body("ok")).into_response()
    }
}

/// `GET /v1/models`: the one model served.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": st.opts.model_id,
            "object": "model",
            "created": st.started,
            "owned_by": "vkdecode",
            "meta": {
                "n_ctx_slot": st.opts.ctx_len,
                "n_slots": st.opts.n_slots,
                "n_vocab": st.tok.vocab_size(),
            },
        }],
    }))
    .into_response()
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct TokenizeRequest {
    content: String,
    /// Add BOS as the model's metadata says (default false, as llama-server).
    add_special: Option<bool>,
    /// Parse special-token text such as `<|im_start|>` (default false, as the CLI).
    parse_special: Option<bool>,
    /// Answer `{id, piece}` pairs instead of bare ids.
    with_pieces: Option<bool>,
}

/// `POST /tokenize` `{"content": "..."}` → `{"tokens": [ids]}`.
pub async fn tokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let bytes = read_body(
            body,
            &headers,
            st.opts.max_body,
            st.opts.limits.body_timeout,
        )
        .await?;
        let req: TokenizeRequest = parse_json(&bytes)?;
        let ids = st
            .tok
            .encode(
                &req.content,
                req.add_special.unwrap_or(false),
                req.parse_special.unwrap_or(false),
            )
            .map_err(|e| ApiError::bad_param("content", e.to_string()))?;
        let tokens = if req.with_pieces.unwrap_or(false) {
            ids.iter()
                .map(|&id| json!({"id": id, "piece": String::from_utf8_lossy(&st.tok.token_bytes(id))}))
                .collect::<Vec<_>>()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok::<_, ApiError>(axum::Json(json!({ "tokens": tokens })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// `POST /detokenize` `{"tokens": [ids]}` → `{"content": "..."}`.
pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let run = async {
        let bytes = read_body(
            body,
            &headers,
            st.opts.max_body,
            st.opts.limits.body_timeout,
        )
        .await?;
        let req: DetokenizeRequest = parse_json(&bytes)?;
        let vocab = st.tok.vocab_size();
        if let Some(bad) = req.tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::bad_param(
                "tokens",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        Ok(axum::Json(json!({ "content": st.tok.decode(&req.tokens) })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

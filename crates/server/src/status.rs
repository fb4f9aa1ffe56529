//! The routes that report on the server: `/health`, `/v1/models`, `/metrics`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::http::AppState;
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

//! The routes that report on the server: `/health`, `/v1/models`, `/metrics`, and
//! llama-server's `/props` and (read-only) `/slots`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::metrics::Metrics;
use crate::state::AppState;

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
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4".to_string(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                started_unix().to_string(),
            ),
        ],
        st.metrics.render(),
    )
        .into_response()
}

/// Unix time (seconds) when the router was built, i.e. when the server started; sent as
/// llama-server's `Process-Start-Time-Unix` header with `/metrics`, so a scraper can tell
/// a restart from a counter reset.
pub fn started_unix() -> u64 {
    static STARTED: OnceLock<u64> = OnceLock::new();
    *STARTED.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// `GET /props`: llama-server's description of the server (what its clients read: the
/// context, the slots, the chat template, the default generation settings).
pub async fn props(State(st): State<Arc<AppState>>) -> Response {
    let d = engine::SamplerOptions::default();
    axum::Json(json!({
        "default_generation_settings": {
            "n_ctx": st.opts.ctx_len,
            "params": {
                "n_predict": st.opts.n_predict.map_or(-1, |n| n as i64),
                "seed": st.opts.seed,
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty,
                "repeat_last_n": d.repeat_last_n,
                "presence_penalty": d.presence_penalty,
                "frequency_penalty": d.frequency_penalty,
            },
        },
        "total_slots": st.opts.n_slots,
        "model_alias": st.opts.model_id,
        "model_path": st.opts.model_path,
        "chat_template": st.template.as_ref().map(|t| t.source()),
        "modalities": {"vision": false, "audio": false},
        "build_info": format!("vkdecode {}", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

/// `GET /slots`: each slot's context and whether it runs a request (read-only: nothing
/// here saves, restores or erases a slot).
pub async fn slots(State(st): State<Arc<AppState>>) -> Response {
    let busy = st.metrics.slot_busy();
    let slots: Vec<_> = (0..st.opts.n_slots)
        .map(|id| {
            json!({
                "id": id,
                "n_ctx": st.opts.ctx_len,
                "is_processing": busy.get(id).copied().unwrap_or(false),
            })
        })
        .collect();
    axum::Json(slots).into_response()
}

//! `/tokenize` and `/detokenize`: the model's tokenizer, as llama-server offers it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::error::ApiError;
use crate::state::AppState;

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
        let req: TokenizeRequest = st.read_json(&headers, body).await?;
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
        let req: DetokenizeRequest = st.read_json(&headers, body).await?;
        st.check_token_ids(&req.tokens, "tokens")?;
        Ok::<_, ApiError>(
            axum::Json(json!({ "content": st.tok.decode(&req.tokens) })).into_response(),
        )
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

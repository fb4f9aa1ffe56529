//! `GET /`: a chat page for the browser (crates/server/assets/chat.html, plain HTML, CSS
//! and JavaScript embedded in the binary; it loads nothing from another host). It streams
//! each reply from `/v1/chat/completions`, keeps the conversation in the page and sends
//! the key the user types as `Authorization: Bearer`. The route itself needs no key, as
//! the page holds no data; the API calls it makes do.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// The page, with `{{MODEL}}` where the model's name goes.
const PAGE: &str = include_str!("../assets/chat.html");

/// What the page may do: its own inline script and style, requests to this server only,
/// no frames around it (clickjacking), no forms sent elsewhere.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// `GET /`: the chat page.
pub async fn chat_page(State(st): State<Arc<AppState>>) -> Response {
    let body = render(&st.opts.model_id);
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// The page naming `model` (escaped: a model's name comes from a file name).
fn render(model: &str) -> String {
    PAGE.replace("{{MODEL}}", &escape_html(model))
}

/// Text safe between tags and in a quoted attribute.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_name_is_escaped() {
        let page = render("<img src=x onerror=alert(1)>&\"'");
        assert!(!page.contains("<img src=x"));
        assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;&amp;&quot;&#39;"));
        assert!(!page.contains("{{MODEL}}"));
    }

    #[test]
    fn the_page_loads_nothing_from_another_host() {
        for needle in [
            "http://",
            "https://",
            "//cdn",
            "<script src",
            "<link rel=\"stylesheet\"",
        ] {
            assert!(!PAGE.contains(needle), "the page contains {needle:?}");
        }
        for hook in [
            "id=\"prompt\"",
            "id=\"send\"",
            "id=\"stop\"",
            "id=\"api-key\"",
        ] {
            assert!(PAGE.contains(hook), "the page lacks {hook}");
        }
    }
}

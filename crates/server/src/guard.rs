//! What keeps web pages out: a page the user visits can send requests to a local server
//! (a form or a `fetch` in no-cors mode needs no preflight for `text/plain` or
//! form-encoded bodies), and DNS rebinding gives it a hostname that resolves to
//! 127.0.0.1. So, before any route runs:
//!
//! - the `Host` must name this server: a loopback name or address, the address the
//!   connection came in on, `--host`, or an `--allowed-hosts` entry (403 otherwise);
//! - a request with an `Origin` (browsers send one on every cross-site POST) must come
//!   from a `--cors-origin` entry (403 otherwise); only those origins get CORS headers,
//!   and their preflights a 204. The server's own chat page (`/`) is let through: its
//!   `Origin` is `http://` and the `Host` it was loaded from, which the check above
//!   allowed, and it needs no CORS headers;
//! - a POST body must be `application/json` (415 otherwise), which a page can only send
//!   after a preflight.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::conn::LocalAddr;
use crate::error::ApiError;

/// Who may reach the server.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// `--host`, and `--allowed-hosts` entries (host names without a port; `*`: any).
    pub allowed_hosts: Vec<String>,
    /// `--cors-origin` entries (`scheme://host[:port]`; `*`: any).
    pub cors_origins: Vec<String>,
}

impl Access {
    /// Whether a `Host` header value names this server.
    pub fn host_allowed(&self, host: &str, local: Option<IpAddr>) -> bool {
        let name = host_name(host);
        if name == "localhost" || self.allowed_hosts.iter().any(|h| h == "*" || *h == name) {
            return true;
        }
        let literal = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(&name);
        literal
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || Some(ip) == local)
    }

    /// Whether requests from `origin` (an `Origin` header value) may run.
    pub fn origin_allowed(&self, origin: &str) -> bool {
        let origin = normal_origin(origin);
        self.cors_origins.iter().any(|o| o == "*" || *o == origin)
    }
}

/// Whether `origin` is the server itself as the request names it: `http://` and its
/// `Host` (an allowed one), as a browser sends from a page this server served. DNS
/// rebinding cannot pass for it: the attacker's name fails the `Host` check first.
pub fn same_origin(origin: &str, host: &str) -> bool {
    let host = host.trim().to_ascii_lowercase();
    !host.is_empty() && normal_origin(origin) == format!("http://{host}")
}

/// The host part of a `Host` value, lower case, without a port or a final dot.
fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let name = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => host[..=end].to_string(),
            None => host,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_string(),
            _ => host,
        }
    };
    name.strip_suffix('.').map(str::to_string).unwrap_or(name)
}

/// An origin as compared: lower case, no final slash.
pub fn normal_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// An `--allowed-hosts` entry as compared.
pub fn normal_host(host: &str) -> String {
    let h = host.trim();
    if h == "*" {
        return h.to_string();
    }
    host_name(h)
}

/// The layer that applies [`Access`] before any route.
pub async fn access(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    if let Some(host) = &host {
        let local = req.extensions().get::<LocalAddr>().map(|a| a.0.ip());
        if !access.host_allowed(host, local) {
            return forbidden(format!(
                "the Host {host:?} does not name this server (a page reaching it through DNS rebinding sends one like that): start the server with --allowed-hosts NAME to serve a name of your own"
            ));
        }
    }
    let origin = match headers.get(header::ORIGIN) {
        None => None,
        Some(o) => {
            let text = String::from_utf8_lossy(o.as_bytes()).into_owned();
            if host.as_deref().is_some_and(|h| same_origin(&text, h)) {
                // the server's own page: as a request without an Origin (no CORS)
                None
            } else if access.origin_allowed(&text) {
                Some(o.clone())
            } else {
                return forbidden(format!(
                    "requests from web pages of origin {text:?} are refused: start the server with --cors-origin {text} to let that site call it"
                ));
            }
        }
    };
    if let Some(o) = &origin {
        if req.method() == Method::OPTIONS
            && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            let mut resp = StatusCode::NO_CONTENT.into_response();
            cors_headers(resp.headers_mut(), o);
            let h = resp.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("Authorization, Content-Type"),
            );
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
            return resp;
        }
    }
    if req.method() == Method::POST {
        if let Err(e) = json_body(headers) {
            let mut resp = e.into_response();
            if let Some(o) = &origin {
                cors_headers(resp.headers_mut(), o);
            }
            return resp;
        }
    }
    let mut resp = next.run(req).await;
    if let Some(o) = &origin {
        cors_headers(resp.headers_mut(), o);
    }
    resp
}

fn forbidden(message: String) -> Response {
    ApiError::forbidden(message).into_response()
}

fn cors_headers(h: &mut HeaderMap, origin: &HeaderValue) {
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    h.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// A POST's `Content-Type` must be `application/json` (parameters such as `charset`
/// allowed).
fn json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence = ct
        .as_deref()
        .map(|c| c.split(';').next().unwrap_or("").trim());
    match essence {
        Some(e) if e.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => Err(ApiError::unsupported_media_type(format!(
            "request bodies must be JSON with `Content-Type: application/json` (got {})",
            ct.map_or("no Content-Type".to_string(), |c| format!("{c:?}"))
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let a = Access {
            allowed_hosts: vec![normal_host("Box.LAN"), normal_host("10.0.0.5")],
            cors_origins: vec![],
        };
        let local: IpAddr = "192.168.1.9".parse().unwrap();
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "127.0.0.1",
            "127.0.0.1:1",
            "127.1.2.3",
            "[::1]",
            "[::1]:8080",
            "box.lan",
            "box.lan:99",
            "10.0.0.5:80",
            "192.168.1.9:8080",
        ] {
            assert!(a.host_allowed(ok, Some(local)), "{ok}");
        }
        for bad in [
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "box.lan.evil",
            "[::2]",
            "192.168.1.10",
            "",
            "localhost:80:80",
        ] {
            assert!(!a.host_allowed(bad, Some(local)), "{bad}");
        }
        let any = Access {
            allowed_hosts: vec!["*".into()],
            cors_origins: vec![],
        };
        assert!(any.host_allowed("evil.example", None));
    }

    #[test]
    fn origins() {
        let a = Access {
            allowed_hosts: vec![],
            cors_origins: vec![normal_origin("http://App.example/")],
        };
        assert!(a.origin_allowed("http://app.example"));
        assert!(!a.origin_allowed("https://app.example"));
        assert!(!a.origin_allowed("http://app.example:81"));
        assert!(!a.origin_allowed("null"));
        assert!(!Access::default().origin_allowed("http://localhost:8080"));
    }

    #[test]
    fn the_servers_own_page_is_same_origin() {
        // what Chrome sends from the page at http://127.0.0.1:8080/
        assert!(same_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(same_origin("http://LocalHost:8080/", "localhost:8080"));
        assert!(same_origin("http://[::1]:8080", "[::1]:8080"));
        assert!(same_origin("http://localhost", "localhost"));
        for (origin, host) in [
            ("http://127.0.0.1:8081", "127.0.0.1:8080"),
            ("http://127.0.0.1", "127.0.0.1:8080"),
            ("https://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://evil.example", "localhost"),
            ("http://localhost.evil.example", "localhost"),
            ("http://localhost:8080.evil.example", "localhost:8080"),
            ("null", "localhost"),
            ("http://", ""),
            ("", ""),
        ] {
            assert!(!same_origin(origin, host), "{origin} from {host}");
        }
    }

    #[test]
    fn content_types() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            json_body(&h)
        };
        assert!(with("application/json").is_ok());
        assert!(with("Application/JSON; charset=utf-8").is_ok());
        assert_eq!(with("text/plain").unwrap_err().status, 415);
        assert_eq!(
            with("application/x-www-form-urlencoded")
                .unwrap_err()
                .status,
            415
        );
        assert_eq!(with("application/jsonx").unwrap_err().status, 415);
        assert_eq!(json_body(&HeaderMap::new()).unwrap_err().status, 415);
    }
}

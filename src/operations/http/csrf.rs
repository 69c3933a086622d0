//! The API's defence against cross-site requests (CSRF): a browser that once answered the
//! Basic login prompt sends those credentials with any request a page of another site makes,
//! so a state-changing call (POST, PUT, DELETE, PATCH) is refused with 403 when the browser
//! says it comes from another site (`Sec-Fetch-Site: cross-site`) or, without that header,
//! when its `Origin` is not the API's own (`Host`, or `X-Forwarded-Host` behind a proxy);
//! and a body a browser sends must be JSON (`Content-Type: application/json`, or no type
//! at all), else 415, since the bodies an HTML form can send without the browser asking the
//! server first are `text/plain`, `application/x-www-form-urlencoded` and
//! `multipart/form-data`. Requests with neither header (curl, `rabbitmqadmin`,
//! `ferrymq ctl`, client libraries) pass with any type, as RabbitMQ takes them, except on
//! the routes where RabbitMQ itself answers 415 ([`JSON_ONLY_ROUTES`]). GET, HEAD and
//! OPTIONS always pass. Runs before the login, so a refused request costs no login.

use std::sync::Arc;

use axum::body::HttpBody as _;
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, HOST, ORIGIN};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::{debug, warn};

use super::error::ApiError;
use super::HttpContext;
use crate::transport::origin::Origin;

/// Why a request was refused before its handler ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A state-changing request from another site (403).
    #[error("{0}")]
    CrossSite(String),
    /// A body that is not JSON (415).
    #[error("{0}")]
    NotJson(String),
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        match r {
            Refusal::CrossSite(why) => ApiError::forbidden(why),
            Refusal::NotJson(why) => {
                ApiError { status: StatusCode::UNSUPPORTED_MEDIA_TYPE, error: "unsupported_media_type", reason: why }
            }
        }
    }
}

/// Whether `method` changes state (the methods a CSRF page would use).
fn state_changing(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

/// The cross-site verdict on a state-changing request's headers: `Some(why)` to refuse.
pub fn cross_site(headers: &HeaderMap, uri_authority: Option<&str>) -> Option<String> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match text("sec-fetch-site").map(str::to_ascii_lowercase).as_deref() {
        Some("same-origin" | "none") => return None,
        Some("cross-site") => {
            return Some("a state-changing request from another site (Sec-Fetch-Site: cross-site)".into());
        }
        // same-site (another origin of the same site) or unknown: the Origin decides.
        _ => {}
    }
    let origin = headers.get(ORIGIN)?;
    let Some(origin) = origin.to_str().ok().and_then(Origin::parse) else {
        return Some("a state-changing request from an opaque or unreadable Origin".into());
    };
    let forwarded = text("x-forwarded-host").and_then(|h| h.split(',').next());
    let own = [headers.get(HOST).and_then(|v| v.to_str().ok()), uri_authority, forwarded];
    match own.into_iter().flatten().any(|authority| origin.same_authority(authority)) {
        true => None,
        false => Some(format!("a state-changing request from another origin ({origin})")),
    }
}

/// Routes (under `/api`) where RabbitMQ answers 415 to any body not declared JSON, from
/// any client.
pub const JSON_ONLY_ROUTES: &[&str] =
    &["/definitions", "/vhost-limits", "/user-limits", "/operator-policies", "/feature-flags"];

/// Whether the request carries what only browsers send (`Origin`, `Sec-Fetch-*`).
fn from_browser(headers: &HeaderMap) -> bool {
    headers.contains_key(ORIGIN) || headers.contains_key("sec-fetch-site") || headers.contains_key("sec-fetch-mode")
}

/// Whether `path` (with or without the `/api` prefix) is one of [`JSON_ONLY_ROUTES`].
fn json_only(path: &str) -> bool {
    let path = path.strip_prefix("/api").filter(|p| p.starts_with('/')).unwrap_or(path);
    JSON_ONLY_ROUTES.iter().any(|r| path == *r || path.strip_prefix(r).is_some_and(|rest| rest.starts_with('/')))
}

/// Whether `content_type` is JSON's media type (`application/json`, any parameters).
fn is_json(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim();
    media.eq_ignore_ascii_case("application/json")
}

/// Checks a state-changing request: not cross-site, and a body (if any) declared as JSON
/// when a browser sends it or the route is one of [`JSON_ONLY_ROUTES`].
pub fn check(req: &Request) -> Result<(), Refusal> {
    if !state_changing(req.method()) {
        return Ok(());
    }
    if let Some(why) = cross_site(req.headers(), req.uri().authority().map(|a| a.as_str())) {
        return Err(Refusal::CrossSite(why));
    }
    let body = req.body();
    let has_body = !body.is_end_stream() && body.size_hint().exact() != Some(0);
    let declared = req.headers().get(CONTENT_TYPE).map(|v| v.to_str().unwrap_or("?"));
    match declared {
        Some(ct) if has_body && !is_json(ct) && (from_browser(req.headers()) || json_only(req.uri().path())) => {
            Err(Refusal::NotJson(format!("the API takes JSON bodies (Content-Type: application/json), not `{ct}`")))
        }
        _ => Ok(()),
    }
}

/// Middleware: refuses what [`check`] refuses (counted in `/metrics`, the first of each
/// kind logged at warn, later ones at debug), else runs the request.
pub async fn refuse_cross_site(State(ctx): State<Arc<HttpContext>>, req: Request, next: Next) -> Response {
    match check(&req) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            let stats = ctx.broker.stats();
            let counter = match refusal {
                Refusal::CrossSite(_) => &stats.http_cross_site_refused,
                Refusal::NotJson(_) => &stats.http_not_json_refused,
            };
            let first = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
            let (method, path) = (req.method().clone(), req.uri().path().to_owned());
            if first {
                warn!(%method, %path, reason = %refusal, "HTTP API: request refused (later ones are logged at debug)");
            } else {
                debug!(%method, %path, reason = %refusal, "HTTP API: request refused");
            }
            ApiError::from(refusal).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(method: &str, headers: &[(&str, &str)], body: &'static str) -> Request {
        let mut b = axum::http::Request::builder().method(method).uri("/api/definitions");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::from(body)).unwrap()
    }

    #[test]
    fn browsers_say_where_a_request_comes_from() {
        let host = ("host", "127.0.0.1:15672");
        let refused = |h: &[(&str, &str)]| check(&request("POST", h, "")).is_err();
        assert!(refused(&[host, ("sec-fetch-site", "cross-site")]));
        assert!(!refused(&[host, ("sec-fetch-site", "same-origin"), ("origin", "http://elsewhere")]));
        assert!(!refused(&[host, ("origin", "http://127.0.0.1:15672")]), "its own origin");
        assert!(refused(&[host, ("origin", "http://127.0.0.1:8080")]), "another port is another origin");
        assert!(refused(&[host, ("sec-fetch-site", "same-site"), ("origin", "http://127.0.0.1:8080")]));
        assert!(refused(&[host, ("origin", "null")]));
        assert!(!refused(&[host]), "no browser headers: curl, rabbitmqadmin");
        let proxied =
            [("host", "127.0.0.1:15672"), ("x-forwarded-host", "mq.example.com"), ("origin", "https://mq.example.com")];
        assert!(!refused(&proxied), "behind a proxy that rewrites Host");
        assert!(check(&request("GET", &[host, ("sec-fetch-site", "cross-site")], "")).is_ok(), "reads pass");
    }

    #[test]
    fn bodies_must_be_declared_json() {
        let origin = ("origin", "http://127.0.0.1:15672");
        let host = ("host", "127.0.0.1:15672");
        let not_json = |ct: &str, body| {
            matches!(check(&request("PUT", &[host, origin, ("content-type", ct)], body)), Err(Refusal::NotJson(_)))
        };
        assert!(not_json("text/plain", "{}"));
        assert!(not_json("application/x-www-form-urlencoded", "a=b"));
        assert!(not_json("multipart/form-data; boundary=x", "--x"));
        assert!(!not_json("application/json", "{}"));
        assert!(!not_json("Application/JSON; charset=utf-8", "{}"));
        assert!(!not_json("text/plain", ""), "no body, no type needed");
        assert!(check(&request("PUT", &[], "{}")).is_ok(), "an undeclared body is read as JSON");
    }

    #[test]
    fn scripts_keep_rabbitmqs_leniency_except_where_rabbitmq_is_strict() {
        let put = |uri: &str, ct: &str| {
            let req = axum::http::Request::builder()
                .method("PUT")
                .uri(uri)
                .header("content-type", ct)
                .body(Body::from("{}"))
                .unwrap();
            check(&req)
        };
        let form = "application/x-www-form-urlencoded";
        assert!(put("/api/queues/%2F/q", form).is_ok(), "curl -d without a type, as RabbitMQ takes it");
        assert!(put("/queues/%2F/q", "text/plain").is_ok());
        assert!(matches!(put("/api/definitions", form), Err(Refusal::NotJson(_))));
        assert!(matches!(put("/definitions/%2F", form), Err(Refusal::NotJson(_))));
        assert!(matches!(put("/api/vhost-limits/%2F/max-queues", "text/plain"), Err(Refusal::NotJson(_))));
        assert!(put("/api/definitionsx", form).is_ok(), "a prefix of a route is not the route");
    }
}

//! Cross-site requests against the management API, as a browser sends them for a page of
//! another site once its user answered the Basic login prompt: the credentials ride along,
//! so a state-changing call is refused when the browser says it comes from elsewhere
//! (`Sec-Fetch-Site`, `Origin`), and a body an HTML form can send without asking the server
//! first (`text/plain`, form encodings) is refused with 415 when a browser sends it (and on
//! RabbitMQ's JSON-only routes from anyone). The dashboard's own calls (same origin, JSON)
//! and clients without browser headers (curl, rabbitmqadmin) pass.
//! Real broker, reqwest with the headers browsers set.

use crate::common::http::Api;
use crate::common::{Broker, WAIT};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// A request with guest's credentials (as the browser adds them), `headers` and a raw body.
async fn send(api: &Api, method: Method, path: &str, headers: &[(&str, &str)], body: &str) -> (StatusCode, Value) {
    let mut req = api.http.request(method, format!("{}{path}", api.base)).basic_auth("guest", Some("guest"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if !body.is_empty() {
        req = req.body(body.to_owned());
    }
    let resp = tokio::time::timeout(WAIT, req.send()).await.expect("answered in time").unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A definitions file that adds an administrator.
fn mallory() -> String {
    json!({"users": [{"name": "mallory", "password": "pwned", "tags": "administrator"}]}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_site_cannot_create_an_administrator() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let defs = mallory();
    // The attack as a browser sends it: an HTML form posting text/plain to /api/definitions.
    let form = [("content-type", "text/plain"), ("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")];
    let (status, body) = send(&api, Method::POST, "/api/definitions", &form, &defs).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "not_authorised", "RabbitMQ's error shape: {body}");
    // A browser that sends neither header (an old one) still cannot post a form body.
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let (status, body) = send(&api, Method::POST, "/api/definitions", &[("content-type", ct)], &defs).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}: {body}");
        assert_eq!(body["error"], "unsupported_media_type", "{body}");
    }
    // An Origin of another site without Sec-Fetch-Site (older browsers), JSON or not.
    let json_from_elsewhere = [("content-type", "application/json"), ("origin", "https://evil.example")];
    let (status, _) = send(&api, Method::POST, "/api/definitions", &json_from_elsewhere, &defs).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api.get("/api/users/mallory").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no administrator was made");

    // curl or rabbitmqadmin (no browser headers, JSON) imports as before.
    let (status, body) =
        send(&api, Method::POST, "/api/definitions", &[("content-type", "application/json")], &defs).await;
    assert!(status.is_success(), "{status}: {body}");
    assert_eq!(api.ok("/api/users/mallory").await["tags"], json!(["administrator"]));

    let metrics = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
    let line = |reason: &str| {
        let key = format!("ferrymq_http_requests_refused_total{{reason=\"{reason}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&key)).map(str::to_owned)
    };
    assert_eq!(line("cross_site").as_deref(), Some("2"), "{metrics}");
    assert_eq!(line("not_json").as_deref(), Some("3"), "{metrics}");
    assert!(broker.log().contains("HTTP API: request refused"), "logged: {}", broker.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changes_from_other_origins_are_refused_and_the_dashboards_own_calls_pass() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let own = format!("http://{}", broker.http.unwrap());
    // The dashboard: same origin, X-Requested-With, JSON bodies.
    let dashboard = [
        ("origin", own.as_str()),
        ("sec-fetch-site", "same-origin"),
        ("x-requested-with", "XMLHttpRequest"),
        ("content-type", "application/json"),
    ];
    let (status, body) = send(&api, Method::PUT, "/api/queues/%2F/jobs", &dashboard, r#"{"durable":true}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Same origin without Sec-Fetch-Site (a browser that does not send it): the Origin decides.
    let plain_own = [("origin", own.as_str()), ("content-type", "application/json")];
    let (status, body) = send(&api, Method::PUT, "/api/queues/%2F/jobs2", &plain_own, "{}").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Another port of the same host is another origin; so are opaque origins.
    let other_port = format!("http://127.0.0.1:{}", broker.http.unwrap().port() + 1);
    for headers in [
        vec![("origin", other_port.as_str())],
        vec![("origin", other_port.as_str()), ("sec-fetch-site", "same-site")],
        vec![("origin", "null")],
        vec![("sec-fetch-site", "cross-site")],
    ] {
        let (status, body) = send(&api, Method::DELETE, "/api/queues/%2F/jobs", &headers, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?}: {body}");
    }
    // Reads are not refused, whatever the origin (a page cannot read the answer anyway).
    let (status, _) = send(&api, Method::GET, "/api/queues/%2F/jobs", &[("sec-fetch-site", "cross-site")], "").await;
    assert_eq!(status, StatusCode::OK, "the queue is still there");

    // Bodyless state changes need no Content-Type: purge, then delete, from the dashboard.
    let bodyless = [("origin", own.as_str()), ("sec-fetch-site", "same-origin")];
    let (status, body) = send(&api, Method::DELETE, "/api/queues/%2F/jobs/contents", &bodyless, "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = send(&api, Method::DELETE, "/api/queues/%2F/jobs", &bodyless, "").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    // A JSON body with charset, and a body that declares no type (scripts that set none).
    let (status, _) =
        send(&api, Method::PUT, "/api/vhosts/v1", &[("content-type", "application/json; charset=utf-8")], "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = send(&api, Method::PUT, "/api/vhosts/v2", &[], "{}").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // A script's `curl -d` (form type, no browser headers) is read as JSON, as RabbitMQ
    // reads it; the same body from a page of the API's own origin must be declared JSON.
    let curl = [("content-type", "application/x-www-form-urlencoded")];
    let (status, body) = send(&api, Method::PUT, "/api/queues/%2F/from-curl", &curl, r#"{"durable":true}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let page = [("content-type", "application/x-www-form-urlencoded"), ("origin", own.as_str())];
    let (status, body) = send(&api, Method::PUT, "/api/queues/%2F/from-page", &page, r#"{"durable":true}"#).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
}

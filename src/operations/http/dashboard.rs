//! The web dashboard: three static files (plain HTML, CSS and JavaScript, no build step)
//! and one vendored library (MQTT.js's browser build, `www/vendor/`) compiled into the
//! binary and served at `/`; the page logs in with the same users and calls the
//! management API like any other client.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("www/index.html");
const APP: &str = include_str!("www/app.js");
const STYLE: &str = include_str!("www/style.css");
const MQTT_JS: &str = include_str!("www/vendor/mqtt.min.js");

/// Everything the page loads comes from this listener; nothing inline, nothing remote. The
/// MQTT client page also opens a WebSocket to the MQTT WebSocket listener (another port).
const POLICY: &str = "default-src 'self'; img-src 'self' data: blob:; connect-src 'self' ws: wss:; object-src 'none'; \
                      frame-ancestors 'none'";

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "no-cache"), (CONTENT_SECURITY_POLICY, POLICY)], body).into_response()
}

/// `GET /`.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /app.js`.
pub async fn app() -> Response {
    asset("text/javascript; charset=utf-8", APP)
}

/// `GET /style.css`.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// `GET /vendor/mqtt.min.js` (MQTT.js, for the MQTT client page).
pub async fn mqtt_js() -> Response {
    asset("text/javascript; charset=utf-8", MQTT_JS)
}

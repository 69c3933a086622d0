//! Errors as RabbitMQ's management API answers them: a status code and
//! `{"error": "...", "reason": "..."}`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::core::entities::EntityError;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// RabbitMQ's `error` (`Object Not Found`, `bad_request`, `not_authorized`, ...).
    pub error: &'static str,
    /// What went wrong.
    pub reason: String,
}

impl ApiError {
    /// 404 Object Not Found.
    pub fn not_found() -> ApiError {
        ApiError { status: StatusCode::NOT_FOUND, error: "Object Not Found", reason: "Not Found".into() }
    }

    /// 400 bad_request with a reason.
    pub fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, error: "bad_request", reason: reason.into() }
    }

    /// 401 without (valid) credentials.
    pub fn unauthorized() -> ApiError {
        Self::unauthorized_because("Not_Authorized")
    }

    /// 401 with a reason.
    pub fn unauthorized_because(reason: &str) -> ApiError {
        ApiError { status: StatusCode::UNAUTHORIZED, error: "not_authorized", reason: reason.into() }
    }

    /// 401 `not_authorised` (RabbitMQ's spelling for a logged-in user refused): the
    /// user's permissions, or its access to the virtual host, do not allow the call.
    pub fn access_refused(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::UNAUTHORIZED, error: "not_authorised", reason: reason.into() }
    }

    /// 403: the user's tags do not allow the call.
    pub fn forbidden(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::FORBIDDEN, error: "not_authorised", reason: reason.into() }
    }

    /// 429: too many logins from the client's address are under way; refused unchecked,
    /// to be tried again after `secs` ([`auth::require_login`](super::auth::require_login)
    /// says so in `Retry-After`).
    pub fn too_many_logins(secs: u64) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            error: "too_many_requests",
            reason: format!("too many logins from this address at once; retry after {secs} s"),
        }
    }

    /// 503 with a reason: the call cannot be answered now (a cluster group without a
    /// majority).
    pub fn unavailable(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, error: "unavailable", reason: reason.into() }
    }

    /// 500 with a reason (storage failed).
    pub fn internal(reason: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, error: "internal_error", reason: reason.into() }
    }
}

impl From<EntityError> for ApiError {
    /// A refused entity operation as the API answers it: 404 for a missing queue or
    /// exchange, 500 when storage failed, 400 with RabbitMQ's text otherwise.
    fn from(e: EntityError) -> ApiError {
        match e {
            EntityError::NotFound { .. } => ApiError::not_found(),
            EntityError::Storage(_) => ApiError::internal(e.to_string()),
            EntityError::Inequivalent { .. }
            | EntityError::QueueLimit { .. }
            | EntityError::InvalidArgument(_)
            | EntityError::InUse { .. }
            | EntityError::NoVhost(_)
            | EntityError::Route(_) => ApiError::bad_request(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({ "error": self.error, "reason": self.reason }));
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"RabbitMQ Management\""),
            );
        }
        response
    }
}

/// The answer to a path the API does not have.
pub async fn not_found() -> ApiError {
    ApiError::not_found()
}

/// The answer to a method a path does not allow.
pub async fn method_not_allowed() -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        error: "Method Not Allowed",
        reason: "Method Not Allowed".into(),
    }
}

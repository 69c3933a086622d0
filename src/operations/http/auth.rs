//! HTTP Basic authentication against the broker's user store, and RabbitMQ's user tags:
//! `administrator` may call everything, `monitoring` may also read other users'
//! connections and the node, `management` and `policymaker` may read and change queues,
//! exchanges and bindings of the virtual hosts they may open, within their permissions.
//! A request without valid credentials gets 401, a user whose tags do not allow the call
//! 403. What each route demands is checked by [`super::permit`], which alone hands a
//! handler its caller.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};

use super::listener::Peer;
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::error::ApiError;
use super::HttpContext;

/// How much a user's tags let it do, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// No management tag: no API access.
    None,
    /// `management` / `policymaker`: read, and change queues, exchanges and bindings.
    Management,
    /// `monitoring`: also read connections, channels and nodes of every user.
    Monitoring,
    /// `administrator`: everything (users, vhosts, permissions, definitions).
    Administrator,
}

impl Access {
    /// The access `tags` give.
    pub fn of(tags: &[String]) -> Access {
        tags.iter()
            .map(|t| match t.as_str() {
                "administrator" => Access::Administrator,
                "monitoring" => Access::Monitoring,
                "management" | "policymaker" => Access::Management,
                _ => Access::None,
            })
            .max()
            .unwrap_or(Access::None)
    }
}

/// The authenticated caller of a request (not `Clone`, so that no handler takes it as an
/// `Extension`: handlers get it from a [`super::permit::Permitted`] proof).
#[derive(Debug)]
pub struct Caller {
    /// User name.
    pub name: String,
    /// The user's tags, as configured.
    pub tags: Vec<String>,
    /// What the tags allow.
    pub access: Access,
}

impl Caller {
    /// Refuses with 403 unless the caller has at least `need`.
    pub fn require(&self, need: Access) -> Result<(), ApiError> {
        if self.access >= need {
            return Ok(());
        }
        let what = match need {
            Access::Administrator => "administrator",
            Access::Monitoring => "monitoring",
            _ => "management",
        };
        Err(ApiError::forbidden(format!("Not {what} user")))
    }
}

/// The user and password of an `Authorization: Basic ...` header.
pub fn basic_credentials(header: &str) -> Option<(String, String)> {
    let encoded = header.strip_prefix("Basic ").or_else(|| header.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_owned(), pass.to_owned()))
}

/// Middleware: authenticates the request and puts its [`Caller`] into the extensions.
/// A script's request (`X-Requested-With`, as the dashboard sends) is refused without
/// `WWW-Authenticate`, so that the browser shows the page's own login, not its dialog; one
/// login too many from an address gets 429 with `Retry-After`.
pub async fn require_login(
    State(ctx): State<Arc<HttpContext>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    mut req: Request,
    next: Next,
) -> Response {
    match authenticate(&ctx, req.headers(), peer).await {
        Ok(caller) => {
            super::permit::admit(&mut req, caller);
            next.run(req).await
        }
        Err(e) => {
            let busy = e.status == axum::http::StatusCode::TOO_MANY_REQUESTS;
            let mut response = e.into_response();
            if busy {
                response.headers_mut().insert(axum::http::header::RETRY_AFTER, retry_after(&ctx).into());
            }
            if req.headers().contains_key("x-requested-with") {
                response.headers_mut().remove(axum::http::header::WWW_AUTHENTICATE);
            }
            response
        }
    }
}

/// Seconds a client refused as one login too many should wait: the login delay, rounded up.
fn retry_after(ctx: &HttpContext) -> u64 {
    ctx.users.throttle().delay().as_millis().div_ceil(1000).max(1) as u64
}

/// Checks a request's credentials (an address, or a user name from it, that failed too
/// often waits first; an address with too many logins under way gets 429 at once).
pub async fn authenticate(ctx: &HttpContext, headers: &HeaderMap, peer: SocketAddr) -> Result<Caller, ApiError> {
    let header = headers.get(AUTHORIZATION).and_then(|h| h.to_str().ok());
    let Some((user, pass)) = header.and_then(basic_credentials) else {
        return Err(ApiError::unauthorized());
    };
    let entry = ctx.users.login(&user, &pass, peer.ip(), "HTTP Basic").await.map_err(|e| match e {
        crate::access::auth::AuthError::TooManyPending => ApiError::too_many_logins(retry_after(ctx)),
        _ => ApiError::unauthorized(),
    })?;
    let access = Access::of(&entry.tags);
    if access == Access::None {
        return Err(ApiError::unauthorized_because("Not management user"));
    }
    Ok(Caller { name: entry.name.clone(), tags: entry.tags.clone(), access })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_give_the_strongest_access_among_them() {
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Access::of(&tags(&[])), Access::None);
        assert_eq!(Access::of(&tags(&["impersonator"])), Access::None);
        assert_eq!(Access::of(&tags(&["management"])), Access::Management);
        assert_eq!(Access::of(&tags(&["management", "monitoring"])), Access::Monitoring);
        assert_eq!(Access::of(&tags(&["administrator"])), Access::Administrator);
    }

    #[test]
    fn basic_credentials_are_decoded() {
        assert_eq!(basic_credentials("Basic Z3Vlc3Q6Z3Vlc3Q="), Some(("guest".into(), "guest".into())));
        assert_eq!(basic_credentials("Basic dTpwOmM="), Some(("u".into(), "p:c".into())), "a colon in the password");
        assert_eq!(basic_credentials("Bearer x"), None);
        assert_eq!(basic_credentials("Basic !!!"), None);
    }
}

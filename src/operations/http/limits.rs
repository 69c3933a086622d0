//! `/api/vhost-limits` and `/api/user-limits`: RabbitMQ's per-virtual-host limits
//! (`max-connections`, `max-queues`) and per-user limits (`max-connections`,
//! `max-channels`), listed as `[{"vhost"|"user": name, "value": {limit: n}}]`, set one at
//! a time with `PUT .../{owner}/{limit}` and `{"value": n}` (negative: no limit), cleared
//! with `DELETE`. Setting and clearing needs the administrator tag, as in RabbitMQ; the
//! limits are stored with the access records and survive restarts.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value as Json_};

use super::access::commit;
use super::error::ApiError;
use super::json::Body;
use super::permit::{Administrator, Management, Permitted, Vhost};
use super::HttpContext;
use crate::core::limits::{parse_limit, LimitScope, LimitValues};
use crate::core::store::LimitsRecord;

type Answer = Result<Json<Json_>, ApiError>;

/// 404 unless the virtual host or user exists.
fn known(ctx: &HttpContext, scope: LimitScope, owner: &str) -> Result<(), ApiError> {
    let exists = match scope {
        LimitScope::Vhost => ctx.broker.routing().has_vhost(owner),
        LimitScope::User => ctx.users.get(owner).is_some(),
    };
    exists.then_some(()).ok_or_else(ApiError::not_found)
}

/// Replaces every limit of `owner` (an empty set clears them), durably.
pub async fn replace_limits(
    ctx: &HttpContext,
    scope: LimitScope,
    owner: &str,
    values: LimitValues,
) -> Result<(), ApiError> {
    let record = LimitsRecord { scope, owner: owner.to_owned(), values };
    commit(ctx, ctx.broker.stores().access.put_limits(&record)).await?;
    if !super::access::applied_by_commit(ctx) {
        ctx.broker.set_limits(scope, owner, record.values);
    }
    Ok(())
}

/// The limits of every owner of `scope` (or of `only`), as RabbitMQ lists them.
pub fn rows(ctx: &HttpContext, scope: LimitScope, only: Option<&str>) -> Vec<Json_> {
    ctx.broker
        .limits()
        .all(scope)
        .into_iter()
        .filter(|(owner, _)| only.is_none_or(|o| o == owner))
        .map(|(owner, values)| json!({ scope.label(): owner, "value": values }))
        .collect()
}

/// Limits as the `limits` of a vhost or user object in definitions: an object, or `[]`
/// when there are none (as RabbitMQ exports them).
pub fn definitions_json(values: &LimitValues) -> Json_ {
    if values.is_empty() {
        json!([])
    } else {
        json!(values)
    }
}

/// The limits of a definitions object's `limits` (an object of integers; `[]` or absent
/// is none); an unknown name or a bad value is a 400.
pub fn from_definitions(scope: LimitScope, limits: Option<&Json_>) -> Result<LimitValues, ApiError> {
    let Some(Json_::Object(o)) = limits else { return Ok(LimitValues::new()) };
    o.iter()
        .map(|(name, value)| {
            let n = parse_limit(scope, name, value).map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok((name.clone(), n))
        })
        .collect()
}

async fn put_one(
    ctx: &HttpContext,
    scope: LimitScope,
    owner: &str,
    name: &str,
    body: &Json_,
) -> Result<StatusCode, ApiError> {
    known(ctx, scope, owner)?;
    let value = body.get("value").ok_or_else(|| ApiError::bad_request("the body needs a \"value\""))?;
    let n = parse_limit(scope, name, value).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut values = ctx.broker.limits().of(scope, owner);
    values.insert(name.to_owned(), n);
    replace_limits(ctx, scope, owner, values).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn clear_one(ctx: &HttpContext, scope: LimitScope, owner: &str, name: &str) -> Result<StatusCode, ApiError> {
    known(ctx, scope, owner)?;
    let mut values = ctx.broker.limits().of(scope, owner);
    if values.remove(name).is_some() {
        replace_limits(ctx, scope, owner, values).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/vhost-limits`: the virtual hosts the caller may open.
pub async fn vhost_limits(p: Permitted<Management>) -> Answer {
    let rows = rows(p.ctx(), LimitScope::Vhost, None)
        .into_iter()
        .filter(|row| row["vhost"].as_str().is_some_and(|v| p.lists(v)))
        .collect();
    Ok(Json(Json_::Array(rows)))
}

/// `GET /api/vhost-limits/{vhost}`.
pub async fn vhost_limits_of(p: Permitted<Vhost>) -> Answer {
    Ok(Json(Json_::Array(rows(p.ctx(), LimitScope::Vhost, Some(&p.name)))))
}

/// `PUT /api/vhost-limits/{vhost}/{name}` with `{"value": n}`.
pub async fn set_vhost_limit(
    p: Permitted<Administrator>,
    Path((vhost, name)): Path<(String, String)>,
    Body(body): Body<Json_>,
) -> Result<StatusCode, ApiError> {
    put_one(p.ctx(), LimitScope::Vhost, &vhost, &name, &body).await
}

/// `DELETE /api/vhost-limits/{vhost}/{name}`.
pub async fn clear_vhost_limit(
    p: Permitted<Administrator>,
    Path((vhost, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    clear_one(p.ctx(), LimitScope::Vhost, &vhost, &name).await
}

/// `GET /api/user-limits`.
pub async fn user_limits(p: Permitted<Administrator>) -> Answer {
    Ok(Json(Json_::Array(rows(p.ctx(), LimitScope::User, None))))
}

/// `GET /api/user-limits/{user}`.
pub async fn user_limits_of(p: Permitted<Administrator>, Path(user): Path<String>) -> Answer {
    known(p.ctx(), LimitScope::User, &user)?;
    Ok(Json(Json_::Array(rows(p.ctx(), LimitScope::User, Some(&user)))))
}

/// `PUT /api/user-limits/{user}/{name}` with `{"value": n}`.
pub async fn set_user_limit(
    p: Permitted<Administrator>,
    Path((user, name)): Path<(String, String)>,
    Body(body): Body<Json_>,
) -> Result<StatusCode, ApiError> {
    put_one(p.ctx(), LimitScope::User, &user, &name, &body).await
}

/// `DELETE /api/user-limits/{user}/{name}`.
pub async fn clear_user_limit(
    p: Permitted<Administrator>,
    Path((user, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    clear_one(p.ctx(), LimitScope::User, &user, &name).await
}

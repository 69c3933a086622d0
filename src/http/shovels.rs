//! Shovels through the API as RabbitMQ's: the runtime parameters
//! `/api/parameters/shovel/{vhost}/{name}` (define, list, delete; kept across restarts) and
//! the shovel plugin's status, `/api/shovels[/{vhost}]`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::access::commit;
use super::auth::{Access, Caller};
use super::error::ApiError;
use super::HttpContext;
use crate::bridge::shovel::{ShovelDefinition, ShovelView};
use crate::core::store::ParameterRecord;

type Answer = Result<Json<Value>, ApiError>;

/// The component name of shovels' parameters.
const SHOVEL: &str = "shovel";

/// A dynamic shovel as `/api/parameters/shovel` shows it.
fn parameter_json(s: &ShovelView) -> Value {
    json!({ "vhost": s.vhost, "component": SHOVEL, "name": s.name, "value": s.definition })
}

/// The dynamic shovels (`vhost`: of one virtual host), as parameters.
pub fn parameters(ctx: &HttpContext, vhost: Option<&str>) -> Vec<Value> {
    ctx.shovels.list().iter().filter(|s| s.dynamic && vhost.is_none_or(|v| v == s.vhost)).map(parameter_json).collect()
}

/// Defines (or redefines) a dynamic shovel from its JSON value: checked, stored, started;
/// true when it is new.
pub async fn put_shovel(ctx: &HttpContext, vhost: &str, name: &str, value: Value) -> Result<bool, ApiError> {
    super::queues::known_vhost(ctx, vhost)?;
    let def: ShovelDefinition =
        serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("shovel `{name}`: {e}")))?;
    def.check().map_err(|e| ApiError::bad_request(format!("shovel `{name}`: {e}")))?;
    if ctx.shovels.get(vhost, name).is_some_and(|s| !s.dynamic) {
        return Err(ApiError::bad_request(format!("shovel `{name}` is defined in the configuration ([[shovel]])")));
    }
    let record = ParameterRecord {
        component: SHOVEL.into(),
        vhost: vhost.into(),
        name: name.into(),
        value: serde_json::to_string(&def).map_err(|e| ApiError::internal(e.to_string()))?,
    };
    commit(ctx, ctx.broker.stores.access.put_parameter(&record)).await?;
    let existed = ctx.shovels.get(vhost, name).is_some();
    ctx.shovels.start(vhost, name, def, true).map_err(|e| ApiError::bad_request(format!("shovel `{name}`: {e}")))?;
    Ok(!existed)
}

/// `GET /api/parameters/shovel`.
pub async fn list_all(State(ctx): State<Arc<HttpContext>>, Extension(caller): Extension<Caller>) -> Answer {
    caller.require(Access::Management)?;
    Ok(Json(Value::Array(parameters(&ctx, None))))
}

/// `GET /api/parameters/shovel/{vhost}`.
pub async fn list_vhost(
    State(ctx): State<Arc<HttpContext>>,
    Extension(caller): Extension<Caller>,
    Path(vhost): Path<String>,
) -> Answer {
    caller.require(Access::Management)?;
    super::queues::known_vhost(&ctx, &vhost)?;
    Ok(Json(Value::Array(parameters(&ctx, Some(&vhost)))))
}

/// `GET /api/parameters/shovel/{vhost}/{name}`.
pub async fn get(
    State(ctx): State<Arc<HttpContext>>,
    Extension(caller): Extension<Caller>,
    Path((vhost, name)): Path<(String, String)>,
) -> Answer {
    caller.require(Access::Management)?;
    let s = ctx.shovels.get(&vhost, &name).filter(|s| s.dynamic).ok_or_else(ApiError::not_found)?;
    Ok(Json(parameter_json(&s)))
}

/// `PUT /api/parameters/shovel/{vhost}/{name}` with `{"value": {...}}`: 201 when new, 204
/// when redefined (RabbitMQ's answers); administrators only.
pub async fn put(
    State(ctx): State<Arc<HttpContext>>,
    Extension(caller): Extension<Caller>,
    Path((vhost, name)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Result<StatusCode, ApiError> {
    caller.require(Access::Administrator)?;
    let value = body.get("value").cloned().ok_or_else(|| ApiError::bad_request("the body needs a `value`"))?;
    match put_shovel(&ctx, &vhost, &name, value).await? {
        true => Ok(StatusCode::CREATED),
        false => Ok(StatusCode::NO_CONTENT),
    }
}

/// `DELETE /api/parameters/shovel/{vhost}/{name}`: the shovel stops and is forgotten.
pub async fn delete(
    State(ctx): State<Arc<HttpContext>>,
    Extension(caller): Extension<Caller>,
    Path((vhost, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.require(Access::Administrator)?;
    if !ctx.shovels.get(&vhost, &name).is_some_and(|s| s.dynamic) {
        return Err(ApiError::not_found());
    }
    commit(&ctx, ctx.broker.stores.access.remove_parameter(SHOVEL, &vhost, &name)).await?;
    ctx.shovels.remove(&vhost, &name);
    Ok(StatusCode::NO_CONTENT)
}

/// A shovel's status as RabbitMQ's shovel plugin shows it.
fn status_json(ctx: &HttpContext, s: &ShovelView) -> Value {
    let d = &s.definition;
    json!({
        "name": s.name,
        "vhost": s.vhost,
        "type": if s.dynamic { "dynamic" } else { "static" },
        "state": if s.status.running { "running" } else { "starting" },
        "reason": s.status.reason,
        "node": ctx.node(),
        "src_uri": d.src_uri,
        "src_queue": d.src_queue,
        "src_exchange": d.src_exchange,
        "src_exchange_key": d.src_exchange_key,
        "dest_uri": d.dest_uri,
        "dest_queue": d.dest_queue,
        "dest_exchange": d.dest_exchange,
        "dest_exchange_key": d.dest_exchange_key,
        "src_protocol": "amqp091",
        "dest_protocol": "amqp091",
        "messages_moved": s.status.moved,
    })
}

/// `GET /api/shovels`.
pub async fn status_all(State(ctx): State<Arc<HttpContext>>, Extension(caller): Extension<Caller>) -> Answer {
    caller.require(Access::Monitoring)?;
    Ok(Json(Value::Array(ctx.shovels.list().iter().map(|s| status_json(&ctx, s)).collect())))
}

/// `GET /api/shovels/{vhost}`.
pub async fn status_vhost(
    State(ctx): State<Arc<HttpContext>>,
    Extension(caller): Extension<Caller>,
    Path(vhost): Path<String>,
) -> Answer {
    caller.require(Access::Monitoring)?;
    let rows = ctx.shovels.list().iter().filter(|s| s.vhost == vhost).map(|s| status_json(&ctx, s)).collect();
    Ok(Json(Value::Array(rows)))
}

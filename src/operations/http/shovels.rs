//! Shovels through the API as RabbitMQ's: the runtime parameters
//! `/api/parameters/shovel/{vhost}/{name}` (define, list, delete; kept across restarts) and
//! the shovel plugin's status, `/api/shovels[/{vhost}]`. A URI's password is shown as
//! `***` in the status to everyone and in the parameters to all but administrators (the
//! definitions export, theirs only, keeps it).

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::access::commit;
use super::auth::Access;
use super::error::ApiError;
use super::permit::{Administrator, Monitoring, Permitted, Policymaker, Vhost};
use super::HttpContext;
use crate::core::store::ParameterRecord;
use crate::links::shovel::{ShovelDefinition, ShovelView, Uris};

type Answer = Result<Json<Value>, ApiError>;

/// The component name of shovels' parameters.
const SHOVEL: &str = "shovel";

/// The password of a URI (`scheme://user:password@host...`) as `***`; anything else as it
/// is. Up to the last `@` before the query counts as the password, so that one with a
/// stray `/` or `@` is masked whole (at worst with part of the path).
pub fn mask_uri(uri: &str) -> String {
    let Some(start) = uri.find("://").map(|i| i + 3) else { return uri.to_owned() };
    let rest = &uri[start..];
    let before_query = rest.find(['?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..before_query].rfind('@') else { return uri.to_owned() };
    match rest[..at].find(':') {
        Some(colon) => format!("{}{}:***{}", &uri[..start], &rest[..colon], &rest[at..]),
        None => uri.to_owned(),
    }
}

/// Every URI in `text` (an error, say) with its password masked.
pub fn mask_uris_in(text: &str) -> String {
    text.split(' ').map(mask_uri).collect::<Vec<_>>().join(" ")
}

fn masked(uris: &Uris) -> Uris {
    match uris {
        Uris::One(u) => Uris::One(mask_uri(u)),
        Uris::Many(v) => Uris::Many(v.iter().map(|u| mask_uri(u)).collect()),
    }
}

/// A dynamic shovel as `/api/parameters/shovel` shows it (`mask`: passwords as `***`).
fn parameter_json(s: &ShovelView, mask: bool) -> Value {
    let mut definition = s.definition.clone();
    if mask {
        definition.src_uri = masked(&definition.src_uri);
        definition.dest_uri = masked(&definition.dest_uri);
    }
    json!({ "vhost": s.vhost, "component": SHOVEL, "name": s.name, "value": definition })
}

/// The dynamic shovels of the virtual hosts `listed` picks, as parameters (`mask`:
/// passwords as `***`).
fn parameter_rows(ctx: &HttpContext, listed: &dyn Fn(&str) -> bool, mask: bool) -> Vec<Value> {
    ctx.shovels.list().iter().filter(|s| s.dynamic && listed(&s.vhost)).map(|s| parameter_json(s, mask)).collect()
}

/// The dynamic shovels (`vhost`: of one virtual host), as parameters, passwords included
/// (the definitions export).
pub fn parameters(ctx: &HttpContext, vhost: Option<&str>) -> Vec<Value> {
    parameter_rows(ctx, &|v| vhost.is_none_or(|only| only == v), false)
}

/// True when `p`'s caller sees shovel URIs with passwords masked (all but administrators).
fn masks<C>(p: &Permitted<C>) -> bool {
    p.caller().access < Access::Administrator
}

/// Defines (or redefines) a dynamic shovel from its JSON value: checked, stored, started;
/// true when it is new.
pub async fn put_shovel(ctx: &HttpContext, vhost: &str, name: &str, value: Value) -> Result<bool, ApiError> {
    super::queues::known_vhost(ctx, vhost)?;
    let def: ShovelDefinition =
        serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("shovel `{name}`: {e}")))?;
    crate::links::shovel::Plan::of(&def).map_err(|e| ApiError::bad_request(format!("shovel `{name}`: {e}")))?;
    if ctx.shovels.get(vhost, name).is_some_and(|s| !s.dynamic) {
        return Err(ApiError::bad_request(format!("shovel `{name}` is defined in the configuration ([[shovel]])")));
    }
    let record = ParameterRecord {
        component: SHOVEL.into(),
        vhost: vhost.into(),
        name: name.into(),
        value: serde_json::to_string(&def).map_err(|e| ApiError::internal(e.to_string()))?,
    };
    commit(ctx, ctx.broker.stores().access.put_parameter(&record)).await?;
    let existed = ctx.shovels.get(vhost, name).is_some();
    ctx.shovels.start(vhost, name, def, true).map_err(|e| ApiError::bad_request(format!("shovel `{name}`: {e}")))?;
    Ok(!existed)
}

/// `GET /api/parameters/shovel`: policymakers (RabbitMQ's rule for runtime parameters),
/// the virtual hosts they may open.
pub async fn list_all(p: Permitted<Policymaker>) -> Answer {
    Ok(Json(Value::Array(parameter_rows(p.ctx(), &|v| p.lists(v), masks(&p)))))
}

/// `GET /api/parameters/shovel/{vhost}`.
pub async fn list_vhost(p: Permitted<Vhost<Policymaker>>) -> Answer {
    Ok(Json(Value::Array(parameter_rows(p.ctx(), &|v| v == p.name, masks(&p)))))
}

/// `GET /api/parameters/shovel/{vhost}/{name}`.
pub async fn get(p: Permitted<Vhost<Policymaker>>, Path((_, name)): Path<(String, String)>) -> Answer {
    let s = p.ctx().shovels.get(&p.name, &name).filter(|s| s.dynamic).ok_or_else(ApiError::not_found)?;
    Ok(Json(parameter_json(&s, masks(&p))))
}

/// `PUT /api/parameters/shovel/{vhost}/{name}` with `{"value": {...}}`: 201 when new, 204
/// when redefined (RabbitMQ's answers); administrators only.
pub async fn put(
    p: Permitted<Administrator>,
    Path((vhost, name)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Result<StatusCode, ApiError> {
    let value = body.get("value").cloned().ok_or_else(|| ApiError::bad_request("the body needs a `value`"))?;
    match put_shovel(p.ctx(), &vhost, &name, value).await? {
        true => Ok(StatusCode::CREATED),
        false => Ok(StatusCode::NO_CONTENT),
    }
}

/// `DELETE /api/parameters/shovel/{vhost}/{name}`: the shovel stops and is forgotten.
pub async fn delete(
    p: Permitted<Administrator>,
    Path((vhost, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    if !ctx.shovels.get(&vhost, &name).is_some_and(|s| s.dynamic) {
        return Err(ApiError::not_found());
    }
    commit(ctx, ctx.broker.stores().access.remove_parameter(SHOVEL, &vhost, &name)).await?;
    ctx.shovels.remove(&vhost, &name);
    Ok(StatusCode::NO_CONTENT)
}

/// A shovel's status as RabbitMQ's shovel plugin shows it, passwords masked.
fn status_json(ctx: &HttpContext, s: &ShovelView) -> Value {
    let d = &s.definition;
    let uri = |u: &Uris| serde_json::to_value(masked(u)).unwrap_or(Value::Null);
    json!({
        "name": s.name,
        "vhost": s.vhost,
        "type": if s.dynamic { "dynamic" } else { "static" },
        "state": if s.status.running { "running" } else { "starting" },
        "reason": s.status.reason.as_deref().map(mask_uris_in),
        "node": ctx.node(),
        "src_uri": uri(&d.src_uri),
        "src_queue": d.src_queue,
        "src_exchange": d.src_exchange,
        "src_exchange_key": d.src_exchange_key,
        "dest_uri": uri(&d.dest_uri),
        "dest_queue": d.dest_queue,
        "dest_exchange": d.dest_exchange,
        "dest_exchange_key": d.dest_exchange_key,
        "src_protocol": "amqp091",
        "dest_protocol": "amqp091",
        "messages_moved": s.status.moved,
    })
}

/// `GET /api/shovels`: the shovels of the virtual hosts the caller may open.
pub async fn status_all(p: Permitted<Monitoring>) -> Answer {
    let ctx = p.ctx();
    Ok(Json(Value::Array(
        ctx.shovels.list().iter().filter(|s| p.lists(&s.vhost)).map(|s| status_json(ctx, s)).collect(),
    )))
}

/// `GET /api/shovels/{vhost}`.
pub async fn status_vhost(p: Permitted<Vhost<Monitoring>>) -> Answer {
    let ctx = p.ctx();
    let rows = ctx.shovels.list().iter().filter(|s| s.vhost == p.name).map(|s| status_json(ctx, s)).collect();
    Ok(Json(Value::Array(rows)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_uris_are_masked() {
        assert_eq!(mask_uri("amqp://user:secret@host:5672/%2F"), "amqp://user:***@host:5672/%2F");
        assert_eq!(mask_uri("amqps://u:p%40ss@h?cacertfile=/x@y"), "amqps://u:***@h?cacertfile=/x@y");
        assert_eq!(mask_uri("amqp://u:pa/ss@host/v"), "amqp://u:***@host/v", "a stray slash");
        assert_eq!(mask_uri("amqp://user@host"), "amqp://user@host", "no password");
        assert_eq!(mask_uri("amqp://host/v"), "amqp://host/v");
        assert_eq!(mask_uri("amqp://"), "amqp://");
        assert_eq!(mask_uri("not a uri"), "not a uri");
        assert_eq!(mask_uris_in("cannot reach amqp://a:b@h: refused"), "cannot reach amqp://a:***@h: refused");
    }
}

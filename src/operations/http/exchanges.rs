//! `/api/exchanges` and `/api/bindings`: exchanges with RabbitMQ's fields, declare,
//! delete, publish (answering `{"routed": bool}`), and bindings with their
//! `properties_key`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Map, Value as Json_};

use super::error::ApiError;
use super::json::{flag, json_table, lenient, list, table_json, Body, ListQuery};
use super::permit::{
    BindingDestination, BindingGrant, BindingPath, Configure, Management, OnExchange, OnQueue, Permitted, Vhost, View,
    Write,
};
use super::HttpContext;
use crate::core::broker::RetainMode;
use crate::core::entities::{check_equivalent_exchange, EntityError};
use crate::core::message::{now_ms, Message, Properties};
use crate::core::router::{Binding, Destination, ExchangeDef, ExchangeKind, RouteError};
use crate::core::store::{QueueId, StoreWrite};

type Answer = Result<Json<Json_>, ApiError>;

fn exchange_json(vhost: &str, x: &ExchangeDef) -> Json_ {
    json!({
        "name": x.name,
        "vhost": vhost,
        "type": x.kind.name(),
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": table_json(&x.arguments),
        "user_who_performed_action": "rmq-internal",
        "policy": Json_::Null,
    })
}

fn sorted_exchanges(ctx: &HttpContext, listed: &dyn Fn(&str) -> bool) -> Vec<(String, (String, ExchangeDef))> {
    let mut all = Vec::new();
    for v in ctx.vhosts().iter().filter(|v| listed(v)) {
        let mut xs = ctx.broker.routing().exchanges(v);
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        all.extend(xs.into_iter().map(|x| (x.name.clone(), (v.clone(), x))));
    }
    all
}

/// `GET /api/exchanges`: the exchanges of the virtual hosts the caller may open.
pub async fn list_all(p: Permitted<Management>, Query(q): Query<ListQuery>) -> Answer {
    list(sorted_exchanges(p.ctx(), &|v| p.lists(v)), &q, |(v, x)| exchange_json(v, x))
}

/// `GET /api/exchanges/{vhost}`.
pub async fn list_vhost(p: Permitted<Vhost>, Query(q): Query<ListQuery>) -> Answer {
    list(sorted_exchanges(p.ctx(), &|v| v == p.name), &q, |(v, x)| exchange_json(v, x))
}

/// `GET /api/exchanges/{vhost}/{name}`.
pub async fn show(p: Permitted<OnExchange<View>>) -> Answer {
    let x = p.ctx().broker.routing().exchange(&p.vhost, &p.name).ok_or_else(ApiError::not_found)?;
    Ok(Json(exchange_json(&p.vhost, &x)))
}

/// The body of `PUT /api/exchanges/{vhost}/{name}`.
#[derive(Debug, Deserialize)]
pub struct DeclareBody {
    /// Exchange type (`direct`, `topic`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// Survives a restart (default true).
    #[serde(default = "yes", deserialize_with = "lenient::bool")]
    pub durable: bool,
    /// Deleted with its last binding.
    #[serde(default, deserialize_with = "lenient::bool")]
    pub auto_delete: bool,
    /// Only other exchanges may publish to it.
    #[serde(default, deserialize_with = "lenient::bool")]
    pub internal: bool,
    /// Arguments (`alternate-exchange`, `x-delayed-type`, ...).
    #[serde(default)]
    pub arguments: Map<String, Json_>,
}

fn yes() -> bool {
    true
}

/// `PUT /api/exchanges/{vhost}/{name}`: 201 created, 204 when an equivalent one exists.
pub async fn declare(
    p: Permitted<OnExchange<Configure>>,
    Body(body): Body<DeclareBody>,
) -> Result<StatusCode, ApiError> {
    let (ctx, vhost, name) = (p.ctx(), p.vhost.as_str(), p.name.as_str());
    let kind = ExchangeKind::parse(&body.kind)
        .ok_or_else(|| ApiError::bad_request(format!("unknown exchange type '{}'", body.kind)))?;
    let def = ExchangeDef {
        name: name.to_owned(),
        kind,
        durable: body.durable,
        auto_delete: body.auto_delete,
        internal: body.internal,
        arguments: json_table(&body.arguments),
    };
    let router = ctx.broker.routing();
    if let Some(ae) = def.arguments.iter().find(|(k, _)| k == "alternate-exchange").and_then(|(_, v)| v.as_str()) {
        p.route_into(ae)?;
    }
    if let Some(current) = router.exchange(vhost, name) {
        check_equivalent_exchange(&current, &def, vhost)?;
        return Ok(StatusCode::NO_CONTENT);
    }
    if name.is_empty() || name.starts_with("amq.") {
        return Err(ApiError::bad_request(format!("exchange name '{name}' contains reserved prefix 'amq.*'")));
    }
    if kind == ExchangeKind::DelayedMessage && def.delayed_type().is_none() {
        return Err(ApiError::bad_request("Invalid argument, 'x-delayed-type' must be an existing exchange type"));
    }
    ctx.entities.declare_exchange(vhost, def).await?;
    Ok(StatusCode::CREATED)
}

/// The query of `DELETE /api/exchanges/{vhost}/{name}`.
#[derive(Debug, Default, Deserialize)]
pub struct DeleteQuery {
    /// Only if no binding has it as source.
    #[serde(rename = "if-unused")]
    pub if_unused: Option<String>,
}

/// `DELETE /api/exchanges/{vhost}/{name}`: configure permission on the exchange.
pub async fn remove(p: Permitted<OnExchange<Configure>>, Query(q): Query<DeleteQuery>) -> Result<StatusCode, ApiError> {
    let (ctx, vhost, name) = (p.ctx(), p.vhost.as_str(), p.name.as_str());
    if name.is_empty() || name.starts_with("amq.") {
        return Err(ApiError::bad_request(format!("operation not permitted on exchange '{name}' in vhost '{vhost}'")));
    }
    match ctx.entities.delete_exchange(vhost, name, flag(&q.if_unused)).await {
        Ok(()) => {}
        Err(EntityError::InUse { .. }) => {
            return Err(ApiError::bad_request(format!("exchange '{name}' in vhost '{vhost}' in use")))
        }
        Err(EntityError::NotFound { .. } | EntityError::NoVhost(_)) => return Err(ApiError::not_found()),
        Err(e) => return Err(e.into()),
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The longest routing or binding key the API takes: what AMQP carries (a short string,
/// 255 bytes), so that the API publishes and binds what an AMQP client could.
pub const MAX_KEY_BYTES: usize = 255;

/// 400 for a key longer than [`MAX_KEY_BYTES`].
fn check_key(field: &str, key: &str) -> Result<(), ApiError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::bad_request(format!(
            "{field} is {} bytes long; at most {MAX_KEY_BYTES} (an AMQP short string)",
            key.len()
        )));
    }
    Ok(())
}

/// The body of `POST /api/exchanges/{vhost}/{name}/publish`.
#[derive(Debug, Deserialize)]
pub struct PublishBody {
    /// Routing key.
    #[serde(default)]
    pub routing_key: String,
    /// Body, as `payload_encoding` says.
    #[serde(default)]
    pub payload: String,
    /// `string` or `base64`.
    #[serde(default = "string")]
    pub payload_encoding: String,
    /// Message properties (`delivery_mode`, `headers`, `content_type`, ...).
    #[serde(default)]
    pub properties: Map<String, Json_>,
}

fn string() -> String {
    "string".into()
}

fn properties_from(p: &Map<String, Json_>, now: u64) -> Properties {
    let text = |k: &str| p.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let int = |k: &str| p.get(k).and_then(|v| v.as_u64());
    Properties {
        content_type: text("content_type"),
        content_encoding: text("content_encoding"),
        headers: p.get("headers").and_then(|h| h.as_object()).map(json_table).unwrap_or_default(),
        correlation_data: text("correlation_id").map(|s| s.into_bytes().into()),
        reply_to: text("reply_to"),
        expiration_ms: text("expiration").and_then(|e| e.parse().ok()),
        expires_at_ms: text("expiration").and_then(|e| e.parse::<u64>().ok()).map(|e| now + e),
        message_id: text("message_id"),
        timestamp: int("timestamp"),
        kind: text("type"),
        user_id: text("user_id"),
        app_id: text("app_id"),
        priority: int("priority").map(|v| v.min(255) as u8),
        delivery_mode: int("delivery_mode").map(|v| v.min(2) as u8),
        ..Properties::default()
    }
}

/// `POST /api/exchanges/{vhost}/{name}/publish`: routed and stored as an AMQP publish
/// with confirms would be; answers once the message is durable.
pub async fn publish(p: Permitted<OnExchange<Write>>, Body(body): Body<PublishBody>) -> Answer {
    check_key("routing_key", &body.routing_key)?;
    let (ctx, vhost, name) = (p.ctx(), p.vhost.as_str(), p.name.clone());
    let topic = ctx.broker.routing().exchange(vhost, &name).is_some_and(|x| x.kind == ExchangeKind::Topic);
    p.publish(&name, topic, &body.routing_key)?;
    let payload = match body.payload_encoding.as_str() {
        "string" => body.payload.into_bytes(),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(body.payload.as_bytes())
            .map_err(|e| ApiError::bad_request(format!("payload is not base64: {e}")))?,
        other => return Err(ApiError::bad_request(format!("unknown payload_encoding '{other}'"))),
    };
    let now = now_ms();
    let props = properties_from(&body.properties, now);
    let qos = u8::from(props.delivery_mode == Some(2));
    let msg = Arc::new(Message {
        exchange: name.clone(),
        routing_key: body.routing_key,
        payload: payload.into(),
        qos,
        retain: false,
        props,
        timestamp_ms: now,
    });
    let (routes, _) = ctx.broker.routing().route(vhost, &name, &msg, "").map_err(|e| match e {
        RouteError::NoExchange(..) | RouteError::NoVhost(..) => ApiError::not_found(),
        e => ApiError::bad_request(e.to_string()),
    })?;
    let routes = Arc::new(routes);
    let routed = !routes.is_empty();
    let (routes, _) = ctx.entities.admit(&msg, &routes);
    if let Some(signal) = ctx.broker.publish(&msg, &routes, RetainMode::None, StoreWrite::none()).await {
        match signal.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ApiError::internal(e.to_string())),
            Err(_) => return Err(ApiError::internal("the journal stopped")),
        }
    }
    Ok(Json(json!({ "routed": routed })))
}

/// RabbitMQ's `properties_key` of a binding: `~` for no key and no arguments, the
/// URL-escaped key otherwise, followed by `~` and a hash of the arguments when there are some.
pub fn properties_key(key: &str, args: &[(String, crate::core::value::Value)]) -> String {
    let escaped: String = key
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    if args.is_empty() {
        return if key.is_empty() { "~".into() } else { escaped };
    }
    let text = table_json(args).to_string();
    let hash = crate::core::stable_hash::hash64(&[text.as_bytes()]);
    format!("{escaped}~{:08x}", hash as u32)
}

/// The names of the AMQP queues, by id.
fn queue_names(ctx: &HttpContext) -> HashMap<QueueId, String> {
    ctx.entities.all().into_iter().map(|q| (q.id, q.name.clone())).collect()
}

fn binding_json(vhost: &str, source: &str, b: &Binding, names: &HashMap<QueueId, String>) -> Option<Json_> {
    let (destination, kind) = match &b.dest {
        Destination::Queue(id) => (names.get(id)?.clone(), "queue"),
        Destination::Exchange(x) => (x.clone(), "exchange"),
        Destination::Session(_) | Destination::Member(_) => return None,
    };
    Some(json!({
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": kind,
        "routing_key": b.key,
        "arguments": table_json(&b.args),
        "properties_key": properties_key(&b.key, &b.args),
    }))
}

/// Every binding of the vhosts `listed` picks to an AMQP queue or an exchange, the
/// default exchange's included, in RabbitMQ's order (source, destination).
fn bindings(ctx: &HttpContext, listed: &dyn Fn(&str) -> bool) -> Vec<Json_> {
    let names = queue_names(ctx);
    let mut all = Vec::new();
    for v in ctx.vhosts().iter().filter(|v| listed(v)) {
        let mut rows: Vec<Json_> = ctx
            .broker
            .routing()
            .bindings(v)
            .iter()
            .filter_map(|(source, b)| binding_json(v, source, b, &names))
            .collect();
        rows.sort_by_key(|r| (r["source"].to_string(), r["destination"].to_string(), r["routing_key"].to_string()));
        all.extend(rows);
    }
    all
}

/// The bindings of one virtual host.
fn bindings_of(ctx: &HttpContext, vhost: &str) -> Vec<Json_> {
    bindings(ctx, &|v| v == vhost)
}

/// `GET /api/bindings`: the bindings of the virtual hosts the caller may open.
pub async fn bindings_all(p: Permitted<Management>) -> Answer {
    Ok(Json(Json_::Array(bindings(p.ctx(), &|v| p.lists(v)))))
}

/// `GET /api/bindings/{vhost}`.
pub async fn bindings_vhost(p: Permitted<Vhost>) -> Answer {
    Ok(Json(Json_::Array(bindings_of(p.ctx(), &p.name))))
}

/// `GET /api/queues/{vhost}/{name}/bindings`.
pub async fn queue_bindings(p: Permitted<OnQueue<View>>) -> Answer {
    let ctx = p.ctx();
    ctx.entities.queue(&p.vhost, &p.name).ok_or_else(ApiError::not_found)?;
    let rows = bindings_of(ctx, &p.vhost)
        .into_iter()
        .filter(|r| r["destination_type"] == "queue" && r["destination"] == p.name.as_str())
        .collect();
    Ok(Json(Json_::Array(rows)))
}

/// A binding as the API names it.
#[derive(Debug, Clone)]
pub struct BindingSpec<'a> {
    /// Source exchange.
    pub source: &'a str,
    /// `q` / `queue` or `e` / `exchange`.
    pub dest_type: &'a str,
    /// Destination queue or exchange.
    pub dest: &'a str,
    /// Routing key.
    pub key: &'a str,
    /// Arguments.
    pub args: Vec<(String, crate::core::value::Value)>,
}

/// Binds as `spec` says in `vhost`, durable when both ends are; `bind = false` removes
/// the binding. The grant is the proof that the binding was checked.
pub async fn set_binding(
    ctx: &HttpContext,
    vhost: &str,
    spec: BindingSpec<'_>,
    bind: bool,
    _checked: BindingGrant,
) -> Result<(), ApiError> {
    let BindingSpec { source, dest_type, dest, key, args } = spec;
    if bind {
        check_key("routing_key", key)?;
    }
    if source.is_empty() {
        return Err(ApiError::bad_request("operation not permitted on the default exchange"));
    }
    let router = ctx.broker.routing();
    let src = router.exchange(vhost, source).ok_or_else(ApiError::not_found)?;
    let (binding, durable) = match dest_type {
        "q" | "queue" => {
            let q = ctx.entities.queue(vhost, dest).ok_or_else(ApiError::not_found)?;
            (Binding::queue(q.id, key, args), q.durable)
        }
        "e" | "exchange" => {
            let x = router.exchange(vhost, dest).ok_or_else(ApiError::not_found)?;
            (Binding::exchange(dest, key, args), x.durable)
        }
        other => return Err(ApiError::bad_request(format!("unknown destination type '{other}'"))),
    };
    let durable = src.durable && durable;
    match bind {
        true => ctx.entities.bind(vhost, source, &binding, durable).await?,
        false => ctx.entities.unbind(vhost, source, &binding, durable).await?,
    }
    Ok(())
}

/// The rows of the bindings from `source` to `destination` in `vhost`.
fn rows_between(ctx: &HttpContext, vhost: &str, source: &str, destination: &BindingDestination) -> Vec<Json_> {
    let (kind, dest) = match destination {
        BindingDestination::Queue(q) => ("queue", q),
        BindingDestination::Exchange(x) => ("exchange", x),
    };
    bindings_of(ctx, vhost)
        .into_iter()
        .filter(|r| r["source"] == source && r["destination"] == dest.as_str() && r["destination_type"] == kind)
        .collect()
}

/// `GET /api/bindings/{vhost}/e/{source}/{q|e}/{destination}`.
pub async fn bindings_between(p: Permitted<BindingPath>) -> Answer {
    Ok(Json(Json_::Array(rows_between(p.ctx(), &p.vhost, &p.source, &p.destination))))
}

/// The body of `POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}`.
#[derive(Debug, Default, Deserialize)]
pub struct BindBody {
    /// Routing key.
    #[serde(default)]
    pub routing_key: String,
    /// Binding arguments.
    #[serde(default)]
    pub arguments: Map<String, Json_>,
}

/// The spec of the binding `p` names, with `key` and `args`.
fn spec_of<'a>(p: &'a BindingPath, key: &'a str, args: Vec<(String, crate::core::value::Value)>) -> BindingSpec<'a> {
    let (dest_type, dest) = match &p.destination {
        BindingDestination::Queue(q) => ("q", q.as_str()),
        BindingDestination::Exchange(x) => ("e", x.as_str()),
    };
    BindingSpec { source: &p.source, dest_type, dest, key, args }
}

/// `POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}`: 201 with the new
/// binding's path in `Location`, as RabbitMQ. Checked as AMQP's `queue.bind` /
/// `exchange.bind`: write on the destination, read on the source and, on a topic
/// source, on the key (topic permissions and MQTT rules).
pub async fn create_binding(
    p: Permitted<BindingPath>,
    Body(body): Body<BindBody>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let grant = p.grant_binding(&body.routing_key, true)?;
    let args = json_table(&body.arguments);
    let props = properties_key(&body.routing_key, &args);
    set_binding(p.ctx(), &p.vhost, spec_of(&p, &body.routing_key, args), true, grant).await?;
    Ok((StatusCode::CREATED, [(axum::http::header::LOCATION, props)]).into_response())
}

/// `DELETE /api/bindings/{vhost}/e/{source}/{q|e}/{destination}/{properties_key}`: the
/// checks of creating it, as RabbitMQ's `queue.unbind`.
pub async fn remove_binding(
    p: Permitted<BindingPath>,
    Path(params): Path<HashMap<String, String>>,
) -> Result<StatusCode, ApiError> {
    let props = params.get("props").ok_or_else(ApiError::not_found)?;
    let (ctx, vhost) = (p.ctx(), p.vhost.as_str());
    let names = queue_names(ctx);
    let (wanted, dest) = match &p.destination {
        BindingDestination::Queue(q) => ("queue", q),
        BindingDestination::Exchange(x) => ("exchange", x),
    };
    let found = ctx.broker.routing().bindings(vhost).into_iter().find(|(s, b)| {
        *s == p.source
            && binding_json(vhost, s, b, &names)
                .is_some_and(|r| r["destination"] == dest.as_str() && r["destination_type"] == wanted)
            && properties_key(&b.key, &b.args) == *props
    });
    let Some((_, b)) = found else { return Err(ApiError::not_found()) };
    let grant = p.grant_binding(&b.key, false)?;
    set_binding(ctx, vhost, spec_of(&p, &b.key, b.args.clone()), false, grant).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/bindings/{vhost}/e/{source}/{q|e}/{destination}/{properties_key}`.
pub async fn binding(p: Permitted<BindingPath>, Path(params): Path<HashMap<String, String>>) -> Answer {
    let props = params.get("props").ok_or_else(ApiError::not_found)?;
    let all = rows_between(p.ctx(), &p.vhost, &p.source, &p.destination);
    let found = all.into_iter().find(|r| r["properties_key"] == props.as_str());
    Ok(Json(found.ok_or_else(ApiError::not_found)?))
}

/// Exchanges of `vhost` a definitions export lists: not the default one nor `amq.*`.
pub fn user_exchanges(ctx: &HttpContext, vhost: &str) -> Vec<Json_> {
    let mut xs: Vec<ExchangeDef> = ctx
        .broker
        .routing()
        .exchanges(vhost)
        .into_iter()
        .filter(|x| !x.name.is_empty() && !x.name.starts_with("amq."))
        .collect();
    xs.sort_by(|a, b| a.name.cmp(&b.name));
    xs.iter().map(|x| exchange_json(vhost, x)).collect()
}

/// Bindings of `vhost` a definitions export lists: not those of the default exchange.
pub fn user_bindings(ctx: &HttpContext, vhost: &str) -> Vec<Json_> {
    bindings_of(ctx, vhost).into_iter().filter(|b| b["source"] != "").collect()
}

//! FerryMQ's MQTT views under `/api/ferrymq/mqtt/...`, with EMQX's vocabulary: clients
//! (connected), sessions (offline persistent ones included), subscriptions, retained
//! messages; kicking a client, deleting a session or a retained message.

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as Json_};

use super::error::ApiError;
use super::permit::{Administrator, Monitoring, Permitted};
use super::queues::payload_json;
use super::HttpContext;
use crate::core::connections::ClientDetails;
use crate::core::message::key_to_mqtt;
use crate::core::router::{mqtt_filter_to_pattern, MQTT_VHOST};
use crate::core::stats::Stats;

type Answer = Result<Json<Json_>, ApiError>;

/// An MQTT binding key (AMQP pattern syntax) as an MQTT topic filter.
fn filter_of(key: &str) -> String {
    key_to_mqtt(&key.split('.').map(|w| if w == "*" { "+" } else { w }).collect::<Vec<_>>().join("."))
}

/// (client id, filter, qos, no_local, retain_as_published, subscription id) of every MQTT subscription.
fn subscriptions(ctx: &HttpContext) -> Vec<(String, String, u8, bool, bool, Option<u32>)> {
    let exchange = ctx.broker.routing().mqtt_exchange().to_owned();
    let mut all: Vec<_> = ctx
        .broker
        .routing()
        .bindings(MQTT_VHOST)
        .into_iter()
        .filter(|(x, _)| *x == exchange)
        .filter_map(|(_, b)| {
            let o = b.mqtt?;
            Some((
                o.client_id.to_string(),
                filter_of(&b.key),
                o.qos,
                o.no_local,
                o.retain_as_published,
                o.subscription_id,
            ))
        })
        .collect();
    all.sort();
    all
}

/// `GET /api/ferrymq/mqtt/clients`: connected MQTT clients.
pub async fn clients(p: Permitted<Monitoring>) -> Answer {
    let ctx = p.ctx();
    let subs = subscriptions(ctx);
    let mut all = Vec::new();
    for c in ctx.broker.connections().list().into_iter().filter(|c| c.protocol.is_mqtt()) {
        let ClientDetails::Mqtt { client_id, keep_alive, clean_start, expiry_secs } = &c.client else { continue };
        let level = match c.protocol.name() {
            "MQTT 3.1" => 3,
            "MQTT 3.1.1" => 4,
            _ => 5,
        };
        all.push(json!({
            "clientid": client_id.as_ref(),
            "username": c.user,
            "proto_name": if level == 3 { "MQIsdp" } else { "MQTT" },
            "proto_ver": level,
            "ip_address": c.peer.ip().to_string(),
            "port": c.peer.port(),
            "keepalive": keep_alive,
            "clean_start": clean_start,
            "expiry_interval": expiry_secs,
            "connected": true,
            "connected_at": c.connected_at_ms,
            "recv_oct": Stats::get(&c.recv_oct),
            "send_oct": Stats::get(&c.send_oct),
            "subscriptions_cnt": subs.iter().filter(|s| s.0 == client_id.as_ref()).count(),
            "inflight_cnt": Stats::get(&c.mqtt.inflight),
            "mqueue_len": Stats::get(&c.mqtt.queued),
            "mqueue_dropped": Stats::get(&c.mqtt.dropped),
            "node": ctx.node(),
            "connection_name": c.name(),
        }));
    }
    Ok(Json(Json_::Array(all)))
}

/// `GET /api/ferrymq/mqtt/delayed`: how many delayed messages wait for their time (EMQX's
/// delayed-publish count; AMQP delayed publishes included), as of the last rates sample.
pub async fn delayed(p: Permitted<Monitoring>) -> Answer {
    let ctx = p.ctx();
    let pending = ctx.delayed_pending.load(std::sync::atomic::Ordering::Relaxed);
    let limit = super::DELAYED_SCAN_LIMIT as u64;
    Ok(Json(json!({ "pending": pending, "scan_limit": limit, "at_limit": pending >= limit })))
}

/// `DELETE /api/ferrymq/mqtt/clients/{clientid}`: kick (MQTT 5 DISCONNECT 0x98).
pub async fn kick(p: Permitted<Administrator>, Path(client_id): Path<String>) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    match ctx.mqtt.sessions.kick(&client_id) {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(ApiError::not_found()),
    }
}

/// `GET /api/ferrymq/mqtt/sessions`: every session, offline persistent ones included,
/// with its subscriptions and (persistent) queued messages.
pub async fn sessions(p: Permitted<Monitoring>) -> Answer {
    let ctx = p.ctx();
    let subs = subscriptions(ctx);
    let mut all = Vec::new();
    for s in ctx.mqtt.sessions.list() {
        let queued = match &s.persistent {
            Some(p) => Some(ctx.broker.queue_len(p.queue).await),
            None => None,
        };
        let subscriptions: Vec<Json_> = match &s.persistent {
            Some(p) => p.stored.subscriptions.iter().map(|(f, o)| json!({ "topic": f, "qos": o.qos })).collect(),
            None => subs
                .iter()
                .filter(|x| x.0 == s.client_id.as_ref())
                .map(|x| json!({ "topic": x.1, "qos": x.2 }))
                .collect(),
        };
        all.push(json!({
            "clientid": s.client_id.as_ref(),
            "connected": s.online,
            "persistent": s.persistent.is_some(),
            "expiry_interval": s.persistent.as_ref().map(|p| p.stored.expiry_secs),
            "disconnected_at": s.persistent.as_ref().and_then(|p| p.stored.disconnected_at_ms),
            "expires_at": s.expires_at_ms,
            "subscriptions": subscriptions,
            "mqueue_len": queued,
        }));
    }
    Ok(Json(Json_::Array(all)))
}

/// `DELETE /api/ferrymq/mqtt/sessions/{clientid}`: kicks the client if it is connected,
/// then discards its persistent session (subscriptions, queued messages, stored state).
pub async fn delete_session(
    p: Permitted<Administrator>,
    Path(client_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    // A connected client is told to go; its cleanup releases the session (awaited, not polled).
    let kicked = ctx.mqtt.sessions.kick(&client_id);
    if let Some(signals) = &kicked {
        signals.wait_finished(std::time::Duration::from_secs(5)).await;
    }
    match ctx.mqtt.sessions.take_offline(&client_id) {
        Some(p) => {
            ctx.mqtt.discard_persistent(&client_id, &p).await;
            Ok(StatusCode::NO_CONTENT)
        }
        // A clean session ends with its connection.
        None if kicked.is_some() => Ok(StatusCode::NO_CONTENT),
        None => Err(ApiError::not_found()),
    }
}

/// `GET /api/ferrymq/mqtt/subscriptions`.
pub async fn subscriptions_list(p: Permitted<Monitoring>) -> Answer {
    let ctx = p.ctx();
    let rows = subscriptions(ctx)
        .into_iter()
        .map(|(client, topic, qos, nl, rap, id)| {
            json!({ "clientid": client, "topic": topic, "qos": qos, "nl": nl, "rap": rap, "subid": id, "node": ctx.node() })
        })
        .collect();
    Ok(Json(Json_::Array(rows)))
}

/// The query of `GET /api/ferrymq/mqtt/retained`.
#[derive(Debug, Default, Deserialize)]
pub struct RetainedQuery {
    /// An MQTT topic filter (default `#`).
    pub topic: Option<String>,
    /// Longest payload preview, bytes (default 256).
    pub truncate: Option<u64>,
}

/// `GET /api/ferrymq/mqtt/retained?topic=FILTER`: the retained messages the caller could
/// receive as an MQTT client (the MQTT rules; with RabbitMQ's permissions, read on the
/// MQTT exchange and its topic permissions), administrators included.
pub async fn retained(p: Permitted<Monitoring>, Query(q): Query<RetainedQuery>) -> Answer {
    let ctx = p.ctx();
    let filter = q.topic.unwrap_or_else(|| "#".into());
    let mut msgs = ctx.broker.retained().matching(&mqtt_filter_to_pattern(&filter));
    msgs.sort_by(|a, b| a.routing_key.cmp(&b.routing_key));
    let mut reader = p.message_reader();
    let exchange = ctx.broker.routing().mqtt_exchange();
    let rows = msgs
        .iter()
        .filter(|m| reader.may_read(MQTT_VHOST, exchange, &m.routing_key))
        .map(|m| {
            let (payload, encoding) = payload_json(&m.payload, "auto", Some(q.truncate.unwrap_or(256)));
            json!({
                "topic": key_to_mqtt(&m.routing_key),
                "qos": m.qos,
                "payload": payload,
                "payload_encoding": encoding,
                "payload_bytes": m.payload.len(),
                "publish_at": m.timestamp_ms,
            })
        })
        .collect();
    Ok(Json(Json_::Array(rows)))
}

/// `DELETE /api/ferrymq/mqtt/retained/{topic}` (the topic URL-encoded): clears it durably,
/// without publishing anything to subscribers.
pub async fn delete_retained(p: Permitted<Administrator>, Path(topic): Path<String>) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    let key = crate::core::message::mqtt_to_key(&topic);
    if ctx.broker.retained().matching(&key).is_empty() {
        return Err(ApiError::not_found());
    }
    ctx.broker.clear_retained(&key).await.map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}

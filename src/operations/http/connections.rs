//! `/api/connections` (AMQP and MQTT clients alike, as RabbitMQ lists its MQTT plugin's
//! connections), closing one, `/api/channels` and `/api/consumers`.

use std::sync::Arc;

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value as Json_};

use super::auth::{Access, Caller};
use super::error::ApiError;
use super::json::{rate, table_json};
use super::permit::{Management, Permitted, Vhost};
use super::HttpContext;
use crate::core::connections::{ClientDetails, ConnectionInfo};
use crate::core::stats::Stats;

type Answer = Result<Json<Json_>, ApiError>;

fn connection_json(ctx: &HttpContext, c: &ConnectionInfo) -> Json_ {
    let (client_properties, mechanism) = match &c.client {
        ClientDetails::Amqp { properties, mechanism } => (table_json(properties), mechanism.as_str()),
        ClientDetails::Mqtt { client_id, .. } => (json!({ "client_id": client_id.as_ref() }), "MQTT"),
    };
    let [recv_rate, send_rate] = ctx.connection_rates.with(|rates| rates(&c.id));
    let mut j = json!({
        "name": c.name(),
        "node": ctx.node(),
        // RabbitMQ's: `direct` for a connection the broker made to itself (in-process).
        "type": if c.listener.internal { "direct" } else { "network" },
        "state": "running",
        "protocol": c.protocol.name(),
        "user": c.user,
        "user_who_performed_action": c.user,
        "vhost": c.vhost,
        "peer_host": c.peer.ip().to_string(),
        "peer_port": c.peer.port(),
        "host": c.listener.addr.ip().to_string(),
        "port": c.listener.addr.port(),
        "ssl": c.listener.tls,
        "connected_at": c.connected_at_ms,
        "recv_oct": Stats::get(&c.recv_oct),
        "recv_oct_details": rate(recv_rate),
        "send_oct": Stats::get(&c.send_oct),
        "send_oct_details": rate(send_rate),
        "channels": Stats::get(&c.channels),
        "client_properties": client_properties,
        "auth_mechanism": mechanism,
    });
    if let ClientDetails::Mqtt { client_id, keep_alive, clean_start, expiry_secs } = &c.client {
        j["client_id"] = json!(client_id.as_ref());
        j["timeout"] = json!(keep_alive);
        j["clean_start"] = json!(clean_start);
        j["session_expiry_interval"] = json!(expiry_secs);
    }
    j
}

/// `GET /api/connections`.
pub async fn list(p: Permitted<Management>) -> Answer {
    let ctx = p.ctx();
    let all = visible(ctx, p.caller(), None);
    Ok(Json(Json_::Array(all.iter().map(|c| connection_json(ctx, c)).collect())))
}

/// `GET /api/vhosts/{vhost}/connections`.
pub async fn list_vhost(p: Permitted<Vhost>) -> Answer {
    let ctx = p.ctx();
    let all = visible(ctx, p.caller(), Some(&p.name));
    Ok(Json(Json_::Array(all.iter().map(|c| connection_json(ctx, c)).collect())))
}

/// The connections `caller` may see: all with monitoring, its own otherwise (RabbitMQ's rule).
fn visible(ctx: &HttpContext, caller: &Caller, vhost: Option<&str>) -> Vec<Arc<ConnectionInfo>> {
    ctx.broker
        .connections()
        .list()
        .into_iter()
        .filter(|c| vhost.is_none_or(|v| v == c.vhost))
        .filter(|c| caller.access >= Access::Monitoring || c.user == caller.name)
        .collect()
}

fn find(ctx: &HttpContext, caller: &Caller, name: &str) -> Result<Arc<ConnectionInfo>, ApiError> {
    let c = ctx.broker.connections().by_name(name).ok_or_else(ApiError::not_found)?;
    if caller.access < Access::Monitoring && c.user != caller.name {
        return Err(ApiError::not_found());
    }
    Ok(c)
}

/// `GET /api/connections/{name}`.
pub async fn show(p: Permitted<Management>, Path(name): Path<String>) -> Answer {
    let c = find(p.ctx(), p.caller(), &name)?;
    Ok(Json(connection_json(p.ctx(), &c)))
}

/// `DELETE /api/connections/{name}`: AMQP Connection.Close 320 with the `X-Reason`
/// header's text (RabbitMQ's), MQTT 5 DISCONNECT 0x98.
pub async fn close(
    p: Permitted<Management>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let caller = p.caller();
    let c = find(p.ctx(), caller, &name)?;
    if caller.access < Access::Administrator && c.user != caller.name {
        return Err(ApiError::forbidden("Not administrator user"));
    }
    let reason = headers.get("x-reason").and_then(|v| v.to_str().ok()).unwrap_or("Closed via management plugin");
    c.close(reason);
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/channels`: every open AMQP channel (`{connection name} ({number})`), and
/// one per MQTT connection as RabbitMQ's MQTT plugin shows it.
pub async fn channels(p: Permitted<Management>) -> Answer {
    let mut all = Vec::new();
    for c in visible(p.ctx(), p.caller(), None) {
        all.extend(channels_of(p.ctx(), &c));
    }
    Ok(Json(Json_::Array(all)))
}

/// `GET /api/connections/{name}/channels`.
pub async fn connection_channels(p: Permitted<Management>, Path(name): Path<String>) -> Answer {
    let c = find(p.ctx(), p.caller(), &name)?;
    Ok(Json(Json_::Array(channels_of(p.ctx(), &c))))
}

fn channels_of(ctx: &HttpContext, c: &ConnectionInfo) -> Vec<Json_> {
    let d = c.details.lock();
    let numbers: Vec<u16> = if c.protocol.is_mqtt() { vec![1] } else { d.numbers.iter().copied().collect() };
    numbers
        .into_iter()
        .map(|n| {
            let consumers = d.consumers.iter().filter(|x| x.channel == n).count();
            json!({
                "name": format!("{} ({n})", c.name()),
                "number": n,
                "node": ctx.node(),
                "user": c.user,
                "vhost": c.vhost,
                "state": "running",
                "consumer_count": consumers,
                "connection_details": { "name": c.name(), "peer_host": c.peer.ip().to_string(), "peer_port": c.peer.port() },
            })
        })
        .collect()
}

/// `GET /api/consumers`: the AMQP consumers with their tag, queue, channel,
/// acknowledgement mode, exclusivity, prefetch and arguments, in the virtual hosts the
/// caller may open.
pub async fn consumers(p: Permitted<Management>) -> Answer {
    Ok(Json(consumers_of(p.ctx(), p.caller(), None, &|v| p.lists(v))))
}

/// `GET /api/consumers/{vhost}`.
pub async fn consumers_vhost(p: Permitted<Vhost>) -> Answer {
    Ok(Json(consumers_of(p.ctx(), p.caller(), Some(&p.name), &|_| true)))
}

fn consumers_of(ctx: &HttpContext, caller: &Caller, vhost: Option<&str>, listed: &dyn Fn(&str) -> bool) -> Json_ {
    let mut all = Vec::new();
    for c in visible(ctx, caller, vhost).into_iter().filter(|c| listed(&c.vhost)) {
        for x in &c.details.lock().consumers {
            all.push(json!({
                "consumer_tag": x.tag,
                "queue": { "name": x.queue, "vhost": c.vhost },
                "channel_details": {
                    "name": format!("{} ({})", c.name(), x.channel),
                    "number": x.channel,
                    "connection_name": c.name(),
                    "peer_host": c.peer.ip().to_string(),
                    "peer_port": c.peer.port(),
                    "user": c.user,
                },
                "ack_required": x.ack_required,
                "exclusive": x.exclusive,
                "prefetch_count": x.prefetch,
                "active": true,
                "activity_status": "up",
                "arguments": table_json(&x.arguments),
            }));
        }
    }
    Json_::Array(all)
}

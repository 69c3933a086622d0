//! `GET /api/ferrymq/bridges`: each bridge's state, as RabbitMQ's shovel status shows a
//! shovel (`running`, `starting`), with FerryMQ's `reconnecting` for one that was up; what
//! the rules refused its local side (`refused_in`, `refused_out`), and `warnings` naming
//! the topic lines whose local topics that side may not publish or receive under the
//! rules in force.
//!
//! Besides FerryMQ's own bridges (`"remote": false`), the view lists the bridges of other
//! brokers connected into FerryMQ (`"remote": true`): a Mosquitto bridge publishes its state
//! on `$SYS/broker/connection/{its client id}/state` (`1` once up, `0` through its will), and
//! the retained message, with the client's connection if it has one, is its row.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::permit::{Monitoring, Permitted};
use super::HttpContext;
use crate::core::connections::{ClientDetails, ConnectionInfo};
use crate::core::message::key_to_mqtt;
use crate::core::router::mqtt_filter_to_pattern;

/// Where a Mosquitto bridge publishes its state (its `notifications` default).
const STATE_TOPICS: &str = "$SYS/broker/connection/+/state";

/// `GET /api/ferrymq/bridges`.
pub async fn list(p: Permitted<Monitoring>) -> Result<Json<Value>, ApiError> {
    let ctx = p.ctx();
    let own = ctx.bridges.list();
    let own_topics: HashSet<String> = own.iter().filter_map(|b| b.status.lock().state_topic.clone()).collect();
    let mut rows: Vec<Value> = own
        .into_iter()
        .map(|bridge| {
            let b = bridge.status.lock().clone();
            let state = match (b.connected, b.connects) {
                (true, _) => "running",
                (false, 0) => "starting",
                (false, _) => "reconnecting",
            };
            json!({
                "name": b.name,
                "type": "mqtt",
                "remote": false,
                "address": b.address,
                "state": state,
                "reason": b.last_error,
                "connects": b.connects,
                "sent": b.sent,
                "received": b.received,
                "refused_in": bridge.refusals.publishes(),
                "refused_out": bridge.refusals.deliveries(),
                "warnings": bridge.warnings(&ctx.authz),
            })
        })
        .collect();
    rows.extend(remote_rows(ctx, &own_topics));
    Ok(Json(Value::Array(rows)))
}

/// The bridges of other brokers, from their retained state messages, by client id.
fn remote_rows(ctx: &HttpContext, own_topics: &HashSet<String>) -> Vec<Value> {
    let mut states: Vec<(String, bool)> = ctx
        .broker
        .retained()
        .matching(&mqtt_filter_to_pattern(STATE_TOPICS))
        .into_iter()
        .filter_map(|m| {
            let topic = key_to_mqtt(&m.routing_key);
            let id = state_topic_client(&topic)?.to_owned();
            (!own_topics.contains(&topic)).then(|| (id, &m.payload[..] == b"1"))
        })
        .collect();
    if states.is_empty() {
        return Vec::new();
    }
    states.sort();
    let ids: HashSet<&str> = states.iter().map(|(id, _)| id.as_str()).collect();
    let connected: HashMap<String, Arc<ConnectionInfo>> = ctx
        .broker
        .connections()
        .list()
        .into_iter()
        .filter_map(|c| match &c.client {
            ClientDetails::Mqtt { client_id, .. } if ids.contains(&**client_id) => {
                Some((client_id.to_string(), c.clone()))
            }
            _ => None,
        })
        .collect();
    states
        .into_iter()
        .map(|(id, up)| {
            let conn = connected.get(&id);
            let (state, reason) = remote_state(conn.is_some(), up);
            json!({
                "name": id,
                "type": "mqtt",
                "remote": true,
                "address": conn.map(|c| c.peer.to_string()),
                "user": conn.map(|c| c.user.clone()),
                "state": state,
                "reason": reason,
                "connects": null,
                "sent": null,
                "received": null,
            })
        })
        .collect()
}

/// The client id a state topic names (`$SYS/broker/connection/{id}/state`).
fn state_topic_client(topic: &str) -> Option<&str> {
    let id = topic.strip_prefix("$SYS/broker/connection/")?.strip_suffix("/state")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// A remote bridge's state and why: `running` when connected and its last state was `1`,
/// `starting` when connected and not yet `1`, `down` when not connected.
fn remote_state(connected: bool, up: bool) -> (&'static str, Option<&'static str>) {
    match (connected, up) {
        (true, true) => ("running", None),
        (true, false) => ("starting", None),
        (false, false) => ("down", Some("the bridge reported its connection down")),
        (false, true) => ("down", Some("not connected")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_topic_names_one_client() {
        assert_eq!(state_topic_client("$SYS/broker/connection/edge-7/state"), Some("edge-7"));
        assert_eq!(state_topic_client("$SYS/broker/connection/a/b/state"), None);
        assert_eq!(state_topic_client("$SYS/broker/connection//state"), None);
        assert_eq!(state_topic_client("$SYS/broker/uptime"), None);
    }
}

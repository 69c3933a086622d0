//! `GET /api/ferrymq/bridges`: each bridge's state, as RabbitMQ's shovel status shows a
//! shovel (`running`, `starting`), with FerryMQ's `reconnecting` for one that was up.

use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::permit::{Monitoring, Permitted};

/// `GET /api/ferrymq/bridges`.
pub async fn list(p: Permitted<Monitoring>) -> Result<Json<Value>, ApiError> {
    let rows: Vec<Value> = p
        .ctx()
        .bridges
        .list()
        .into_iter()
        .map(|b| {
            let state = match (b.connected, b.connects) {
                (true, _) => "running",
                (false, 0) => "starting",
                (false, _) => "reconnecting",
            };
            json!({
                "name": b.name,
                "type": "mqtt",
                "address": b.address,
                "state": state,
                "reason": b.last_error,
                "connects": b.connects,
                "sent": b.sent,
                "received": b.received,
            })
        })
        .collect();
    Ok(Json(Value::Array(rows)))
}

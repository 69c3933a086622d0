//! `GET /api/ferrymq/bridges`: each bridge's state, as RabbitMQ's shovel status shows a
//! shovel (`running`, `starting`), with FerryMQ's `reconnecting` for one that was up; what
//! the rules refused its local side (`refused_in`, `refused_out`), and `warnings` naming
//! the topic lines whose local topics that side may not publish or receive under the
//! rules in force.

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::auth::{Access, Caller};
use super::error::ApiError;
use super::HttpContext;

/// `GET /api/ferrymq/bridges`.
pub async fn list(
    State(ctx): State<Arc<HttpContext>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Access::Monitoring)?;
    let rows: Vec<Value> = ctx
        .bridges
        .list()
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
    Ok(Json(Value::Array(rows)))
}

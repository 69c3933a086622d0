//! RabbitMQ's health checks (`/api/health/checks/...`, `/api/aliveness-test/{vhost}`):
//! 200 `{"status":"ok"}`, or 503 `{"status":"failed","reason":...}` — what Kubernetes
//! probes and monitoring scripts call.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::permit::{Monitoring, Permitted, Vhost};
use crate::access::authz::{Permission, ResourceKind};
use crate::core::alarm::Resource;

fn ok() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

fn failed(body: serde_json::Value) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Checks that always pass on a single node (`node-is-quorum-critical`, ...).
pub async fn ok_check(_: Permitted<Monitoring>) -> Result<Response, ApiError> {
    Ok(ok())
}

/// `GET /api/health/checks/alarms` and `local-alarms`.
pub async fn alarms(p: Permitted<Monitoring>) -> Result<Response, ApiError> {
    let ctx = p.ctx();
    let raised = ctx.alarm.raised();
    if raised.is_empty() {
        return Ok(ok());
    }
    let alarms: Vec<_> = raised
        .iter()
        .map(|r| {
            let resource = match r {
                Resource::Memory => "memory",
                Resource::Disk => "disk",
            };
            json!({ "node": ctx.node(), "resource": resource })
        })
        .collect();
    Ok(failed(json!({ "status": "failed", "reason": "resource alarm(s) in effect in the cluster", "alarms": alarms })))
}

/// `GET /api/health/checks/virtual-hosts`: every virtual host is running.
pub async fn virtual_hosts(_: Permitted<Monitoring>) -> Result<Response, ApiError> {
    Ok(ok())
}

/// `GET /api/health/checks/port-listener/{port}`.
pub async fn port_listener(p: Permitted<Monitoring>, Path(port): Path<String>) -> Result<Response, ApiError> {
    let ctx = p.ctx();
    let port: u16 = port.parse().map_err(|_| ApiError::bad_request(format!("{port} is not a port number")))?;
    let ports: Vec<u16> = ctx.listeners.read().iter().map(|l| l.addr.port()).collect();
    if ports.contains(&port) {
        return Ok(Json(json!({ "status": "ok", "port": port })).into_response());
    }
    Ok(failed(json!({ "status": "failed", "reason": "No active listener", "missing": port, "ports": ports })))
}

/// `GET /api/health/checks/protocol-listener/{protocol}` (`amqp`, `amqp/ssl`, `mqtt`,
/// `mqtt/ssl`, `http`; RabbitMQ's aliases `amqp091`, `amqp0.9.1`, `mqtts`, `amqps`, `https` too).
pub async fn protocol_listener(p: Permitted<Monitoring>, Path(protocol): Path<String>) -> Result<Response, ApiError> {
    let ctx = p.ctx();
    let wanted = match protocol.as_str() {
        "amqp091" | "amqp0.9.1" | "amqp0-9-1" | "amqp" => "amqp",
        "amqps" | "amqp/ssl" => "amqp/ssl",
        "mqtts" | "mqtt/ssl" => "mqtt/ssl",
        "https" | "http/ssl" => "http/ssl",
        other => other,
    };
    let protocols: Vec<&str> = ctx.listeners.read().iter().map(|l| l.protocol).collect();
    if protocols.contains(&wanted) {
        return Ok(Json(json!({ "status": "ok", "protocol": wanted })).into_response());
    }
    Ok(failed(json!({ "status": "failed", "reason": "No active listener", "missing": wanted, "protocols": protocols })))
}

/// `GET /api/aliveness-test/{vhost}`: publishes a message to the vhost's `aliveness-test`
/// queue and takes it back, as RabbitMQ does (with the caller's permissions: configure
/// and read on the queue, write on the default exchange).
pub async fn aliveness(p: Permitted<Vhost>) -> Result<Response, ApiError> {
    const QUEUE: &str = "aliveness-test";
    p.resource(ResourceKind::Queue, QUEUE, Permission::Configure)?;
    p.resource(ResourceKind::Exchange, "", Permission::Write)?;
    p.resource(ResourceKind::Queue, QUEUE, Permission::Read)?;
    match super::queues::round_trip(p.ctx(), &p.name, QUEUE).await {
        Ok(()) => Ok(ok()),
        Err(reason) => Ok(failed(json!({ "status": "failed", "reason": reason }))),
    }
}

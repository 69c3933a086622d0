//! `/api/overview`, `/api/nodes`, `/api/whoami` and `/api/extensions`.

use axum::extract::Path;
use axum::Json;
use serde_json::{json, Value as Json_};

use super::auth::Access;
use super::error::ApiError;
use super::json::rate;
use super::permit::{Management, Monitoring, Permitted};
use super::queues::QueueTotals;
use super::HttpContext;
use crate::core::alarm::{resident_memory, Resource};
use crate::core::stats::Stats;

/// The RabbitMQ version whose management API FerryMQ answers as.
pub const RABBITMQ_API_VERSION: &str = "3.13.7";

type Answer = Result<Json<Json_>, ApiError>;

/// `GET /api/overview`: queue and object totals over the virtual hosts the caller may
/// open (every one to monitoring users and administrators), its own connections unless
/// it is a monitoring user, as RabbitMQ.
pub async fn overview(p: Permitted<Management>) -> Answer {
    let ctx = p.ctx();
    let r = ctx.rates.current();
    let t = super::rates::Totals::now(&ctx.broker);
    let q = QueueTotals::of_vhosts(ctx, |v| p.sees_vhost(v));
    let exchanges: usize =
        ctx.vhosts().iter().filter(|v| p.sees_vhost(v)).map(|v| ctx.broker.routing().exchanges(v).len()).sum();
    let caller = p.caller();
    let mut conns = ctx.broker.connections().list();
    conns.retain(|c| caller.access >= Access::Monitoring || c.user == caller.name);
    let channels: u64 = conns.iter().map(|c| Stats::get(&c.channels)).sum();
    let churn = ctx.broker.connections().churn();
    Ok(Json(json!({
        "management_version": RABBITMQ_API_VERSION,
        "rabbitmq_version": RABBITMQ_API_VERSION,
        "product_name": "FerryMQ",
        "product_version": env!("CARGO_PKG_VERSION"),
        "rates_mode": "basic",
        "erlang_version": "none (FerryMQ is written in Rust)",
        "erlang_full_version": "none",
        "release_series_support_status": "supported",
        "disable_stats": false,
        "enable_queue_totals": true,
        "is_op_policy_updating_enabled": false,
        "exchange_types": exchange_types(),
        "message_stats": {
            "publish": t.publish, "publish_details": rate(r.publish),
            "confirm": t.confirm, "confirm_details": rate(r.confirm),
            "deliver_get": t.deliver_get, "deliver_get_details": rate(r.deliver_get),
            "redeliver": t.redeliver, "redeliver_details": rate(r.redeliver),
            "ack": t.ack, "ack_details": rate(r.ack),
        },
        "churn_rates": {
            "connection_created": churn.0, "connection_created_details": rate(r.connection_created),
            "connection_closed": churn.1, "connection_closed_details": rate(r.connection_closed),
        },
        "queue_totals": q.json(),
        "object_totals": {
            "connections": conns.len(),
            "channels": channels,
            "consumers": q.consumers,
            "exchanges": exchanges,
            "queues": q.queues,
        },
        "statistics_db_event_queue": 0,
        "node": ctx.node(),
        "cluster_name": ctx.access.cluster_name(),
        "listeners": ctx.listeners.read().iter().map(|l| json!({
            "node": ctx.node(),
            "protocol": l.protocol,
            "ip_address": l.addr.ip().to_string(),
            "port": l.addr.port(),
            "socket_opts": {},
        })).collect::<Vec<_>>(),
        "contexts": [{ "node": ctx.node(), "description": "FerryMQ Management", "path": "/", "port": http_port(ctx) }],
    })))
}

fn http_port(ctx: &HttpContext) -> String {
    ctx.listeners.read().iter().find(|l| l.protocol == "http").map(|l| l.addr.port().to_string()).unwrap_or_default()
}

/// The exchange types FerryMQ routes.
fn exchange_types() -> Json_ {
    let types = [
        ("direct", "AMQP direct exchange, as per the AMQP specification"),
        ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
        ("headers", "AMQP headers exchange, as per the AMQP specification"),
        ("topic", "AMQP topic exchange, as per the AMQP specification"),
        ("x-consistent-hash", "Consistent Hashing Exchange"),
        ("x-delayed-message", "Delayed Message Exchange"),
        (crate::core::dedup::EXCHANGE_TYPE, "Message Deduplication Exchange"),
    ];
    Json_::Array(types.iter().map(|(n, d)| json!({ "name": n, "description": d, "enabled": true })).collect())
}

/// `GET /api/whoami`.
pub async fn whoami(p: Permitted<Management>) -> Json<Json_> {
    let caller = p.caller();
    Json(json!({ "name": caller.name, "tags": caller.tags, "is_internal_user": true }))
}

/// `GET /api/extensions` (the dashboard's plugins: none).
pub async fn extensions(_: Permitted<Management>) -> Answer {
    Ok(Json(json!([])))
}

/// Open file descriptors and the soft limit on them, read from `/proc` on the blocking
/// pool: with many connections, `/proc/self/fd` is a long directory to list.
async fn descriptors() -> (usize, u64) {
    crate::core::blocking::spawn(|| {
        let used = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
        (used, open_files_limit().unwrap_or(0))
    })
    .await
    .unwrap_or((0, 0))
}

fn node_json(ctx: &HttpContext, (fd_used, fd_total): (usize, u64)) -> Json_ {
    let (mem_limit, disk_free_limit) = ctx.alarm.limits();
    let raised = ctx.alarm.raised();
    let journal = ctx.broker.journal_stats();
    json!({
        "name": ctx.node(),
        "type": "disc",
        "running": true,
        "being_drained": false,
        "os_pid": std::process::id().to_string(),
        "uptime": ctx.broker.uptime().as_millis() as u64,
        "processors": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "mem_used": resident_memory().unwrap_or(0),
        "mem_limit": mem_limit,
        "mem_alarm": raised.contains(&Resource::Memory),
        "disk_free": ctx.alarm.disk_free().unwrap_or(0),
        "disk_free_limit": disk_free_limit,
        "disk_free_alarm": raised.contains(&Resource::Disk),
        "fd_used": fd_used,
        "fd_total": fd_total,
        "sockets_used": ctx.broker.connections().len(),
        "sockets_total": fd_total,
        "proc_used": 0,
        "proc_total": 0,
        "run_queue": 0,
        "partitions": [],
        "rates_mode": "basic",
        "net_ticktime": 60,
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_mqtt", "rabbitmq_prometheus"],
        "journal": {
            "segments": journal.segments,
            "log_bytes": journal.log_bytes,
            "group_commits": journal.batches,
            "fsyncs": journal.fsyncs,
            "checkpoints": journal.checkpoints,
        },
    })
}

/// `GET /api/nodes`: this node with its figures; on a cluster member, every other member
/// too, as far as this one knows it (`running`: heard from within 5 s; its figures are its
/// own `/api/nodes`').
pub async fn nodes(p: Permitted<Monitoring>) -> Answer {
    let ctx = p.ctx();
    let mut nodes = vec![node_json(ctx, descriptors().await)];
    if let Some(cluster) = &ctx.cluster {
        let status = cluster.status();
        if let Some(me) = status.members.iter().find(|m| m.this) {
            nodes[0]["ferrymq_cluster"] = json!({ "role": me.role });
        }
        for m in status.members.iter().filter(|m| !m.this) {
            nodes.push(member_json(m));
        }
    }
    Ok(Json(Json_::Array(nodes)))
}

/// Another member as `/api/nodes` lists it.
fn member_json(m: &crate::cluster::MemberStatus) -> Json_ {
    json!({
        "name": m.name,
        "type": "disc",
        "running": m.running,
        "partitions": [],
        "ferrymq_cluster": { "role": m.role, "last_contact_ms": m.last_contact_ms, "matched_index": m.matched_index },
    })
}

/// `GET /api/nodes/{name}`.
pub async fn node(p: Permitted<Monitoring>, Path(name): Path<String>) -> Answer {
    let ctx = p.ctx();
    if name == ctx.node() {
        return Ok(Json(node_json(ctx, descriptors().await)));
    }
    let status = ctx.cluster.as_ref().map(|c| c.status());
    match status.and_then(|s| s.members.into_iter().find(|m| m.name == name)) {
        Some(m) => Ok(Json(member_json(&m))),
        None => Err(ApiError::not_found()),
    }
}

/// The soft limit on open files, from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().find_map(|w| w.parse().ok())
}

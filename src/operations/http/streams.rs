//! FerryMQ's stream views under `/api/ferrymq/...`: the consumer groups of a stream or
//! of a super stream (per partition: committed offset, end offset, lag, members), resetting
//! a group to an offset or a time, and looking messages up by key.

use std::sync::Arc;

use axum::extract::{Path, Query};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as Json_};

use super::error::ApiError;
use super::json::{lenient, table_json, Body};
use super::permit::{Monitoring, OnQueue, Permitted, Read, Vhost, View};
use super::queues::{payload_json, properties_json};
use super::HttpContext;
use crate::access::authz::{Permission, ResourceKind};
use crate::core::entities::QueueEntity;
use crate::core::router::Destination;
use crate::core::stream::{StreamOffset, StreamStatus};

type Answer = Result<Json<Json_>, ApiError>;

fn stream(ctx: &HttpContext, vhost: &str, name: &str) -> Result<Arc<QueueEntity>, ApiError> {
    match ctx.entities.queue(vhost, name) {
        Some(q) if q.is_stream() => Ok(q),
        Some(_) => Err(ApiError::bad_request(format!("queue '{name}' in vhost '{vhost}' is not a stream"))),
        None => Err(ApiError::not_found()),
    }
}

/// The partitions of super stream `exchange`: the streams it is bound to, by name.
fn partitions(ctx: &HttpContext, vhost: &str, exchange: &str) -> Result<Vec<Arc<QueueEntity>>, ApiError> {
    ctx.broker.routing().exchange(vhost, exchange).ok_or_else(ApiError::not_found)?;
    let by_id: std::collections::HashMap<_, _> =
        ctx.entities.all().into_iter().filter(|q| q.vhost == vhost && q.is_stream()).map(|q| (q.id, q)).collect();
    let mut parts: Vec<Arc<QueueEntity>> = ctx
        .broker
        .routing()
        .bindings_of(vhost, exchange)
        .iter()
        .filter_map(|b| match &b.dest {
            Destination::Queue(id) => by_id.get(id).cloned(),
            _ => None,
        })
        .collect();
    parts.sort_by(|a, b| a.name.cmp(&b.name));
    parts.dedup_by(|a, b| a.id == b.id);
    Ok(parts)
}

fn group_rows(s: &StreamStatus, only: Option<&str>) -> Vec<Json_> {
    s.groups
        .iter()
        .filter(|g| only.is_none_or(|o| o == g.name))
        .map(|g| {
            json!({
                "name": g.name,
                "committed_offset": g.committed,
                "acked_above_committed": g.acked_above,
                "end_offset": s.next,
                "lag": g.lag(s),
                "in_flight": g.in_flight,
                "members": g.members,
                "single_active": g.exclusive,
            })
        })
        .collect()
}

async fn status(ctx: &HttpContext, q: &QueueEntity) -> Result<StreamStatus, ApiError> {
    ctx.broker.stream_status(q.id).await.ok_or_else(ApiError::not_found)
}

fn stream_json(q: &QueueEntity, s: &StreamStatus, group: Option<&str>) -> Json_ {
    json!({
        "name": q.name,
        "vhost": q.vhost,
        "first_offset": s.first,
        "end_offset": s.next,
        "messages": s.next - s.first,
        "consumers": s.consumers,
        "groups": group_rows(s, group),
    })
}

/// `GET /api/ferrymq/streams/{vhost}/{name}/groups`.
pub async fn stream_groups(p: Permitted<OnQueue<View>>) -> Answer {
    let q = stream(p.ctx(), &p.vhost, &p.name)?;
    let s = status(p.ctx(), &q).await?;
    Ok(Json(stream_json(&q, &s, None)))
}

/// `GET /api/ferrymq/super-streams/{vhost}/{exchange}/groups`: each partition's groups,
/// and each group's lag summed over the partitions.
pub async fn super_stream_groups(p: Permitted<Vhost>, Path(params): Path<Params>) -> Answer {
    let (ctx, vhost, exchange) = (p.ctx(), &p.name, param(&params, "exchange")?);
    let mut parts = Vec::new();
    let mut totals: std::collections::BTreeMap<String, u64> = Default::default();
    for part in partitions(ctx, vhost, exchange)? {
        let s = status(ctx, &part).await?;
        let row = stream_json(&part, &s, None);
        for g in row["groups"].as_array().into_iter().flatten() {
            *totals.entry(g["name"].as_str().unwrap_or_default().to_owned()).or_default() +=
                g["lag"].as_u64().unwrap_or(0);
        }
        parts.push(row);
    }
    let groups: Vec<Json_> = totals.into_iter().map(|(name, lag)| json!({ "name": name, "lag": lag })).collect();
    Ok(Json(json!({ "name": exchange, "vhost": vhost, "partitions": parts, "groups": groups })))
}

/// The body of a group reset: one of `offset`, `timestamp` (ms since the epoch) or `to`
/// (`first`, `last`, `next`).
#[derive(Debug, Default, Deserialize)]
pub struct ResetBody {
    /// An absolute offset (clamped to the entries kept).
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub offset: Option<u64>,
    /// The first entry stored at or after this time.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub timestamp: Option<u64>,
    /// `first`, `last` or `next`.
    #[serde(default)]
    pub to: Option<String>,
}

impl ResetBody {
    fn target(&self) -> Result<StreamOffset, ApiError> {
        match (self.offset, self.timestamp, self.to.as_deref()) {
            (Some(o), None, None) => Ok(StreamOffset::Offset(o)),
            (None, Some(t), None) => Ok(StreamOffset::Timestamp(t)),
            (None, None, Some("first")) => Ok(StreamOffset::First),
            (None, None, Some("last")) => Ok(StreamOffset::Last),
            (None, None, Some("next")) => Ok(StreamOffset::Next),
            _ => Err(ApiError::bad_request("give one of offset, timestamp, or to = first | last | next")),
        }
    }
}

/// The route's path parameters by name (beyond what the proof holds).
type Params = std::collections::HashMap<String, String>;

fn param<'a>(params: &'a Params, name: &str) -> Result<&'a str, ApiError> {
    params.get(name).map(String::as_str).ok_or_else(ApiError::not_found)
}

/// `POST /api/ferrymq/streams/{vhost}/{name}/groups/{group}/reset`: moves the group's
/// committed offset; its members continue from there. Answers the new offset. Read
/// permission on the stream, as consuming from it.
pub async fn reset_stream_group(
    p: Permitted<OnQueue<Read>>,
    Path(params): Path<Params>,
    Body(body): Body<ResetBody>,
) -> Answer {
    let (ctx, name, group) = (p.ctx(), &p.name, param(&params, "group")?);
    let to = body.target()?;
    let q = stream(ctx, &p.vhost, name)?;
    let offset = ctx.broker.reset_stream_group(q.id, group, to).await.ok_or_else(ApiError::not_found)?;
    Ok(Json(json!({ "stream": name, "group": group, "committed_offset": offset })))
}

/// `POST /api/ferrymq/super-streams/{vhost}/{exchange}/groups/{group}/reset`: every
/// partition (an offset applies to each partition alike; a timestamp is the usual choice).
/// Read permission on every partition, checked before any moves.
pub async fn reset_super_stream_group(
    p: Permitted<Vhost>,
    Path(params): Path<Params>,
    Body(body): Body<ResetBody>,
) -> Answer {
    let (ctx, vhost) = (p.ctx(), &p.name);
    let (exchange, group) = (param(&params, "exchange")?, param(&params, "group")?);
    let to = body.target()?;
    let parts = partitions(ctx, vhost, exchange)?;
    for part in &parts {
        p.resource(ResourceKind::Queue, &part.name, Permission::Read)?;
    }
    let mut rows = Vec::new();
    for part in parts {
        let offset = ctx.broker.reset_stream_group(part.id, group, to).await.ok_or_else(ApiError::not_found)?;
        rows.push(json!({ "stream": part.name, "committed_offset": offset }));
    }
    Ok(Json(json!({ "super_stream": exchange, "group": group, "partitions": rows })))
}

/// The query of `GET /api/ferrymq/messages`.
#[derive(Debug, Default, Deserialize)]
pub struct LookupQuery {
    /// The key: a `message_id`, an `x-key` header or an MQTT `key` user property.
    pub key: String,
    /// Stored at or after, ms since the epoch (default 0).
    pub from: Option<u64>,
    /// Stored at or before (default now).
    pub to: Option<u64>,
    /// Most messages (default 20, at most 1000).
    pub limit: Option<usize>,
    /// Longest body preview, bytes (default 1024).
    pub truncate: Option<u64>,
}

/// `GET /api/ferrymq/messages?key=K[&from=&to=&limit=]`: the messages stored under a
/// key in a time range, oldest first, with their properties, a body preview and where
/// they are in the commit log. Only messages the caller could read as a client are
/// listed; a stored message does not record its virtual host, so that holds in every
/// virtual host with an exchange of its name ([`super::permit::MessageReader`]).
pub async fn lookup(p: Permitted<Monitoring>, Query(q): Query<LookupQuery>) -> Answer {
    let ctx = p.ctx();
    if q.key.is_empty() {
        return Err(ApiError::bad_request("key is required"));
    }
    let to = q.to.unwrap_or_else(crate::core::message::now_ms);
    let limit = q.limit.unwrap_or(20).clamp(1, 1000);
    let found = ctx
        .broker
        .messages_by_key(&q.key, q.from.unwrap_or(0), to, limit)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut reader = p.message_reader();
    let rows = found
        .iter()
        .filter(|(_, _, m)| reader.may_read_anywhere(&m.exchange, &m.routing_key))
        .map(|(pos, at, m)| {
            let (payload, encoding) = payload_json(&m.payload, "auto", Some(q.truncate.unwrap_or(1024)));
            json!({
                "log_position": pos,
                "stored_at": at,
                "exchange": m.exchange,
                "routing_key": m.routing_key,
                "properties": properties_json(m),
                "headers": table_json(&m.props.headers),
                "payload": payload,
                "payload_encoding": encoding,
                "payload_bytes": m.payload.len(),
            })
        })
        .collect();
    Ok(Json(Json_::Array(rows)))
}

//! `/api/queues`: the AMQP queues (and streams) with RabbitMQ's fields, paged lists,
//! declare, delete (`if-empty`, `if-unused`), purge and get.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Map, Value as Json_};

use super::error::ApiError;
use super::json::{flag, json_table, lenient, list, rate, table_json, Body, ListQuery};
use super::permit::{Configure, Management, OnQueue, Permitted, Read, Vhost, View};
use super::rates::{QueuePerSecond, QueueSample};
use super::HttpContext;
use crate::cluster::Placement;
use crate::core::entities::{check_equivalent_queue, QueueEntity};
use crate::core::message::Message;
use crate::core::queue::{MessageCounts, QueueGauge, RequeueCause};
use crate::core::QueueId;

/// Message and consumer counts over queues.
#[derive(Debug, Default, Clone, Copy)]
pub struct QueueTotals {
    /// Queues counted.
    pub queues: u64,
    /// Live messages.
    pub messages: u64,
    /// Ready messages.
    pub ready: u64,
    /// Consumers.
    pub consumers: u64,
    /// Summed depth rates: messages, ready, unacknowledged (per second).
    pub rates: [f64; 3],
}

impl QueueTotals {
    /// Over every queue.
    pub fn of(ctx: &HttpContext) -> QueueTotals {
        Self::of_vhost(ctx, None)
    }

    /// Over the queues of `vhost` (all with `None`).
    pub fn of_vhost(ctx: &HttpContext, vhost: Option<&str>) -> QueueTotals {
        Self::of_vhosts(ctx, |v| vhost.is_none_or(|only| only == v))
    }

    /// Over the queues of the virtual hosts `counted` picks.
    pub fn of_vhosts(ctx: &HttpContext, counted: impl Fn(&str) -> bool) -> QueueTotals {
        let mut t = QueueTotals::default();
        ctx.queue_rates.with(|rates| {
            for q in ctx.entities.all() {
                if !counted(&q.vhost) {
                    continue;
                }
                let c = Counts::of(&q);
                t.queues += 1;
                t.messages += c.messages;
                t.ready += c.ready;
                t.consumers += c.consumers;
                let r = QueuePerSecond::from(rates(&q.id));
                t.rates[0] += r.messages;
                t.rates[1] += r.ready;
                t.rates[2] += r.unacked;
            }
        });
        t
    }

    /// RabbitMQ's `messages*` fields.
    pub fn json(&self) -> Json_ {
        json!({
            "messages": self.messages, "messages_details": rate(self.rates[0]),
            "messages_ready": self.ready, "messages_ready_details": rate(self.rates[1]),
            "messages_unacknowledged": self.messages - self.ready.min(self.messages),
            "messages_unacknowledged_details": rate(self.rates[2]),
        })
    }
}

/// One queue's live counts, from the gauge its owner shard writes.
struct Counts {
    messages: u64,
    ready: u64,
    bytes: u64,
    consumers: u64,
}

impl Counts {
    fn of(q: &QueueEntity) -> Counts {
        let g = &q.config.gauge;
        let messages = QueueGauge::get(&g.len);
        Counts {
            messages,
            ready: QueueGauge::get(&g.ready).min(messages),
            bytes: QueueGauge::get(&g.bytes),
            consumers: q.consumers.load(Ordering::Relaxed),
        }
    }
}

/// A queue's counters and depths for the rate sampler.
pub fn sample(q: &QueueEntity) -> QueueSample {
    let c = Counts::of(q);
    QueueSample { counts: q.config.gauge.counts(), messages: c.messages, ready: c.ready }
}

/// RabbitMQ's queue `message_stats`: counters since start with their rates.
fn message_stats(counts: MessageCounts, r: &QueuePerSecond) -> Json_ {
    json!({
        "publish": counts.publish, "publish_details": rate(r.publish),
        "deliver": counts.deliver, "deliver_details": rate(r.deliver),
        "deliver_no_ack": 0, "deliver_no_ack_details": rate(0.0),
        "get": counts.get, "get_details": rate(r.get),
        "get_no_ack": 0, "get_no_ack_details": rate(0.0),
        "deliver_get": counts.deliver + counts.get, "deliver_get_details": rate(r.deliver + r.get),
        "redeliver": counts.redeliver, "redeliver_details": rate(r.redeliver),
        "ack": counts.ack, "ack_details": rate(r.ack),
    })
}

/// The queue's type as RabbitMQ names it.
fn queue_type(q: &QueueEntity) -> &'static str {
    if q.is_stream() {
        return "stream";
    }
    match q.arguments.iter().find(|(k, _)| k == "x-queue-type").and_then(|(_, v)| v.as_str()) {
        Some("quorum") => "quorum",
        _ => "classic",
    }
}

/// How much of a queue a listing shows (RabbitMQ's `disable_stats` / `enable_queue_totals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// `disable_stats=true`: the definition and consumer count only.
    Definition,
    /// `disable_stats=true&enable_queue_totals=true`: also `messages`, `messages_ready`,
    /// `messages_unacknowledged`, without rates or message_stats.
    Totals,
    /// Everything, rates included (the default).
    Full,
}

impl Detail {
    fn of(q: &ListQuery) -> Detail {
        match (flag(&q.disable_stats), flag(&q.enable_queue_totals)) {
            (false, _) => Detail::Full,
            (true, true) => Detail::Totals,
            (true, false) => Detail::Definition,
        }
    }
}

/// A queue as RabbitMQ's `/api/queues` shows it, to `detail` (`rates` looks a queue's up;
/// `placement`: where a cluster's data group is, for the queues it holds).
fn queue_json(
    ctx: &HttpContext,
    q: &QueueEntity,
    detail: Detail,
    rates: &dyn Fn(&QueueId) -> [f64; 8],
    placement: Option<&Placement>,
) -> Json_ {
    let mut o = Map::new();
    o.insert("name".into(), json!(q.name));
    o.insert("vhost".into(), json!(q.vhost));
    o.insert("type".into(), json!(queue_type(q)));
    o.insert("durable".into(), json!(q.durable));
    o.insert("auto_delete".into(), json!(q.auto_delete));
    o.insert("exclusive".into(), json!(q.exclusive_owner.is_some()));
    o.insert("arguments".into(), table_json(&q.arguments));
    match placement.filter(|_| q.durable && q.is_stream()) {
        // A stream of a cluster: on every member, led by the data group's leader.
        Some(p) => {
            o.insert("node".into(), json!(p.leader));
            o.insert("leader".into(), json!(p.leader));
            o.insert("members".into(), json!(p.members));
            o.insert("online".into(), json!(p.online));
        }
        None => {
            o.insert("node".into(), json!(ctx.node()));
        }
    }
    o.insert("state".into(), json!("running"));
    o.insert("policy".into(), Json_::Null);
    o.insert("effective_policy_definition".into(), json!({}));
    o.insert("exclusive_consumer_tag".into(), Json_::Null);
    let c = Counts::of(q);
    o.insert("consumers".into(), json!(c.consumers));
    if let (Some(s), false) = (&q.stream, detail == Detail::Definition) {
        // RabbitMQ's `committed_offset` (the newest entry), and FerryMQ's extent.
        let e = &s.extent;
        o.insert("committed_offset".into(), json!(e.last()));
        o.insert("first_offset".into(), json!(e.first()));
        o.insert("last_offset".into(), json!(e.last()));
    }
    if detail == Detail::Totals {
        o.insert("messages".into(), json!(c.messages));
        o.insert("messages_ready".into(), json!(c.ready));
        o.insert("messages_unacknowledged".into(), json!(c.messages - c.ready));
    }
    if detail == Detail::Full {
        let unacked = c.messages - c.ready;
        let r = QueuePerSecond::from(rates(&q.id));
        o.insert("messages".into(), json!(c.messages));
        o.insert("messages_details".into(), rate(r.messages));
        o.insert("messages_ready".into(), json!(c.ready));
        o.insert("messages_ready_details".into(), rate(r.ready));
        o.insert("messages_unacknowledged".into(), json!(unacked));
        o.insert("messages_unacknowledged_details".into(), rate(r.unacked));
        o.insert("message_stats".into(), message_stats(q.config.gauge.counts(), &r));
        o.insert("message_bytes".into(), json!(c.bytes));
        o.insert("message_bytes_ready".into(), json!((c.bytes * c.ready).checked_div(c.messages).unwrap_or(0)));
        o.insert(
            "message_bytes_unacknowledged".into(),
            json!((c.bytes * unacked).checked_div(c.messages).unwrap_or(0)),
        );
        o.insert("message_bytes_persistent".into(), json!(c.bytes));
        o.insert("message_bytes_ram".into(), json!(0));
        o.insert("consumer_capacity".into(), json!(if c.consumers > 0 { 1.0 } else { 0.0 }));
        o.insert("consumer_utilisation".into(), json!(if c.consumers > 0 { 1.0 } else { 0.0 }));
    }
    Json_::Object(o)
}

fn sorted_queues(ctx: &HttpContext, listed: &dyn Fn(&str) -> bool) -> Vec<(String, Arc<QueueEntity>)> {
    let mut all: Vec<Arc<QueueEntity>> = ctx.entities.all().into_iter().filter(|q| listed(&q.vhost)).collect();
    all.sort_unstable_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
    all.into_iter().map(|q| (q.name.clone(), q)).collect()
}

fn answer_list(ctx: &HttpContext, listed: &dyn Fn(&str) -> bool, q: &ListQuery) -> Result<Json<Json_>, ApiError> {
    let detail = Detail::of(q);
    let placement = ctx.cluster.as_ref().map(|c| c.data_placement());
    ctx.queue_rates
        .with(|rates| list(sorted_queues(ctx, listed), q, |e| queue_json(ctx, e, detail, rates, placement.as_ref())))
}

/// `GET /api/queues`: the queues of the virtual hosts the caller may open.
pub async fn list_all(p: Permitted<Management>, Query(q): Query<ListQuery>) -> Result<Json<Json_>, ApiError> {
    answer_list(p.ctx(), &|v| p.lists(v), &q)
}

/// `GET /api/queues/{vhost}`.
pub async fn list_vhost(p: Permitted<Vhost>, Query(q): Query<ListQuery>) -> Result<Json<Json_>, ApiError> {
    answer_list(p.ctx(), &|v| v == p.name, &q)
}

/// 404 unless `vhost` exists.
pub fn known_vhost(ctx: &HttpContext, vhost: &str) -> Result<(), ApiError> {
    match ctx.vhosts().iter().any(|v| v == vhost) {
        true => Ok(()),
        false => Err(ApiError::not_found()),
    }
}

fn find(ctx: &HttpContext, vhost: &str, name: &str) -> Result<Arc<QueueEntity>, ApiError> {
    ctx.entities.queue(vhost, name).ok_or_else(ApiError::not_found)
}

/// `GET /api/queues/{vhost}/{name}`.
pub async fn show(p: Permitted<OnQueue<View>>) -> Result<Json<Json_>, ApiError> {
    let ctx = p.ctx();
    let q = find(ctx, &p.vhost, &p.name)?;
    let placement = ctx.cluster.as_ref().map(|c| c.data_placement());
    Ok(Json(ctx.queue_rates.with(|rates| queue_json(ctx, &q, Detail::Full, rates, placement.as_ref()))))
}

/// The body of `PUT /api/queues/{vhost}/{name}`.
#[derive(Debug, Default, Deserialize)]
pub struct DeclareBody {
    /// Survives a restart (default true, as RabbitMQ's API).
    #[serde(default = "yes", deserialize_with = "lenient::bool")]
    pub durable: bool,
    /// Deleted when its last consumer goes.
    #[serde(default, deserialize_with = "lenient::bool")]
    pub auto_delete: bool,
    /// `x-` arguments.
    #[serde(default)]
    pub arguments: Map<String, Json_>,
    /// Ignored (a single node).
    #[serde(default)]
    pub node: Option<String>,
}

fn yes() -> bool {
    true
}

/// `PUT /api/queues/{vhost}/{name}`: 201 when created, 204 when an equivalent one exists,
/// 400 with RabbitMQ's `inequivalent arg` text otherwise.
pub async fn declare(p: Permitted<OnQueue<Configure>>, Body(body): Body<DeclareBody>) -> Result<StatusCode, ApiError> {
    let (ctx, vhost, name) = (p.ctx(), &p.vhost, &p.name);
    let arguments = json_table(&body.arguments);
    if name.is_empty() || name.starts_with("amq.") {
        return Err(ApiError::bad_request(format!("queue name '{name}' contains reserved prefix 'amq.*'")));
    }
    let dlx = arguments.iter().find(|(k, _)| k == "x-dead-letter-exchange").and_then(|(_, v)| v.as_str());
    if let Some(dlx) = dlx {
        p.route_into(dlx)?;
    }
    if let Some(existing) = ctx.entities.queue(vhost, name) {
        check_equivalent_queue(&existing, body.durable, false, body.auto_delete, &arguments).map_err(ApiError::from)?;
        return Ok(StatusCode::NO_CONTENT);
    }
    ctx.entities.create_queue(vhost, name, body.durable, None, body.auto_delete, arguments).await?;
    Ok(StatusCode::CREATED)
}

/// The query of `DELETE /api/queues/{vhost}/{name}`.
#[derive(Debug, Default, Deserialize)]
pub struct DeleteQuery {
    /// Only if it holds no message.
    #[serde(rename = "if-empty")]
    pub if_empty: Option<String>,
    /// Only if it has no consumer.
    #[serde(rename = "if-unused")]
    pub if_unused: Option<String>,
}

/// `DELETE /api/queues/{vhost}/{name}`: configure permission on the queue.
pub async fn remove(p: Permitted<OnQueue<Configure>>, Query(q): Query<DeleteQuery>) -> Result<StatusCode, ApiError> {
    let (ctx, vhost, name) = (p.ctx(), &p.vhost, &p.name);
    let entity = find(ctx, vhost, name)?;
    let c = Counts::of(&entity);
    if flag(&q.if_empty) && ctx.broker.queue_len(entity.id).await > 0 {
        return Err(ApiError::bad_request(format!(
            "PRECONDITION_FAILED - queue '{name}' in vhost '{vhost}' not empty"
        )));
    }
    if flag(&q.if_unused) && c.consumers > 0 {
        return Err(ApiError::bad_request(format!("PRECONDITION_FAILED - queue '{name}' in vhost '{vhost}' in use")));
    }
    ctx.entities.delete_queue(&entity).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /api/queues/{vhost}/{name}/contents`: purge (read permission on the queue).
pub async fn purge(p: Permitted<OnQueue<Read>>) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    let entity = find(ctx, &p.vhost, &p.name)?;
    if entity.is_stream() {
        return Err(ApiError::bad_request("a stream cannot be purged"));
    }
    ctx.broker.purge_queue(entity.id).await;
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `POST /api/queues/{vhost}/{name}/get`.
#[derive(Debug, Deserialize)]
pub struct GetBody {
    /// Most messages to take.
    #[serde(default = "one", deserialize_with = "lenient::u64")]
    pub count: u64,
    /// `ack_requeue_true` (look: they go back), `ack_requeue_false` (take them),
    /// `reject_requeue_true` (back, redelivered), `reject_requeue_false` (dropped or dead-lettered).
    #[serde(default)]
    pub ackmode: String,
    /// `auto` (text when it is UTF-8, else base64) or `base64`.
    #[serde(default = "auto")]
    pub encoding: String,
    /// Longest payload shown, bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub truncate: Option<u64>,
    /// RabbitMQ 3.6's spelling of `ackmode` (`true` = `ack_requeue_true`).
    #[serde(default, deserialize_with = "lenient::opt_bool")]
    pub requeue: Option<bool>,
}

fn one() -> u64 {
    1
}

fn auto() -> String {
    "auto".into()
}

/// Message properties as RabbitMQ's API shows them.
pub fn properties_json(m: &Message) -> Json_ {
    let p = &m.props;
    let mut o = Map::new();
    let mut put = |k: &str, v: Option<Json_>| {
        if let Some(v) = v {
            o.insert(k.into(), v);
        }
    };
    put("content_type", p.content_type.as_ref().map(|v| json!(v)));
    put("content_encoding", p.content_encoding.as_ref().map(|v| json!(v)));
    put("delivery_mode", p.delivery_mode.map(|v| json!(v)));
    put("priority", p.priority.map(|v| json!(v)));
    put("correlation_id", p.correlation_data.as_ref().map(|v| json!(String::from_utf8_lossy(v))));
    put("reply_to", p.reply_to.as_ref().map(|v| json!(v)));
    put("expiration", p.expiration_ms.map(|v| json!(v.to_string())));
    put("message_id", p.message_id.as_ref().map(|v| json!(v)));
    put("timestamp", p.timestamp.map(|v| json!(v)));
    put("type", p.kind.as_ref().map(|v| json!(v)));
    put("user_id", p.user_id.as_ref().map(|v| json!(v)));
    put("app_id", p.app_id.as_ref().map(|v| json!(v)));
    if !p.headers.is_empty() {
        o.insert("headers".into(), table_json(&p.headers));
    }
    Json_::Object(o)
}

/// A payload as the API shows it: (payload, encoding).
pub fn payload_json(body: &[u8], encoding: &str, truncate: Option<u64>) -> (String, &'static str) {
    let body = &body[..truncate.map_or(body.len(), |t| (t.min(body.len() as u64)) as usize)];
    match (encoding, std::str::from_utf8(body)) {
        ("auto", Ok(text)) => (text.to_owned(), "string"),
        _ => (base64::engine::general_purpose::STANDARD.encode(body), "base64"),
    }
}

/// `POST /api/queues/{vhost}/{name}/get`: read permission on the queue.
pub async fn get_messages(p: Permitted<OnQueue<Read>>, Body(body): Body<GetBody>) -> Result<Response, ApiError> {
    let ctx = p.ctx();
    let entity = find(ctx, &p.vhost, &p.name)?;
    if entity.is_stream() {
        return Err(ApiError::bad_request("basic.get is not supported on streams"));
    }
    let ackmode = match (body.ackmode.as_str(), body.requeue) {
        ("", Some(true)) => "ack_requeue_true",
        ("", Some(false)) => "ack_requeue_false",
        (m, _) => m,
    };
    if !matches!(ackmode, "ack_requeue_true" | "ack_requeue_false" | "reject_requeue_true" | "reject_requeue_false") {
        return Err(ApiError::bad_request(format!("unknown ackmode '{ackmode}'")));
    }
    if !matches!(body.encoding.as_str(), "auto" | "base64") {
        return Err(ApiError::bad_request(format!("unknown encoding '{}'", body.encoding)));
    }
    let take = ackmode == "ack_requeue_false";
    let consumer = ctx.broker.next_id();
    let mut got = Vec::new();
    for _ in 0..body.count.min(10_000) {
        match ctx.broker.get_message(entity.id, consumer, take).await {
            Some(g) => got.push(g),
            None => break,
        }
    }
    let mut out = Vec::with_capacity(got.len());
    for g in &got {
        let d = &g.delivery;
        let (payload, encoding) = payload_json(&d.msg.payload, &body.encoding, body.truncate);
        out.push(json!({
            "payload_bytes": d.msg.payload.len(),
            "redelivered": d.redelivered,
            "exchange": d.msg.exchange,
            "routing_key": d.msg.routing_key,
            "message_count": g.remaining,
            "properties": properties_json(&d.msg),
            "payload": payload,
            "payload_encoding": encoding,
        }));
    }
    // What was only looked at goes back at once, as basic.reject / nack with requeue.
    for g in got.iter().filter(|_| !take) {
        let (queue, offset) = (entity.id, g.delivery.offset);
        match ackmode {
            "reject_requeue_false" => ctx.broker.reject(queue, offset),
            _ => ctx.broker.requeue(queue, offset, RequeueCause::Returned, consumer),
        }
    }
    entity.touch();
    Ok(Json(Json_::Array(out)).into_response())
}

/// Publishes a message to queue `name` of `vhost` (declared if missing, not durable) through
/// the default exchange and takes it back: the aliveness test.
pub async fn round_trip(ctx: &HttpContext, vhost: &str, name: &str) -> Result<(), String> {
    let entity = match ctx.entities.queue(vhost, name) {
        Some(q) => q,
        None => {
            ctx.entities.create_queue(vhost, name, false, None, false, Vec::new()).await.map_err(|e| e.to_string())?
        }
    };
    let now = crate::core::message::now_ms();
    let msg = Arc::new(Message {
        exchange: String::new(),
        routing_key: name.to_owned(),
        payload: bytes::Bytes::from_static(b"test_message"),
        qos: 1,
        retain: false,
        props: crate::core::message::Properties { delivery_mode: Some(2), ..Default::default() },
        timestamp_ms: now,
    });
    let (routes, _) = ctx.broker.routing().route(vhost, "", &msg, "").map_err(|e| e.to_string())?;
    if let Some(signal) =
        ctx.broker.publish(&msg, &routes, crate::core::broker::RetainMode::None, Default::default()).await
    {
        signal.await.map_err(|_| "the journal stopped".to_string())?.map_err(|e| e.to_string())?;
    }
    let consumer = ctx.broker.next_id();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        if let Some(got) = ctx.broker.get_message(entity.id, consumer, true).await {
            if &got.delivery.msg.payload[..] == b"test_message" {
                return Ok(());
            }
            continue;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("the message published to '{name}' did not come back"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

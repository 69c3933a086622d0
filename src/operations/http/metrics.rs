//! `GET /metrics`: OpenMetrics text with RabbitMQ's Prometheus names where RabbitMQ has
//! the metric (so existing Grafana dashboards work), MQTT ones under `ferrymq_mqtt_*` and
//! the journal's under `ferrymq_journal_*`. Aggregated over all queues, as RabbitMQ's
//! default endpoint is. Built from the counters at each scrape; nothing is kept per message.

use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};

use super::listener::Peer;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::auth::{authenticate, Access};
use super::error::ApiError;
use super::queues::QueueTotals;
use super::HttpContext;
use crate::core::stats::Stats;
use crate::transport::accept::Refusal;

/// OpenMetrics' content type.
pub const CONTENT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;

/// A histogram read from the journal's counters at scrape time.
#[derive(Debug)]
struct ConstHistogram {
    /// (upper bound, values in that bucket), the last bound `f64::MAX` (+Inf).
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl ConstHistogram {
    /// From a journal snapshot, each value multiplied by `scale` (µs to s: 1e-6).
    fn of(s: &crate::core::HistogramSnapshot, scale: f64) -> ConstHistogram {
        let mut buckets: Vec<(f64, u64)> =
            s.bounds.iter().zip(&s.counts).map(|(b, c)| (*b as f64 * scale, *c)).collect();
        buckets.push((f64::MAX, s.counts.last().copied().unwrap_or(0)));
        ConstHistogram { buckets, sum: s.sum as f64 * scale, count: s.count() }
    }
}

impl prometheus_client::encoding::EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c: Counter = Counter::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let g: Gauge = Gauge::default();
    g.set(value.min(i64::MAX as u64) as i64);
    registry.register(name, help, g);
}

fn by_protocol(registry: &mut Registry, name: &str, help: &str, values: &[(&str, u64)]) {
    let f = Family::<Labels, Counter>::default();
    for (protocol, v) in values {
        f.get_or_create(&vec![("protocol".to_string(), protocol.to_string())]).inc_by(*v);
    }
    registry.register(name, help, f);
}

/// The metrics text now.
pub fn render(ctx: &HttpContext) -> String {
    let b = &ctx.broker;
    let s = b.stats();
    let a = &s.amqp;
    let mut r = Registry::default();
    let conns = b.connections().list();
    let channels: u64 = conns.iter().map(|c| Stats::get(&c.channels)).sum();
    let q = QueueTotals::of(ctx);
    // Which node these figures are of, and its cluster (RabbitMQ's labels): a scraper of
    // every member tells them apart by it.
    let identity = Family::<Labels, Gauge>::default();
    identity
        .get_or_create(&vec![
            ("rabbitmq_node".to_string(), ctx.node().to_string()),
            ("rabbitmq_cluster".to_string(), ctx.access.cluster_name()),
        ])
        .set(1);
    r.register("rabbitmq_identity_info", "The node and cluster these metrics are of", identity);
    if let Some(cluster) = &ctx.cluster {
        counter(
            &mut r,
            "ferrymq_cluster_forward_dropped",
            "Publishes for other cluster members' subscribers dropped (a member not reached, or its queue full)",
            cluster.forward_dropped(),
        );
    }
    gauge(&mut r, "rabbitmq_connections", "Connections currently open (AMQP and MQTT)", conns.len() as u64);
    gauge(&mut r, "rabbitmq_channels", "Channels currently open", channels);
    gauge(&mut r, "rabbitmq_consumers", "Consumers currently connected", q.consumers);
    gauge(&mut r, "rabbitmq_queues", "Queues available", q.queues);
    gauge(&mut r, "rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers", q.ready);
    gauge(
        &mut r,
        "rabbitmq_queue_messages_unacked",
        "Messages delivered to consumers but not yet acknowledged",
        q.messages - q.ready.min(q.messages),
    );
    gauge(&mut r, "rabbitmq_queue_messages", "Sum of ready and unacknowledged messages", q.messages);
    let (opened, closed) = b.connections().churn();
    counter(&mut r, "rabbitmq_connections_opened", "Total number of connections opened", opened);
    counter(&mut r, "rabbitmq_connections_closed", "Total number of connections closed or terminated", closed);
    let amqp = "amqp091";
    let mqtt = "mqtt";
    by_protocol(
        &mut r,
        "rabbitmq_global_messages_received",
        "Total number of messages received from publishers",
        &[(amqp, Stats::get(&a.published)), (mqtt, Stats::get(&s.publish_received))],
    );
    by_protocol(
        &mut r,
        "rabbitmq_global_messages_confirmed",
        "Total number of messages confirmed to publishers",
        &[(amqp, Stats::get(&a.confirmed))],
    );
    by_protocol(
        &mut r,
        "rabbitmq_global_messages_delivered",
        "Total number of messages delivered to consumers",
        &[(amqp, Stats::get(&a.delivered)), (mqtt, Stats::get(&s.publish_sent))],
    );
    by_protocol(
        &mut r,
        "rabbitmq_global_messages_redelivered",
        "Total number of messages redelivered to consumers",
        &[(amqp, Stats::get(&a.redelivered))],
    );
    by_protocol(
        &mut r,
        "rabbitmq_global_messages_acknowledged",
        "Total number of messages acknowledged by consumers",
        &[(amqp, Stats::get(&a.acked))],
    );
    let mqtt_conns = conns.iter().filter(|c| c.protocol.is_mqtt()).count() as u64;
    gauge(&mut r, "ferrymq_mqtt_connections", "MQTT clients connected", mqtt_conns);
    counter(&mut r, "ferrymq_mqtt_messages_received", "MQTT PUBLISH packets received", Stats::get(&s.publish_received));
    counter(&mut r, "ferrymq_mqtt_messages_sent", "MQTT PUBLISH packets sent", Stats::get(&s.publish_sent));
    counter(
        &mut r,
        "ferrymq_mqtt_messages_dropped",
        "MQTT messages dropped (slow subscriber buffer full, queue full, too large)",
        Stats::get(&s.publish_dropped),
    );
    let dropped = Family::<Labels, Counter>::default();
    for (reason, v) in [
        ("queue_full", &s.dropped_queue_full),
        ("expired", &s.dropped_expired),
        ("too_large", &s.dropped_too_large),
        ("no_subscribers", &s.dropped_no_subscribers),
        ("not_authorized", &s.dropped_not_authorized),
    ] {
        dropped.get_or_create(&vec![("reason".to_string(), reason.to_string())]).inc_by(Stats::get(v));
    }
    r.register(
        "ferrymq_mqtt_dropped",
        "MQTT messages not delivered, by reason (EMQX's: a subscriber's queue full, expired, too large for the client, no subscribers, refused)",
        dropped,
    );
    let logins = |of: &[std::sync::atomic::AtomicU64; 2]| [(mqtt, Stats::get(&of[0])), (amqp, Stats::get(&of[1]))];
    let [ok, denied] = [logins(&s.auth_allowed), logins(&s.auth_denied)];
    by_protocol(&mut r, "rabbitmq_auth_attempts_succeeded", "Logins accepted", &ok);
    by_protocol(&mut r, "rabbitmq_auth_attempts_failed", "Logins refused", &denied);
    let attempts = [(mqtt, ok[0].1 + denied[0].1), (amqp, ok[1].1 + denied[1].1)];
    by_protocol(&mut r, "rabbitmq_auth_attempts", "Login attempts", &attempts);
    gauge(
        &mut r,
        "ferrymq_delayed_messages",
        "Delayed messages waiting for their time (MQTT $delayed, AMQP delayed publishes), as of the last sample",
        ctx.delayed_pending.load(std::sync::atomic::Ordering::Relaxed),
    );
    counter(
        &mut r,
        "ferrymq_mqtt_slow_consumers",
        "Subscribers disconnected as slow consumers",
        Stats::get(&s.slow_consumers),
    );
    let refused = Family::<Labels, Counter>::default();
    for (reason, v) in [("cross_site", &s.http_cross_site_refused), ("not_json", &s.http_not_json_refused)] {
        refused.get_or_create(&vec![("reason".to_string(), reason.to_string())]).inc_by(Stats::get(v));
    }
    r.register(
        "ferrymq_http_requests_refused",
        "Management API requests refused before the login: cross-site state changes (403), bodies not JSON (415)",
        refused,
    );
    counter(
        &mut r,
        "ferrymq_logins_refused_pending",
        "Logins refused at once, unchecked, as too many from one address were under way (auth.max_pending_logins_per_address)",
        ctx.users.throttle().refused_pending(),
    );
    counter(
        &mut r,
        "ferrymq_mqtt_ws_origin_refused",
        "MQTT WebSocket upgrades refused for their browser Origin (403)",
        Stats::get(&s.ws_origin_refused),
    );
    counter(
        &mut r,
        "ferrymq_mqtt_connect_state_unreadable",
        "MQTT CONNECTs refused with Server unavailable as the session's inbound QoS 2 state could not be read",
        Stats::get(&s.mqtt_state_unreadable),
    );
    counter(
        &mut r,
        "ferrymq_delayed_unreadable",
        "Delayed messages due whose record could not be read: kept and tried again later, never dropped",
        Stats::get(&s.delayed_unreadable),
    );
    counter(
        &mut r,
        "ferrymq_routes_off_worker",
        "Routes whose walk of a topic exchange was long (bindings of many wildcards) and finished off the runtime's workers",
        b.routing().long_routes(),
    );
    counter(&mut r, "ferrymq_mqtt_bytes_received", "Bytes read from MQTT connections", Stats::get(&s.bytes_received));
    counter(&mut r, "ferrymq_mqtt_bytes_sent", "Bytes written to MQTT connections", Stats::get(&s.bytes_sent));
    gauge(&mut r, "ferrymq_mqtt_retained_messages", "Retained messages", b.retained().len() as u64);
    let j = b.journal_stats();
    counter(&mut r, "ferrymq_journal_group_commits", "Group commits of the commit log", j.batches);
    counter(&mut r, "ferrymq_journal_fsyncs", "fdatasync calls on commit-log segments", j.fsyncs);
    counter(&mut r, "ferrymq_journal_checkpoints", "Checkpoints taken", j.checkpoints);
    gauge(&mut r, "ferrymq_journal_segments", "Commit-log segments on disk", j.segments);
    gauge(&mut r, "ferrymq_journal_disk_bytes", "Bytes of the commit log's segments", j.log_bytes);
    counter(&mut r, "ferrymq_journal_out_of_space", "Appends refused for lack of disk space", j.out_of_space);
    gauge(
        &mut r,
        "ferrymq_journal_poisoned",
        "The journal refuses writes since an I/O failure (1)",
        u64::from(j.poisoned),
    );
    gauge(&mut r, "ferrymq_journal_log_end_bytes", "Next commit-log position", j.log_end);
    r.register(
        "ferrymq_journal_fsync_seconds",
        "Commit-log fdatasync latency",
        ConstHistogram::of(&j.fsync_micros, 1e-6),
    );
    r.register(
        "ferrymq_journal_group_commit_submissions",
        "Submissions per group commit",
        ConstHistogram::of(&j.batch_submissions, 1.0),
    );
    // Counted under the table's lock: no copy of every session per scrape.
    let (sessions, offline) = ctx.mqtt.sessions.counts();
    gauge(&mut r, "ferrymq_mqtt_sessions", "MQTT sessions, online and offline", sessions as u64);
    gauge(&mut r, "ferrymq_mqtt_sessions_offline", "Persistent MQTT sessions without a connection", offline as u64);
    let (mem_limit, disk_limit) = ctx.alarm.limits();
    gauge(
        &mut r,
        "rabbitmq_process_resident_memory_bytes",
        "Resident memory",
        crate::core::alarm::resident_memory().unwrap_or(0),
    );
    gauge(&mut r, "rabbitmq_resident_memory_limit_bytes", "Memory high watermark", mem_limit);
    gauge(
        &mut r,
        "rabbitmq_disk_space_available_bytes",
        "Free space of the data directory's file system",
        ctx.alarm.disk_free().unwrap_or(0),
    );
    gauge(&mut r, "rabbitmq_disk_space_available_limit_bytes", "Free disk space limit", disk_limit);
    let raised = ctx.alarm.raised();
    gauge(
        &mut r,
        "rabbitmq_alarms_memory_used_watermark",
        "Memory alarm raised (1)",
        u64::from(raised.contains(&crate::core::alarm::Resource::Memory)),
    );
    gauge(
        &mut r,
        "rabbitmq_alarms_free_disk_space_watermark",
        "Disk alarm raised (1)",
        u64::from(raised.contains(&crate::core::alarm::Resource::Disk)),
    );
    links(ctx, &mut r);
    sockets(ctx, &mut r);
    let mut out = String::new();
    let _ = encode(&mut out, &r);
    out
}

/// Client sockets per kind of listener: open, cap, reserve, refused at accept (by
/// reason: the cap, or the descriptors kept for the other listeners), failed accepts.
fn sockets(ctx: &HttpContext, r: &mut Registry) {
    let open = Family::<Labels, Gauge>::default();
    let cap = Family::<Labels, Gauge>::default();
    let reserve = Family::<Labels, Gauge>::default();
    let refused = Family::<Labels, Counter>::default();
    let errors = Family::<Labels, Counter>::default();
    let as_i64 = |v: usize| v.min(i64::MAX as usize) as i64;
    for s in ctx.sockets.stats() {
        let l = vec![("listener".to_string(), s.class.name().to_string())];
        open.get_or_create(&l).set(as_i64(s.open));
        cap.get_or_create(&l).set(as_i64(s.cap));
        reserve.get_or_create(&l).set(as_i64(s.reserve));
        errors.get_or_create(&l).inc_by(s.accept_errors);
        for (reason, n) in [(Refusal::Cap, s.refused_cap), (Refusal::Descriptors, s.refused_descriptors)] {
            let mut l = l.clone();
            l.push(("reason".to_string(), reason.name().to_string()));
            refused.get_or_create(&l).inc_by(n);
        }
    }
    r.register("ferrymq_listener_sockets", "Client sockets open, per kind of listener", open);
    r.register("ferrymq_listener_socket_cap", "Most client sockets a kind of listener may hold", cap);
    r.register(
        "ferrymq_listener_socket_reserve",
        "Descriptors kept for a kind of listener that the others cannot take",
        reserve,
    );
    r.register(
        "ferrymq_connections_refused",
        "Sockets closed at accept: at the listener's cap, or for the descriptors kept for the other listeners",
        refused,
    );
    r.register("ferrymq_accept_errors", "Accepts that failed (e.g. out of file descriptors)", errors);
    let budget = ctx.sockets.descriptors();
    if budget != usize::MAX {
        gauge(r, "ferrymq_client_socket_budget", "Client sockets the open-files limit leaves", budget as u64);
    }
}

/// Bridges and shovels, one series each (few by nature): up (1) or not, messages carried.
fn links(ctx: &HttpContext, r: &mut Registry) {
    let up = Family::<Labels, Gauge>::default();
    let moved = Family::<Labels, Counter>::default();
    let refused = Family::<Labels, Counter>::default();
    for link in ctx.bridges.list() {
        let b = link.status.lock().clone();
        let bridge = ("bridge".to_string(), b.name.clone());
        up.get_or_create(&vec![bridge.clone()]).set(i64::from(b.connected));
        let direction = |d: &str| vec![bridge.clone(), ("direction".to_string(), d.to_string())];
        for (d, n) in [("out", b.sent), ("in", b.received)] {
            moved.get_or_create(&direction(d)).inc_by(n);
        }
        for (d, n) in [("out", link.refusals.deliveries()), ("in", link.refusals.publishes())] {
            refused.get_or_create(&direction(d)).inc_by(n);
        }
    }
    r.register("ferrymq_bridge_up", "MQTT bridge connected (1) or reconnecting (0)", up);
    r.register("ferrymq_bridge_messages", "Messages an MQTT bridge carried, by direction", moved);
    r.register(
        "ferrymq_bridge_refused",
        "Messages an MQTT bridge dropped because the rules refused its local side, by direction",
        refused,
    );
    let up = Family::<Labels, Gauge>::default();
    let moved = Family::<Labels, Counter>::default();
    for s in ctx.shovels.list() {
        let l = vec![("vhost".to_string(), s.vhost.clone()), ("shovel".to_string(), s.name.clone())];
        up.get_or_create(&l).set(i64::from(s.status.running));
        moved.get_or_create(&l).inc_by(s.status.moved);
    }
    r.register("ferrymq_shovel_up", "Shovel running (1) or not (0)", up);
    r.register("ferrymq_shovel_messages", "Messages a shovel moved", moved);
}

/// The per-object series: per queue and stream (RabbitMQ's `rabbitmq_detailed_queue_*`
/// names, labels `vhost`, `queue`; a stream's `ferrymq_stream_first_offset` and
/// `ferrymq_stream_last_offset`) and per stream consumer group (`ferrymq_stream_group_lag`,
/// `ferrymq_stream_group_committed_offset`, labels `vhost`, `stream`, `group`).
pub async fn render_per_object(ctx: &HttpContext) -> String {
    let mut r = Registry::default();
    let ready = Family::<Labels, Gauge>::default();
    let unacked = Family::<Labels, Gauge>::default();
    let messages = Family::<Labels, Gauge>::default();
    let bytes = Family::<Labels, Gauge>::default();
    let consumers = Family::<Labels, Gauge>::default();
    let lag = Family::<Labels, Gauge>::default();
    let committed = Family::<Labels, Gauge>::default();
    let first_offset = Family::<Labels, Gauge>::default();
    let last_offset = Family::<Labels, Gauge>::default();
    let published = Family::<Labels, Counter>::default();
    let delivered = Family::<Labels, Counter>::default();
    let fetched = Family::<Labels, Counter>::default();
    let redelivered = Family::<Labels, Counter>::default();
    let acked = Family::<Labels, Counter>::default();
    let as_i64 = |v: u64| v.min(i64::MAX as u64) as i64;
    for q in ctx.entities.all() {
        let labels = vec![("vhost".to_string(), q.vhost.clone()), ("queue".to_string(), q.name.clone())];
        let g = &q.config.gauge;
        let len = Stats::get(&g.len);
        let r_ = Stats::get(&g.ready).min(len);
        ready.get_or_create(&labels).set(as_i64(r_));
        unacked.get_or_create(&labels).set(as_i64(len - r_));
        messages.get_or_create(&labels).set(as_i64(len));
        bytes.get_or_create(&labels).set(as_i64(Stats::get(&g.bytes)));
        consumers.get_or_create(&labels).set(as_i64(q.consumers.load(std::sync::atomic::Ordering::Relaxed)));
        let c = g.counts();
        for (family, n) in [
            (&published, c.publish),
            (&delivered, c.deliver),
            (&fetched, c.get),
            (&redelivered, c.redeliver),
            (&acked, c.ack),
        ] {
            family.get_or_create(&labels).inc_by(n);
        }
        if let Some(stream) = &q.stream {
            let e = &stream.extent;
            first_offset.get_or_create(&labels).set(as_i64(e.first()));
            if let Some(last) = e.last() {
                last_offset.get_or_create(&labels).set(as_i64(last));
            }
            if let Some(s) = ctx.broker.stream_status(q.id).await {
                for gr in &s.groups {
                    let mut l = vec![("vhost".to_string(), q.vhost.clone()), ("stream".to_string(), q.name.clone())];
                    l.push(("group".to_string(), gr.name.clone()));
                    lag.get_or_create(&l).set(as_i64(gr.lag(&s)));
                    committed.get_or_create(&l).set(as_i64(gr.committed));
                }
            }
        }
    }
    r.register("rabbitmq_detailed_queue_messages_ready", "Messages ready to be delivered, per queue", ready);
    r.register(
        "rabbitmq_detailed_queue_messages_unacked",
        "Messages delivered and not yet acknowledged, per queue",
        unacked,
    );
    r.register("rabbitmq_detailed_queue_messages", "Ready and unacknowledged messages, per queue", messages);
    r.register("rabbitmq_detailed_queue_messages_bytes", "Bytes of the messages, per queue", bytes);
    r.register("rabbitmq_detailed_queue_consumers", "Consumers, per queue", consumers);
    r.register("rabbitmq_detailed_queue_messages_published", "Messages that entered the queue", published);
    r.register("rabbitmq_detailed_queue_messages_delivered", "Messages delivered to consumers, per queue", delivered);
    r.register("rabbitmq_detailed_queue_get", "Messages fetched with basic.get, per queue", fetched);
    r.register("rabbitmq_detailed_queue_messages_redelivered", "Messages redelivered, per queue", redelivered);
    r.register("rabbitmq_detailed_queue_messages_acked", "Messages acknowledged, per queue", acked);
    r.register("ferrymq_stream_first_offset", "Oldest offset a stream keeps, per stream (label queue)", first_offset);
    r.register(
        "ferrymq_stream_last_offset",
        "Newest offset of a stream, per non-empty stream (label queue)",
        last_offset,
    );
    r.register("ferrymq_stream_group_lag", "Messages a stream consumer group has not acknowledged yet", lag);
    r.register(
        "ferrymq_stream_group_committed_offset",
        "Offset below which a stream group acknowledged everything",
        committed,
    );
    let mut out = String::new();
    let _ = encode(&mut out, &r);
    out
}

/// `GET /metrics/per-object` (kept off `/metrics`: RabbitMQ users see a full scrape time
/// out at ~170k queues).
pub async fn per_object(
    State(ctx): State<Arc<HttpContext>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    req: Request,
) -> Result<Response, ApiError> {
    if !ctx.cfg.metrics_without_auth {
        authenticate(&ctx, req.headers(), peer).await?.require(Access::Monitoring)?;
    }
    Ok(([(CONTENT_TYPE, CONTENT)], render_per_object(&ctx).await).into_response())
}

/// `GET /metrics` (credentials needed only when `http.metrics_without_auth` is off).
pub async fn metrics(
    State(ctx): State<Arc<HttpContext>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    req: Request,
) -> Result<Response, ApiError> {
    if !ctx.cfg.metrics_without_auth {
        authenticate(&ctx, req.headers(), peer).await?.require(Access::Monitoring)?;
    }
    Ok(([(CONTENT_TYPE, CONTENT)], render(&ctx)).into_response())
}

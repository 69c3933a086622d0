//! `$SYS/broker/...` topics, as Mosquitto publishes them: retained, QoS 0, refreshed every
//! `mqtt.sys_interval_secs`. Kept in memory only (they describe this run).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::MqttContext;
use crate::core::broker::RetainMode;
use crate::core::message::{mqtt_to_key, now_ms, Message, Properties};
use crate::core::stats::Stats;
use crate::core::store::StoreWrite;

/// Publishes the `$SYS` topics every `interval` until the runtime stops.
pub async fn run(ctx: Arc<MqttContext>, interval: Duration) {
    publish(&ctx, "$SYS/broker/version", format!("ferrymq version {}", env!("CARGO_PKG_VERSION"))).await;
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let b = &ctx.broker;
        let s = &b.stats;
        let connected = Stats::get(&s.clients_connected);
        let disconnected = ctx.sessions.offline_count() as u64;
        let values: [(&str, String); 19] = [
            ("uptime", format!("{} seconds", b.started.elapsed().as_secs())),
            ("clients/connected", connected.to_string()),
            ("clients/active", connected.to_string()),
            ("clients/disconnected", disconnected.to_string()),
            ("clients/inactive", disconnected.to_string()),
            ("clients/total", (connected + disconnected).to_string()),
            ("clients/maximum", Stats::get(&s.clients_maximum).to_string()),
            ("clients/slow", Stats::get(&s.slow_consumers).to_string()),
            ("messages/received", Stats::get(&s.messages_received).to_string()),
            ("messages/sent", Stats::get(&s.messages_sent).to_string()),
            ("publish/messages/received", Stats::get(&s.publish_received).to_string()),
            ("publish/messages/sent", Stats::get(&s.publish_sent).to_string()),
            ("publish/messages/dropped", Stats::get(&s.publish_dropped).to_string()),
            ("bytes/received", Stats::get(&s.bytes_received).to_string()),
            ("bytes/sent", Stats::get(&s.bytes_sent).to_string()),
            ("subscriptions/count", b.router.len().to_string()),
            ("routing/lookups", Stats::get(&s.route_lookups).to_string()),
            ("retained messages/count", b.retained.len().to_string()),
            ("store/messages/bytes", b.stored_bytes().to_string()),
        ];
        for (topic, value) in values {
            publish(&ctx, &format!("$SYS/broker/{topic}"), value).await;
        }
    }
}

async fn publish(ctx: &MqttContext, topic: &str, value: String) {
    let msg = Arc::new(Message {
        exchange: ctx.broker.router.mqtt_exchange().to_owned(),
        routing_key: mqtt_to_key(topic),
        payload: Bytes::from(value),
        qos: 0,
        retain: true,
        props: Properties::default(),
        timestamp_ms: now_ms(),
    });
    let routes = ctx.broker.router.resolve(&msg, "");
    // QoS 0 and memory-only retained: nothing goes to the journal unless a persistent
    // session subscribed to `$SYS`, whose queue then gets the update.
    let _ = ctx.broker.publish(&msg, &routes, RetainMode::MemoryOnly, StoreWrite::none()).await;
}

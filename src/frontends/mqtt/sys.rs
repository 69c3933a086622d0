//! `$SYS/broker/...` topics, as Mosquitto publishes them: retained, QoS 0, refreshed every
//! `mqtt.sys_interval_secs`. Kept in memory only (they describe this run). The `load/...`
//! topics are Mosquitto's per-minute moving averages over 1, 5 and 15 minutes; `heap/...`
//! is the process's resident memory (FerryMQ's allocator does not count its heap).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::MqttContext;
use crate::core::broker::RetainMode;
use crate::core::message::{mqtt_to_key, now_ms, Message, Properties};
use crate::core::stats::Stats;
use crate::core::store::StoreWrite;

/// The counters the `load/...` topics average, in order.
const LOADS: [&str; 7] = [
    "messages/received",
    "messages/sent",
    "publish/received",
    "publish/sent",
    "bytes/received",
    "bytes/sent",
    "connections",
];

/// Per-minute moving averages of counters over 1, 5 and 15 minutes (Mosquitto's formula:
/// each sample moves the average towards the last interval's per-minute rate).
#[derive(Debug, Default)]
struct Load {
    last: Option<[u64; LOADS.len()]>,
    averages: [[f64; 3]; LOADS.len()],
}

impl Load {
    fn sample(&mut self, now: [u64; LOADS.len()], interval: Duration) {
        let secs = interval.as_secs_f64().max(1e-3);
        if let Some(last) = self.last {
            for (i, avg) in self.averages.iter_mut().enumerate() {
                let per_minute = now[i].saturating_sub(last[i]) as f64 * 60.0 / secs;
                for (a, minutes) in avg.iter_mut().zip([1.0, 5.0, 15.0]) {
                    let keep = (-secs / (60.0 * minutes)).exp();
                    *a = *a * keep + per_minute * (1.0 - keep);
                }
            }
        }
        self.last = Some(now);
    }
}

/// Publishes the `$SYS` topics every `interval` until the runtime stops.
pub(crate) async fn run(ctx: Arc<MqttContext>, interval: Duration) {
    publish(&ctx, "$SYS/broker/version", format!("ferrymq version {}", env!("CARGO_PKG_VERSION"))).await;
    let mut tick = tokio::time::interval(interval);
    let mut load = Load::default();
    let mut heap_max = 0u64;
    loop {
        tick.tick().await;
        let b = &ctx.broker;
        let s = b.stats();
        load.sample(
            [
                Stats::get(&s.messages_received),
                Stats::get(&s.messages_sent),
                Stats::get(&s.publish_received),
                Stats::get(&s.publish_sent),
                Stats::get(&s.bytes_received),
                Stats::get(&s.bytes_sent),
                Stats::get(&s.clients_total),
            ],
            interval,
        );
        for (name, avg) in LOADS.iter().zip(&load.averages) {
            for (a, window) in avg.iter().zip(["1min", "5min", "15min"]) {
                publish(&ctx, &format!("$SYS/broker/load/{name}/{window}"), format!("{a:.2}")).await;
            }
        }
        let heap = crate::core::alarm::resident_memory().unwrap_or(0);
        heap_max = heap_max.max(heap);
        publish(&ctx, "$SYS/broker/heap/current", heap.to_string()).await;
        publish(&ctx, "$SYS/broker/heap/maximum", heap_max.to_string()).await;
        let connected = Stats::get(&s.clients_connected);
        let disconnected = ctx.sessions.offline_count() as u64;
        let values: [(&str, String); 19] = [
            ("uptime", format!("{} seconds", b.uptime().as_secs())),
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
            ("subscriptions/count", b.routing().subscriptions().to_string()),
            ("routing/lookups", Stats::get(&s.route_lookups).to_string()),
            ("retained messages/count", b.retained().len().to_string()),
            ("store/messages/bytes", b.stored_bytes().to_string()),
        ];
        for (topic, value) in values {
            publish(&ctx, &format!("$SYS/broker/{topic}"), value).await;
        }
    }
}

/// Publishes `value` on the broker's own `$SYS` topic `topic`: retained in memory, QoS 0.
pub(crate) async fn publish(ctx: &MqttContext, topic: &str, value: String) {
    let msg = Arc::new(Message {
        exchange: ctx.broker.routing().mqtt_exchange().to_owned(),
        routing_key: mqtt_to_key(topic),
        payload: Bytes::from(value),
        qos: 0,
        retain: true,
        props: Properties::default(),
        timestamp_ms: now_ms(),
    });
    let routes = ctx.broker.routing().resolve(&msg, "");
    // QoS 0 and memory-only retained: nothing goes to the journal unless a persistent
    // session subscribed to `$SYS`, whose queue then gets the update.
    let _ = ctx.broker.publish(&msg, &routes, RetainMode::MemoryOnly, StoreWrite::none()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_averages_move_towards_the_per_minute_rate() {
        let mut l = Load::default();
        let mut n = [0u64; LOADS.len()];
        l.sample(n, Duration::from_secs(10));
        for _ in 0..200 {
            n[0] += 100; // 600 a minute
            l.sample(n, Duration::from_secs(10));
        }
        let [one, five, fifteen] = l.averages[0];
        assert!((one - 600.0).abs() < 1.0, "{one}");
        assert!(five > 590.0 && fifteen > 500.0 && fifteen < five, "{five} {fifteen}");
        assert_eq!(l.averages[1], [0.0; 3]);
    }
}

//! Many subscribers of one topic (every device of a fleet subscribed to its broadcast
//! topic): what one more subscription, and one unsubscription, cost in the routing table
//! as the subscribers of that topic grow — each is made under the table's write lock, so a
//! cost that grows with them stalls every publisher.
//!
//! `cargo bench --bench same_topic_subscriptions -- [SUBSCRIBERS...]` (default 1000 10000
//! 100000; `-- 1000 10000` is a quick check).
//!
//! In process: a [`Router`], SUBSCRIBERS MQTT subscriptions of `fleet/broadcast` (one per
//! destination), then a route of one publish to it, then every subscription removed. It
//! prints, per width, the microseconds per subscribe and per unsubscribe over the whole
//! width and over its last tenth (flat when each costs the same whatever is beside it),
//! and the route's milliseconds (which visits every subscriber, as it must).

use std::time::Instant;

use ferrymq::core::message::Message;
use ferrymq::core::router::{Destination, MqttOptions, Router};
use ferrymq_storage::QueueId;

fn opts() -> MqttOptions {
    MqttOptions {
        client_id: "device".into(),
        qos: 1,
        no_local: false,
        retain_as_published: false,
        subscription_id: None,
        tag_filter: None,
        share_group: None,
    }
}

fn main() {
    let widths: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let widths = if widths.is_empty() { vec![1000, 10_000, 100_000] } else { widths };
    for n in widths {
        let router = Router::new();
        let tenth = (n / 10).max(1);
        let began = Instant::now();
        let mut last_tenth_from = began;
        for i in 0..n {
            if i == n - tenth {
                last_tenth_from = Instant::now();
            }
            assert!(router.subscribe("fleet/broadcast", Destination::Queue(QueueId(i as u64)), opts()));
        }
        let subscribe_us = began.elapsed().as_secs_f64() * 1e6 / n as f64;
        let subscribe_last_us = last_tenth_from.elapsed().as_secs_f64() * 1e6 / tenth as f64;
        let msg = Message {
            exchange: "amq.topic".into(),
            routing_key: "fleet.broadcast".into(),
            payload: Default::default(),
            qos: 1,
            retain: false,
            props: Default::default(),
            timestamp_ms: 0,
        };
        let routed = Instant::now();
        let (routes, _) = router.route("/", "amq.topic", &msg, "").expect("route");
        let route_ms = routed.elapsed().as_secs_f64() * 1e3;
        assert_eq!(routes.queues.len(), n, "every subscriber is a target");
        let began = Instant::now();
        let mut first_tenth_us = 0.0;
        for i in 0..n {
            if i == tenth {
                first_tenth_us = began.elapsed().as_secs_f64() * 1e6 / tenth as f64;
            }
            assert!(router.unsubscribe("fleet/broadcast", &Destination::Queue(QueueId(i as u64))));
        }
        let unsubscribe_us = began.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!(
            "{{\"subscribers\": {n}, \"subscribe_us\": {subscribe_us:.2}, \"subscribe_last_tenth_us\": \
             {subscribe_last_us:.2}, \"route_ms\": {route_ms:.2}, \"unsubscribe_us\": {unsubscribe_us:.2}, \
             \"unsubscribe_first_tenth_us\": {first_tenth_us:.2}}}"
        );
    }
}

//! One stuck subscriber stalls no one. A clean-session subscriber that stops reading its
//! socket sits beside a healthy one on the same topic: the publisher's acks and the healthy
//! subscriber's deliveries keep coming (each within a few seconds, while the broker would
//! wait 30 s for the stuck one if it paced publishers to it); QoS 0 beyond the stuck
//! one's buffer is dropped for it alone; QoS 1 spills to disk for it and arrives complete
//! and in order when it reads again. A subscriber that stays unread past the slow-consumer
//! timeout, or whose backlog passes its limits, is disconnected and counted.

use crate::common;

use std::time::Duration;

use crate::common::{v4, Broker, Opts};

/// Payloads large enough that a few hundred fill the kernel's socket buffers.
const SIZE: usize = 64 * 1024;
/// Longest wait for any one delivery or ack to the publisher or the healthy subscriber.
const PATIENCE: Duration = Duration::from_secs(5);

fn payload(i: u32) -> Vec<u8> {
    let mut p = vec![b'x'; SIZE];
    p[..4].copy_from_slice(&i.to_be_bytes());
    p
}

fn index(p: &[u8]) -> u32 {
    u32::from_be_bytes(p[..4].try_into().unwrap())
}

fn broker(extra: &[(&str, &str)]) -> Broker {
    let mut o = Opts::default()
        .env("FERRYMQ_MQTT__MAX_ONLINE_QUEUE", "10")
        .env("FERRYMQ_MQTT__SLOW_CONSUMER_TIMEOUT_SECS", "30")
        .env("FERRYMQ_MQTT__SYS_INTERVAL_SECS", "1");
    for (k, v) in extra {
        o = o.env(k, v);
    }
    Broker::start_with(o)
}

/// Waits until `$SYS/broker/clients/slow` reports `n` (as a client sees it).
async fn slow_consumers_reach(b: &Broker, n: u32) {
    let mut sys = v4::connect(b, "sys-watcher").await;
    sys.subscribe("$SYS/broker/clients/slow", v4::QoS::AtMostOnce).await;
    let want = n.to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let p = tokio::time::timeout_at(deadline, sys.next_publish()).await.expect("slow consumers counted in $SYS");
        if p.payload == want.as_bytes() {
            return;
        }
    }
}

/// 3.1.1 options already take 16 MiB packets.
fn large_v4(_: &mut v4::MqttOptions) {}

fn large_v5(o: &mut common::v5::MqttOptions) {
    o.set_max_packet_size(Some(16 * 1024 * 1024));
}

macro_rules! stuck_subscriber_tests {
    ($name:ident, $m:ident, $big:path, $qos1:ident, $qos0:ident, $unread:ident, $limits:ident) => {
        mod $name {
            use super::*;
            use crate::common::$m::{AsyncClient, Event, EventLoop, Packet, QoS};

            /// Options that take this test's large payloads.
            fn options(b: &Broker, id: &str) -> common::$m::MqttOptions {
                let mut o = common::$m::options(b, id);
                $big(&mut o);
                o
            }

            async fn connect(b: &Broker, id: &str) -> common::$m::Client {
                common::$m::connect_with(options(b, id)).await
            }

            /// A subscriber whose event loop is polled until its SUBACK and then left
            /// alone: it no longer reads its socket.
            async fn stuck(b: &Broker, id: &str, qos: QoS) -> (AsyncClient, EventLoop) {
                let mut o = options(b, id);
                o.set_keep_alive(Duration::from_secs(120));
                let (client, mut el) = AsyncClient::new(o, 10);
                client.subscribe("slow/t", qos).await.unwrap();
                loop {
                    match tokio::time::timeout(common::WAIT, el.poll()).await.expect("SUBACK in time") {
                        Ok(Event::Incoming(Packet::SubAck(_))) => return (client, el),
                        Ok(_) => {}
                        Err(e) => panic!("stuck subscriber: {e:?}"),
                    }
                }
            }

            /// Reads again: the payload indexes of every PUBLISH until `n` arrived or the
            /// connection ended or went quiet.
            async fn resume(el: &mut EventLoop, n: usize) -> Vec<u32> {
                let mut got = Vec::new();
                while got.len() < n {
                    match tokio::time::timeout(PATIENCE, el.poll()).await {
                        Ok(Ok(Event::Incoming(Packet::Publish(p)))) => got.push(index(&p.payload)),
                        Ok(Ok(_)) => {}
                        Ok(Err(_)) | Err(_) => break,
                    }
                }
                got
            }

            async fn next_index(c: &mut common::$m::Client) -> u32 {
                let p = tokio::time::timeout(PATIENCE, c.next_publish()).await.expect("the healthy subscriber waited");
                index(&p.payload)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $qos1() {
                let b = broker(&[]);
                let (_stuck, mut stuck_el) = stuck(&b, "stuck", QoS::AtLeastOnce).await;
                let mut healthy = connect(&b, "healthy").await;
                healthy.subscribe("slow/t", QoS::AtLeastOnce).await;
                let mut publisher = connect(&b, "publisher").await;
                const N: u32 = 300;
                let publish = async {
                    for i in 0..N {
                        publisher.client.publish("slow/t", QoS::AtLeastOnce, false, payload(i)).await.unwrap();
                    }
                    let mut acks = 0;
                    while acks < N {
                        let p = tokio::time::timeout(PATIENCE, publisher.next()).await.expect("the publisher waited");
                        acks += matches!(p, Packet::PubAck(_)) as u32;
                    }
                };
                let receive = async {
                    for i in 0..N {
                        assert_eq!(
                            next_index(&mut healthy).await,
                            i,
                            "the healthy subscriber gets everything in order"
                        );
                    }
                };
                tokio::join!(publish, receive);
                // The stuck subscriber reads again before the slow-consumer timeout: every
                // message, in order (those beyond its buffer came back from disk).
                let got = resume(&mut stuck_el, N as usize).await;
                assert_eq!(got, (0..N).collect::<Vec<_>>(), "the stuck subscriber gets every QoS 1 message in order");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $qos0() {
                let b = broker(&[]);
                let (_stuck, mut stuck_el) = stuck(&b, "stuck0", QoS::AtMostOnce).await;
                let mut healthy = connect(&b, "healthy0").await;
                healthy.subscribe("slow/t", QoS::AtMostOnce).await;
                let publisher = connect(&b, "publisher0").await;
                const N: u32 = 300;
                // Paced by the healthy subscriber (a window of five), so its own buffer
                // never overflows: every drop is the stuck one's.
                for start in (0..N).step_by(5) {
                    for i in start..start + 5 {
                        publisher.client.publish("slow/t", QoS::AtMostOnce, false, payload(i)).await.unwrap();
                    }
                    for i in start..start + 5 {
                        assert_eq!(next_index(&mut healthy).await, i, "the healthy subscriber gets everything");
                    }
                }
                let got = resume(&mut stuck_el, N as usize).await;
                assert!(got.len() < N as usize, "QoS 0 beyond the stuck subscriber's buffer is dropped for it");
                assert!(got.windows(2).all(|w| w[0] < w[1]), "what it gets is in order: {got:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $unread() {
                let b = broker(&[("FERRYMQ_MQTT__SLOW_CONSUMER_TIMEOUT_SECS", "2")]);
                let (_stuck, _stuck_el) = stuck(&b, "unread", QoS::AtLeastOnce).await;
                let publisher = connect(&b, "publisher-u").await;
                for i in 0..300 {
                    publisher.client.publish("slow/t", QoS::AtLeastOnce, false, payload(i)).await.unwrap();
                }
                slow_consumers_reach(&b, 1).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $limits() {
                let b = broker(&[("FERRYMQ_MQTT__MAX_QUEUED_MESSAGES", "20")]);
                let (_stuck, _stuck_el) = stuck(&b, "over", QoS::AtLeastOnce).await;
                let publisher = connect(&b, "publisher-l").await;
                for i in 0..300 {
                    publisher.client.publish("slow/t", QoS::AtLeastOnce, false, payload(i)).await.unwrap();
                }
                // Long before the 30 s unread timeout: the backlog passed 20 messages.
                slow_consumers_reach(&b, 1).await;
            }
        }
    };
}

stuck_subscriber_tests!(
    v311,
    v4,
    large_v4,
    a_stuck_qos1_subscriber_stalls_no_one_and_gets_everything_in_order,
    a_stuck_qos0_subscriber_stalls_no_one_and_loses_only_its_own,
    a_subscriber_unread_past_the_timeout_is_disconnected_and_counted,
    a_backlog_past_its_limit_disconnects_the_subscriber
);
stuck_subscriber_tests!(
    mqtt5,
    v5,
    large_v5,
    a_stuck_qos1_subscriber_stalls_no_one_and_gets_everything_in_order,
    a_stuck_qos0_subscriber_stalls_no_one_and_loses_only_its_own,
    a_subscriber_unread_past_the_timeout_is_disconnected_and_counted,
    a_backlog_past_its_limit_disconnects_the_subscriber
);

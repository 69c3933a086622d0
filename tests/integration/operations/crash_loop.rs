//! FerryMQ-only: SIGKILL in a loop under mixed MQTT + AMQP load. Twenty rounds of: AMQP
//! publishes with confirms and MQTT QoS 1 publishes to a persistent-session subscriber,
//! some of both consumed (AMQP with manual acks), a few more AMQP publishes left
//! unconfirmed, then SIGKILL and a restart on the same data directory. At the end every
//! confirmed or PUBACKed message has been delivered, and no AMQP message was delivered a
//! second time without the redelivered flag. Skipped against RabbitMQ (the harness cannot
//! kill the reference node).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::amqp::*;
use crate::common::v4::{self, QoS};
use crate::common::Broker;

const ROUNDS: usize = 20;
const PER_ROUND: usize = 40;

/// Every AMQP delivery seen, by body: the redelivered flag of each, in order.
#[derive(Default)]
struct Seen(HashMap<String, Vec<bool>>);

impl Seen {
    fn record(&mut self, body: String, redelivered: bool) {
        self.0.entry(body).or_default().push(redelivered);
    }
}

/// The persistent-session subscriber; it acknowledges only what the test recorded.
async fn subscriber(b: &Broker) -> v4::Client {
    let mut o = v4::options(b, "loop-sub");
    o.set_clean_session(false);
    o.set_manual_acks(true);
    v4::connect_with(o).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_sigkill_in_a_loop_under_mixed_load() {
    if skip_on_rabbitmq("kills the broker with SIGKILL") {
        return;
    }
    let mut broker = Broker::start();
    let (mut confirmed, mut puback) = (Vec::new(), Vec::new());
    let mut amqp = Seen::default();
    let mut mqtt: HashSet<String> = HashSet::new();
    for round in 0..ROUNDS {
        let t = Target::ferrymq(broker);
        let b = t.broker.as_ref().expect("FerryMQ");
        let mut sub = subscriber(b).await;
        if round == 0 {
            sub.subscribe("loop/#", QoS::AtLeastOnce).await;
        }
        let mut publisher = v4::connect(b, "loop-pub").await;
        let (_conn, ch) = t.channel().await;
        confirm_select(&ch).await;
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        declare_queue_with(&ch, "loop", durable, FieldTable::default()).await;
        let mut consumer = consume(&ch, "loop", BasicConsumeOptions::default(), FieldTable::default()).await;

        let mut pending = Vec::new();
        for i in 0..PER_ROUND {
            let body = format!("a{round}-{i}");
            let c = publish_opts(&ch, "", "loop", BasicPublishOptions::default(), body.as_bytes(), persistent()).await;
            pending.push((body, c));
        }
        for (body, c) in pending {
            assert!(bounded("confirm", c).await.unwrap().is_ack(), "{body} nacked");
            confirmed.push(body);
        }
        for i in 0..PER_ROUND {
            let body = format!("m{round}-{i}");
            publisher.publish_acked(&format!("loop/{round}"), QoS::AtLeastOnce, false, body.clone()).await;
            puback.push(body);
        }
        for d in take(&mut consumer, PER_ROUND / 2).await {
            amqp.record(text(&d), d.redelivered);
            d.ack(BasicAckOptions::default()).await.unwrap();
        }
        for _ in 0..PER_ROUND / 2 {
            let p = sub.next_publish().await;
            mqtt.insert(String::from_utf8_lossy(&p.payload).into_owned());
            sub.client.ack(&p).await.unwrap();
        }
        // In flight at the kill: publishes nobody waits the confirm of (they may or may not
        // survive).
        for i in 0..10 {
            let body = format!("x{round}-{i}");
            drop(publish_opts(&ch, "", "loop", BasicPublishOptions::default(), body.as_bytes(), persistent()).await);
        }
        let mut t = t;
        broker = t.broker.take().expect("FerryMQ").crash_restart();
    }

    // What is left: AMQP by basic.get (auto-ack), MQTT by the persistent session.
    let t = Target::ferrymq(broker);
    let (_conn, ch) = t.channel().await;
    while let Some(m) = get(&ch, "loop", true).await {
        amqp.record(text(&m.delivery), m.delivery.redelivered);
    }
    let b = t.broker.as_ref().expect("FerryMQ");
    let mut sub = subscriber(b).await;
    let missing = |mqtt: &HashSet<String>| puback.iter().filter(|m| !mqtt.contains(*m)).count();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while missing(&mqtt) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "MQTT messages PUBACKed but never delivered: {}",
            missing(&mqtt)
        );
        let p = sub.next_publish().await;
        mqtt.insert(String::from_utf8_lossy(&p.payload).into_owned());
        sub.client.ack(&p).await.unwrap();
    }

    for body in &confirmed {
        assert!(amqp.0.contains_key(body), "confirmed AMQP message {body} lost");
    }
    for (body, flags) in &amqp.0 {
        assert!(flags.iter().skip(1).all(|r| *r), "{body} delivered again without the redelivered flag: {flags:?}");
    }
    assert_eq!(confirmed.len(), ROUNDS * PER_ROUND);
    eprintln!(
        "crash loop: {} confirmed AMQP and {} PUBACKed MQTT messages over {ROUNDS} SIGKILLs, all delivered; {} AMQP redeliveries",
        confirmed.len(),
        puback.len(),
        amqp.0.values().map(|f| f.len() - 1).sum::<usize>()
    );
}

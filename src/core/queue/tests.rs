use bytes::Bytes;
use ferrymq_storage::{Append, JournalConfig, QueueTarget, Record};
use tokio::sync::mpsc;

use super::*;
use crate::core::message::Properties;

struct Fixture {
    _dir: tempfile::TempDir,
    journal: Journal,
    queue: Queue,
    fx: Effects,
}

fn fixture(configure: impl FnOnce(&mut QueueConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = JournalConfig::new(dir.path());
    cfg.fsync = ferrymq_storage::FsyncPolicy::Never;
    let journal = Journal::open(cfg).unwrap();
    let id = journal.queue_id("q").unwrap();
    let mut config = QueueConfig::new("q", "/");
    config.memory_window = 8;
    configure(&mut config);
    let queue = Queue::load(id, Arc::new(config), &journal);
    Fixture { _dir: dir, journal, queue, fx: Effects::default() }
}

fn message(n: u32, qos: u8, timestamp_ms: u64) -> SharedMessage {
    Arc::new(Message {
        exchange: "amq.topic".into(),
        routing_key: "t".into(),
        payload: Bytes::from(n.to_be_bytes().to_vec()),
        qos,
        retain: false,
        props: Properties::default(),
        timestamp_ms,
    })
}

impl Fixture {
    /// Stores a message in the queue, as the publish path does.
    fn publish_msg(&mut self, msg: SharedMessage) -> Admission {
        let (offset, ptr) = self.store(&msg);
        self.complete(offset, ptr, &msg)
    }

    /// Writes a message to the journal only: its completion is yet to reach the queue.
    fn store(&mut self, msg: &SharedMessage) -> (u64, Pointer) {
        let target = QueueTarget { queue: self.queue.id(), tag_hash: 0, flags: msg.qos };
        let receipt = self
            .journal
            .write_blocking(vec![Op::Append(Append {
                record: Record { header: msg.encode_header(), body: msg.payload.clone() },
                queues: vec![target],
                retained_topic: None,
                timer: None,
                keys: None,
            })])
            .unwrap();
        let a = &receipt.appended[0];
        let ptr = Pointer { pos: a.pos, size: a.size, body_len: msg.payload.len() as u32, tag_hash: 0, flags: msg.qos };
        (a.offsets[0].1, ptr)
    }

    /// The journal's completion of a stored message reaches the queue.
    fn complete(&mut self, offset: u64, ptr: Pointer, msg: &SharedMessage) -> Admission {
        let admission = self.queue.appended(offset, ptr, msg, &self.journal, &mut self.fx);
        // As the shard does at the end of each turn.
        self.queue.publish_gauge();
        self.flush();
        admission
    }

    fn publish(&mut self, n: u32, qos: u8) -> Admission {
        self.publish_msg(message(n, qos, now_ms()))
    }

    fn flush(&mut self) {
        if !self.fx.ops.is_empty() {
            self.journal.write_blocking(std::mem::take(&mut self.fx.ops)).unwrap();
        }
    }

    fn consumer_with(&mut self, id: ConsumerId, credit: u32, priority: i32) -> mpsc::UnboundedReceiver<ConsumerEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.queue.attach(Consumer { id, tx, credit, max_qos: 2, priority });
        self.pump();
        rx
    }

    fn consumer(&mut self, id: ConsumerId, credit: u32) -> mpsc::UnboundedReceiver<ConsumerEvent> {
        self.consumer_with(id, credit, 0)
    }

    fn pump(&mut self) {
        self.queue.pump(&self.journal, &mut self.fx);
        self.flush();
    }

    fn dead(&mut self) -> Vec<(u32, DeathReason)> {
        self.fx.dead.drain(..).map(|d| (n_of(&d.msg), d.reason)).collect()
    }
}

fn n_of(m: &Message) -> u32 {
    u32::from_be_bytes(m.payload[..4].try_into().unwrap())
}

/// (message number, redelivered, offset) of every delivery waiting in `rx`.
fn drain(rx: &mut mpsc::UnboundedReceiver<ConsumerEvent>) -> Vec<(u32, bool, u64)> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let ConsumerEvent::Deliver(d) = ev {
            out.push((n_of(&d.msg), d.redelivered, d.offset));
        }
    }
    out
}

fn numbers(v: &[(u32, bool, u64)]) -> Vec<u32> {
    v.iter().map(|d| d.0).collect()
}

#[test]
fn offline_backlog_stays_on_disk_and_pages_in_order_under_credit() {
    let mut f = fixture(|_| {});
    for n in 0..50 {
        f.publish(n, 1);
    }
    assert!(f.queue.ready.is_empty(), "no consumer: nothing kept in memory");
    assert_eq!(f.queue.len(), 50);
    let mut rx = f.consumer(1, 10);
    assert_eq!(numbers(&drain(&mut rx)), (0..10).collect::<Vec<_>>(), "credit limits deliveries");
    for o in 0..10 {
        f.queue.ack(o, &mut f.fx.ops);
    }
    f.pump();
    assert_eq!(numbers(&drain(&mut rx)), (10..20).collect::<Vec<_>>());
    assert_eq!(f.queue.len(), 40);
    assert_eq!(f.journal.queue_len(f.queue.id()).unwrap(), 40, "acks remove entries from storage");
}

#[test]
fn after_a_reload_only_entries_delivered_before_are_redeliveries() {
    let mut f = fixture(|_| {});
    for n in 0..4 {
        f.publish(n, 1);
    }
    let mut rx = f.consumer(1, 2);
    assert_eq!(drain(&mut rx), vec![(0, false, 0), (1, false, 1)], "first deliveries");
    // A restart: the two delivered entries may have reached the client, the others not.
    let config = f.queue.config().clone();
    f.queue = Queue::load(f.queue.id(), config, &f.journal);
    let mut rx = f.consumer(2, 10);
    assert_eq!(
        drain(&mut rx),
        vec![(0, true, 0), (1, true, 1), (2, false, 2), (3, false, 3)],
        "DUP / redelivered only where a delivery may have happened"
    );
}

#[test]
fn detach_returns_unacked_in_order_as_redeliveries() {
    let mut f = fixture(|_| {});
    let mut rx = f.consumer(1, 3);
    for n in 0..5 {
        f.publish(n, 1);
        f.pump();
    }
    assert_eq!(drain(&mut rx).iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(), vec![(0, false), (1, false), (2, false)]);
    f.queue.ack(1, &mut f.fx.ops);
    f.queue.detach(1, &mut f.fx);
    let mut rx2 = f.consumer(2, 10);
    let got: Vec<(u32, bool)> = drain(&mut rx2).iter().map(|d| (d.0, d.1)).collect();
    assert_eq!(got, vec![(0, true), (2, true), (3, false), (4, false)]);
}

#[test]
fn full_session_queue_evicts_qos0_from_storage_first_then_drops_new() {
    let mut f = fixture(|c| {
        c.max_len = 4;
        c.overflow = Overflow::DropQos0First;
    });
    assert_eq!(f.publish(0, 0), Admission::Accepted);
    assert_eq!(f.publish(1, 1), Admission::Accepted);
    assert_eq!(f.publish(2, 0), Admission::Accepted);
    assert_eq!(f.publish(3, 1), Admission::Accepted);
    assert_eq!(f.publish(4, 0), Admission::Dropped, "a QoS 0 message is dropped when full");
    assert_eq!(f.publish(5, 1), Admission::EvictedQos0);
    assert_eq!(f.publish(6, 1), Admission::EvictedQos0);
    assert_eq!(f.publish(7, 1), Admission::Dropped, "no QoS 0 left to evict");
    let mut rx = f.consumer(1, 10);
    assert_eq!(numbers(&drain(&mut rx)), vec![1, 3, 5, 6]);
    assert_eq!(f.queue.len(), 4);
}

#[test]
fn an_append_that_raced_the_load_is_counted_once() {
    let mut f = fixture(|c| {
        c.max_len = 5;
        c.overflow = Overflow::DropQos0First;
    });
    // Stored, but its completion is still on its way when the shard loads the queue
    // (for a consumer that attaches and detaches at once).
    let first = message(0, 0, now_ms());
    let (offset, ptr) = f.store(&first);
    let config = f.queue.config().clone();
    f.queue = Queue::load(f.queue.id(), config, &f.journal);
    drop(f.consumer(1, 10));
    f.queue.detach(1, &mut f.fx);
    assert_eq!(f.complete(offset, ptr, &first), Admission::Accepted);
    assert_eq!(f.queue.len(), 1, "counted by the load only");
    for n in 1..3 {
        f.publish(n, 0);
    }
    let admitted: Vec<Admission> = (10..16).map(|n| f.publish(n, 1)).collect();
    assert_eq!(admitted[5], Admission::Dropped, "the sixth QoS 1 message finds no QoS 0 left to evict");
    assert_eq!(f.queue.len(), 5);
    let mut rx = f.consumer(2, 10);
    assert_eq!(numbers(&drain(&mut rx)), (10..15).collect::<Vec<_>>());
}

#[test]
fn a_deduplicated_append_that_raced_the_load_is_no_duplicate_of_itself() {
    let mut f = fixture(|c| c.dedup = true);
    let mut msg = message(0, 1, now_ms());
    let header = (crate::core::dedup::HEADER.to_owned(), crate::core::value::Value::Str("k".into()));
    Arc::make_mut(&mut msg).props.headers.push(header);
    let (offset, ptr) = f.store(&msg);
    // Loaded (and its index read) before the completion arrives.
    let config = f.queue.config().clone();
    f.queue = Queue::load(f.queue.id(), config, &f.journal);
    assert_eq!(f.complete(offset, ptr, &msg), Admission::Accepted);
    assert_eq!(f.publish_msg(msg.clone()), Admission::Duplicate, "its value is in the queue");
    assert_eq!(f.queue.len(), 1);
}

#[test]
fn full_queue_drops_head_into_the_dead_letter_exchange() {
    let mut f = fixture(|c| {
        c.max_len = 2;
        c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
    });
    for n in 0..4 {
        f.publish(n, 1);
    }
    assert_eq!(f.dead(), vec![(0, DeathReason::MaxLen), (1, DeathReason::MaxLen)]);
    let mut rx = f.consumer(1, 10);
    assert_eq!(numbers(&drain(&mut rx)), vec![2, 3]);
}

#[test]
fn reject_publish_drops_new_messages() {
    let mut f = fixture(|c| {
        c.max_len = 1;
        c.overflow = Overflow::RejectPublish;
    });
    assert_eq!(f.publish(0, 1), Admission::Accepted);
    assert!(!f.queue.config().admit(10), "publishers are told the queue is full");
    assert_eq!(f.publish(1, 1), Admission::Dropped, "a publish that raced the check is dropped");
    let mut rx = f.consumer(1, 10);
    assert_eq!(numbers(&drain(&mut rx)), vec![0]);
}

#[test]
fn requeue_goes_back_in_place_and_reject_dead_letters() {
    let mut f = fixture(|c| c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None }));
    let mut rx = f.consumer(1, 2);
    for n in 0..4 {
        f.publish(n, 1);
        f.pump();
    }
    assert_eq!(numbers(&drain(&mut rx)), vec![0, 1]);
    f.queue.requeue(1, RequeueCause::Failed, &mut f.fx);
    f.queue.reject(0, &mut f.fx);
    assert_eq!(f.dead(), vec![(0, DeathReason::Rejected)]);
    f.pump();
    let got = drain(&mut rx);
    assert_eq!(got.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(), vec![(1, true), (2, false)]);
}

#[test]
fn delivery_limit_allows_limit_plus_one_deliveries() {
    let mut f = fixture(|c| {
        c.delivery_limit = Some(1);
        c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
    });
    let mut rx = f.consumer(1, 1);
    f.publish(7, 1);
    f.pump();
    assert_eq!(numbers(&drain(&mut rx)), vec![7]);
    f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
    f.pump();
    assert_eq!(numbers(&drain(&mut rx)), vec![7], "second delivery (limit 1 allows 2)");
    f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
    f.pump();
    assert!(drain(&mut rx).is_empty());
    assert_eq!(f.dead(), vec![(7, DeathReason::DeliveryLimit)]);
    assert_eq!(f.queue.len(), 0);
}

#[test]
fn a_retry_waits_aside_and_survives_a_reload() {
    let policy = RetryPolicy { on: RetryOn::Failed, backoff: Backoff::Linear { min_ms: 60_000, max_ms: 60_000 } };
    let mut f = fixture(|c| c.retry = Some(policy));
    let mut rx = f.consumer(1, 10);
    for n in 0..3 {
        f.publish(n, 1);
        f.pump();
    }
    assert_eq!(numbers(&drain(&mut rx)), vec![0, 1, 2]);
    f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
    assert!(f.fx.durable, "a retry wait is written durably");
    f.queue.requeue(1, RequeueCause::Returned, &mut f.fx);
    f.pump();
    let got: Vec<(u32, bool)> = drain(&mut rx).iter().map(|d| (d.0, d.1)).collect();
    assert_eq!(got, vec![(1, true)], "`failed` only: a returned message comes back at once, the failed one waits");
    assert_eq!((f.queue.waiting_len(), f.queue.ready_len()), (1, 0));
    let timers = f.journal.timers_due(u64::MAX, 10).unwrap();
    assert_eq!(timers.len(), 1);
    assert_eq!(retry::decode_target(&timers[0].target), Some((f.queue.id(), 0)));

    // A restart: the waiting entry stays aside; the unacked ones come back.
    let config = f.queue.config().clone();
    f.queue = Queue::load(f.queue.id(), config, &f.journal);
    f.fx.ops.extend(f.queue.take_load_ops());
    f.flush();
    assert_eq!(f.journal.timers_due(u64::MAX, 10).unwrap(), timers, "the timer is kept (not duplicated)");
    let mut rx = f.consumer(2, 10);
    assert_eq!(numbers(&drain(&mut rx)), vec![1, 2]);
    f.queue.retry_due(0, timers[0].due_ms - 1);
    f.pump();
    assert!(drain(&mut rx).is_empty(), "a timer older than the wait is ignored");
    f.queue.retry_due(0, timers[0].due_ms);
    f.pump();
    let Ok(ConsumerEvent::Deliver(d)) = rx.try_recv() else { panic!("no redelivery") };
    assert_eq!((n_of(&d.msg), d.redelivered), (0, true));
    f.queue.ack(0, &mut f.fx.ops);
    f.flush();
    let records = f.journal.scan(Space::Retry, b"").unwrap();
    assert!(
        !records.iter().any(|(k, v)| retry::decode_record(k, v).is_some()),
        "the retry record leaves with the entry"
    );
}

#[test]
fn ttl_expires_the_head_and_dead_letters() {
    let mut f = fixture(|c| {
        c.message_ttl = Some(1000);
        c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
    });
    f.publish_msg(message(1, 1, now_ms() - 5000));
    f.publish_msg(message(2, 1, now_ms()));
    assert!(f.queue.may_expire());
    f.queue.expire(&f.journal, &mut f.fx);
    assert_eq!(f.dead(), vec![(1, DeathReason::Expired)]);
    assert_eq!(f.queue.len(), 1);
}

#[test]
fn ttl_zero_delivers_at_once_or_expires() {
    let mut f = fixture(|c| {
        c.message_ttl = Some(0);
        c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
    });
    f.publish(1, 1);
    assert_eq!(f.dead(), vec![(1, DeathReason::Expired)], "nobody to take it: expired at once");
    assert_eq!(f.queue.len(), 0);
    let mut rx = f.consumer(1, 1);
    f.publish(2, 1);
    f.pump();
    assert_eq!(numbers(&drain(&mut rx)), vec![2], "a consumer with credit takes it at once");
    f.publish(3, 1);
    assert_eq!(f.dead(), vec![(3, DeathReason::Expired)], "no credit left: expired");
    assert!(drain(&mut rx).is_empty());
}

#[test]
fn get_purge_and_delete() {
    let mut f = fixture(|_| {});
    for n in 0..5 {
        f.publish(n, 1);
    }
    let got = f.queue.get(9, false, &f.journal, &mut f.fx).unwrap();
    assert_eq!((n_of(&got.delivery.msg), got.remaining), (0, 4));
    let got = f.queue.get(9, true, &f.journal, &mut f.fx).unwrap();
    assert_eq!((n_of(&got.delivery.msg), got.remaining), (1, 3));
    assert_eq!(f.queue.purge(&mut f.fx.ops), 3, "ready messages only");
    f.flush();
    assert_eq!(f.queue.len(), 1, "the unacked get stays");
    assert_eq!(f.journal.queue_len(f.queue.id()).unwrap(), 1);
    f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
    let mut rx = f.consumer(1, 10);
    assert_eq!(drain(&mut rx).iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(), vec![(0, true)]);
    assert_eq!(f.queue.delete(&mut f.fx.ops), 1);
    assert!(matches!(rx.try_recv(), Ok(ConsumerEvent::Cancelled { consumer: 1, .. })));
}

#[test]
fn single_active_consumer_and_priorities() {
    let mut f = fixture(|c| c.single_active_consumer = true);
    let mut a = f.consumer(1, 10);
    let mut b = f.consumer(2, 10);
    for n in 0..3 {
        f.publish(n, 1);
        f.pump();
    }
    assert_eq!(numbers(&drain(&mut a)), vec![0, 1, 2]);
    assert!(drain(&mut b).is_empty());
    f.queue.detach(1, &mut f.fx);
    f.pump();
    assert_eq!(numbers(&drain(&mut b)), vec![0, 1, 2], "the next consumer takes over from the first unacked");

    let mut f = fixture(|_| {});
    let mut low = f.consumer_with(1, 10, 0);
    let mut high = f.consumer_with(2, 1, 5);
    for n in 0..3 {
        f.publish(n, 1);
        f.pump();
    }
    assert_eq!(numbers(&drain(&mut high)), vec![0], "higher priority first, while it has credit");
    assert_eq!(numbers(&drain(&mut low)), vec![1, 2]);
}

#[test]
fn offset_span_limit_holds_back_deliveries() {
    let mut f = fixture(|c| c.max_offset_span = Some(3));
    let mut rx = f.consumer(1, 10);
    for n in 0..6 {
        f.publish(n, 1);
        f.pump();
    }
    assert_eq!(drain(&mut rx).len(), 3, "offsets 0..3 only while 0 is unacked");
    f.queue.ack(0, &mut f.fx.ops);
    f.pump();
    assert_eq!(drain(&mut rx).iter().map(|d| d.0).collect::<Vec<_>>(), vec![3]);
}

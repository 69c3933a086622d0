//! Stream owner tests against a real journal: cursors, consumer groups (split, resume
//! across a reload, returned entries, reset) and retention.

use bytes::Bytes;
use ferrymq_storage::{Append, JournalConfig, QueueTarget, Record};
use tokio::sync::mpsc;

use super::*;
use crate::core::message::{Message, Properties};

struct Fixture {
    dir: tempfile::TempDir,
    journal: Journal,
    stream: Stream,
}

fn open(dir: tempfile::TempDir) -> Fixture {
    let mut cfg = JournalConfig::new(dir.path());
    cfg.fsync = ferrymq_storage::FsyncPolicy::Never;
    let journal = Journal::open(cfg).unwrap();
    let id = journal.queue_id("s").unwrap();
    let stream = Stream::load(id, Arc::new(StreamConfig::new("s", "/")), &journal);
    Fixture { dir, journal, stream }
}

fn fixture() -> Fixture {
    open(tempfile::tempdir().unwrap())
}

type Rx = mpsc::UnboundedReceiver<ConsumerEvent>;

impl Fixture {
    fn publish_at(&mut self, n: u32, timestamp_ms: u64) {
        let msg = Arc::new(Message {
            exchange: String::new(),
            routing_key: "s".into(),
            payload: Bytes::from(n.to_be_bytes().to_vec()),
            qos: 1,
            retain: false,
            props: Properties::default(),
            timestamp_ms,
        });
        let r = self
            .journal
            .write_blocking(vec![Op::Append(Append {
                record: Record { header: msg.encode_header(), body: msg.payload.clone() },
                queues: vec![QueueTarget { queue: self.stream.id(), tag_hash: 0, flags: 1 }],
                retained_topic: None,
                timer: None,
                keys: None,
            })])
            .unwrap();
        let a = &r.appended[0];
        let ptr = Pointer { pos: a.pos, size: a.size, body_len: 4, tag_hash: 0, flags: 1 };
        self.stream.appended(a.offsets[0].1, ptr, &msg);
        self.pump();
    }

    fn publish(&mut self, range: std::ops::Range<u32>) {
        for n in range {
            self.publish_at(n, crate::core::message::now_ms());
        }
    }

    fn attach(&mut self, id: ConsumerId, credit: u32, start: StreamOffset, group: Option<&str>) -> Rx {
        let (tx, rx) = mpsc::unbounded_channel();
        self.stream.attach(id, tx, credit, start, group.map(str::to_owned), &self.journal);
        self.pump();
        rx
    }

    /// Pumps and stores group cursors, as the shard does at the end of a turn.
    fn pump(&mut self) {
        self.stream.pump(&self.journal);
        let mut ops = Vec::new();
        self.stream.take_cursor_writes(&mut ops);
        if !ops.is_empty() {
            self.journal.write_blocking(ops).unwrap();
        }
    }

    fn ack(&mut self, consumer: ConsumerId, offsets: &[u64]) {
        for o in offsets {
            self.stream.settle(consumer, *o);
        }
        self.pump();
    }

    /// Simulates a restart: the journal is closed and reopened, the stream reloaded.
    fn restart(self) -> Fixture {
        self.journal.close().unwrap();
        drop(self.stream);
        drop(self.journal);
        open(self.dir)
    }
}

/// (offset, message number, redelivered) of every delivery waiting in `rx`.
fn drain(rx: &mut Rx) -> Vec<(u64, u32, bool)> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let ConsumerEvent::Deliver(d) = ev {
            out.push((d.offset, u32::from_be_bytes(d.msg.payload[..4].try_into().unwrap()), d.redelivered));
        }
    }
    out
}

fn offsets(v: &[(u64, u32, bool)]) -> Vec<u64> {
    v.iter().map(|d| d.0).collect()
}

#[test]
fn each_consumer_has_its_own_cursor_and_credit() {
    let mut f = fixture();
    f.publish(0..5);
    let mut a = f.attach(1, 2, StreamOffset::First, None);
    let mut b = f.attach(2, 10, StreamOffset::Offset(3), None);
    let mut c = f.attach(3, 10, StreamOffset::Next, None);
    assert_eq!(offsets(&drain(&mut a)), vec![0, 1]);
    assert_eq!(offsets(&drain(&mut b)), vec![3, 4]);
    f.ack(1, &[0]);
    assert_eq!(offsets(&drain(&mut a)), vec![2]);
    f.publish(5..6);
    assert_eq!(offsets(&drain(&mut c)), vec![5]);
    assert_eq!(f.stream.len(), 6, "nothing removed by consuming");
}

#[test]
fn a_group_splits_entries_and_groups_each_get_everything() {
    let mut f = fixture();
    let mut a = f.attach(1, 100, StreamOffset::First, Some("g"));
    let mut b = f.attach(2, 100, StreamOffset::First, Some("g"));
    let mut other = f.attach(3, 100, StreamOffset::First, Some("h"));
    f.publish(0..10);
    let (da, db) = (offsets(&drain(&mut a)), offsets(&drain(&mut b)));
    assert!(!da.is_empty() && !db.is_empty(), "both members get work: {da:?} {db:?}");
    let mut all: Vec<u64> = da.iter().chain(&db).copied().collect();
    all.sort();
    assert_eq!(all, (0..10).collect::<Vec<_>>(), "each entry to exactly one member");
    assert_eq!(offsets(&drain(&mut other)), (0..10).collect::<Vec<_>>(), "another group gets everything");
}

#[test]
fn a_departing_members_unacked_entries_go_to_the_others() {
    let mut f = fixture();
    f.publish(0..4);
    let mut a = f.attach(1, 2, StreamOffset::First, Some("g"));
    assert_eq!(offsets(&drain(&mut a)), vec![0, 1]);
    let mut b = f.attach(2, 10, StreamOffset::First, Some("g"));
    assert_eq!(offsets(&drain(&mut b)), vec![2, 3]);
    f.ack(1, &[1]);
    f.stream.detach(1);
    f.pump();
    assert_eq!(drain(&mut b), vec![(0, 0, true)], "only the unacked one comes again, marked redelivered");
}

#[test]
fn a_group_resumes_after_a_restart_without_redelivering_acks_or_skipping_unacked() {
    let mut f = fixture();
    f.publish(0..6);
    let mut a = f.attach(1, 10, StreamOffset::First, Some("g"));
    assert_eq!(offsets(&drain(&mut a)), (0..6).collect::<Vec<_>>());
    // 0, 1 and 3, 4 acked: committed offset 2, acks above the gap remembered.
    f.ack(1, &[0, 1, 3, 4]);
    assert_eq!(f.stream.group_cursor("g").map(|c| (c.committed, c.acked.len())), Some((2, 2)));
    let mut f = f.restart();
    assert_eq!(f.stream.len(), 6);
    // The group's cursor wins over the consumer's x-stream-offset.
    let mut a = f.attach(7, 10, StreamOffset::Next, Some("g"));
    assert_eq!(offsets(&drain(&mut a)), vec![2, 5]);
    f.ack(7, &[2, 5]);
    assert_eq!(f.stream.group_cursor("g").map(|c| (c.committed, c.acked.len())), Some((6, 0)));
    // A new group starts at `next` by default.
    let mut fresh = f.attach(8, 10, StreamOffset::Next, Some("new"));
    f.publish(6..7);
    assert_eq!(offsets(&drain(&mut fresh)), vec![6]);
}

#[test]
fn reset_moves_a_group_to_an_offset_or_a_timestamp_durably() {
    let mut f = fixture();
    for n in 0..3 {
        f.publish_at(n, 1_000_000 + n as u64 * 1000);
    }
    for n in 3..6 {
        f.publish_at(n, 2_000_000 + n as u64 * 1000);
    }
    let mut a = f.attach(1, 10, StreamOffset::First, Some("g"));
    let got = offsets(&drain(&mut a));
    f.ack(1, &got);
    assert_eq!(f.stream.group_cursor("g").unwrap().committed, 6);
    assert_eq!(f.stream.reset_group("g", StreamOffset::Timestamp(2_000_000), &f.journal), 3);
    f.pump();
    assert_eq!(offsets(&drain(&mut a)), vec![3, 4, 5], "members continue from the reset point");
    // Reset of a group without members, then a restart: the stored cursor is the reset one.
    assert_eq!(f.stream.reset_group("idle", StreamOffset::Offset(1), &f.journal), 1);
    f.pump();
    let mut f = f.restart();
    let mut b = f.attach(2, 10, StreamOffset::Next, Some("idle"));
    assert_eq!(offsets(&drain(&mut b)), (1..6).collect::<Vec<_>>());
}

/// Six entries, four of them older than a 5 s `x-max-age`, trimmed by one retention pass;
/// returns the fixture and the pass's clock.
fn trimmed_to_the_last_two() -> (Fixture, u64) {
    let mut f = fixture();
    let now = crate::core::message::now_ms();
    for n in 0..4 {
        f.publish_at(n, now - 10_000);
    }
    f.publish(4..6);
    let mut config = StreamConfig::new("s", "/");
    config.max_age_ms = Some(5_000);
    f.stream.set_config(Arc::new(config), &f.journal);
    let mut ops = Vec::new();
    assert!(f.stream.enforce_retention(&f.journal, now, &mut ops));
    f.journal.write_blocking(ops).unwrap();
    (f, now)
}

#[test]
fn retention_trims_the_oldest_and_moves_cursors_and_groups() {
    let (mut f, now) = trimmed_to_the_last_two();
    assert_eq!((f.stream.first_offset(), f.stream.len()), (4, 2));
    let mut c = f.attach(1, 10, StreamOffset::Offset(0), None);
    assert_eq!(offsets(&drain(&mut c)), vec![4, 5]);
    let mut g = f.attach(2, 10, StreamOffset::First, Some("g"));
    assert_eq!(offsets(&drain(&mut g)), vec![4, 5]);
    let mut ops = Vec::new();
    assert!(!f.stream.enforce_retention(&f.journal, now, &mut ops), "nothing more to trim");
}

#[test]
fn a_reloaded_stream_knows_its_extent_without_reading_its_entries() {
    let (f, _) = trimmed_to_the_last_two();
    let mut f = f.restart();
    assert_eq!(
        (f.stream.first_offset(), f.stream.len(), f.stream.counting_bytes()),
        (4, 2, true),
        "no scan at load without a byte limit"
    );
    let mut c = f.attach(1, 10, StreamOffset::First, None);
    assert_eq!(offsets(&drain(&mut c)), vec![4, 5]);
    // A byte limit arriving later counts the bytes once.
    let mut config = StreamConfig::new("s", "/");
    config.max_bytes = Some(1 << 20);
    f.stream.set_config(Arc::new(config), &f.journal);
    assert_eq!((f.stream.bytes, f.stream.counting_bytes()), (8, false));
}

#[test]
fn a_reloaded_stream_counts_the_bytes_it_held_a_page_at_a_time() {
    let mut f = fixture();
    f.publish(0..10);
    let mut f = f.restart();
    f.publish(10..12);
    assert_eq!(f.stream.bytes, 8, "only what came after the load");
    assert!(f.stream.count_bytes(&f.journal, 3));
    assert_eq!((f.stream.bytes, f.stream.counting_bytes()), (20, true), "three more entries");
    while f.stream.count_bytes(&f.journal, 3) {}
    assert_eq!((f.stream.bytes, f.stream.counting_bytes()), (48, false), "12 entries of 4 bytes");
    f.stream.publish_gauge();
    let extent = &f.stream.config.extent;
    assert_eq!((extent.first(), extent.last(), extent.end(), extent.bytes_counted()), (0, Some(11), 12, true));
    assert_eq!(f.stream.config.gauge.bytes.load(Ordering::Relaxed), 48);
}

#[test]
fn retention_during_the_count_subtracts_only_what_was_counted() {
    let mut f = fixture();
    let now = crate::core::message::now_ms();
    for n in 0..6 {
        f.publish_at(n, now - 10_000);
    }
    f.publish(6..8);
    let mut f = f.restart();
    f.publish(8..10);
    assert!(f.stream.count_bytes(&f.journal, 2), "offsets 0 and 1 counted");
    let mut config = StreamConfig::new("s", "/");
    config.max_age_ms = Some(5_000);
    f.stream.set_config(Arc::new(config), &f.journal);
    let mut ops = Vec::new();
    assert!(f.stream.enforce_retention(&f.journal, now, &mut ops), "offsets 0..6 are too old");
    f.journal.write_blocking(ops).unwrap();
    assert_eq!(f.stream.bytes, 8, "the two appended since the load; 2..6 were never counted");
    while f.stream.count_bytes(&f.journal, 100) {}
    assert_eq!((f.stream.first_offset(), f.stream.len(), f.stream.bytes), (6, 4, 16));
}

#[test]
fn an_exclusive_group_is_read_by_its_active_member_and_changes_hands_after_settlement() {
    let mut f = fixture();
    f.publish(0..6);
    // As the shard attaches a member of an exclusive group: exclusive before any pump.
    let member = |f: &mut Fixture, id| {
        let (tx, rx) = mpsc::unbounded_channel();
        f.stream.attach(id, tx, 2, StreamOffset::First, Some("g".into()), &f.journal);
        f.stream.make_exclusive("g");
        f.pump();
        rx
    };
    let mut a = member(&mut f, 1);
    let mut b = member(&mut f, 2);
    assert!(drain(&mut a).is_empty() && drain(&mut b).is_empty(), "nobody reads before a member is named");
    f.stream.activate("g", Some(1));
    f.pump();
    assert_eq!(offsets(&drain(&mut a)), vec![0, 1]);
    assert!(drain(&mut b).is_empty());
    // B is named while A holds 0 and 1: B waits until they are settled or returned.
    f.stream.activate("g", Some(2));
    f.pump();
    assert!(drain(&mut b).is_empty(), "the hand-over waits for A's entries");
    f.ack(1, &[0]);
    assert!(drain(&mut b).is_empty() && drain(&mut a).is_empty(), "A gets nothing more; B still waits for 1");
    f.stream.returned(1, 1);
    f.pump();
    assert_eq!(drain(&mut b), vec![(1, 1, true), (2, 2, false)], "returned first, then in order");
    // The group's last member leaves: the next members share it as they say.
    f.stream.detach(1);
    f.stream.detach(2);
    let mut c = f.attach(3, 10, StreamOffset::First, Some("g"));
    assert_eq!(offsets(&drain(&mut c)), vec![1, 2, 3, 4, 5], "a plain member reads again (1 and 2 were returned)");
}

//! Model-based property test: random sequences of submissions (appends, enqueues,
//! removals, flag changes, queue deletion, retained, timers, KV), segment rolls, restarts
//! and crashes are applied to the journal and to an in-memory model; after every step both
//! must agree.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use ferrymq_storage::{
    Append, FsyncPolicy, Journal, JournalConfig, JournalError, LogPos, Op, Pointer, QueueId, QueueTarget, Receipt,
    Record, Space, Timer, TimerEntry,
};
use proptest::prelude::*;

const QUEUES: usize = 3;
const SPACES: [Space; 3] = [Space::Session, Space::InboundQos2, Space::Meta];

#[derive(Debug, Clone)]
enum OpSpec {
    Append { reps: usize, queues: Vec<u8>, retained: Option<u8>, timer: Option<u8> },
    Enqueue { pick: usize, queues: Vec<u8>, dead: bool },
    Remove { queue: u8, pick: usize },
    SetFlags { queue: u8, pick: usize, flags: u8 },
    DeleteQueue { queue: u8 },
    DeleteRetained { topic: u8 },
    DeleteTimer { pick: usize },
    Put { space: u8, key: u8, value: u8 },
    Delete { space: u8, key: u8 },
    DeletePrefix { space: u8, prefix: u8 },
}

#[derive(Debug, Clone)]
enum Step {
    /// Submissions sent back to back (so several may share a group commit).
    Submit(Vec<Vec<OpSpec>>),
    /// Close and reopen.
    Restart,
    /// Stop as a crash would (no checkpoint) and reopen: the log since the checkpoint is
    /// replayed.
    Crash,
    /// A crash that also tears the consume-queue files: whatever was written to them since
    /// the journal was opened (when a run takes no checkpoints but the one at open) is cut
    /// off (`true`) or overwritten with garbage; recovery rebuilds it from the log.
    CrashTorn(bool, u64),
    /// `queue_id` of the queue's name (a new id if the queue was deleted).
    Name(u8),
    /// Close the active segment whatever its size (`roll_segment`): changes nothing the
    /// model sees, before or after a crash.
    Roll,
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    let queues = || prop::collection::vec(0u8..QUEUES as u8, 0..3);
    prop_oneof![
        5 => (prop_oneof![9 => Just(1usize), 1 => Just(12usize)], queues(), prop::option::of(0u8..3), prop::option::of(0u8..40))
            .prop_map(|(reps, queues, retained, timer)| OpSpec::Append { reps, queues, retained, timer }),
        1 => (any::<usize>(), prop::collection::vec(0u8..QUEUES as u8, 1..3), prop::bool::weighted(0.2))
            .prop_map(|(pick, queues, dead)| OpSpec::Enqueue { pick, queues, dead }),
        3 => (0u8..QUEUES as u8, any::<usize>()).prop_map(|(queue, pick)| OpSpec::Remove { queue, pick }),
        1 => (0u8..QUEUES as u8, any::<usize>(), any::<u8>())
            .prop_map(|(queue, pick, flags)| OpSpec::SetFlags { queue, pick, flags }),
        1 => (0u8..QUEUES as u8).prop_map(|queue| OpSpec::DeleteQueue { queue }),
        1 => (0u8..3).prop_map(|topic| OpSpec::DeleteRetained { topic }),
        1 => any::<usize>().prop_map(|pick| OpSpec::DeleteTimer { pick }),
        2 => (0u8..3, 0u8..6, any::<u8>()).prop_map(|(space, key, value)| OpSpec::Put { space, key, value }),
        1 => (0u8..3, 0u8..6).prop_map(|(space, key)| OpSpec::Delete { space, key }),
        1 => (0u8..3, 0u8..2).prop_map(|(space, prefix)| OpSpec::DeletePrefix { space, prefix }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => prop::collection::vec(prop::collection::vec(op_spec(), 1..4), 1..4).prop_map(Step::Submit),
        1 => Just(Step::Restart),
        1 => Just(Step::Crash),
        1 => (any::<bool>(), any::<u64>()).prop_map(|(cut, seed)| Step::CrashTorn(cut, seed)),
        1 => (0u8..QUEUES as u8).prop_map(Step::Name),
        1 => Just(Step::Roll),
    ]
}

fn policy() -> impl Strategy<Value = FsyncPolicy> {
    prop_oneof![
        Just(FsyncPolicy::Never),
        Just(FsyncPolicy::Always),
        Just(FsyncPolicy::Interval(std::time::Duration::from_millis(2))),
    ]
}

fn kv_key(key: u8) -> Vec<u8> {
    vec![b'a' + key % 2, b'0' + key / 2 % 3]
}

fn record(n: u64, reps: usize) -> Record {
    let one = common::body(n);
    let mut body = Vec::with_capacity(one.len() * reps);
    for _ in 0..reps {
        body.extend_from_slice(&one);
    }
    Record { header: Bytes::copy_from_slice(&n.to_be_bytes()), body: Bytes::from(body) }
}

#[derive(Debug, Clone)]
struct ModelRecord {
    reps: usize,
    /// Position and size, once the receipt told them.
    at: Option<(LogPos, u32)>,
}

#[derive(Debug, Clone)]
struct ModelQueue {
    id: QueueId,
    named: bool,
    next: u64,
    /// offset -> (record id, tag hash, flags)
    entries: BTreeMap<u64, (usize, u32, u8)>,
}

#[derive(Debug, Clone)]
struct Model {
    records: Vec<ModelRecord>,
    queues: Vec<ModelQueue>,
    retained: BTreeMap<String, usize>,
    /// (due, record id) -> target
    timers: BTreeMap<(u64, usize), Vec<u8>>,
    kv: Vec<BTreeMap<Vec<u8>, Vec<u8>>>,
}

/// What a submission's receipt must say: per Append/Enqueue, the record and the offsets.
struct Expect {
    appended: Vec<(usize, Vec<(QueueId, u64)>)>,
    fails: bool,
}

impl Model {
    fn known(&self) -> Vec<usize> {
        (0..self.records.len()).filter(|&r| self.records[r].at.is_some()).collect()
    }

    /// Body length of record `rid` (what its pointers carry).
    fn body_len(&self, rid: usize) -> u32 {
        (common::body(rid as u64).len() * self.records[rid].reps) as u32
    }

    fn targets(&mut self, queues: &[u8], rid: usize, tag: u32, flags: u8) -> (Vec<QueueTarget>, Vec<(QueueId, u64)>) {
        let mut targets = Vec::new();
        let mut offsets = Vec::new();
        for &q in queues {
            let mq = &mut self.queues[q as usize];
            targets.push(QueueTarget { queue: mq.id, tag_hash: tag, flags });
            if !mq.named {
                // A deleted queue: the journal drops the pointer.
                continue;
            }
            offsets.push((mq.id, mq.next));
            mq.entries.insert(mq.next, (rid, tag, flags));
            mq.next += 1;
        }
        (targets, offsets)
    }

    /// Turns specs into ops, applying them to the model as the journal will.
    fn build(&mut self, specs: &[OpSpec]) -> (Vec<Op>, Expect) {
        let mut ops = Vec::new();
        let mut expect = Expect { appended: Vec::new(), fails: false };
        for spec in specs {
            match spec {
                OpSpec::Append { reps, queues, retained, timer } => {
                    let rid = self.records.len();
                    self.records.push(ModelRecord { reps: *reps, at: None });
                    let (targets, offsets) = self.targets(queues, rid, rid as u32, 1);
                    let topic = retained.map(|t| format!("t{t}"));
                    if let Some(t) = &topic {
                        self.retained.insert(t.clone(), rid);
                    }
                    let timer = timer.map(|due| {
                        let target = format!("target{rid}").into_bytes();
                        self.timers.insert((due as u64, rid), target.clone());
                        Timer { due_ms: due as u64, target: Bytes::from(target) }
                    });
                    ops.push(Op::Append(Append {
                        record: record(rid as u64, *reps),
                        queues: targets,
                        retained_topic: topic,
                        timer,
                        keys: None,
                    }));
                    expect.appended.push((rid, offsets));
                }
                OpSpec::Enqueue { pick, queues, dead } => {
                    let known = self.known();
                    if *dead {
                        let q = QueueTarget { queue: self.queues[0].id, tag_hash: 0, flags: 0 };
                        ops.push(Op::Enqueue { pos: LogPos(1 << 50), size: 100, body_len: 0, queues: vec![q] });
                        expect.fails = true;
                    } else if !known.is_empty() {
                        let rid = known[pick % known.len()];
                        let (pos, size) = self.records[rid].at.unwrap();
                        let (targets, offsets) = self.targets(queues, rid, 7, 2);
                        ops.push(Op::Enqueue { pos, size, body_len: self.body_len(rid), queues: targets });
                        expect.appended.push((rid, offsets));
                    }
                }
                OpSpec::Remove { queue, pick } => {
                    let mq = &mut self.queues[*queue as usize];
                    let offset = match mq.entries.keys().nth(pick % mq.entries.len().max(1)) {
                        Some(&o) => o,
                        None => mq.next + (*pick as u64 % 3), // no such entry: a no-op
                    };
                    // Half the removals name the record's position, as the broker's acks do;
                    // the others make the writer read the entry back.
                    let at = match mq.entries.remove(&offset) {
                        Some((rid, _, _)) if pick % 2 == 0 => self.records[rid].at.map(|(pos, _)| pos),
                        _ => None,
                    };
                    ops.push(Op::Remove { queue: mq.id, offset, at });
                }
                OpSpec::SetFlags { queue, pick, flags } => {
                    let mq = &mut self.queues[*queue as usize];
                    let offset = match mq.entries.keys().nth(pick % mq.entries.len().max(1)) {
                        Some(&o) => o,
                        None => mq.next + 1,
                    };
                    if let Some(e) = mq.entries.get_mut(&offset) {
                        e.2 = *flags;
                    }
                    ops.push(Op::SetFlags { queue: mq.id, offset, flags: *flags });
                }
                OpSpec::DeleteQueue { queue } => {
                    let mq = &mut self.queues[*queue as usize];
                    mq.entries.clear();
                    mq.next = 0;
                    mq.named = false;
                    ops.push(Op::DeleteQueue { queue: mq.id });
                }
                OpSpec::DeleteRetained { topic } => {
                    let topic = format!("t{topic}");
                    self.retained.remove(&topic);
                    ops.push(Op::DeleteRetained { topic });
                }
                OpSpec::DeleteTimer { pick } => {
                    let known: Vec<(u64, usize)> =
                        self.timers.keys().copied().filter(|&(_, rid)| self.records[rid].at.is_some()).collect();
                    let (due_ms, pos) = match known.get(pick % known.len().max(1)) {
                        Some(&(due, rid)) => {
                            self.timers.remove(&(due, rid));
                            (due, self.records[rid].at.unwrap().0)
                        }
                        None => (999, LogPos(123_456)),
                    };
                    ops.push(Op::DeleteTimer { due_ms, pos });
                }
                OpSpec::Put { space, key, value } => {
                    let k = kv_key(*key);
                    self.kv[*space as usize].insert(k.clone(), vec![*value]);
                    ops.push(Op::Put {
                        space: SPACES[*space as usize],
                        key: Bytes::from(k),
                        value: Bytes::from(vec![*value]),
                    });
                }
                OpSpec::Delete { space, key } => {
                    let k = kv_key(*key);
                    self.kv[*space as usize].remove(&k);
                    ops.push(Op::Delete { space: SPACES[*space as usize], key: Bytes::from(k) });
                }
                OpSpec::DeletePrefix { space, prefix } => {
                    let p = vec![b'a' + prefix];
                    self.kv[*space as usize].retain(|k, _| !k.starts_with(&p));
                    ops.push(Op::DeletePrefix { space: SPACES[*space as usize], prefix: Bytes::from(p) });
                }
            }
        }
        (ops, expect)
    }

    fn at(&self, rid: usize) -> (LogPos, u32) {
        self.records[rid].at.expect("record position known after its receipt")
    }

    fn check(&self, j: &Journal) {
        for (q, mq) in self.queues.iter().enumerate() {
            let want: Vec<(u64, Pointer)> = mq
                .entries
                .iter()
                .map(|(&off, &(rid, tag_hash, flags))| {
                    let (pos, size) = self.at(rid);
                    (off, Pointer { pos, size, body_len: self.body_len(rid), tag_hash, flags })
                })
                .collect();
            assert_eq!(j.queue_entries(mq.id, 0, 10_000).unwrap(), want, "entries of queue {q}");
            assert_eq!(j.queue_len(mq.id).unwrap(), want.len() as u64, "len of queue {q}");
            assert_eq!(j.queue_next_offset(mq.id), mq.next, "next offset of queue {q}");
        }
        let mut names = j.queues().unwrap();
        names.sort();
        let mut want: Vec<(String, QueueId)> =
            self.queues.iter().enumerate().filter(|(_, q)| q.named).map(|(i, q)| (format!("q{i}"), q.id)).collect();
        want.sort();
        assert_eq!(names, want, "queue names");
        let want: Vec<(String, LogPos)> = self.retained.iter().map(|(t, &rid)| (t.clone(), self.at(rid).0)).collect();
        assert_eq!(j.retained().unwrap(), want, "retained");
        let mut want: Vec<TimerEntry> = self
            .timers
            .iter()
            .map(|(&(due_ms, rid), target)| {
                let (pos, size) = self.at(rid);
                TimerEntry { due_ms, pos, size, target: Bytes::from(target.clone()) }
            })
            .collect();
        want.sort_by_key(|t| (t.due_ms, t.pos));
        assert_eq!(j.timers_due(u64::MAX, 10_000).unwrap(), want, "timers");
        assert_eq!(j.next_timer().unwrap(), want.first().map(|t| t.due_ms));
        for (i, space) in SPACES.iter().enumerate() {
            let got: Vec<(Vec<u8>, Vec<u8>)> =
                j.scan(*space, b"").unwrap().into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
            let want: Vec<(Vec<u8>, Vec<u8>)> = self.kv[i].clone().into_iter().collect();
            assert_eq!(got, want, "keyspace {space:?}");
        }
        for (rid, r) in self.records.iter().enumerate() {
            if let Some((pos, _)) = r.at {
                assert_eq!(j.read(pos).unwrap(), record(rid as u64, r.reps), "record {rid}");
            }
        }
    }
}

fn config(dir: &Path, policy: FsyncPolicy, checkpoints: bool) -> JournalConfig {
    let mut c = common::config(dir, policy);
    c.segment_size = 1024;
    c.max_batch = 3;
    if checkpoints {
        // Checkpoints land anywhere in a run, so crashes replay from changing places.
        c.checkpoint_interval = std::time::Duration::from_millis(3);
    } else {
        // Only the one each open writes: nothing written since is trusted by recovery.
        c.checkpoint_interval = std::time::Duration::from_secs(3600);
        c.checkpoint_bytes = 0;
    }
    c
}

/// Lengths of the consume-queue files.
fn cq_files(dir: &Path) -> BTreeMap<std::path::PathBuf, u64> {
    let mut files = BTreeMap::new();
    let Ok(queues) = std::fs::read_dir(dir.join("cq")) else { return files };
    for q in queues {
        for f in std::fs::read_dir(q.unwrap().path()).unwrap() {
            let f = f.unwrap();
            files.insert(f.path(), f.metadata().unwrap().len());
        }
    }
    files
}

/// Cuts every consume-queue file back to its length in `at_open`, or overwrites what
/// grew since with garbage.
fn tear_cq_files(dir: &Path, at_open: &BTreeMap<std::path::PathBuf, u64>, cut: bool, mut seed: u64) {
    use std::os::unix::fs::FileExt;
    for (path, len) in cq_files(dir) {
        let kept = at_open.get(&path).copied().unwrap_or(0).min(len);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        if cut {
            f.set_len(kept).unwrap();
        } else {
            let garbage: Vec<u8> = (kept..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // Often the presence byte, so that torn entries look written.
                    if seed >> 62 == 0 {
                        0xCE
                    } else {
                        (seed >> 33) as u8
                    }
                })
                .collect();
            f.write_all_at(&garbage, kept).unwrap();
        }
    }
}

fn run(policy: FsyncPolicy, checkpoints: bool, steps: Vec<Step>) {
    let dir = tempfile::tempdir().unwrap();
    let config = |dir: &Path| config(dir, policy, checkpoints);
    let mut j = Journal::open(config(dir.path())).unwrap();
    let mut at_open = cq_files(dir.path());
    let queues = (0..QUEUES)
        .map(|i| ModelQueue {
            id: j.queue_id(&format!("q{i}")).unwrap(),
            named: true,
            next: 0,
            entries: BTreeMap::new(),
        })
        .collect();
    let mut model = Model {
        records: Vec::new(),
        queues,
        retained: BTreeMap::new(),
        timers: BTreeMap::new(),
        kv: vec![BTreeMap::new(); 3],
    };
    for step in steps {
        match step {
            Step::Restart => {
                j.close().unwrap();
                drop(j);
                j = Journal::open(config(dir.path())).unwrap();
                at_open = cq_files(dir.path());
            }
            Step::Crash | Step::CrashTorn(..) => {
                j.crash();
                drop(j);
                if let (Step::CrashTorn(cut, seed), false) = (&step, checkpoints) {
                    tear_cq_files(dir.path(), &at_open, *cut, *seed);
                }
                j = Journal::open(config(dir.path())).unwrap();
                at_open = cq_files(dir.path());
                assert!(!j.stats().index_scanned, "replayed, not scanned");
            }
            Step::Roll => {
                // Behind whatever is still to be logged (a queue's name mapping).
                j.write_blocking(vec![]).unwrap();
                let before = j.stats();
                let rolled = j.roll_segment().unwrap();
                let after = j.stats();
                assert_eq!(after.log_end, before.log_end, "positions stay contiguous");
                assert_eq!(after.segments, before.segments + u64::from(rolled));
            }
            Step::Name(q) => {
                let id = j.queue_id(&format!("q{q}")).unwrap();
                let mq = &mut model.queues[q as usize];
                if mq.named {
                    assert_eq!(id, mq.id);
                } else {
                    assert_ne!(id, mq.id, "ids are never reused");
                    *mq = ModelQueue { id, named: true, next: 0, entries: BTreeMap::new() };
                }
            }
            Step::Submit(subs) => {
                let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<Receipt, JournalError>)>();
                let mut expects = Vec::new();
                for (i, specs) in subs.iter().enumerate() {
                    let mut next = model.clone();
                    let (ops, expect) = next.build(specs);
                    if !expect.fails {
                        model = next;
                    }
                    expects.push(expect);
                    let tx = tx.clone();
                    let mut ops = ops;
                    let mut done: Option<ferrymq_storage::Completion> =
                        Some(Box::new(move |r| tx.send((i, r)).unwrap()));
                    loop {
                        match j.try_submit(ops, done) {
                            Ok(()) => break,
                            Err((o, d, _)) => {
                                (ops, done) = (o, d);
                                std::thread::yield_now();
                            }
                        }
                    }
                }
                drop(tx);
                let results: Vec<_> = rx.iter().collect();
                assert_eq!(results.len(), subs.len());
                for ((i, result), expect) in results.into_iter().zip(expects) {
                    if expect.fails {
                        assert_eq!(result, Err(JournalError::NotFound(1 << 50)), "submission {i}");
                        continue;
                    }
                    let receipt = result.unwrap_or_else(|e| panic!("submission {i}: {e}"));
                    assert_eq!(receipt.appended.len(), expect.appended.len());
                    for (got, (rid, offsets)) in receipt.appended.iter().zip(expect.appended) {
                        assert_eq!(got.offsets, offsets, "offsets");
                        let rec = &mut model.records[rid];
                        match rec.at {
                            None => rec.at = Some((got.pos, got.size)),
                            Some(at) => assert_eq!(at, (got.pos, got.size)),
                        }
                    }
                }
            }
        }
        model.check(&j);
        j.verify_counters().unwrap();
    }
    j.close().unwrap();
    drop(j);
    let j = Journal::open(config(dir.path())).unwrap();
    model.check(&j);
    j.verify_counters().unwrap();
}

proptest! {
    // 32 cases keep `cargo test` fast; set PROPTEST_CASES for a longer hunt.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(32),
        max_shrink_iters: 500,
        ..ProptestConfig::default()
    })]

    #[test]
    fn journal_matches_model(
        policy in policy(),
        checkpoints in any::<bool>(),
        steps in prop::collection::vec(step(), 1..30),
    ) {
        run(policy, checkpoints, steps);
    }
}

//! Crash test: a child process (this test binary, re-executed) writes with
//! `FsyncPolicy::Always` from several threads and prints every acknowledged write; the
//! parent kills it with SIGKILL mid-stream, reopens the directory and checks that every
//! acknowledged record, pointer, retained entry and key is there and intact. sled is never
//! flushed on the write path, so what the child acknowledged after the last checkpoint
//! comes back only through the replay of the commit log's effects records.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use ferrymq_storage::{FsyncPolicy, LogPos, Op, Space};

const CHILD_ENV: &str = "FERRYMQ_STORAGE_CRASH_CHILD_DIR";
const THREADS: u64 = 4;
const KILL_AFTER_ACKS: usize = 600;

/// The child's side: runs only when the parent sets `CHILD_ENV`; writes until killed.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let j = open(std::path::Path::new(&dir), FsyncPolicy::Always);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let j = j.clone();
            std::thread::spawn(move || {
                let q = j.queue_id(&format!("q{t}")).unwrap();
                for i in 0u64.. {
                    let seq = t * 1_000_000 + i;
                    let mut a = append(seq, &[q]);
                    a.retained_topic = Some(format!("r{t}"));
                    let ops = vec![
                        Op::Append(a),
                        Op::Put {
                            space: Space::Meta,
                            key: Bytes::from(format!("seq/{seq}")),
                            value: Bytes::copy_from_slice(&seq.to_be_bytes()),
                        },
                    ];
                    let r = j.write_blocking(ops).unwrap();
                    let ap = &r.appended[0];
                    let line = format!("ACK {seq} {} {} {}\n", ap.pos.0, q.0, ap.offsets[0].1);
                    let mut out = std::io::stdout().lock();
                    out.write_all(line.as_bytes()).unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

struct Ack {
    seq: u64,
    pos: LogPos,
    queue: u64,
    offset: u64,
}

fn parse(line: &str) -> Option<Ack> {
    let mut it = line.strip_prefix("ACK ")?.split(' ');
    let mut next = || it.next()?.trim().parse::<u64>().ok();
    Some(Ack { seq: next()?, pos: LogPos(next()?), queue: next()?, offset: next()? })
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child_writer", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut acks = Vec::new();
    while acks.len() < KILL_AFTER_ACKS {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => acks.extend(parse(&line)),
            Err(_) => {
                let _ = child.kill();
                panic!("child produced only {} acks before the deadline or exit", acks.len());
            }
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    // Lines the child completed before it died are acknowledged too.
    acks.extend(rx.try_iter().filter_map(|l| parse(&l)));
    assert!(acks.len() >= KILL_AFTER_ACKS);

    let j = open(dir.path(), FsyncPolicy::Always);
    assert!(!j.stats().index_scanned, "recovery replays the log after the checkpoint instead of scanning");
    j.verify_counters().unwrap();
    let names: HashMap<String, u64> = j.queues().unwrap().into_iter().map(|(n, q)| (n, q.0)).collect();
    let mut last_per_thread: HashMap<u64, &Ack> = HashMap::new();
    for a in &acks {
        assert_record(&j, a.pos, a.seq);
        let t = a.seq / 1_000_000;
        assert_eq!(names.get(&format!("q{t}")), Some(&a.queue));
        let e = j.queue_entries(ferrymq_storage::QueueId(a.queue), a.offset, 1).unwrap();
        assert_eq!(e.first().map(|(o, p)| (*o, p.pos)), Some((a.offset, a.pos)), "pointer of seq {}", a.seq);
        let v = j.get(Space::Meta, format!("seq/{}", a.seq).as_bytes()).unwrap();
        assert_eq!(v.as_deref(), Some(&a.seq.to_be_bytes()[..]));
        let last = last_per_thread.entry(t).or_insert(a);
        if a.seq > last.seq {
            *last = a;
        }
    }
    // The retained entry of each thread is its last acknowledged record or a later one.
    let retained: HashMap<String, LogPos> = j.retained().unwrap().into_iter().collect();
    for (t, a) in &last_per_thread {
        let pos = retained[&format!("r{t}")];
        assert!(pos >= a.pos);
        let r = j.read(pos).unwrap();
        let seq = u64::from_be_bytes(r.header[..].try_into().unwrap());
        assert!(seq >= a.seq && seq / 1_000_000 == *t);
    }
    // Offsets are never reused: new writes land after every acknowledged offset.
    for (t, a) in &last_per_thread {
        let q = ferrymq_storage::QueueId(a.queue);
        assert!(j.queue_next_offset(q) > a.offset);
        let r = j.write_blocking(append_op(9_000_000 + t, &[q])).unwrap();
        assert!(r.appended[0].offsets[0].1 > a.offset);
        assert_record(&j, r.appended[0].pos, 9_000_000 + t);
    }
    eprintln!("crash test: {} acknowledged writes verified", acks.len());
}

//! Start-up fails closed: a stored record that cannot be read or decoded — of any kind
//! restored at start (users, permissions, parameters, limits, rules, MQTT sessions and their
//! shared subscriptions, exchanges, queues, bindings, de-duplication values, retained
//! messages and their commit-log records, timers, retry records, stream group cursors,
//! queue names, and any commit-log record below the end a clean stop recorded) — stops the broker with exit code 2 and a message naming the data
//! directory, the kind of record and its key, and what to do; the data directory is left
//! byte for byte as it was. A failure to read a client's inbound QoS 2 state at CONNECT
//! refuses that client with Server unavailable (5.0: 0x88, 3.1.1: 3), and only it.
//!
//! The data directory is edited while the broker is stopped, through sled (the store of
//! the journal's keyed state) or the commit-log segment files, as damage would.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{run_binary, v4, v5, Broker, Opts, Raw};
use serde_json::json;

/// Every file and directory under `dir`: a file with the SHA-256 of its contents.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut all = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(dir).unwrap().to_path_buf();
            if path.is_dir() {
                all.insert(rel, "directory".to_owned());
                todo.push(path);
            } else {
                let digest = ring::digest::digest(&ring::digest::SHA256, &std::fs::read(&path).unwrap());
                all.insert(rel, digest.as_ref().iter().map(|b| format!("{b:02x}")).collect());
            }
        }
    }
    all
}

/// What differs between two snapshots, one line per path.
fn differences(before: &BTreeMap<PathBuf, String>, after: &BTreeMap<PathBuf, String>) -> Vec<String> {
    let mut paths: Vec<&PathBuf> = before.keys().chain(after.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .map(|p| format!("{}: {:?} -> {:?}", p.display(), before.get(p), after.get(p)))
        .collect()
}

/// Opens the sled database of a stopped broker's data directory, retrying while a handle
/// this process just dropped still holds its lock (sled's threads release it a moment later).
fn open_db(dir: &Path) -> sled::Db {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match sled::Config::new().path(dir.join("db")).open() {
            Ok(db) => return db,
            Err(e) if Instant::now() < deadline => {
                assert!(e.to_string().contains("lock"), "cannot open sled: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("cannot open sled: {e}"),
        }
    }
}

/// Edits the sled database of a stopped broker's data directory.
fn edit_db(dir: &Path, edit: impl FnOnce(&sled::Db)) {
    let db = open_db(dir);
    edit(&db);
    db.flush().unwrap();
}

/// Opens the sled database once without writing: sled rewrites its own snapshot file (and
/// the tail of its log) the first time it is opened after a write — its recovery, which
/// changes no record, done by whichever program opens it first. Done before a directory is
/// hashed, so that the comparison sees what the broker writes.
fn settle_db(dir: &Path) {
    drop(open_db(dir));
}

/// A record value as the broker's metadata records are encoded: a table of text fields
/// (count, then per field its name, `S` and its text, lengths u32 big-endian).
fn text_table(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = (fields.len() as u32).to_be_bytes().to_vec();
    for (k, v) in fields {
        b.extend_from_slice(&(k.len() as u32).to_be_bytes());
        b.extend_from_slice(k.as_bytes());
        b.push(b'S');
        b.extend_from_slice(&(v.len() as u32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b
}

/// Replaces the first `from` in `bytes` with `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes.windows(from.len()).position(|w| w == from).unwrap_or_else(|| {
        panic!("{:?} not in {:?}", from.escape_ascii().to_string(), bytes.escape_ascii().to_string())
    });
    [&bytes[..at], to, &bytes[at + from.len()..]].concat()
}

/// Copies a directory tree (a stopped broker's data directory).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// The payload of the retained message, found in the commit log by the corruption case.
const RETAINED_PAYLOAD: &[u8] = b"retained-payload-7f3a9c";

/// Makes a data directory holding state of every kind restored at start, then stops the
/// broker cleanly: a user re-passworded at runtime (`guest`) and one made then (`alice`) with
/// permissions, a persistent MQTT session (`sess-1`) in a shared group (`$share/grp/t/2`)
/// with messages waiting, a retained message (`r/1`), a durable exchange (`ex1`), queue
/// (`q1`) and binding with a message, and a delayed message due in an hour (a timer).
async fn prepare(dir: &Path) {
    let mut broker = Broker::start_in(dir.to_path_buf(), opts());
    let mut session = v4::connect_persistent(&broker, "sess-1").await;
    session.subscribe("t/1", v4::QoS::AtLeastOnce).await;
    session.subscribe("$share/grp/t/2", v4::QoS::AtLeastOnce).await;
    drop(session);
    let mut publisher = v4::connect(&broker, "publisher").await;
    for i in 0..3 {
        publisher.publish_acked("t/2", v4::QoS::AtLeastOnce, false, format!("for the group {i}")).await;
    }
    publisher.publish_acked("r/1", v4::QoS::AtLeastOnce, true, RETAINED_PAYLOAD).await;
    // Past the first segment: the retained message's record is in a closed one.
    for _ in 0..3 {
        publisher.publish_acked("t/1", v4::QoS::AtLeastOnce, false, vec![b'x'; SEGMENT_SIZE / 2]).await;
    }
    drop(publisher);

    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(&broker))).await.unwrap();
    let ch = open_channel(&conn).await;
    confirm_select(&ch).await;
    let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
    declare_exchange(&ch, "ex1", ExchangeKind::Topic, durable, FieldTable::default()).await;
    let durable_queue = QueueDeclareOptions { durable: true, ..Default::default() };
    declare_queue_with(&ch, "q1", durable_queue, FieldTable::default()).await;
    bind(&ch, "q1", "ex1", "k.#", FieldTable::default()).await;
    publish_confirmed(&ch, "ex1", "k.1", b"in q1", persistent()).await;
    let delayed = ExchangeKind::Custom("x-delayed-message".into());
    declare_exchange(&ch, "dx", delayed, durable, table(&[("x-delayed-type", string("topic"))])).await;
    let in_an_hour = BasicProperties::default().with_headers(table(&[("x-delay", AMQPValue::LongLongInt(3_600_000))]));
    publish_confirmed(&ch, "dx", "later", b"delayed", in_an_hour).await;
    bounded("connection.close", conn.close(200, "bye".into())).await.unwrap();

    let api = Api::of(&broker);
    let (status, body) = api.put("/api/users/alice", json!({"password": "alice-pw", "tags": ""})).await;
    assert!(status.is_success(), "{status} {body}");
    let all = json!({"configure": ".*", "write": ".*", "read": ".*"});
    let (status, body) = api.put("/api/permissions/%2F/alice", all).await;
    assert!(status.is_success(), "{status} {body}");
    let (status, body) = api.put("/api/users/guest", json!({"password": "changed", "tags": "administrator"})).await;
    assert!(status.is_success(), "{status} {body}");
    broker.stop();
}

/// Commit-log segments of this size (bytes): the prepared directory has closed ones.
const SEGMENT_SIZE: usize = 64 * 1024;

/// The configuration of every start: small segments.
fn config() -> String {
    format!("[storage]\nsegment_size = {SEGMENT_SIZE}\n")
}

/// Options of a broker of these tests.
fn opts() -> Opts {
    Opts::default().config(&config())
}

/// The listeners of a start on `data`, each on an ephemeral loopback port, with
/// [`config`] (written beside the directory).
fn start_args(data: &Path) -> Vec<String> {
    let file = data.with_extension("toml");
    std::fs::write(&file, config()).unwrap();
    let mut a =
        vec!["--data-dir".to_owned(), data.display().to_string(), "--config".to_owned(), file.display().to_string()];
    for flag in ["--mqtt-listen", "--mqtt-ws-listen", "--amqp-listen", "--http-listen"] {
        a.extend([flag.to_owned(), "127.0.0.1:0".to_owned()]);
    }
    a
}

/// One way the data directory is damaged: what is done to it, and what the refusal must say.
struct Case {
    name: &'static str,
    damage: fn(&Path),
    /// The kind of record and its key, as the message words them.
    says: &'static str,
}

fn meta(db: &sled::Db) -> sled::Tree {
    db.open_tree("kv:meta").unwrap()
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "a user re-passworded at runtime",
            damage: |d| edit_db(d, |db| drop(meta(db).insert(b"u\0guest", &b"\xff\xff"[..]).unwrap())),
            says: r#"the user record "u\x00guest" cannot be decoded"#,
        },
        Case {
            name: "permissions whose expression does not compile",
            damage: |d| {
                edit_db(d, |db| {
                    let old = meta(db).get(b"p\0/\0alice").unwrap().expect("alice's permissions are stored");
                    meta(db).insert(b"p\0/\0alice", replace(&old, b".*", b"(*")).unwrap();
                })
            },
            says: r#"the permission record "vhost=/ user=alice" cannot be decoded"#,
        },
        Case {
            name: "a runtime parameter whose value is not a shovel's definition",
            damage: |d| {
                let value = text_table(&[
                    ("component", "shovel"),
                    ("vhost", "/"),
                    ("name", "s1"),
                    ("value", "{\"src-uri\": 5}"),
                ]);
                edit_db(d, |db| drop(meta(db).insert(b"a\0shovel\0/\0s1", value).unwrap()))
            },
            says: r#"the runtime parameter record "component=shovel vhost=/ name=s1" cannot be decoded"#,
        },
        Case {
            name: "a global parameter that is not JSON",
            damage: |d| {
                let value = text_table(&[("name", "cluster_name"), ("value", "{not json")]);
                edit_db(d, |db| drop(meta(db).insert(b"g\0cluster_name", value).unwrap()))
            },
            says: r#"the global parameter record "cluster_name" cannot be decoded"#,
        },
        Case {
            name: "limits of an unknown scope",
            damage: |d| {
                let value = text_table(&[("scope", "galaxy"), ("owner", "/")]);
                edit_db(d, |db| drop(meta(db).insert(b"l\0v\0/", value).unwrap()))
            },
            says: r#"the limits record "l\x00v\x00/" cannot be decoded"#,
        },
        Case {
            name: "MQTT rules that are not JSON",
            damage: |d| edit_db(d, |db| drop(meta(db).insert(b"r\0mqtt", text_table(&[("rules", "[{")])).unwrap())),
            says: r#"the MQTT rules record "mqtt" cannot be decoded"#,
        },
        Case {
            name: "an MQTT session",
            damage: |d| {
                edit_db(d, |db| drop(db.open_tree("kv:session").unwrap().insert(b"sess-1", &b"{"[..]).unwrap()))
            },
            says: r#"the MQTT session record "sess-1" cannot be decoded"#,
        },
        Case {
            name: "a session's shared subscription without a topic filter",
            damage: |d| {
                edit_db(d, |db| {
                    let sessions = db.open_tree("kv:session").unwrap();
                    let old = sessions.get(b"sess-1").unwrap().expect("the session is stored");
                    sessions.insert(b"sess-1", replace(&old, b"\"$share/grp/t/2\"", b"\"$share/grp/\"")).unwrap();
                })
            },
            says: r#"the shared subscription of an MQTT session record "client_id=sess-1 filter=$share/grp/" cannot be decoded"#,
        },
        Case {
            name: "a durable exchange",
            damage: |d| edit_db(d, |db| drop(meta(db).insert(b"x\0/\0ex1", &b"\0\0"[..]).unwrap())),
            says: r#"the exchange record "x\x00/\x00ex1" cannot be decoded"#,
        },
        Case {
            name: "a durable queue",
            damage: |d| edit_db(d, |db| drop(meta(db).insert(b"q\0/\0q1", &b"\0\0\0\x09"[..]).unwrap())),
            says: r#"the queue record "q\x00/\x00q1" cannot be decoded"#,
        },
        Case {
            name: "a durable binding",
            damage: |d| {
                edit_db(d, |db| {
                    let (key, _) = meta(db).scan_prefix(b"b\0/\0ex1\0").next().expect("the binding is stored").unwrap();
                    meta(db).insert(key, &b"\x01"[..]).unwrap();
                })
            },
            says: r#"the binding record "b\x00/\x00ex1\x00"#,
        },
        Case {
            name: "a de-duplication value",
            damage: |d| edit_db(d, |db| drop(meta(db).insert(b"d\0x3:/dd\0id-1", &b"bad"[..]).unwrap())),
            says: r#"the de-duplication value record "d\x00x3:/dd\x00id-1" cannot be decoded"#,
        },
        Case {
            name: "the retained-message index",
            // Retained messages are indexed by routing key: `r/1` is `r.1`.
            damage: |d| edit_db(d, |db| drop(db.open_tree("retained").unwrap().insert(b"r.1", &b"\x01"[..]).unwrap())),
            says: r#"the retained message index record "r.1" cannot be decoded"#,
        },
        Case {
            name: "a retained message's commit-log record",
            damage: |d| {
                let mut segments: Vec<PathBuf> =
                    std::fs::read_dir(d.join("log")).unwrap().map(|e| e.unwrap().path()).collect();
                segments.sort();
                assert!(segments.len() > 1, "the prepared directory has a closed segment: {segments:?}");
                // Not the last: a damaged record there is the case below.
                let mut hit = 0;
                for path in &segments[..segments.len() - 1] {
                    let path = path.clone();
                    let bytes = std::fs::read(&path).unwrap();
                    if let Some(at) = bytes.windows(RETAINED_PAYLOAD.len()).position(|w| w == RETAINED_PAYLOAD) {
                        let mut bytes = bytes;
                        bytes[at] ^= 0x20;
                        std::fs::write(&path, bytes).unwrap();
                        hit += 1;
                    }
                }
                assert_eq!(hit, 1, "the retained payload is in one closed segment");
            },
            says: r#"the retained message record "r.1" cannot be read: corrupt record at log position"#,
        },
        Case {
            name: "a commit-log record of the last segment, after a clean stop",
            damage: |d| {
                let mut segments: Vec<PathBuf> =
                    std::fs::read_dir(d.join("log")).unwrap().map(|e| e.unwrap().path()).collect();
                segments.sort();
                let last = segments.last().expect("the prepared directory has a segment");
                let mut bytes = std::fs::read(last).unwrap();
                assert!(bytes.len() > 64, "the last segment holds records: {} bytes", bytes.len());
                // Inside the segment's first record: below the end the clean stop recorded,
                // so not a torn write for recovery to cut.
                bytes[10] ^= 0x20;
                std::fs::write(last, bytes).unwrap();
            },
            says: r#"the commit-log record "at log position "#,
        },
        Case {
            name: "a timer whose target names nothing",
            damage: |d| {
                edit_db(d, |db| {
                    let timers = db.open_tree("timer").unwrap();
                    let (key, value) = timers.iter().next().expect("the delayed message has a timer").unwrap();
                    // Its size kept; the target a retry's tag without a queue entry.
                    timers.insert(key, [&value[..4], &b"\xff\x01\x00"[..]].concat()).unwrap();
                })
            },
            says: r#"the timer record "due at "#,
        },
        Case {
            name: "a timer that does not decode",
            damage: |d| edit_db(d, |db| drop(db.open_tree("timer").unwrap().insert(b"short", &b"\x01"[..]).unwrap())),
            says: r#"the timer record "short" cannot be decoded"#,
        },
        Case {
            name: "a retry record",
            damage: |d| {
                let key = [7u64.to_be_bytes(), 3u64.to_be_bytes()].concat();
                edit_db(d, |db| drop(db.open_tree("kv:retry").unwrap().insert(key, &b"bad"[..]).unwrap()))
            },
            says: r#"the retry record "\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x03" cannot be decoded"#,
        },
        Case {
            name: "a stream consumer group's cursor",
            damage: |d| {
                let key = [&7u64.to_be_bytes()[..], b"group-1"].concat();
                edit_db(d, |db| drop(db.open_tree("kv:cursor").unwrap().insert(key, &b"bad"[..]).unwrap()))
            },
            says: r#"the stream consumer group cursor record "\x00\x00\x00\x00\x00\x00\x00\x07group-1" cannot be decoded"#,
        },
        Case {
            name: "a queue name",
            damage: |d| {
                edit_db(d, |db| drop(db.open_tree("queue_names").unwrap().insert(b"amqp//junk", &b"\x01"[..]).unwrap()))
            },
            says: r#"the queue name record "amqp//junk" cannot be decoded"#,
        },
    ]
}

/// Each kind of damage, on a copy of one prepared data directory: the start is refused with
/// code 2 and a message naming the directory, the record's kind and key, and the backup to
/// restore; not a byte of the (settled) directory changed. Cases are all run, and every one that
/// does not hold is reported.
#[test]
fn a_record_that_cannot_be_restored_stops_the_start_with_code_2_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prepared");
    tokio::runtime::Runtime::new().unwrap().block_on(prepare(&prepared));
    // The undamaged directory starts, and its state came back.
    {
        let copy = tmp.path().join("undamaged");
        copy_dir(&prepared, &copy);
        let mut broker = Broker::start_in(copy.clone(), opts());
        assert!(broker.wait_log("restored persistent MQTT sessions"), "{}", broker.log());
        broker.stop();
        std::fs::remove_dir_all(&copy).unwrap();
    }
    let mut failed = Vec::new();
    for (i, case) in cases().into_iter().enumerate() {
        let data = tmp.path().join(format!("case-{i}"));
        copy_dir(&prepared, &data);
        (case.damage)(&data);
        settle_db(&data);
        let before = snapshot(&data);
        let args = start_args(&data);
        let (code, err) = run_binary(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        let changed = differences(&before, &snapshot(&data));
        let mut wrong = Vec::new();
        if code != 2 {
            wrong.push(format!("exit code {code}, not 2"));
        }
        for needle in [
            case.says,
            &format!("cannot restore the state stored in the data directory {}", data.display()),
            "restore it from a backup (see \"Backing up a data directory\" in docs/durability.md)",
        ] {
            if !err.contains(needle) {
                wrong.push(format!("the message does not say {needle:?}"));
            }
        }
        if !changed.is_empty() {
            wrong.push(format!("the data directory changed:\n      {}", changed.join("\n      ")));
        }
        if !wrong.is_empty() {
            failed.push(format!("{}:\n    {}\n    stderr:\n{err}", case.name, wrong.join("\n    ")));
        }
        std::fs::remove_dir_all(&data).unwrap();
    }
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), cases().len(), failed.join("\n"));
}

/// The CONNACK a raw client gets for a CONNECT that resumes `client_id`'s session:
/// 3.1.1 (`level` 4) clean session off; 5.0 clean start off, session expiry an hour.
async fn connack_of_resume(broker: &Broker, level: u8, client_id: &str) -> Vec<u8> {
    let props: &[u8] = if level == 5 { &[5, 0x11, 0, 0, 0x0e, 0x10] } else { &[] };
    let mut raw = Raw::connect(broker).await;
    raw.send(&common::connect_bytes(level, client_id, 0x00, 60, props)).await;
    raw.read_until_closed().await
}

/// A client whose inbound QoS 2 state cannot be read is refused with Server unavailable
/// (3.1.1: return code 3; 5.0: reason 0x88), logged once with its client id and counted;
/// its stored session stays; other clients connect as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_qos2_state_cannot_be_read_is_refused_with_server_unavailable() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut broker = Broker::start_in(data.clone(), Opts::default());
    drop(v4::connect_persistent(&broker, "qos2-v4").await);
    let mut o = v5::options(&broker, "qos2-v5");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(3600));
    drop(v5::connect_with(o).await);
    broker.stop();
    // An inbound QoS 2 id of three bytes: what a re-sent PUBLISH would be checked against
    // cannot be known.
    edit_db(&data, |db| {
        let ids = db.open_tree("kv:inbound_qos2").unwrap();
        for client in ["qos2-v4", "qos2-v5"] {
            ids.insert([client.as_bytes(), b"\0\x00\x07\x01"].concat(), &b""[..]).unwrap();
        }
    });
    let broker = broker.start_again();

    let v4_connack = connack_of_resume(&broker, 4, "qos2-v4").await;
    assert_eq!(v4_connack, [0x20, 2, 0, 3], "3.1.1 CONNACK: session not present, return code 3 (Server unavailable)");
    let v5_connack = connack_of_resume(&broker, 5, "qos2-v5").await;
    assert!(v5_connack.len() >= 4 && v5_connack[0] == 0x20, "a CONNACK: {v5_connack:02x?}");
    assert_eq!(v5_connack[3], 0x88, "5.0 CONNACK reason Server unavailable: {v5_connack:02x?}");

    // Others are served; a refused client's session is still there to resume.
    drop(v4::connect(&broker, "someone-else").await);
    assert_eq!(connack_of_resume(&broker, 4, "qos2-v4").await, [0x20, 2, 0, 3], "refused again, not forgotten");
    let refusal = "connection refused (Server unavailable): the session's inbound QoS 2 state cannot be read";
    assert!(broker.wait_log(refusal), "{}", broker.log());
    let log = broker.log();
    let warned: Vec<&str> = log.lines().filter(|l| l.contains(refusal) && l.contains(" WARN ")).collect();
    assert_eq!(warned.len(), 1, "logged at warn once: {warned:?}");
    assert!(warned[0].contains("qos2-v4") || warned[0].contains("qos2-v5"), "with the client id: {}", warned[0]);
    let text = reqwest::get(format!("{}/metrics", Api::of(&broker).base)).await.unwrap().text().await.unwrap();
    assert!(text.contains("ferrymq_mqtt_connect_state_unreadable_total 3"), "counted: {text}");
}

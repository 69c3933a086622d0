//! A full disk is survivable (RabbitMQ's disk alarm, RocketMQ's retention by disk use): on a
//! small file system of its own (a 48 MiB tmpfs; the test is skipped, saying so, where
//! mounting is not allowed), 64 KiB persistent publishes with confirms are blocked by the
//! disk alarm before the file system is full; every confirmed message is consumable; once
//! the queue is drained, retention deletes the segments nothing points into any more, the
//! alarm clears and publishes are confirmed again, without a restart; and a restart on a
//! file system filled to the last byte (by another file) comes up with the queue intact:
//! the ballast it kept in reserve is given up so the journal can open, and made again once
//! space returns. A file system filled by another process while the broker runs is
//! survived too: with the alarm, publishers are blocked and consumers drain; without it, a
//! write that runs out of space is refused and taken back, sled running out of space is
//! opened again in place, and publishes are confirmed again once space returns. A small
//! volume configured as shipped (128 MiB segments, more than the disk) comes back after a
//! drain as well: segments are capped at an eighth of the file system, and an active
//! segment holding all the drained data is rolled over and deleted.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::amqp::*;
use crate::common::{eventually, Broker, Opts, WAIT};

/// A tmpfs mounted on a temporary directory for the test's lifetime.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mib: u32) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let opts = format!("size={size_mib}m");
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", &opts, "tmpfs"]).arg(dir.path()).status().ok()?;
        st.success().then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

const BODY: usize = 64 * 1024;
const CONFIG: &str = "[storage]\ndisk_free_limit_bytes = 8388608\nsegment_size = 4194304\nballast_bytes = 4194304\n";

/// Publishes 64 KiB persistent messages to `queue`, one at a time, until the connection
/// is blocked; returns how many were confirmed and the publish left waiting. A publish may also be refused (nack): when the publishes outrun
/// the alarm's look at the disk, the journal refuses appends at half the free limit.
async fn fill(
    conn: &Connection,
    ch: &Channel,
    queue: &str,
) -> (usize, tokio::task::JoinHandle<lapin::Result<Confirmation>>) {
    let mut confirmed = 0;
    let mut refused = 0;
    // Bounded: three times the file system's size in messages (retention may delete drained
    // segments while this runs, which lifts the alarm for a moment); it is blocked before.
    for _ in 0..(3 * 48 * 1024 * 1024 / BODY) {
        let (ch, q) = (ch.clone(), queue.to_string());
        let mut publish = tokio::spawn(async move {
            let props = BasicProperties::default().with_delivery_mode(2);
            ch.basic_publish("".into(), q.as_str().into(), BasicPublishOptions::default(), &[b'x'; BODY], props)
                .await?
                .await
        });
        // Confirmed, refused, or held because the connection is blocked; a busy machine
        // may take a while to tell which (bounded).
        let mut waited = 0;
        let outcome = loop {
            match tokio::time::timeout(Duration::from_secs(1), &mut publish).await {
                Ok(r) => break Some(r),
                Err(_) if conn.status().blocked() => break None,
                Err(_) => {
                    waited += 1;
                    assert!(waited < 30, "publish {confirmed}: neither confirmed nor blocked within 30 s");
                }
            }
        };
        match outcome {
            Some(Ok(Ok(Confirmation::Ack(_)))) => confirmed += 1,
            Some(Ok(Ok(Confirmation::Nack(_)))) => refused += 1,
            Some(other) => panic!("publish {confirmed}: not confirmed, refused or blocked: {other:?}"),
            None => {
                eprintln!("{confirmed} confirmed, {refused} refused, then blocked");
                return (confirmed, publish);
            }
        }
    }
    panic!("{confirmed} publishes of 64 KiB confirmed, {refused} refused on a 48 MiB file system: never blocked");
}

/// Takes every message off `queue` (acknowledged), returning how many there were.
async fn drain_count(ch: &Channel, queue: &str) -> usize {
    let mut n = 0;
    while let Some(m) = get(ch, queue, false).await {
        assert_eq!(m.delivery.data.len(), BODY);
        bounded("ack", m.delivery.acker.ack(BasicAckOptions::default())).await.expect("ack");
        n += 1;
    }
    n
}

/// A broker with `config` on a 48 MiB tmpfs of its own, a connection in confirm mode and
/// the durable queue `queue`; `None` (the test is skipped, saying so) where mounting is not
/// allowed.
async fn start_on_tmpfs(config: &str, queue: &str) -> Option<(Tmpfs, Target, Connection, Channel, String)> {
    start_on_tmpfs_of(48, config, queue).await
}

/// [`start_on_tmpfs`] on a tmpfs of `size_mib`.
async fn start_on_tmpfs_of(
    size_mib: u32,
    config: &str,
    queue: &str,
) -> Option<(Tmpfs, Target, Connection, Channel, String)> {
    let Some(fs) = Tmpfs::mount(size_mib) else {
        common::skipped("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)");
        return None;
    };
    let t = Target::ferrymq(Broker::start_in(fs.path().join("data"), Opts::default().config(config)));
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let opts = QueueDeclareOptions { durable: true, ..Default::default() };
    let q = declare_queue_with(&ch, queue, opts, FieldTable::default()).await.name().to_string();
    Some((fs, t, conn, ch, q))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_blocks_publishers_before_loss_and_recovers_without_a_restart() {
    let Some((fs, t, conn, ch, q)) = start_on_tmpfs(CONFIG, "fill").await else { return };
    let mut ev = events(&conn);

    let (confirmed, waiting) = fill(&conn, &ch, &q).await;
    assert!(conn.status().blocked(), "the publish waits because the connection is blocked");
    match next_event(&mut ev).await {
        Event::ConnectionBlocked(reason) => assert_eq!(reason.as_str(), "low on disk"),
        other => panic!("expected connection.blocked, got {other:?}"),
    }
    assert!(confirmed >= 300, "only {confirmed} of 64 KiB before the alarm (limit 8 MiB free of 48)");
    assert!(!t.broker.as_ref().unwrap().log().contains("journal poisoned"), "the disk never filled up");

    // Every confirmed message is there; draining it lets retention free the space.
    let (_c2, consumer) = t.channel().await;
    // The publish left waiting may have been read just before the block (then it is here
    // too, and confirmed below).
    let drained = drain_count(&consumer, &q).await;
    assert!(drained == confirmed || drained == confirmed + 1, "{drained} consumed, {confirmed} confirmed");
    match next_event(&mut ev).await {
        Event::ConnectionUnblocked => {}
        other => panic!("expected connection.unblocked once the drained segments are deleted, got {other:?}"),
    }
    let c = bounded("the waiting publish, confirmed after the unblock", waiting).await.unwrap().expect("publish");
    assert_eq!(c, Confirmation::Ack(None));
    let in_queue = usize::from(drained == confirmed);

    // As full as the alarm lets it get again, then to the last byte by another file, then
    // a restart: it comes up, nothing is lost.
    let (again, waiting) = fill(&conn, &ch, &q).await;
    drop(waiting);
    drop((conn, ch, _c2, consumer));
    let junk = fs.path().join("junk");
    fill_to_the_last_byte(&junk);
    let t = Target::ferrymq(t.broker.unwrap().restart());
    assert!(t.broker.as_ref().unwrap().log().contains("released the ballast"), "the ballast made room");
    let (_conn, ch) = t.channel().await;
    let kept = bounded(
        "queue.declare passive",
        ch.queue_declare(
            "fill".into(),
            QueueDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        ),
    )
    .await
    .expect("the queue survived the restart")
    .message_count() as usize;
    // The publish left waiting at the stop may or may not have been read before it.
    let before = in_queue + again;
    assert!(kept == before || kept == before + 1, "{kept} messages after the restart, {before} confirmed");
    assert_eq!(drain_count(&ch, "fill").await, kept);
    std::fs::remove_file(&junk).unwrap();
    let ballast = t.broker.as_ref().unwrap().dir.join("ballast");
    eventually("the ballast made again", WAIT, || async { ballast.exists().then_some(()) }).await;
}

/// Another process fills the file system to the last byte while the broker is idle, and
/// there is no floor or ballast to stop the commit log first: the next persistent publish
/// runs into ENOSPC. The journal takes the batch back and refuses it (nack), the
/// connection stays, nothing is poisoned; once the other file is deleted publishes are
/// confirmed again without a restart, and exactly the confirmed messages are in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_runs_out_of_space_is_refused_and_the_journal_resumes_once_space_returns() {
    let config = "[storage]\ndisk_free_limit_bytes = 0\nsegment_size = 4194304\nballast_bytes = 0\n";
    let Some((fs, t, conn, ch, q)) = start_on_tmpfs(config, "enospc").await else { return };
    let body = |n: u8| vec![n; BODY];
    for n in 0..5 {
        assert_eq!(publish_confirmed(&ch, "", &q, &body(n), persistent()).await, Confirmation::Ack(None));
    }

    let junk = fs.path().join("junk");
    fill_to_the_last_byte(&junk);
    for n in 5..8 {
        let c = publish_confirmed(&ch, "", &q, &body(n), persistent()).await;
        assert!(matches!(c, Confirmation::Nack(_)), "publish {n} on a full file system: {c:?}");
    }
    assert!(conn.status().connected(), "the connection stays open");
    let log = t.broker.as_ref().unwrap().log();
    assert!(log.contains("the data file system is full"), "said once: {log}");
    assert!(!log.contains("journal poisoned"), "not poisoned: {log}");

    std::fs::remove_file(&junk).unwrap();
    // If the background checkpoint's sled flush also ran into the full disk, sled is opened
    // again once space returns (every REOPEN_INTERVAL): until then a publish is still
    // refused. Refused ones are not stored; the first confirmed one is.
    let resumed = Instant::now() + Duration::from_secs(10);
    while publish_confirmed(&ch, "", &q, &body(8), persistent()).await != Confirmation::Ack(None) {
        assert!(Instant::now() < resumed, "publishes are still refused 10 s after space returned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(publish_confirmed(&ch, "", &q, &body(9), persistent()).await, Confirmation::Ack(None));
    let (_c2, consumer) = t.channel().await;
    let mut seen = Vec::new();
    while let Some(m) = get(&consumer, &q, false).await {
        seen.push(m.delivery.data[0]);
        assert!(m.delivery.data.iter().all(|b| *b == m.delivery.data[0]), "body intact");
        bounded("ack", m.delivery.acker.ack(BasicAckOptions::default())).await.expect("ack");
    }
    assert_eq!(seen, vec![0, 1, 2, 3, 4, 8, 9], "every confirmed message, in order, and none refused");
}

/// The file system fills up (another process) while consumers acknowledge, with no floor
/// and no ballast: sled, writing the acknowledgements out, runs out of space too, and
/// stops itself at its first failed write. Publishes are refused meanwhile (nack); once the
/// other file is deleted, sled is opened again in the running broker and publishes are
/// confirmed, without a restart; every confirmed message not acknowledged is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_running_out_of_space_is_cured_without_a_restart() {
    let config = "[storage]\ndisk_free_limit_bytes = 0\nsegment_size = 4194304\nballast_bytes = 0\n";
    let Some((fs, t, conn, ch, q)) = start_on_tmpfs(config, "store").await else { return };
    let body = |n: u8| vec![n; 1024];
    for n in 0..200 {
        assert_eq!(publish_confirmed(&ch, "", &q, &body(n), persistent()).await, Confirmation::Ack(None));
    }
    let junk = fs.path().join("junk");
    fill_to_the_last_byte(&junk);
    // Acknowledgements go to sled (no commit-log write); it fails once it writes them out.
    let (_c2, consumer) = t.channel().await;
    let mut acked = 0u8;
    let broker = t.broker.as_ref().unwrap();
    for _ in 0..100 {
        let m = get(&consumer, &q, false).await.expect("a message");
        assert_eq!(m.delivery.data[0], acked);
        bounded("ack", m.delivery.acker.ack(BasicAckOptions::default())).await.expect("ack");
        acked += 1;
        if broker.log().contains("sled ran out of space") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = publish_confirmed(&ch, "", &q, &body(250), persistent()).await;
    assert!(matches!(c, Confirmation::Nack(_)), "a publish on a full file system: {c:?}");
    let hit = broker.log().contains("sled ran out of space");
    eprintln!("sled ran out of space: {hit}; {acked} acknowledged while full");

    std::fs::remove_file(&junk).unwrap();
    let (publisher, queue) = (&ch, q.as_str());
    eventually("publishes confirmed again once space returns", WAIT, || async move {
        matches!(publish_confirmed(publisher, "", queue, &body(251), persistent()).await, Confirmation::Ack(_))
            .then_some(())
    })
    .await;
    assert!(!broker.log().contains("journal poisoned"), "{}", broker.log());
    if hit {
        assert!(broker.log().contains("sled is open again"), "{}", broker.log());
    }
    assert!(conn.status().connected());
    // Every confirmed, unacknowledged message is there (acknowledged ones that sled never
    // wrote out may come back, as after a crash: at least once).
    let mut seen = std::collections::BTreeSet::new();
    while let Some(m) = get(&consumer, &q, false).await {
        seen.insert(m.delivery.data[0]);
        bounded("ack", m.delivery.acker.ack(BasicAckOptions::default())).await.expect("ack");
    }
    for n in acked..200 {
        assert!(seen.contains(&n), "confirmed message {n} is missing: {seen:?}");
    }
    assert!(seen.contains(&251));
}

/// Another process fills the file system to the last byte while the broker runs (with the
/// disk alarm and a ballast): the ballast is given up at once so that sled has room, the
/// alarm blocks publishers, consumers drain and acknowledge (nothing is poisoned), and once
/// the other file is deleted the alarm clears and the waiting publish is confirmed, without
/// a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_system_filled_by_another_process_blocks_publishers_and_consumers_drain() {
    let Some((fs, t, conn, ch, q)) = start_on_tmpfs(CONFIG, "filled").await else { return };
    for _ in 0..20 {
        assert_eq!(publish_confirmed(&ch, "", &q, &[b'x'; BODY], persistent()).await, Confirmation::Ack(None));
    }
    let mut ev = events(&conn);
    let ballast = t.broker.as_ref().unwrap().dir.join("ballast");
    assert!(ballast.exists(), "the ballast is kept while there is room");

    let junk = fs.path().join("junk");
    fill_to_the_last_byte(&junk);
    // The connection has published: the alarm blocks it at once.
    match next_event(&mut ev).await {
        Event::ConnectionBlocked(reason) => assert_eq!(reason.as_str(), "low on disk"),
        other => panic!("expected connection.blocked, got {other:?}"),
    }
    eventually("the ballast given up", WAIT, || async { (!ballast.exists()).then_some(()) }).await;
    let mut waiting = {
        let (ch, q) = (ch.clone(), q.clone());
        tokio::spawn(async move {
            let props = BasicProperties::default().with_delivery_mode(2);
            ch.basic_publish("".into(), q.as_str().into(), BasicPublishOptions::default(), &[b'y'; BODY], props)
                .await?
                .await
        })
    };
    // Bounded negative wait: held while blocked.
    if let Ok(done) = tokio::time::timeout(Duration::from_millis(500), &mut waiting).await {
        panic!("the publish finished while blocked: {done:?}");
    }

    let (_c2, consumer) = t.channel().await;
    assert_eq!(drain_count(&consumer, &q).await, 20, "consumers drain a full disk");
    assert!(!t.broker.as_ref().unwrap().log().contains("journal poisoned"));

    std::fs::remove_file(&junk).unwrap();
    match next_event(&mut ev).await {
        Event::ConnectionUnblocked => {}
        other => panic!("expected connection.unblocked once space returned, got {other:?}"),
    }
    let c = bounded("the waiting publish", waiting).await.unwrap().expect("publish");
    assert_eq!(c, Confirmation::Ack(None));
    assert_eq!(publish_confirmed(&ch, "", &q, &[b'z'; BODY], persistent()).await, Confirmation::Ack(None));
    eventually("the ballast made again", WAIT, || async { ballast.exists().then_some(()) }).await;
    assert_eq!(drain_count(&consumer, &q).await, 2);
}

/// The disk free limit of the two small-disk runs below: 8 MiB of a 48 MiB file system.
const SMALL_DISK_LIMIT: u64 = 8 << 20;

/// A small volume at the edge, configured as shipped but for the alarm: `storage.segment_size`
/// is left at 128 MiB, more than the whole 48 MiB file system, and the 16 MiB ballast at its
/// default. Publishers fill it until the alarm blocks them for good (the ballast's space
/// lifted the alarm once and is spent); the queue is drained; the alarm clears and the
/// publish left waiting is confirmed, without a restart, within the test's bound. The
/// segment size was capped at an eighth of the file system, so the drained segments are
/// closed ones that retention deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_disk_with_the_default_segment_size_comes_back_after_a_drain() {
    let config = format!("[storage]\ndisk_free_limit_bytes = {SMALL_DISK_LIMIT}\n");
    let Some((fs, t, conn, ch, q)) = start_on_tmpfs(&config, "small").await else { return };
    let broker = t.broker.as_ref().unwrap();
    let ballast = broker.dir.join("ballast");
    assert!(ballast.exists(), "the default ballast is kept while there is room");
    let mut ev = events(&conn);

    // Full until the alarm holds for good: a block while the ballast exists gives it up
    // (free space below half its size), which lifts the alarm once.
    let mut confirmed = 0;
    let mut rounds = 0;
    let waiting = loop {
        rounds += 1;
        assert!(rounds <= 3, "the alarm never held with the ballast spent");
        let (n, waiting) = fill(&conn, &ch, &q).await;
        confirmed += n;
        match next_event(&mut ev).await {
            Event::ConnectionBlocked(reason) => assert_eq!(reason.as_str(), "low on disk"),
            other => panic!("expected connection.blocked, got {other:?}"),
        }
        eventually("the ballast given up", WAIT, || async { (!ballast.exists()).then_some(()) }).await;
        if fs4::available_space(fs.path()).unwrap() < SMALL_DISK_LIMIT {
            break waiting;
        }
        match next_event(&mut ev).await {
            Event::ConnectionUnblocked => {}
            other => panic!("expected connection.unblocked once the ballast was given up, got {other:?}"),
        }
        let c = bounded("the waiting publish, after the ballast", waiting).await.unwrap().expect("publish");
        assert_eq!(c, Confirmation::Ack(None));
        confirmed += 1;
    };
    eprintln!("{confirmed} messages of 64 KiB confirmed in {rounds} rounds, then blocked with the ballast spent");
    assert!(!broker.log().contains("journal poisoned"), "the disk never filled up");

    let (_c2, consumer) = t.channel().await;
    let drained = drain_count(&consumer, &q).await;
    assert!(drained == confirmed || drained == confirmed + 1, "{drained} consumed, {confirmed} confirmed");
    match next_event(&mut ev).await {
        Event::ConnectionUnblocked => {}
        other => panic!("expected connection.unblocked once the drained segments are deleted, got {other:?}"),
    }
    let c = bounded("the waiting publish, confirmed after the drain", waiting).await.unwrap().expect("publish");
    assert_eq!(c, Confirmation::Ack(None));
    assert_eq!(publish_confirmed(&ch, "", &q, &[b'z'; BODY], persistent()).await, Confirmation::Ack(None));
    let log = broker.log();
    assert!(log.contains("commit-log segments capped"), "the cap is said at start: {log}");
    assert!(log.contains("configured=134217728") && log.contains("effective=6291456"), "{log}");
}

/// Another program leaves the broker 14 MiB on a 96 MiB file system with an 8 MiB alarm
/// and no ballast: what the broker writes before the alarm (or, should publishes outrun
/// its look, the journal's floor at half of it) stops it, at most 10 MiB, stays in its
/// active segment, below even the capped segment size (12 MiB), so once the queue is
/// drained retention has no closed segment to delete. It rolls the active segment over and
/// deletes it: the alarm clears and the waiting publish is confirmed, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_active_segment_is_rolled_over_and_deleted_when_the_disk_is_short() {
    let config = format!("[storage]\ndisk_free_limit_bytes = {SMALL_DISK_LIMIT}\nballast_bytes = 0\n");
    let Some((fs, t, conn, ch, q)) = start_on_tmpfs_of(96, &config, "active").await else { return };
    let broker = t.broker.as_ref().unwrap();
    leave_free(&fs.path().join("junk"), SMALL_DISK_LIMIT + (6 << 20));
    let mut ev = events(&conn);

    let (confirmed, waiting) = fill(&conn, &ch, &q).await;
    match next_event(&mut ev).await {
        Event::ConnectionBlocked(reason) => assert_eq!(reason.as_str(), "low on disk"),
        other => panic!("expected connection.blocked, got {other:?}"),
    }
    assert!(confirmed >= 10, "only {confirmed} of 64 KiB confirmed in 6 MiB");
    let segments = segment_files(&broker.dir);
    assert_eq!(segments.len(), 1, "everything is in the active segment: {segments:?}");

    let (_c2, consumer) = t.channel().await;
    let drained = drain_count(&consumer, &q).await;
    assert!(drained == confirmed || drained == confirmed + 1, "{drained} consumed, {confirmed} confirmed");
    match next_event(&mut ev).await {
        Event::ConnectionUnblocked => {}
        other => panic!("expected connection.unblocked once the drained active segment is deleted, got {other:?}"),
    }
    let c = bounded("the waiting publish, confirmed after the drain", waiting).await.unwrap().expect("publish");
    assert_eq!(c, Confirmation::Ack(None));
    assert_eq!(publish_confirmed(&ch, "", &q, &[b'z'; BODY], persistent()).await, Confirmation::Ack(None));
    assert!(!segments[0].exists(), "the drained segment is gone");
    let log = broker.log();
    assert!(log.contains("rolled the active segment over for retention"), "{log}");
    assert!(!log.contains("journal poisoned"), "{log}");
    let kept = drain_count(&consumer, &q).await;
    assert_eq!(kept, 1 + usize::from(drained == confirmed), "the waiting publish (unless drained before) and the last");
}

/// The commit-log segment files of the data directory `dir`, oldest first.
fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Writes `path` (allocated, not sparse) until its file system has about `free` bytes free.
fn leave_free(path: &Path, free: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while fs4::available_space(path).unwrap() > free + chunk.len() as u64 {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

/// Writes `path` until the file system is full (ENOSPC).
fn fill_to_the_last_byte(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling the file system: {e}"),
        }
    }
    let _ = f.sync_all();
}

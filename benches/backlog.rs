//! Backlog benchmark: does a large backlog slow publishing or start-up down?
//!
//! `cargo bench --bench backlog -- [delayed|queue|stream] [COUNT] [PROBES]`
//!
//! Starts the real `ferrymq` binary (release build, fresh data directory, default
//! configuration: fsync `always`, `--log warn`) on ephemeral loopback ports with the
//! integration tests' harness (`tests/integration/common/broker.rs`) and drives it with `lapin`:
//!
//! * `delayed` (default COUNT 1,000,000): PROBES probes, then fill an `x-delayed-message`
//!   exchange with COUNT messages due in 30 days (pending timers), probe again, restart,
//!   probe again, crash, probe again.
//! * `queue` (default COUNT 10,000,000): the same with a durable queue nobody consumes,
//!   filled with COUNT persistent messages.
//! * `stream` (default COUNT 10,000,000): the same with a stream (`x-queue-type: stream`)
//!   that nobody reads.
//!
//! A probe publishes 20,000 persistent 256-byte messages with publisher confirms (window 64)
//! to a separate queue, consumes them, and reports confirm latency percentiles and the rate.
//! Each series runs PROBES (default 10) probes back to back and reports how far the worst
//! probe's p99 is from the median probe's (a bimodal broker shows up there).
//! The crash: a publisher sends persistent messages with confirms to another queue for
//! [`CRASH_LOAD`] (many checkpoint intervals, so the broker dies with a full interval of
//! state not yet in sled), then the broker gets SIGKILL; the restart replays the log tail.
//! The run checks that the crash queue holds every confirmed message and that the backlog
//! queue holds COUNT.
//! Restarts are timed from spawn to the READY line. Every phase is bounded in count and time;
//! the run prints a Markdown table and stops by itself.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

// The bench uses part of the harness.
#[allow(dead_code)]
#[path = "../tests/integration/common/broker.rs"]
mod broker;
use broker::{Broker, Opts};

const PROBE: usize = 20_000;
const PROBE_WINDOW: usize = 64;
const FILL_WINDOW: usize = 1_000;
const BODY: usize = 256;
/// Longest any phase may take.
const PHASE_LIMIT: Duration = Duration::from_secs(900);
/// How long the publisher runs before the crash.
const CRASH_LOAD: Duration = Duration::from_secs(2);

/// The broker's AMQP URI (guest, default vhost).
fn uri(b: &Broker) -> String {
    format!("amqp://guest:guest@{}/%2f", b.amqp.expect("an amqp= address in the READY line"))
}

/// Stops the broker (SIGTERM; panics unless it exits cleanly).
fn stop(mut b: Broker) -> Broker {
    b.stop();
    b
}

struct Probe {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    rate: f64,
}

async fn channel(uri: &str) -> (Connection, Channel) {
    let conn = Connection::connect(uri, ConnectionProperties::default()).await.expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default()).await.expect("confirm.select");
    (conn, ch)
}

/// Publishes `count` messages with confirms, `window` in flight; returns confirm latencies.
async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    key: &str,
    count: usize,
    window: usize,
    props: BasicProperties,
) -> Vec<Duration> {
    let body = vec![b'x'; BODY];
    let mut inflight = VecDeque::with_capacity(window);
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        if inflight.len() == window {
            let (t, c): (Instant, lapin::PublisherConfirm) = inflight.pop_front().unwrap();
            assert!(c.await.expect("confirm").is_ack(), "nacked");
            latencies.push(t.elapsed());
        }
        let c = ch
            .basic_publish(exchange.into(), key.into(), BasicPublishOptions::default(), &body, props.clone())
            .await
            .expect("publish");
        inflight.push_back((Instant::now(), c));
    }
    for (t, c) in inflight {
        assert!(c.await.expect("confirm").is_ack(), "nacked");
        latencies.push(t.elapsed());
    }
    latencies
}

/// Declares the durable queue `name`.
async fn declare_durable(ch: &Channel, name: &str, args: FieldTable) {
    ch.queue_declare(name.into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
        .await
        .unwrap_or_else(|e| panic!("declare {name}: {e}"));
}

async fn probe(uri: &str) -> Probe {
    let (conn, ch) = channel(uri).await;
    declare_durable(&ch, "probe", FieldTable::default()).await;
    let t0 = Instant::now();
    let mut lat =
        publish_confirmed(&ch, "", "probe", PROBE, PROBE_WINDOW, BasicProperties::default().with_delivery_mode(2))
            .await;
    let rate = PROBE as f64 / t0.elapsed().as_secs_f64();
    // Consume them so the next probe starts from an empty probe queue.
    let mut c = ch
        .basic_consume(
            "probe".into(),
            "".into(),
            BasicConsumeOptions { no_ack: true, ..Default::default() },
            FieldTable::default(),
        )
        .await
        .expect("consume");
    for _ in 0..PROBE {
        tokio::time::timeout(Duration::from_secs(60), c.next()).await.expect("probe delivery").unwrap().unwrap();
    }
    let _ = conn.close(200, "probe done".into()).await;
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Probe {
        p50_ms: ms(lat[lat.len() / 2]),
        p99_ms: ms(lat[lat.len() * 99 / 100]),
        max_ms: ms(*lat.last().unwrap()),
        rate,
    }
}

/// Fills the backlog; returns the fill rate in msg/s.
async fn fill(uri: &str, mode: &str, count: usize) -> f64 {
    let (conn, ch) = channel(uri).await;
    let t0 = Instant::now();
    match mode {
        "delayed" => {
            let mut args = FieldTable::default();
            args.insert("x-delayed-type".into(), AMQPValue::LongString("direct".into()));
            ch.exchange_declare(
                "backlog-delayed".into(),
                ExchangeKind::Custom("x-delayed-message".into()),
                ExchangeDeclareOptions { durable: true, ..Default::default() },
                args,
            )
            .await
            .expect("declare delayed exchange");
            let mut headers = FieldTable::default();
            headers.insert("x-delay".into(), AMQPValue::LongLongInt(30 * 24 * 3600 * 1000));
            let props = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
            publish_confirmed(&ch, "backlog-delayed", "nowhere", count, FILL_WINDOW, props).await;
        }
        _ => {
            let mut args = FieldTable::default();
            if mode == "stream" {
                args.insert("x-queue-type".into(), AMQPValue::LongString("stream".into()));
            }
            declare_durable(&ch, "backlog", args).await;
            publish_confirmed(&ch, "", "backlog", count, FILL_WINDOW, BasicProperties::default().with_delivery_mode(2))
                .await;
        }
    }
    let rate = count as f64 / t0.elapsed().as_secs_f64();
    let _ = conn.close(200, "filled".into()).await;
    rate
}

/// The broker's resident set, MB (from `/proc/PID/status`; 0 if it cannot be read).
fn rss_mb(b: &Broker) -> u64 {
    let status = b.pid().and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok());
    let kb = status.as_deref().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    kb.unwrap_or(0) / 1024
}

fn dir_mb(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .map(|e| match e.metadata() {
                        Ok(m) if m.is_dir() => walk(&e.path()),
                        Ok(m) => m.len(),
                        Err(_) => 0,
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    walk(dir) / (1 << 20)
}

/// Runs `n` probes back to back.
async fn series(uri: &str, what: &str, n: usize) -> Vec<Probe> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(phase(&format!("probe {}/{n}, {what}", i + 1), probe(uri)).await);
    }
    out
}

/// The median of `xs` (upper median for an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One table row per series: median rate and latencies, and the worst p99 against the
/// median p99; then the rates and p99s of every probe.
fn row(what: &str, ps: &[Probe]) -> f64 {
    let p99s: Vec<f64> = ps.iter().map(|p| p.p99_ms).collect();
    let med_p99 = median(p99s.clone());
    let worst = p99s.iter().cloned().fold(0.0, f64::max);
    let rates: Vec<f64> = ps.iter().map(|p| p.rate).collect();
    let (lo, hi) = rates.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    println!(
        "| {what} | {} | {:.0} ({lo:.0}-{hi:.0}) | {:.2} | {med_p99:.2} | {worst:.2} | {:.2}x | {:.2} |",
        ps.len(),
        median(rates),
        median(ps.iter().map(|p| p.p50_ms).collect()),
        worst / med_p99,
        ps.iter().map(|p| p.max_ms).fold(0.0, f64::max),
    );
    worst / med_p99
}

fn detail(what: &str, ps: &[Probe]) {
    let each: Vec<String> = ps.iter().map(|p| format!("{:.0}/{:.1}", p.rate, p.p99_ms)).collect();
    println!("- {what} (msg/s / p99 ms): {}", each.join(", "));
}

async fn phase<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    eprintln!("[backlog] {what} ...");
    tokio::time::timeout(PHASE_LIMIT, f).await.unwrap_or_else(|_| panic!("{what}: longer than {PHASE_LIMIT:?}"))
}

/// Publishes persistent messages with confirms to the `crash` queue for [`CRASH_LOAD`],
/// kills the broker and starts it again; returns the restarted broker and how many
/// messages were confirmed before the kill.
async fn crash_under_load(b: Broker) -> (Broker, usize, Duration) {
    let (conn, ch) = channel(&uri(&b)).await;
    declare_durable(&ch, "crash", FieldTable::default()).await;
    let confirmed = Arc::new(AtomicUsize::new(0));
    let counter = confirmed.clone();
    let load = tokio::spawn(async move {
        let body = vec![b'x'; BODY];
        let props = BasicProperties::default().with_delivery_mode(2);
        let mut inflight = VecDeque::with_capacity(PROBE_WINDOW);
        loop {
            if inflight.len() == PROBE_WINDOW {
                let c: lapin::PublisherConfirm = inflight.pop_front().unwrap();
                match c.await {
                    Ok(c) if c.is_ack() => counter.fetch_add(1, Ordering::SeqCst),
                    _ => return,
                };
            }
            match ch
                .basic_publish("".into(), "crash".into(), BasicPublishOptions::default(), &body, props.clone())
                .await
            {
                Ok(c) => inflight.push_back(c),
                Err(_) => return,
            }
        }
    });
    tokio::time::sleep(CRASH_LOAD).await;
    let before = confirmed.load(Ordering::SeqCst);
    let restarted = Instant::now();
    let b = b.crash_restart();
    let started_in = restarted.elapsed();
    // Confirms that arrived while the kill was under way count too.
    let confirmed = confirmed.load(Ordering::SeqCst);
    assert!(before > 0, "nothing was confirmed in {CRASH_LOAD:?}");
    load.abort();
    drop(conn);
    (b, confirmed, started_in)
}

/// Restarts `b` on its data directory; with the time from the spawn to its READY line.
fn timed_restart(b: Broker) -> (Broker, Duration) {
    let restarted = Instant::now();
    let b = b.restart();
    (b, restarted.elapsed())
}

/// The number of ready messages in `queue` (passive declare).
async fn depth(uri: &str, queue: &str) -> u32 {
    let (conn, ch) = channel(uri).await;
    let q = ch
        .queue_declare(queue.into(), QueueDeclareOptions { passive: true, ..Default::default() }, FieldTable::default())
        .await
        .expect("passive declare");
    let _ = conn.close(200, "counted".into()).await;
    q.message_count()
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let mode = args.first().map(String::as_str).unwrap_or("delayed").to_owned();
    assert!(
        ["delayed", "queue", "stream"].contains(&mode.as_str()),
        "mode is `delayed`, `queue` or `stream`, not {mode:?}"
    );
    let count: usize = args
        .get(1)
        .map(|c| c.replace(['_', ','], "").parse().expect("COUNT"))
        .unwrap_or(if mode == "delayed" { 1_000_000 } else { 10_000_000 });
    let probes: usize = args.get(2).map(|n| n.parse().expect("PROBES")).unwrap_or(10);
    assert!(probes > 0, "PROBES is at least 1");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        // Each restart keeps the data directory and is timed from spawn to READY.
        let b = Broker::start_with(Opts::default().log("warn"));
        phase("warm-up probe", probe(&uri(&b))).await;
        let empty = series(&uri(&b), "empty", probes).await;
        let (b, start_empty) = timed_restart(stop(b));
        let fill_rate = phase(&format!("fill {count} ({mode})"), fill(&uri(&b), &mode, count)).await;
        let full = series(&uri(&b), "backlog", probes).await;
        let rss_full = rss_mb(&b);
        let b = stop(b);
        let size = dir_mb(&b.dir);
        let (b, start_full) = timed_restart(b);
        let rss_restarted = rss_mb(&b);
        let after = series(&uri(&b), "backlog after restart", probes).await;
        let (b, confirmed, start_crash) = phase("crash under load", crash_under_load(b)).await;
        let kept = depth(&uri(&b), "crash").await as usize;
        assert!(kept >= confirmed, "{confirmed} messages confirmed before the crash, {kept} in the queue after it");
        if mode == "queue" {
            assert_eq!(depth(&uri(&b), "backlog").await as usize, count, "backlog depth after the crash");
        }
        let crashed = series(&uri(&b), "backlog after a crash", probes).await;
        // What the broker logged at `warn` and above, over all runs (the harness marks
        // each restart with a `--- ... ---` line).
        let log = stop(b).log();
        if log.lines().any(|l| !l.starts_with("--- ")) {
            eprintln!("[backlog] broker log:\n{log}");
        }
        let what = match mode.as_str() {
            "delayed" => "pending delayed messages",
            "stream" => "messages in a stream",
            _ => "messages in an unconsumed queue",
        };
        println!(
            "\nBacklog: {count} {what} (filled at {fill_rate:.0} msg/s; data dir {size} MB; broker RSS \
             {rss_full} MB after the fill and its probes, {rss_restarted} MB just after the restart)\n"
        );
        println!("| series: probes of {PROBE} persistent {BODY} B publishes, confirms, window {PROBE_WINDOW} | probes | msg/s median (min-max) | confirm p50 ms | median p99 ms | worst p99 ms | worst / median p99 | max ms |");
        println!("|---|---|---|---|---|---|---|---|");
        let spread = [
            row("no backlog", &empty),
            row("with the backlog", &full),
            row("with the backlog, after a restart", &after),
            row("with the backlog, after a crash", &crashed),
        ];
        println!();
        detail("no backlog", &empty);
        detail("with the backlog", &full);
        detail("after a restart", &after);
        detail("after a crash", &crashed);
        println!(
            "\nStart-up to READY: {:.0} ms without the backlog, {:.0} ms with it, {:.0} ms after SIGKILL with it \
             ({confirmed} messages confirmed in the {CRASH_LOAD:?} before the kill, {kept} kept).",
            start_empty.as_secs_f64() * 1000.0,
            start_full.as_secs_f64() * 1000.0,
            start_crash.as_secs_f64() * 1000.0
        );
        let worst = spread.iter().cloned().fold(0.0, f64::max);
        println!("Worst probe p99 within {worst:.2}x of its series' median p99.");
    });
}

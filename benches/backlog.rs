//! Backlog benchmark: does a large backlog slow publishing or start-up down?
//!
//! `cargo bench --bench backlog -- [delayed|queue|stream] [COUNT]`
//!
//! Starts the real `ferrymq` binary (release build, fresh data directory, default
//! configuration: fsync `always`, `--log warn`) on ephemeral loopback ports with the
//! integration tests' harness (`tests/common/broker.rs`) and drives it with `lapin`:
//!
//! * `delayed` (default COUNT 1,000,000): probe, then fill an `x-delayed-message` exchange with
//!   COUNT messages due in 30 days (pending timers), probe again, restart, probe again.
//! * `queue` (default COUNT 10,000,000): probe, then fill a durable queue nobody consumes with
//!   COUNT persistent messages, probe again, restart, probe again.
//! * `stream` (default COUNT 10,000,000): the same with a stream (`x-queue-type: stream`)
//!   that nobody reads.
//!
//! A probe publishes 20,000 persistent 256-byte messages with publisher confirms (window 64)
//! to a separate queue, consumes them, and reports confirm latency percentiles and the rate
//! (after the restart twice, to tell a warming-up broker from a lasting effect).
//! Restarts are timed from spawn to the READY line. Every phase is bounded in count and time;
//! the run prints a Markdown table and stops by itself.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

#[path = "../tests/common/broker.rs"]
mod broker;
use broker::{Broker, Opts};

const PROBE: usize = 20_000;
const PROBE_WINDOW: usize = 64;
const FILL_WINDOW: usize = 1_000;
const BODY: usize = 256;
/// Longest any phase may take.
const PHASE_LIMIT: Duration = Duration::from_secs(900);

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

async fn probe(uri: &str) -> Probe {
    let (conn, ch) = channel(uri).await;
    ch.queue_declare(
        "probe".into(),
        QueueDeclareOptions { durable: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .expect("declare probe");
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
            ch.queue_declare("backlog".into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
                .await
                .expect("declare backlog");
            publish_confirmed(&ch, "", "backlog", count, FILL_WINDOW, BasicProperties::default().with_delivery_mode(2))
                .await;
        }
    }
    let rate = count as f64 / t0.elapsed().as_secs_f64();
    let _ = conn.close(200, "filled".into()).await;
    rate
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

fn row(what: &str, p: &Probe) {
    println!("| {what} | {:.0} | {:.2} | {:.2} | {:.2} |", p.rate, p.p50_ms, p.p99_ms, p.max_ms);
}

async fn phase<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    eprintln!("[backlog] {what} ...");
    tokio::time::timeout(PHASE_LIMIT, f).await.unwrap_or_else(|_| panic!("{what}: longer than {PHASE_LIMIT:?}"))
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
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        // Each restart keeps the data directory and times spawn -> READY (`started_in`).
        let b = Broker::start_with(Opts::default().log("warn"));
        phase("warm-up probe", probe(&uri(&b))).await;
        let empty = phase("probe, empty", probe(&uri(&b))).await;
        let b = stop(b).restart();
        let start_empty = b.started_in;
        let fill_rate = phase(&format!("fill {count} ({mode})"), fill(&uri(&b), &mode, count)).await;
        let full = phase("probe, backlog", probe(&uri(&b))).await;
        let b = stop(b);
        let size = dir_mb(&b.dir);
        let b = b.restart();
        let start_full = b.started_in;
        let after = phase("probe, backlog after restart", probe(&uri(&b))).await;
        let again = phase("probe, backlog after restart, again", probe(&uri(&b))).await;
        // What the broker logged at `warn` and above, over all three runs (the harness marks
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
        println!("\nBacklog: {count} {what} (filled at {fill_rate:.0} msg/s; data dir {size} MB)\n");
        println!("| probe: {PROBE} persistent {BODY} B publishes, confirms, window {PROBE_WINDOW} | msg/s | confirm p50 ms | p99 ms | max ms |");
        println!("|---|---|---|---|---|");
        row("no backlog", &empty);
        row("with the backlog", &full);
        row("with the backlog, after a restart", &after);
        row("the same, second probe", &again);
        println!("\nStart-up to READY: {:.0} ms without the backlog, {:.0} ms with it.", start_empty.as_secs_f64() * 1000.0, start_full.as_secs_f64() * 1000.0);
    });
}

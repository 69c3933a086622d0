//! Route-cache churn benchmark: does subscription churn elsewhere slow publishers down?
//!
//! `cargo bench --bench route_churn -- [PUBLISHERS] [SECONDS] [CHURN_PER_SEC]`
//! (defaults 200, 8, 1000)
//!
//! Starts the real `ferrymq` binary (release build, `--log warn`) on ephemeral loopback
//! ports with the integration tests' harness and drives it over raw MQTT 3.1.1 sockets:
//! PUBLISHERS connections publish QoS 0 to `plant/line<i>` as fast as they can (batches of
//! 64 publishes per write), one subscriber on `plant/#` counts what arrives. The run has
//! two phases of SECONDS each: without churn, then with CHURN_PER_SEC clean clients per
//! second that connect, subscribe to `devices/<n>/cmd` and disconnect (as a fleet of
//! devices coming and going). It reports delivered messages per second, the broker's CPU
//! time per million delivered messages (from `/proc`) and how many publishes per thousand
//! were routed through the routing table instead of a connection's route cache
//! (`$SYS/broker/routing/lookups`), per phase. Every loop is
//! bounded in count and time and the run stops by itself.
//!
//! `BENCH_FERRYMQ_BINARY=/path/to/ferrymq` runs another build (e.g. an older one) the same
//! way, for a side-by-side comparison.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// The bench uses part of the harness.
#[allow(dead_code)]
#[path = "../tests/integration/common/broker.rs"]
mod broker;
use broker::{Broker, Opts};

const BATCH: usize = 64;
const PAYLOAD: usize = 64;

fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let mut b = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            b |= 0x80;
        }
        out.push(b);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

fn connect(id: &str) -> Vec<u8> {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60];
    body.extend_from_slice(&(id.len() as u16).to_be_bytes());
    body.extend_from_slice(id.as_bytes());
    packet(0x10, &body)
}

fn subscribe(filter: &str) -> Vec<u8> {
    let mut body = vec![0, 1];
    body.extend_from_slice(&(filter.len() as u16).to_be_bytes());
    body.extend_from_slice(filter.as_bytes());
    body.push(0);
    packet(0x82, &body)
}

fn publish(topic: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(2 + topic.len() + PAYLOAD);
    body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&[b'x'; PAYLOAD]);
    packet(0x30, &body)
}

/// Connects and waits for CONNACK (and SUBACK when subscribing).
async fn client(addr: std::net::SocketAddr, id: &str, filter: Option<&str>) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).ok();
    s.write_all(&connect(id)).await.expect("CONNECT");
    let mut want = 4;
    if let Some(f) = filter {
        s.write_all(&subscribe(f)).await.expect("SUBSCRIBE");
        want += 5;
    }
    let mut got = 0;
    let mut buf = [0u8; 64];
    while got < want {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await.expect("CONNACK").expect("read");
        assert!(n > 0, "closed before CONNACK");
        got += n;
    }
    s
}

/// Counts PUBLISH packets on a subscriber socket (QoS 0, fixed topic and payload sizes).
async fn count(mut s: TcpStream, delivered: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let n = match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => n,
            Err(_) => continue,
        };
        pending.extend_from_slice(&buf[..n]);
        let mut i = 0;
        let mut packets = 0;
        loop {
            // Fixed header: type byte, remaining length (one or two bytes here).
            if i + 2 > pending.len() {
                break;
            }
            let (mut len, mut at, mut mult) = (0usize, i + 1, 1usize);
            while let Some(&b) = pending.get(at) {
                len += (b & 0x7F) as usize * mult;
                mult *= 128;
                at += 1;
                if b & 0x80 == 0 {
                    break;
                }
            }
            if at > pending.len() || at + len > pending.len() {
                break;
            }
            if pending[i] & 0xF0 == 0x30 {
                packets += 1;
            }
            i = at + len;
        }
        pending.drain(..i);
        delivered.fetch_add(packets, Ordering::Relaxed);
    }
}

async fn publisher(addr: std::net::SocketAddr, i: usize, stop: Arc<AtomicBool>) {
    let mut s = client(addr, &format!("pub-{i}"), None).await;
    let one = publish(&format!("plant/line{i}"));
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * BATCH).collect();
    while !stop.load(Ordering::Relaxed) {
        if s.write_all(&batch).await.is_err() {
            return;
        }
    }
}

/// Devices coming and going: `per_sec` connect, subscribe and disconnect each second.
async fn churn(addr: std::net::SocketAddr, per_sec: u64, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let start = Instant::now();
    let mut n = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        let due = start + Duration::from_secs_f64(n as f64 / per_sec as f64);
        tokio::time::sleep_until(due.into()).await;
        while tasks.len() >= 64 {
            tasks.join_next().await;
        }
        let done = done.clone();
        tasks.spawn(async move {
            let s = client(addr, &format!("dev-{n}"), Some(&format!("devices/{n}/cmd"))).await;
            drop(s);
            done.fetch_add(1, Ordering::Relaxed);
        });
        n += 1;
    }
    while tasks.join_next().await.is_some() {}
}

/// The broker's count of publishes routed through the table rather than a route cache
/// (`$SYS/broker/routing/lookups`, retained, refreshed every second).
async fn routing_lookups(addr: std::net::SocketAddr) -> u64 {
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut s = client(addr, "sys-reader", Some("$SYS/broker/routing/lookups")).await;
    let mut buf = vec![0u8; 512];
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
        // PUBLISH: 0x3?, remaining length, topic length + topic, payload (the number).
        if let Some(i) = got.iter().position(|b| b & 0xF0 == 0x30) {
            if got.len() > i + 4 {
                let len = got[i + 1] as usize;
                let tlen = u16::from_be_bytes([got[i + 2], got[i + 3]]) as usize;
                if got.len() >= i + 2 + len {
                    let payload = &got[i + 4 + tlen..i + 2 + len];
                    return std::str::from_utf8(payload).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
                }
            }
        }
    }
    0
}

/// The broker's CPU time so far (user + system), from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

struct Phase {
    rate: f64,
    cpu_per_million: f64,
    churned: u64,
    /// Routing-table lookups per 1,000 publishes.
    lookups_per_k: f64,
}

async fn phase(b: &Broker, publishers: usize, secs: u64, churn_per_sec: u64) -> Phase {
    let addr = b.mqtt;
    let lookups0 = routing_lookups(addr).await;
    let stop = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(AtomicU64::new(0));
    let churned = Arc::new(AtomicU64::new(0));
    let sub = client(addr, "counter", Some("plant/#")).await;
    let counter = tokio::spawn(count(sub, delivered.clone(), stop.clone()));
    let mut pubs = Vec::new();
    for i in 0..publishers {
        pubs.push(tokio::spawn(publisher(addr, i, stop.clone())));
    }
    let churner = (churn_per_sec > 0).then(|| tokio::spawn(churn(addr, churn_per_sec, stop.clone(), churned.clone())));
    // Warm up one second, then measure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = b.pid().expect("broker pid");
    let (d0, c0, t0) = (delivered.load(Ordering::Relaxed), cpu_seconds(pid), Instant::now());
    let churn0 = churned.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (d1, c1, elapsed) = (delivered.load(Ordering::Relaxed), cpu_seconds(pid), t0.elapsed());
    let churn1 = churned.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for p in pubs {
        let _ = tokio::time::timeout(Duration::from_secs(10), p).await;
    }
    if let Some(c) = churner {
        let _ = tokio::time::timeout(Duration::from_secs(20), c).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), counter).await;
    let all = delivered.load(Ordering::Relaxed) as f64;
    let lookups = routing_lookups(addr).await.saturating_sub(lookups0) as f64;
    let messages = (d1 - d0) as f64;
    Phase {
        rate: messages / elapsed.as_secs_f64(),
        cpu_per_million: (c1 - c0) / messages.max(1.0) * 1e6,
        churned: churn1 - churn0,
        lookups_per_k: lookups / all.max(1.0) * 1000.0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let publishers: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(200);
    let secs: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(8).clamp(1, 120);
    let churn_per_sec: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let b = Broker::start_with(Opts::default().log("warn").env("FERRYMQ_MQTT__SYS_INTERVAL_SECS", "1"));
    let (quiet, busy) = rt.block_on(async {
        let quiet = phase(&b, publishers, secs, 0).await;
        let busy = phase(&b, publishers, secs, churn_per_sec).await;
        (quiet, busy)
    });
    println!(
        "| phase | delivered msg/s | broker CPU s per 1M delivered | table lookups per 1k publishes | churn clients |"
    );
    println!("| --- | --- | --- | --- | --- |");
    println!("| no churn | {:.0} | {:.2} | {:.2} | 0 |", quiet.rate, quiet.cpu_per_million, quiet.lookups_per_k);
    println!(
        "| {churn_per_sec}/s churn | {:.0} | {:.2} | {:.2} | {} ({:.0}/s) |",
        busy.rate,
        busy.cpu_per_million,
        busy.lookups_per_k,
        busy.churned,
        busy.churned as f64 / secs as f64
    );
    println!("publishers {publishers}, {secs} s per phase, QoS 0, {PAYLOAD}-byte payloads");
}

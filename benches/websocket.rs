//! MQTT over WebSocket against MQTT over TCP on one broker in one run: connections per
//! second (CONNECT, CONNACK, DISCONNECT, one client after another) and QoS 1 throughput
//! (one rumqttc publisher -> one rumqttc subscriber, 64-byte payloads, 100 in flight).
//! The same client library on both transports, so the ratio is the transport's cost.
//!
//! `cargo bench --bench websocket -- [CONNECTIONS] [MESSAGES]` (default 2,000 and 200,000;
//! `-- 20 200` is a quick check). Starts the release `ferrymq` binary of this build on
//! ephemeral loopback ports and stops it at the end.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS, Transport};

struct Broker {
    child: std::process::Child,
    mqtt: SocketAddr,
    ws: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Broker {
    fn start() -> Broker {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferrymq"))
            .args(["--data-dir", dir.path().to_str().unwrap(), "--mqtt-listen", "127.0.0.1:0"])
            .args(["--mqtt-ws-listen", "127.0.0.1:0", "--amqp-listen", "", "--http-listen", "", "--log", "warn"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ferrymq");
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        while !line.contains("READY") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "ferrymq exited before READY");
        }
        let field = |name: &str| -> SocketAddr {
            line.split_whitespace().find_map(|kv| kv.strip_prefix(&format!("{name}="))).unwrap().parse().unwrap()
        };
        Broker { mqtt: field("mqtt"), ws: field("ws"), child, _dir: dir }
    }
}

impl Broker {
    /// CPU seconds the broker process has used (user + system, from /proc).
    fn cpu_s(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<f64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        let ticks = 100.0; // USER_HZ on Linux
        f.get(11).zip(f.get(12)).map(|(u, s)| (u + s) / ticks).unwrap_or(0.0)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn options(broker: &Broker, id: &str, ws: bool) -> MqttOptions {
    let mut o = if ws {
        let mut o = MqttOptions::new(id, format!("ws://{}/mqtt", broker.ws), broker.ws.port());
        o.set_transport(Transport::Ws);
        o
    } else {
        MqttOptions::new(id, broker.mqtt.ip().to_string(), broker.mqtt.port())
    };
    o.set_keep_alive(Duration::from_secs(60));
    o.set_inflight(100);
    o
}

/// Polls until `done` says so (bounded: 120 s).
async fn drive(el: &mut rumqttc::EventLoop, mut done: impl FnMut(&Packet) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "no progress within 120 s");
        if let Event::Incoming(p) = tokio::time::timeout(Duration::from_secs(30), el.poll()).await.unwrap().unwrap() {
            if done(&p) {
                return;
            }
        }
    }
}

async fn connections_per_s(broker: &Broker, ws: bool, n: usize) -> f64 {
    let t0 = Instant::now();
    for i in 0..n {
        let (client, mut el) = AsyncClient::new(options(broker, &format!("c{i}"), ws), 10);
        drive(&mut el, |p| matches!(p, Packet::ConnAck(_))).await;
        client.disconnect().await.unwrap();
        while el.poll().await.is_ok() {}
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

/// (messages per second, broker core-microseconds per message).
async fn qos1_msgs_per_s(broker: &Broker, ws: bool, n: usize) -> (f64, f64) {
    let topic = format!("bench/{}", if ws { "ws" } else { "tcp" });
    let (sub, mut sub_el) = AsyncClient::new(options(broker, &format!("sub-{ws}"), ws), 1000);
    sub.subscribe(&topic, QoS::AtLeastOnce).await.unwrap();
    drive(&mut sub_el, |p| matches!(p, Packet::SubAck(_))).await;
    let (publisher, mut pub_el) = AsyncClient::new(options(broker, &format!("pub-{ws}"), ws), 1000);
    let t0 = Instant::now();
    let cpu0 = broker.cpu_s();
    let sender = tokio::spawn({
        let topic = topic.clone();
        async move {
            for _ in 0..n {
                publisher.publish(&topic, QoS::AtLeastOnce, false, vec![0u8; 64]).await.unwrap();
            }
            publisher
        }
    });
    let acks = tokio::spawn(async move {
        let mut acked = 0;
        drive(&mut pub_el, |p| {
            acked += matches!(p, Packet::PubAck(_)) as usize;
            acked == n
        })
        .await;
    });
    let mut got = 0;
    drive(&mut sub_el, |p| {
        got += matches!(p, Packet::Publish(_)) as usize;
        got == n
    })
    .await;
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    let us_per_msg = (broker.cpu_s() - cpu0) * 1e6 / n as f64;
    acks.await.unwrap();
    drop(sender.await.unwrap());
    (rate, us_per_msg)
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let conns = args.first().copied().unwrap_or(2_000);
    let msgs = args.get(1).copied().unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let broker = Broker::start();
        // Alternated, so that drift hits both.
        let tcp_c = connections_per_s(&broker, false, conns).await;
        let ws_c = connections_per_s(&broker, true, conns).await;
        let (ws_t, ws_us) = qos1_msgs_per_s(&broker, true, msgs).await;
        let (tcp_t, tcp_us) = qos1_msgs_per_s(&broker, false, msgs).await;
        println!(
            "{{\"connections\": {conns}, \"tcp_connections_per_s\": {tcp_c:.0}, \"ws_connections_per_s\": {ws_c:.0}, \
             \"ws_over_tcp_connections\": {:.3}, \"messages\": {msgs}, \"tcp_qos1_msgs_per_s\": {tcp_t:.0}, \
             \"ws_qos1_msgs_per_s\": {ws_t:.0}, \"ws_over_tcp_qos1\": {:.3}, \"tcp_broker_core_us_per_msg\": {tcp_us:.2}, \
             \"ws_broker_core_us_per_msg\": {ws_us:.2}}}",
            ws_c / tcp_c,
            ws_t / tcp_t
        );
    });
}

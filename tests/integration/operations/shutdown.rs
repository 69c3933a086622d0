//! SIGTERM stops the broker within its shutdown grace period (`broker.shutdown_grace_secs`)
//! whatever its clients do: while publishes route through binding keys of many `#` words,
//! while connections hold the shutdown up (it ends with the grace period, naming them), and
//! at once on a second SIGTERM (exit code 1, logging what was still running).

use std::time::Duration;

use crate::common::amqp::*;
use crate::common::{Broker, Opts, WAIT};
use tokio::net::TcpStream;

/// A broker whose shutdown waits at most `grace_secs` and whose not-yet-logged-in MQTT
/// sockets would stay two minutes.
fn broker(grace_secs: u64) -> Broker {
    Broker::start_with(
        Opts::default()
            .config(&format!("[broker]\nshutdown_grace_secs = {grace_secs}\n[mqtt]\nconnect_timeout_secs = 120\n")),
    )
}

/// Connections that do not close when told: an MQTT socket that never sends CONNECT and a
/// logged-in AMQP connection that never answers connection.close (the broker waits 5 s for
/// close-ok). Returns them (kept open) and the AMQP one's name as the broker reports it.
async fn stubborn_connections(b: &Broker) -> (TcpStream, RawAmqp<TcpStream>, String) {
    let mqtt = TcpStream::connect(b.mqtt).await.expect("tcp connect");
    let mut amqp = RawAmqp::connect(amqp_addr(b)).await;
    amqp.handshake(0, 0).await;
    let name = format!("{} -> {}", amqp.stream.local_addr().unwrap(), amqp_addr(b));
    (mqtt, amqp, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_broker_while_publishes_route_through_many_hash_words() {
    let mut b = broker(3);
    let addr = amqp_addr(&b);
    let uri = format!("amqp://guest:guest@{addr}/%2f");
    let conn = connect_uri(&uri).await.expect("connect");
    let ch = open_channel(&conn).await;
    declare_exchange(&ch, "hostile", ExchangeKind::Topic, ExchangeDeclareOptions::default(), FieldTable::default())
        .await;
    declare_queue(&ch, "sink", FieldTable::default()).await;
    for n in [1, 3, 6, 12] {
        let pattern = format!("{}.x", vec!["#"; n].join("."));
        bind(&ch, "sink", "hostile", &pattern, FieldTable::default()).await;
    }
    // One publisher more than the broker has runtime workers, all connected first; each
    // then publishes keys of 127 words as fast as its confirms come back (bounded).
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let key = vec!["a"; 127].join(".");
    let mut channels = Vec::new();
    for _ in 0..=workers {
        let conn = connect_uri(&uri).await.expect("connect");
        let ch = open_channel(&conn).await;
        confirm_select(&ch).await;
        channels.push((conn, ch));
    }
    let mut publishers = Vec::new();
    let (sent_tx, mut sent) = tokio::sync::mpsc::unbounded_channel();
    for (conn, ch) in channels {
        let key = key.clone();
        let sent_tx = sent_tx.clone();
        publishers.push(tokio::spawn(async move {
            let _conn = conn;
            for i in 0..10_000 {
                let publish = ch.basic_publish(
                    "hostile".into(),
                    key.as_str().into(),
                    Default::default(),
                    b"hostile",
                    BasicProperties::default(),
                );
                let Ok(Ok(confirm)) = tokio::time::timeout(WAIT, publish).await else { return };
                if i == 0 {
                    let _ = sent_tx.send(());
                }
                if !matches!(tokio::time::timeout(WAIT, confirm).await, Ok(Ok(_))) {
                    return;
                }
            }
        }));
    }
    for _ in 0..=workers {
        bounded("a first publish written", sent.recv()).await.expect("a publisher ended");
    }
    // The publishers are still at it: SIGTERM stops the broker cleanly within its grace.
    b.signal("TERM");
    let status = b.wait_exit(Duration::from_secs(3) + WAIT);
    let status = status.unwrap_or_else(|| panic!("broker still running after SIGTERM; log:\n{}", b.log()));
    assert!(status.success(), "exit {status}; log:\n{}", b.log());
    for p in publishers {
        p.abort();
    }
}

#[tokio::test]
async fn the_grace_period_ends_a_shutdown_that_connections_hold_up() {
    let mut b = broker(2);
    let (_mqtt, _amqp, name) = stubborn_connections(&b).await;
    b.signal("TERM");
    let status = b.wait_exit(Duration::from_secs(2) + WAIT);
    let status = status.unwrap_or_else(|| panic!("broker still running after SIGTERM; log:\n{}", b.log()));
    // The orderly path stopped without them, flushed and exited 0; the log says who stayed.
    assert!(status.success(), "exit {status}; log:\n{}", b.log());
    let log = b.log();
    let line = log
        .lines()
        .find(|l| l.contains("connections still open at the end of the grace period"))
        .unwrap_or_else(|| panic!("no line about the connections left; log:\n{log}"));
    assert!(line.contains("2 connections open") && line.contains(&name), "{line}");
}

#[tokio::test]
async fn a_second_sigterm_exits_at_once_naming_what_is_still_open() {
    let mut b = broker(60);
    let (_mqtt, _amqp, name) = stubborn_connections(&b).await;
    b.signal("TERM");
    // The second signal goes once the shutdown waits for the connections (it logs so).
    assert!(b.wait_log("waiting for connections to close"), "no wait for connections; log:\n{}", b.log());
    // The shutdown now waits up to a minute for the connections: a second SIGTERM ends it.
    b.signal("TERM");
    let status = b.wait_exit(WAIT);
    let status = status.unwrap_or_else(|| panic!("broker still running after a second SIGTERM; log:\n{}", b.log()));
    assert_eq!(status.code(), Some(1), "log:\n{}", b.log());
    let log = b.log();
    let line = log
        .lines()
        .find(|l| l.contains("a second SIGTERM: exiting before the shutdown finished"))
        .unwrap_or_else(|| panic!("no forced-exit line; log:\n{log}"));
    assert!(line.contains("waiting for connections to close"), "{line}");
    assert!(line.contains("2 connections open") && line.contains(&name) && line.contains("user 'guest'"), "{line}");
}

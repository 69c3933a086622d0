//! AMQP 0-9-1 handshake, authentication, heartbeats, frame limits and channels, as a client
//! observes them. Runs against FerryMQ, or against RabbitMQ with `FERRYMQ_TEST_RABBITMQ`.

use std::time::{Duration, Instant};

use crate::common::amqp::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_connects_and_closes_cleanly() {
    let t = Target::start();
    let conn = t.connect().await;
    assert!(conn.status().connected());
    assert_eq!(conn.status().username(), "guest");
    assert_eq!(conn.status().vhost().as_str(), "/");
    bounded("connection.close", conn.close(200, "bye".into())).await.expect("connection.close-ok");
    // lapin resolves close() on close-ok and records the closed state from its own task.
    eventually("connection closed", Duration::from_secs(5), || async { conn.status().closed().then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_start_advertises_version_mechanisms_and_capabilities() {
    let t = Target::start();
    let mut raw = RawAmqp::connect(t.addr).await;
    raw.send(PROTOCOL_HEADER).await;
    let start = raw.expect_method(10, 10).await;
    let p = &start.payload[4..];
    assert_eq!((p[0], p[1]), (0, 9), "version-major/minor");
    // server-properties table, then mechanisms and locales long strings.
    let tlen = u32::from_be_bytes([p[2], p[3], p[4], p[5]]) as usize;
    let table = &p[6..6 + tlen];
    let rest = &p[6 + tlen..];
    let mlen = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let mechanisms = String::from_utf8_lossy(&rest[4..4 + mlen]).to_string();
    assert!(mechanisms.split(' ').any(|m| m == "PLAIN"), "mechanisms {mechanisms:?}");
    let rest = &rest[4 + mlen..];
    let llen = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let locales = String::from_utf8_lossy(&rest[4..4 + llen]).to_string();
    assert!(locales.split(' ').any(|l| l == "en_US"), "locales {locales:?}");
    // Capabilities clients rely on (looked up as raw bytes in the encoded table).
    for cap in [
        "capabilities",
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
    ] {
        let needle = [&[cap.len() as u8][..], cap.as_bytes()].concat();
        assert!(table.windows(needle.len()).any(|w| w == needle), "server-properties lack {cap}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_refused_with_403() {
    let t = Target::start();
    let r = connect_uri(&t.uri_for("guest", "not-the-password", "/")).await;
    let text = expect_code(r, 403);
    assert!(text.starts_with("ACCESS_REFUSED"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_user_is_refused_with_403() {
    let t = Target::start();
    let r = connect_uri(&t.uri_for(&unique("nobody"), "x", "/")).await;
    let text = expect_code(r, 403);
    assert!(text.starts_with("ACCESS_REFUSED"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_vhost_is_refused_with_530() {
    let t = Target::start();
    let vhost = unique("no-such-vhost");
    let r = connect_uri(&t.uri_for("guest", "guest", &vhost)).await;
    let text = expect_code(r, 530);
    assert!(text.starts_with("NOT_ALLOWED"), "{text:?}");
    assert!(text.contains(&vhost), "names the vhost: {text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_protocol_header_gets_the_supported_header_and_a_close() {
    let t = Target::start();
    for bad in [&b"AMQP\x00\x00\x08\x00"[..], b"AMQP\x01\x01\x00\x0a", b"GET / HTTP/1.1\r\n\r\n"] {
        let mut raw = RawAmqp::connect(t.addr).await;
        raw.send(bad).await;
        let answer = raw.read_raw(8).await;
        assert_eq!(answer, PROTOCOL_HEADER, "answer to {bad:02x?}");
        assert!(raw.read_until_closed(WAIT_CLOSE).await.is_empty(), "nothing after the header");
    }
}

const WAIT_CLOSE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_interval_is_negotiated_to_the_lower_value() {
    let t = Target::start();
    let uri = format!("{}?heartbeat=5", t.uri);
    let conn = connect_uri(&uri).await.expect("connect");
    assert_eq!(conn.configuration().heartbeat(), 5);
    // The server's own proposal (in Tune) is larger than 5 and non-zero.
    let mut raw = RawAmqp::connect(t.addr).await;
    let (_, (_, _, server_hb)) = raw.handshake_until_open("guest", "guest", "/", 0, 0).await;
    raw.expect_method(10, 41).await;
    assert!(server_hb > 5, "server proposes heartbeat {server_hb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sends_heartbeats_and_drops_a_silent_peer() {
    let t = Target::start();
    let mut raw = RawAmqp::connect(t.addr).await;
    raw.handshake(0, 1).await;
    let silent_since = Instant::now();
    // The peer now sends nothing; the server must give up after about two intervals.
    let frames = raw.read_until_closed(Duration::from_secs(8)).await;
    let after = silent_since.elapsed();
    eprintln!("silent peer dropped after {after:?}");
    assert!(after >= Duration::from_millis(1500), "closed too early: {after:?}");
    assert!(frames.iter().any(|f| f.kind == 8 && f.channel == 0), "heartbeat frames before the close: {frames:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_sends_heartbeats_stays_connected() {
    let t = Target::start();
    let mut raw = RawAmqp::connect(t.addr).await;
    raw.handshake(0, 1).await;
    let heartbeat = frame(8, 0, &[]);
    let until = Instant::now() + Duration::from_millis(3500);
    while Instant::now() < until {
        raw.send(&heartbeat).await;
        match raw.try_read_frame(Duration::from_millis(400)).await {
            Ok(Some(f)) => assert_eq!(f.kind, 8, "only heartbeats expected: {f:?}"),
            Ok(None) => panic!("the server closed a connection that sent heartbeats"),
            Err(()) => {}
        }
    }
    raw.open_channel(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_larger_than_frame_max_closes_the_connection_with_501() {
    let t = Target::start();
    let mut raw = RawAmqp::connect(t.addr).await;
    let (_, server_max, _) = raw.handshake(4096, 0).await;
    assert!(server_max == 0 || server_max >= 4096);
    raw.open_channel(1).await;
    let queue = unique("frame-max");
    let body = vec![b'x'; 10_000];
    // One body frame of 10000 bytes, far above the negotiated 4096.
    raw.send(&publish_frames(1, "", &queue, &body, body.len())).await;
    let (code, text) = raw.expect_connection_close().await;
    assert_eq!(code, 501, "{text}");
    assert!(text.starts_with("FRAME_ERROR"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_split_across_body_frames_is_reassembled() {
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    let q = declare_queue(&ch, &unique("split"), FieldTable::default()).await;
    let mut raw = RawAmqp::connect(t.addr).await;
    raw.handshake(4096, 0).await;
    raw.open_channel(1).await;
    let body: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    raw.send(&publish_frames(1, "", &q, &body, 4000)).await;
    // Close the raw connection cleanly so the publish is surely processed.
    raw.send(&method_frame(0, 10, 50, &[0, 200, 2, b'o', b'k', 0, 0, 0, 0])).await;
    raw.expect_method(10, 51).await;
    let m = get(&ch, &q, true).await.expect("the message");
    assert_eq!(m.delivery.data, body);
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_open_close_and_many_on_one_connection() {
    let t = Target::start();
    let conn = t.connect().await;
    let mut chans = Vec::new();
    for _ in 0..50 {
        chans.push(open_channel(&conn).await);
    }
    let ids: std::collections::HashSet<u16> = chans.iter().map(|c| c.id()).collect();
    assert_eq!(ids.len(), 50, "distinct channel ids");
    let q = declare_queue(&chans[0], &unique("many-ch"), FieldTable::default()).await;
    for (i, ch) in chans.iter().enumerate() {
        publish(ch, "", &q, format!("m{i}").as_bytes(), BasicProperties::default()).await;
    }
    for ch in &chans[..49] {
        bounded("channel.close", ch.close(200, "done".into())).await.expect("channel.close-ok");
        assert!(!ch.status().connected());
    }
    let last = &chans[49];
    let (messages, _) = queue_counts(last, &q).await.unwrap();
    assert_eq!(messages, 50);
    // A closed channel cannot be used; the connection and other channels still work.
    assert!(chans[0].basic_qos(1, BasicQosOptions::default()).await.is_err());
    let fresh = open_channel(&conn).await;
    assert_eq!(queue_counts(&fresh, &q).await.unwrap().0, 50);
    delete_queue(&fresh, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_flow_is_acknowledged() {
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    // RabbitMQ answers channel.flow(active=true) with flow-ok(true); FerryMQ must too.
    let active =
        bounded("channel.flow", ch.channel_flow(ChannelFlowOptions { active: true })).await.expect("channel.flow-ok");
    assert!(active);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn using_a_channel_that_was_never_opened_is_a_504_connection_error() {
    let t = Target::start();
    let mut raw = RawAmqp::connect(t.addr).await;
    raw.handshake(0, 0).await;
    // queue.declare on channel 7 without channel.open.
    let mut args = 0u16.to_be_bytes().to_vec();
    args.extend(shortstr("x"));
    args.push(0);
    args.extend_from_slice(&0u32.to_be_bytes());
    raw.send(&method_frame(7, 50, 10, &args)).await;
    let (code, text) = raw.expect_connection_close().await;
    assert_eq!(code, 504, "{text}");
    assert!(text.starts_with("CHANNEL_ERROR"), "{text:?}");
}

/// Connection.Update-Secret (RabbitMQ 3.8+, OAuth token refresh): answered with
/// Update-Secret-Ok and the connection keeps working, as RabbitMQ's internal users do
/// (their credentials do not expire, so the new secret is accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_secret_is_answered_and_the_connection_kept() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = declare_queue(&ch, "", FieldTable::default()).await;
    bounded("connection.update-secret", conn.update_secret("new-token".into(), "token refresh".into()))
        .await
        .expect("Update-Secret-Ok");
    assert!(conn.status().connected(), "the connection stays open");
    confirm_select(&ch).await;
    assert!(publish_confirmed(&ch, "", &q, b"after the update", BasicProperties::default()).await.is_ack());
    assert_eq!(drain(&ch, &q).await, ["after the update"]);
}

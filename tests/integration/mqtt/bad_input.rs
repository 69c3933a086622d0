//! Misbehaving clients (raw sockets): each bad input closes only that connection, with the
//! protocol's own error where one exists, and everyone else keeps being served.

use std::time::Duration;

use crate::common::{connect_bytes, connect_v4_bytes, connect_v5_bytes, packet, v4, Broker, Opts, Raw};

/// Asserts that a healthy client still gets a round trip through the broker.
async fn broker_still_serves(broker: &Broker, sub: &mut v4::Client, tag: &str) {
    let p = v4::connect(broker, &format!("check-{tag}")).await;
    p.client.publish("health", v4::QoS::AtLeastOnce, false, tag.as_bytes().to_vec()).await.unwrap();
    let m = sub.next_publish().await;
    assert_eq!(&m.payload[..], tag.as_bytes());
}

/// Sends `bytes` after a CONNECT at `level` and returns everything the broker sends until
/// it closes the connection.
async fn after_connect(broker: &Broker, level: u8, bytes: &[u8]) -> Vec<u8> {
    let mut raw = Raw::connect(broker).await;
    let connect = if level == 5 { connect_v5_bytes("bad") } else { connect_v4_bytes("bad") };
    raw.send(&connect).await;
    let ack = raw.read_at_least(if level == 5 { 3 } else { 4 }).await;
    assert_eq!(ack[0], 0x20, "CONNACK first");
    let ack_len = 2 + ack[1] as usize;
    raw.send(bytes).await;
    let mut rest = ack[ack_len.min(ack.len())..].to_vec();
    rest.extend(raw.read_until_closed().await);
    rest
}

fn has_disconnect(bytes: &[u8], reason: u8) -> bool {
    bytes.windows(3).any(|w| w[0] == 0xE0 && w[2] == reason)
}

#[tokio::test]
async fn malformed_packets_close_only_their_connection() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "healthy").await;
    sub.subscribe("health", v4::QoS::AtLeastOnce).await;

    let cases: Vec<(&str, Vec<u8>, Option<u8>)> = vec![
        // remaining length with 5 continuation bytes
        ("bad remaining length", vec![0x30, 0xff, 0xff, 0xff, 0xff, 0x7f], Some(0x81)),
        // topic that is not UTF-8
        ("bad utf-8", packet(0x30, &[0, 2, 0xc3, 0x28, 0, b'x']), Some(0x81)),
        // wildcard in a PUBLISH topic
        ("wildcard topic", packet(0x30, &[0, 3, b'a', b'/', b'#', 0, b'x']), Some(0x90)),
        // QoS 3
        ("qos 3", packet(0x36, &[0, 1, b'a', 0, 1, 0, b'x']), Some(0x81)),
        // SUBSCRIBE with reserved flags 0000 instead of 0010
        ("reserved flags", packet(0x80, &[0, 1, 0, 0, 1, b'a', 0]), Some(0x81)),
        // reserved packet type 0
        ("packet type 0", vec![0x00, 0x00], Some(0x82)),
        // second CONNECT
        ("second connect", connect_v5_bytes("again"), Some(0x82)),
    ];
    for (name, bytes, reason) in cases {
        // MQTT 5: DISCONNECT with the reason code, then close.
        let got = after_connect(&broker, 5, &bytes).await;
        if let Some(r) = reason {
            assert!(has_disconnect(&got, r), "{name}: expected DISCONNECT 0x{r:02x}, got {got:02x?}");
        }
        // MQTT 3.1.1: just closed.
        let got = after_connect(&broker, 4, &bytes).await;
        assert!(!got.contains(&0xE0), "{name}: 3.1.1 gets no DISCONNECT: {got:02x?}");
        broker_still_serves(&broker, &mut sub, name).await;
    }
}

#[tokio::test]
async fn first_packet_must_be_connect() {
    let broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&packet(0x30, &[0, 1, b'a', b'x'])).await;
    assert!(raw.read_until_closed().await.is_empty());
}

#[tokio::test]
async fn unsupported_protocol_level_is_refused() {
    let broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(9, "x", 0x02, 60, &[])).await;
    let got = raw.read_until_closed().await;
    assert_eq!(got, vec![0x20, 0x02, 0x00, 0x01], "3.1.1 CONNACK 'unacceptable protocol version'");
}

#[tokio::test]
async fn mqtt_3_1_clients_are_accepted() {
    let broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    let mut body = vec![0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 0x02, 0, 60];
    body.extend_from_slice(&[0, 4, b'o', b'l', b'd', b'y']);
    raw.send(&packet(0x10, &body)).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
}

/// MQTT 3.1 sets DUP on a retransmitted PUBREL, SUBSCRIBE and UNSUBSCRIBE (the 3.1.1 rule
/// that those flags must be 0010 does not apply): each is answered, the connection stays.
#[tokio::test]
async fn mqtt_3_1_retransmissions_with_dup_are_answered() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "watcher").await;
    sub.subscribe("old/#", v4::QoS::ExactlyOnce).await;
    let mut raw = Raw::connect(&broker).await;
    let mut body = vec![0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 0x02, 0, 60];
    body.extend_from_slice(&[0, 4, b'o', b'l', b'd', b'y']);
    raw.send(&packet(0x10, &body)).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
    // QoS 2 PUBLISH id 1, then its PUBREL sent twice, the second time with DUP (0x6A).
    raw.send(&packet(0x34, &[0, 5, b'o', b'l', b'd', b'/', b'a', 0, 1, b'x'])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x50, 0x02, 0x00, 0x01], "PUBREC");
    raw.send(&[0x6A, 0x02, 0x00, 0x01]).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x70, 0x02, 0x00, 0x01], "PUBCOMP for a PUBREL with DUP");
    raw.send(&[0x6A, 0x02, 0x00, 0x01]).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x70, 0x02, 0x00, 0x01], "PUBCOMP for a repeated PUBREL");
    assert_eq!(&sub.next_publish().await.payload[..], b"x");
    // SUBSCRIBE (0x8A) and UNSUBSCRIBE (0xAA) with DUP.
    raw.send(&packet(0x8A, &[0, 2, 0, 5, b'o', b'l', b'd', b'/', b'b', 1])).await;
    assert_eq!(raw.read_at_least(5).await, vec![0x90, 0x03, 0x00, 0x02, 0x01], "SUBACK");
    raw.send(&packet(0xAA, &[0, 3, 0, 5, b'o', b'l', b'd', b'/', b'b'])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0xB0, 0x02, 0x00, 0x03], "UNSUBACK");
    // Still connected: a PINGREQ is answered.
    raw.send(&[0xC0, 0x00]).await;
    assert_eq!(raw.read_at_least(2).await, vec![0xD0, 0x00]);
}

#[tokio::test]
async fn oversize_packet_is_refused_before_its_body() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_PACKET_SIZE", "1024"));
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_v5_bytes("big")).await;
    let _ = raw.read_at_least(3).await;
    // Announce 100 MB and send only the header: the broker must not wait for the body.
    raw.send(&[0x30, 0x80, 0x80, 0x80, 0x30]).await;
    let got = raw.read_until_closed().await;
    assert!(has_disconnect(&got, 0x95), "DISCONNECT 0x95 packet too large, got {got:02x?}");
}

#[tokio::test]
async fn keep_alive_is_enforced() {
    let broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "sleepy", 0x02, 1, &[0])).await;
    let _ = raw.read_at_least(3).await;
    let started = std::time::Instant::now();
    let got = raw.read_until_closed().await;
    let waited = started.elapsed();
    assert!(has_disconnect(&got, 0x8D), "DISCONNECT 0x8D keep alive timeout, got {got:02x?}");
    assert!(
        waited >= Duration::from_millis(1200) && waited < Duration::from_millis(2500),
        "closed after 1.5 x keep-alive, took {waited:?}"
    );
}

#[tokio::test]
async fn silent_sockets_are_closed_after_the_connect_timeout() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__CONNECT_TIMEOUT_SECS", "1"));
    let mut raw = Raw::connect(&broker).await;
    assert!(raw.read_until_closed().await.is_empty());
}

#[tokio::test]
async fn garbage_floods_do_not_disturb_others() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "healthy").await;
    sub.subscribe("health", v4::QoS::AtLeastOnce).await;
    let mut seed = 0x1234_5678u64;
    for round in 0..30 {
        let mut raw = Raw::connect(&broker).await;
        if round % 2 == 0 {
            raw.send(&connect_v4_bytes(&format!("g{round}"))).await;
        }
        let mut junk = vec![0u8; 512];
        for b in junk.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        let _ = tokio::io::AsyncWriteExt::write_all(&mut raw.stream, &junk).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_until_closed()).await;
    }
    broker_still_serves(&broker, &mut sub, "after-garbage").await;
}

#[tokio::test]
async fn connection_limit_is_enforced() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_CONNECTIONS", "2"));
    let _a = v4::connect(&broker, "a").await;
    let _b = v4::connect(&broker, "b").await;
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_v4_bytes("c")).await;
    assert!(raw.read_until_closed().await.is_empty(), "third connection is closed without CONNACK");
}

//! Feeds arbitrary bytes to a server-side `Connection`, split into chunks chosen by the
//! first input byte, with a minimal broker that accepts and acknowledges everything.
//!
//! The target itself is [`decode_and_drive`]: `fuzz_targets/decode_and_drive.rs` hands it libFuzzer's input
//! under `cargo +nightly fuzz run decode_and_drive`; on a stable toolchain the same binary replays
//! files, and `cargo test` here replays the committed corpus (`corpus/decode_and_drive/`), so the
//! target compiles and runs in CI without nightly.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ferrymq_mqtt::codec;
use ferrymq_mqtt::*;

fn drive(conn: &mut Connection) {
    while let Some(ev) = conn.poll_event() {
        match ev {
            Event::Connect(_) => conn.accept(Accept { inbound_qos2: vec![1, 2], ..Accept::default() }),
            Event::Publish(p) if p.qos != QoS::AtMostOnce => conn.ack_publish(p.pkid, ReasonCode::SUCCESS),
            Event::Subscribe(s) => {
                conn.ack_subscribe(s.pkid, vec![ReasonCode::GRANTED_QOS_2; s.filters.len()]);
                let _ = conn.send_publish(Outgoing {
                    topic: "fuzz/out".into(),
                    payload: Bytes::from_static(b"x"),
                    qos: QoS::ExactlyOnce,
                    retain: false,
                    dup: false,
                    pkid: None,
                    properties: PublishProperties::default(),
                });
            }
            Event::Unsubscribe(u) => conn.ack_unsubscribe(u.pkid, vec![ReasonCode::SUCCESS; u.filters.len()]),
            _ => {}
        }
    }
    let mut out = BytesMut::new();
    conn.poll_transmit(&mut out);
}

/// Runs one fuzz input; must never panic.
pub fn decode_and_drive(data: &[u8]) {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk % 64) + 1;
    let t0 = Instant::now();
    let config = Config { max_packet_size: 64 * 1024, receive_maximum: 8, topic_alias_maximum: 4, ..Config::default() };
    let mut conn = Connection::new(config, t0);
    let mut buf = BytesMut::new();
    for (i, piece) in rest.chunks(chunk).enumerate() {
        buf.extend_from_slice(piece);
        conn.handle_input(&mut buf, t0 + Duration::from_millis(i as u64));
        drive(&mut conn);
    }
    conn.handle_timeout(t0 + Duration::from_secs(3600));
    drive(&mut conn);
    // The codec alone, at every level, on the same bytes.
    for level in [None, Some(ProtocolLevel::V3_1), Some(ProtocolLevel::V3_1_1), Some(ProtocolLevel::V5)] {
        let mut b = BytesMut::from(rest);
        while let Ok(Some(p)) = codec::decode(&mut b, level, 64 * 1024) {
            let mut out = BytesMut::new();
            let _ = codec::encode(&p, level.unwrap_or(ProtocolLevel::V5), &mut out);
        }
    }
}

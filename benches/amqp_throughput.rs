//! Rough throughput of the sans-IO AMQP 0-9-1 connection's hot paths (`ferrymq-amqp`'s public
//! API, no sockets): encoding deliveries and decoding publishes (method + header + 100-byte
//! body frames) on one open channel.
//!
//! `cargo bench --bench amqp_throughput -- [N]` (default 1,000,000 messages each way, rounded
//! up to a multiple of 1,000; `-- 10000` is a quick check).

use std::time::Instant;

use amq_protocol::frame::{gen_frame, AMQPContentHeader, AMQPFrame, WriteContext};
use amq_protocol::protocol::{basic, channel, connection};
use bytes::{Bytes, BytesMut};
use ferrymq_amqp::frame::PROTOCOL_HEADER;
use ferrymq_amqp::*;

fn encode(frame: &AMQPFrame) -> Vec<u8> {
    gen_frame(frame)(WriteContext::from(Vec::new())).expect("gen").write
}

fn open_connection() -> Connection {
    let t0 = Instant::now();
    let mut conn = Connection::new(Config::default(), t0);
    let mut buf = BytesMut::from(&PROTOCOL_HEADER[..]);
    for m in [
        AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
            mechanism: "PLAIN".into(),
            response: "\0u\0p".into(),
            ..Default::default()
        })),
        AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
            channel_max: 0,
            frame_max: 0,
            heartbeat: 0,
        })),
        AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open { virtual_host: "/".into() })),
    ] {
        buf.extend_from_slice(&encode(&AMQPFrame::Method(0, m)));
        conn.handle_input(&mut buf, t0);
        while let Some(ev) = conn.poll_event() {
            match ev {
                Event::Login { .. } => conn.accept_login(),
                Event::Open { .. } => conn.open_ok(),
                _ => {}
            }
        }
    }
    buf.extend_from_slice(&encode(&AMQPFrame::Method(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    )));
    conn.handle_input(&mut buf, t0);
    while let Some(ev) = conn.poll_event() {
        if let Event::ChannelOpened { channel } = ev {
            conn.channel_open_ok(channel);
        }
    }
    let mut out = BytesMut::new();
    conn.poll_transmit(&mut out);
    conn
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(|a| a.replace(['_', ','], "").parse().expect("N"))
        .unwrap_or(1_000_000);
    let n = n.max(1).div_ceil(1000) * 1000;
    let mut conn = open_connection();
    let props = BasicProperties::default().with_delivery_mode(2).with_content_type("text/plain".into());
    let body = Bytes::from(vec![7u8; 100]);

    // Deliveries.
    let mut out = BytesMut::with_capacity(1 << 20);
    let t = Instant::now();
    for i in 0..n {
        conn.deliver(
            1,
            "amq.ctag-abcdefghijklmnop",
            i as u64,
            false,
            Content { exchange: "amq.direct", routing_key: "some.routing.key", properties: &props, body: &body },
        );
        if conn.pending_output() > 1 << 20 {
            out.clear();
            conn.poll_transmit(&mut out);
        }
    }
    let d = t.elapsed();
    println!("deliver (100 B body): {:.0} msg/s", n as f64 / d.as_secs_f64());

    // Publishes.
    let mut one = Vec::new();
    one.extend(encode(&AMQPFrame::Method(
        1,
        AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: "amq.direct".into(),
            routing_key: "some.routing.key".into(),
            mandatory: false,
            immediate: false,
        })),
    )));
    one.extend(encode(&AMQPFrame::Header(
        1,
        AMQPContentHeader { class_id: 60, body_size: 100, properties: props.clone() },
    )));
    one.extend(encode(&AMQPFrame::Body(1, vec![7u8; 100])));
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 1000).collect();
    let t0 = Instant::now();
    let t = Instant::now();
    let mut published = 0;
    for _ in 0..n / 1000 {
        let mut buf = BytesMut::from(&batch[..]);
        conn.handle_input(&mut buf, t0);
        while let Some(ev) = conn.poll_event() {
            if matches!(ev, Event::Publish(_)) {
                published += 1;
            }
        }
    }
    let d = t.elapsed();
    assert_eq!(published, n);
    println!("publish (100 B body): {:.0} msg/s", n as f64 / d.as_secs_f64());
}

//! Rough throughput of the hot paths (ignored; run in release):
//! `cargo test -p ferrymq-amqp --release --test throughput -- --ignored --nocapture`.

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
    while conn.poll_event().is_some() {}
    let mut out = BytesMut::new();
    conn.poll_transmit(&mut out);
    conn
}

#[test]
#[ignore]
fn throughput() {
    const N: usize = 1_000_000;
    let mut conn = open_connection();
    let props = BasicProperties::default().with_delivery_mode(2).with_content_type("text/plain".into());
    let body = Bytes::from(vec![7u8; 100]);

    // Deliveries.
    let mut out = BytesMut::with_capacity(1 << 20);
    let t = Instant::now();
    for i in 0..N {
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
    println!("deliver (100 B body): {:.0} msg/s", N as f64 / d.as_secs_f64());

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
    let mut n = 0;
    for _ in 0..N / 1000 {
        let mut buf = BytesMut::from(&batch[..]);
        conn.handle_input(&mut buf, t0);
        while let Some(ev) = conn.poll_event() {
            if matches!(ev, Event::Publish(_)) {
                n += 1;
            }
        }
    }
    let d = t.elapsed();
    assert_eq!(n, N);
    println!("publish (100 B body): {:.0} msg/s", N as f64 / d.as_secs_f64());
}

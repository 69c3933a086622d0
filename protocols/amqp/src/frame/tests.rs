use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::{basic, channel, connection, queue};
use amq_protocol::types::{AMQPValue, FieldTable};

use super::*;

/// Encodes a frame with amq-protocol's generator (an independent implementation).
fn amq_encode(frame: &AMQPFrame) -> Vec<u8> {
    let ctx = gen_frame(frame)(amq_protocol::frame::WriteContext::from(Vec::new())).expect("gen");
    ctx.write
}

fn sample_properties() -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("x-int".into(), AMQPValue::LongInt(-5));
    headers.insert("x-str".into(), AMQPValue::LongString("v".into()));
    let mut inner = FieldTable::default();
    inner.insert("deep".into(), AMQPValue::Boolean(true));
    headers.insert("x-table".into(), AMQPValue::FieldTable(inner));
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_priority(3)
        .with_correlation_id("c".into())
        .with_reply_to("r".into())
        .with_expiration("1000".into())
        .with_message_id("m".into())
        .with_timestamp(1_700_000_000)
        .with_type("t".into())
        .with_user_id("u".into())
        .with_app_id("a".into())
}

fn all_frames() -> Vec<Frame> {
    vec![
        Frame::Method {
            channel: 0,
            method: Box::new(AMQPClass::Connection(connection::AMQPMethod::Tune(connection::Tune {
                channel_max: 7,
                frame_max: 4096,
                heartbeat: 30,
            }))),
        },
        Frame::Method {
            channel: 3,
            method: Box::new(AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "amq.topic".into(),
                routing_key: "a.b".into(),
                mandatory: true,
                immediate: false,
            }))),
        },
        Frame::Method {
            channel: 65535,
            method: Box::new(AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: "q".into(),
                durable: true,
                arguments: sample_properties().headers().clone().unwrap_or_default(),
                ..Default::default()
            }))),
        },
        Frame::Header { channel: 3, class_id: 60, body_size: 123_456, properties: Box::new(sample_properties()) },
        Frame::Body { channel: 3, payload: Bytes::from_static(b"hello") },
        Frame::Body { channel: 9, payload: Bytes::new() },
        Frame::Heartbeat,
    ]
}

#[test]
fn every_frame_type_round_trips() {
    for frame in all_frames() {
        let mut buf = BytesMut::new();
        write_frame(&mut buf, &frame);
        buf.extend_from_slice(b"tail");
        assert_eq!(read_frame(&mut buf, 131_072), Ok(Some(frame.clone())), "{frame:?}");
        assert_eq!(&buf[..], b"tail");
    }
}

#[test]
fn our_frames_parse_with_amq_protocol_and_back() {
    for frame in all_frames() {
        let mut buf = BytesMut::new();
        write_frame(&mut buf, &frame);
        let (rest, parsed) = parse_frame(&buf[..]).expect("amq-protocol parses our frame");
        assert!(rest.is_empty());
        let expected = match &frame {
            Frame::Method { channel, method } => AMQPFrame::Method(*channel, (**method).clone()),
            Frame::Header { channel, class_id, body_size, properties } => AMQPFrame::Header(
                *channel,
                AMQPContentHeader { class_id: *class_id, body_size: *body_size, properties: (**properties).clone() },
            ),
            Frame::Body { channel, payload } => AMQPFrame::Body(*channel, payload.to_vec()),
            Frame::Heartbeat => AMQPFrame::Heartbeat,
        };
        assert_eq!(parsed, expected);
        // And amq-protocol's encoding reads back with ours.
        let mut theirs = BytesMut::from(&amq_encode(&expected)[..]);
        assert_eq!(read_frame(&mut theirs, 131_072), Ok(Some(frame)));
    }
}

#[test]
fn byte_by_byte() {
    let mut all = BytesMut::new();
    for frame in all_frames() {
        write_frame(&mut all, &frame);
    }
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for b in all.iter() {
        buf.extend_from_slice(&[*b]);
        while let Some(f) = read_frame(&mut buf, 131_072).expect("valid") {
            got.push(f);
        }
    }
    assert!(buf.is_empty());
    assert_eq!(got, all_frames());
}

#[test]
fn frame_max_is_enforced_from_the_header() {
    // Only the 7-byte header of a 5000-byte method frame: refused at once.
    let mut buf = BytesMut::from(&[1u8, 0, 1, 0, 0, 0x13, 0x88][..]);
    assert_eq!(read_frame(&mut buf, 4096), Err(FrameError::TooLarge { size: 5000, max: 4096 }));
    assert_eq!(buf.len(), 7, "nothing consumed");
    // Exactly frame_max is accepted (RabbitMQ allows payload == frame_max).
    let mut buf = BytesMut::from(&[3u8, 0, 1, 0, 0, 0x10, 0x00][..]);
    assert_eq!(read_frame(&mut buf, 4096), Ok(None));
    // A size that does not fit in u32 arithmetic with the header.
    let mut buf = BytesMut::from(&[3u8, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF][..]);
    assert!(matches!(read_frame(&mut buf, u32::MAX), Ok(None)));
}

#[test]
fn malformed_frames() {
    // Bad frame end.
    let mut buf = BytesMut::from(&[8u8, 0, 0, 0, 0, 0, 0, 0xCD][..]);
    assert!(matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(m)) if m.contains("frame end")));
    // Unknown type, from the header alone.
    let mut buf = BytesMut::from(&[4u8, 0, 0, 0, 0, 0, 9][..]);
    assert!(matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(m)) if m.contains("unknown frame type 4")));
    let mut buf = BytesMut::from(&b"AMQP\x00\x00\x09\x01"[..]);
    assert!(matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(_))));
    // Heartbeat with a payload, or on channel 1.
    let mut buf = BytesMut::from(&[8u8, 0, 0, 0, 0, 0, 1][..]);
    assert!(matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(_))));
    let mut buf = BytesMut::from(&[8u8, 0, 1, 0, 0, 0, 0, 0xCE, 9][..]);
    assert!(matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(m)) if m.contains("channel 1")));
    assert_eq!(&buf[..], &[9], "complete frame consumed");
    // Method payload shorter than its ids, and an undecodable one: consumed, reported.
    let mut buf = BytesMut::from(&[1u8, 0, 1, 0, 0, 0, 2, 0, 20, 0xCE][..]);
    assert!(matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(_))));
    assert!(buf.is_empty());
    let mut buf = BytesMut::from(&[1u8, 0, 1, 0, 0, 0, 4, 0, 20, 0, 10, 0xCE][..]);
    assert!(
        matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(m)) if m.contains("cannot decode method 20.10"))
    );
    // Content header too short.
    let mut buf = BytesMut::from(&[2u8, 0, 1, 0, 0, 0, 2, 0, 60, 0xCE][..]);
    assert!(matches!(read_frame(&mut buf, 4096), Err(FrameError::Malformed(_))));
}

#[test]
fn body_payload_is_not_copied() {
    let mut buf = BytesMut::new();
    write_frame(&mut buf, &Frame::Body { channel: 1, payload: Bytes::from(vec![7u8; 1000]) });
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let Ok(Some(Frame::Body { payload, .. })) = read_frame(&mut buf, 4096) else {
        panic!("body frame expected");
    };
    assert_eq!(payload.len(), 1000);
    let start = payload.as_ptr() as usize;
    assert!(range.contains(&start) && range.contains(&(start + 999)), "payload points into the read buffer");
}

#[test]
fn content_is_split_at_frame_max() {
    let body = Bytes::from((0..20_000u32).map(|i| i as u8).collect::<Vec<_>>());
    for (frame_max, frames) in [(4096u32, 5usize), (131_072, 1), (20_008, 1), (20_007, 2)] {
        let mut out = BytesMut::new();
        write_content(&mut out, 5, &sample_properties(), &body, frame_max);
        let Ok(Some(Frame::Header { body_size, .. })) = read_frame(&mut out, frame_max) else {
            panic!("header");
        };
        assert_eq!(body_size, 20_000);
        let mut got = Vec::new();
        let mut n = 0;
        while let Some(f) = read_frame(&mut out, frame_max).expect("valid") {
            let Frame::Body { channel: 5, payload } = f else {
                panic!("body frame expected");
            };
            assert!(payload.len() + 8 <= frame_max as usize);
            got.extend_from_slice(&payload);
            n += 1;
        }
        assert_eq!(n, frames, "frame_max {frame_max}");
        assert_eq!(got, body);
    }
    // No body frame for an empty body.
    let mut out = BytesMut::new();
    write_content(&mut out, 1, &BasicProperties::default(), &Bytes::new(), 4096);
    assert!(matches!(read_frame(&mut out, 4096), Ok(Some(Frame::Header { body_size: 0, .. }))));
    assert!(out.is_empty());
}

#[test]
fn server_methods_match_amq_protocol() {
    use amq_protocol::protocol::{access, confirm, exchange, tx};
    let methods = vec![
        AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
        AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: 320,
            reply_text: "CONNECTION_FORCED - bye".into(),
            class_id: 0,
            method_id: 0,
        })),
        AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
        AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked { reason: "mem".into() })),
        AMQPClass::Connection(connection::AMQPMethod::Unblocked(connection::Unblocked {})),
        AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(connection::UpdateSecretOk {})),
        AMQPClass::Connection(connection::AMQPMethod::Secure(connection::Secure { challenge: "c".into() })),
        AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
        AMQPClass::Channel(channel::AMQPMethod::Flow(channel::Flow { active: true })),
        AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk { active: false })),
        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
        AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})),
        AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {})),
        AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {})),
        AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {})),
        AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {})),
        AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
            queue: "amq.gen-1".into(),
            message_count: 5,
            consumer_count: 6,
        })),
        AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})),
        AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk { message_count: 3 })),
        AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk { message_count: 4 })),
        AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {})),
        AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
        AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk { consumer_tag: "ctag".into() })),
        AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel { consumer_tag: "ctag".into(), nowait: true })),
        AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk { consumer_tag: "ctag".into() })),
        AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
            exchange: "x".into(),
            routing_key: "k".into(),
        })),
        AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
            consumer_tag: "ctag".into(),
            delivery_tag: 99,
            redelivered: true,
            exchange: "x".into(),
            routing_key: "k".into(),
        })),
        AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
            delivery_tag: 1,
            redelivered: false,
            exchange: "".into(),
            routing_key: "q".into(),
            message_count: 10,
        })),
        AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})),
        AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack { delivery_tag: 5, multiple: true })),
        AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack { delivery_tag: 5, multiple: false, requeue: true })),
        AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {})),
        AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})),
        AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})),
        AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})),
        AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
    ];
    for m in methods {
        let mut ours = BytesMut::new();
        write_method(&mut ours, 2, &m);
        let theirs = amq_encode(&AMQPFrame::Method(2, m.clone()));
        assert_eq!(&ours[..], &theirs[..], "{m:?}");
    }
}

//! Content assembly, publisher confirms, tx/confirm exclusion, outbound content.

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{basic, channel, confirm, queue, tx, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};
use bytes::{Bytes, BytesMut};

use super::client::{bytes, encode, Client};
use crate::connection::{Config, Content, Event, Publish};
use crate::BasicProperties;

fn published(c: &mut Client) -> Vec<Publish> {
    c.events()
        .into_iter()
        .map(|e| match e {
            Event::Publish(p) => *p,
            other => panic!("expected Publish, got {other:?}"),
        })
        .collect()
}

#[test]
fn publish_with_zero_one_and_many_body_frames() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish(1, "empty", b"", 10);
    c.publish(1, "one", b"hello", 100);
    c.publish(1, "many", b"hello world, in pieces", 3);
    let p = published(&mut c);
    assert_eq!(p.len(), 3);
    assert_eq!((p[0].routing_key.as_str(), &p[0].body[..]), ("empty", &b""[..]));
    assert_eq!((p[1].routing_key.as_str(), &p[1].body[..]), ("one", &b"hello"[..]));
    assert_eq!(&p[2].body[..], b"hello world, in pieces");
    assert!(p.iter().all(|p| p.channel == 1 && p.confirm_tag.is_none() && p.exchange.as_str().is_empty()));
    assert!(c.recv().is_empty(), "no reply to a publish");
}

#[test]
fn publish_fields_and_properties() {
    let mut c = Client::open(Config::default());
    c.open_channel(2);
    let mut headers = FieldTable::default();
    headers.insert("h".into(), AMQPValue::LongString("v".into()));
    let props =
        BasicProperties::default().with_content_type("text/plain".into()).with_delivery_mode(2).with_headers(headers);
    c.method(
        2,
        AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: "amq.direct".into(),
            routing_key: "rk".into(),
            mandatory: true,
            immediate: true,
        })),
    );
    c.header(2, 3, props.clone());
    c.body(2, b"abc");
    let p = published(&mut c);
    assert_eq!(
        p,
        vec![Publish {
            channel: 2,
            exchange: "amq.direct".into(),
            routing_key: "rk".into(),
            mandatory: true,
            immediate: true,
            properties: props,
            body: bytes(b"abc"),
            confirm_tag: None,
        }]
    );
}

#[test]
fn single_body_frame_is_not_copied() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish_method(1, "k");
    c.header(1, 1000, BasicProperties::default());
    let frame = encode(&AMQPFrame::Body(1, vec![42u8; 1000]));
    let mut input = BytesMut::from(&frame[..]);
    let range = input.as_ptr() as usize..input.as_ptr() as usize + input.len();
    c.conn.handle_input(&mut input, c.now);
    let p = published(&mut c);
    let start = p[0].body.as_ptr() as usize;
    assert!(range.contains(&start) && range.contains(&(start + 999)), "body points into the read buffer");
}

#[test]
fn interleaved_channels() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.open_channel(2);
    c.publish_method(1, "one");
    c.publish_method(2, "two");
    c.header(2, 4, BasicProperties::default());
    c.header(1, 6, BasicProperties::default());
    c.body(1, b"aaa");
    c.body(2, b"bb");
    c.method(3, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})));
    c.body(2, b"bb");
    c.body(1, b"aaa");
    assert_eq!(c.events(), vec![Event::ChannelOpened { channel: 3 }], "held until the broker answers");
    c.conn.channel_open_ok(3);
    let events = c.events();
    assert_eq!(events.len(), 2);
    let Event::Publish(two) = &events[0] else { panic!("{events:?}") };
    let Event::Publish(one) = &events[1] else { panic!("{events:?}") };
    assert_eq!((two.channel, &two.body[..]), (2, &b"bbbb"[..]));
    assert_eq!((one.channel, &one.body[..]), (1, &b"aaaaaa"[..]));
}

#[test]
fn content_byte_by_byte() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    let mut all = Vec::new();
    all.extend(encode(&AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish::default())))));
    all.extend(encode(&AMQPFrame::Header(
        1,
        amq_protocol::frame::AMQPContentHeader { class_id: 60, body_size: 5, properties: BasicProperties::default() },
    )));
    all.extend(encode(&AMQPFrame::Body(1, b"12".to_vec())));
    all.extend(encode(&AMQPFrame::Body(1, b"345".to_vec())));
    for b in all {
        c.raw(&[b]);
    }
    let p = published(&mut c);
    assert_eq!(&p[0].body[..], b"12345");
    assert!(c.inbuf.is_empty());
}

#[test]
fn method_between_publish_and_header_is_505() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish_method(1, "k");
    c.method(1, AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos::default())));
    let text = c.expect_error(505, (60, 40));
    assert_eq!(text, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead");
    // Body instead of the header.
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish_method(1, "k");
    c.body(1, b"x");
    c.expect_error(505, (60, 40));
}

#[test]
fn method_between_header_and_body_is_505() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish_method(1, "k");
    c.header(1, 10, BasicProperties::default());
    c.body(1, b"12345");
    c.publish_method(1, "k");
    let text = c.expect_error(505, (60, 40));
    assert_eq!(text, "UNEXPECTED_FRAME - expected content body, got non content body frame instead");
    // A second header.
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish_method(1, "k");
    c.header(1, 10, BasicProperties::default());
    c.header(1, 10, BasicProperties::default());
    c.expect_error(505, (60, 40));
}

#[test]
fn content_without_publish_is_505() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.header(1, 1, BasicProperties::default());
    let text = c.expect_error(505, (0, 0));
    assert_eq!(text, "UNEXPECTED_FRAME - expected method frame, got non method frame instead");
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.body(1, b"x");
    c.expect_error(505, (0, 0));
    // On a channel that is not open.
    let mut c = Client::open(Config::default());
    c.body(7, b"x");
    c.expect_error(505, (0, 0));
}

#[test]
fn body_longer_than_announced_is_501() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish_method(1, "k");
    c.header(1, 4, BasicProperties::default());
    c.body(1, b"12");
    c.body(1, b"345");
    let text = c.expect_error(501, (60, 40));
    assert_eq!(text, "FRAME_ERROR - content body frame exceeds remaining content size");
}

#[test]
fn header_of_another_class_is_505() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.publish_method(1, "k");
    c.send(AMQPFrame::Header(
        1,
        amq_protocol::frame::AMQPContentHeader { class_id: 50, body_size: 0, properties: BasicProperties::default() },
    ));
    c.expect_error(505, (60, 40));
}

#[test]
fn oversized_message_closes_the_channel_with_406() {
    let mut c = Client::open(Config { max_message_size: 10, ..Config::default() });
    c.open_channel(1);
    c.open_channel(2);
    c.publish_method(1, "k");
    c.header(1, 11, BasicProperties::default());
    assert_eq!(
        c.expect_channel_close(1),
        (406, "PRECONDITION_FAILED - message size 11 is larger than configured max size 10".into(), 60, 40)
    );
    // Its body frames are discarded; the other channel still works.
    c.body(1, b"12345678901");
    c.publish(2, "k", b"0123456789", 4);
    let events = c.events();
    assert!(matches!(events.as_slice(), [Event::Publish(p)] if p.channel == 2), "{events:?}");
    c.method(1, AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})));
    assert_eq!(c.events(), vec![Event::ChannelClosed { channel: 1 }]);
}

#[test]
fn confirm_tags() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.open_channel(2);
    c.confirm_select(1, false);
    assert_eq!(c.recv_methods(), vec![(1, AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})))]);
    assert_eq!(c.events(), vec![Event::ConfirmSelected { channel: 1 }]);
    c.confirm_select(2, true);
    assert!(c.recv().is_empty(), "nowait: no Select-Ok");
    assert_eq!(c.events(), vec![Event::ConfirmSelected { channel: 2 }]);
    for _ in 0..3 {
        c.publish(1, "k", b"x", 1);
    }
    c.publish(2, "k", b"x", 1);
    // A second Confirm.Select does not restart the sequence.
    c.confirm_select(1, true);
    c.publish(1, "k", b"", 1);
    let tags: Vec<_> = c
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Publish(p) => Some((p.channel, p.confirm_tag)),
            _ => None,
        })
        .collect();
    assert_eq!(tags, vec![(1, Some(1)), (1, Some(2)), (1, Some(3)), (2, Some(1)), (1, Some(4))]);
    // The broker confirms.
    c.conn.confirm(1, 3, true, true);
    c.conn.confirm(2, 1, false, false);
    assert_eq!(
        c.recv_methods(),
        vec![
            (1, AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack { delivery_tag: 3, multiple: true }))),
            (
                2,
                AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack {
                    delivery_tag: 1,
                    multiple: false,
                    requeue: false
                }))
            ),
        ]
    );
    // After reopening, the counter restarts (and confirm mode is off until selected).
    c.method(1, AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close::default())));
    c.recv();
    c.events();
    c.open_channel(1);
    c.publish(1, "k", b"x", 1);
    c.confirm_select(1, true);
    c.publish(1, "k", b"x", 1);
    let tags: Vec<_> = published_tags(&mut c);
    assert_eq!(tags, vec![None, Some(1)]);
}

fn published_tags(c: &mut Client) -> Vec<Option<u64>> {
    c.events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Publish(p) => Some(p.confirm_tag),
            _ => None,
        })
        .collect()
}

#[test]
fn tx_and_confirm_exclude_each_other() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.method(1, AMQPClass::Tx(tx::AMQPMethod::Select(tx::Select {})));
    assert!(matches!(c.events().as_slice(), [Event::Method { channel: 1, .. }]));
    c.confirm_select(1, false);
    assert_eq!(
        c.expect_channel_close(1),
        (406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode".into(), 85, 10)
    );
    assert!(c.events().is_empty());

    c.open_channel(2);
    c.confirm_select(2, true);
    c.events();
    c.method(2, AMQPClass::Tx(tx::AMQPMethod::Select(tx::Select {})));
    assert_eq!(
        c.expect_channel_close(2),
        (406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode".into(), 90, 10)
    );
    assert!(c.events().is_empty());
}

fn content<'a>(props: &'a BasicProperties, body: &'a Bytes) -> Content<'a> {
    Content { exchange: "ex", routing_key: "rk", properties: props, body }
}

#[test]
fn deliver_splits_the_body_at_the_negotiated_frame_max() {
    let mut c = Client::new(Config::default());
    c.raw(crate::frame::PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("u", "p"), false);
    c.conn.accept_login();
    c.tune_ok(0, 4096, 0);
    c.connection_open("/");
    c.conn.open_ok();
    c.recv();
    c.events();
    c.open_channel(1);
    let props = BasicProperties::default().with_message_id("m1".into());
    let body = Bytes::from(vec![9u8; 10_000]);
    c.conn.deliver(1, "ctag", 7, true, content(&props, &body));
    let frames = c.recv();
    assert_eq!(frames.len(), 2 + 3, "method, header, 3 bodies of at most 4088 bytes");
    assert_eq!(
        frames[0],
        AMQPFrame::Method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
                consumer_tag: "ctag".into(),
                delivery_tag: 7,
                redelivered: true,
                exchange: "ex".into(),
                routing_key: "rk".into(),
            }))
        )
    );
    let AMQPFrame::Header(1, h) = &frames[1] else { panic!("{:?}", frames[1]) };
    assert_eq!((h.class_id, h.body_size, &h.properties), (60, 10_000, &props));
    let mut got = Vec::new();
    for f in &frames[2..] {
        let AMQPFrame::Body(1, b) = f else { panic!("{f:?}") };
        assert!(b.len() <= 4096 - 8);
        got.extend_from_slice(b);
    }
    assert_eq!(got, body);
}

#[test]
fn get_ok_and_return() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    let props = BasicProperties::default();
    let body = bytes(b"payload");
    c.conn.get_ok(1, 3, false, 41, content(&props, &body));
    c.conn.basic_return(1, 312, "NO_ROUTE", content(&props, &body));
    c.conn.reply(1, AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})));
    let frames = c.recv();
    assert_eq!(frames.len(), 7);
    assert_eq!(
        frames[0],
        AMQPFrame::Method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
                delivery_tag: 3,
                redelivered: false,
                exchange: "ex".into(),
                routing_key: "rk".into(),
                message_count: 41,
            }))
        )
    );
    assert_eq!(frames[2], AMQPFrame::Body(1, b"payload".to_vec()));
    assert_eq!(
        frames[3],
        AMQPFrame::Method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
                reply_code: 312,
                reply_text: "NO_ROUTE".into(),
                exchange: "ex".into(),
                routing_key: "rk".into(),
            }))
        )
    );
    assert_eq!(frames[6], AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {}))));
}

#[test]
fn output_for_channels_that_are_not_open_is_dropped() {
    let mut c = Client::open(Config::default());
    let props = BasicProperties::default();
    let body = bytes(b"x");
    c.conn.deliver(5, "t", 1, false, content(&props, &body));
    c.conn.get_ok(5, 1, false, 0, content(&props, &body));
    c.conn.basic_return(5, 312, "NO_ROUTE", content(&props, &body));
    c.conn.confirm(5, 1, false, true);
    c.conn.reply(5, AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})));
    c.conn.channel_error(5, 404, "x", 0, 0);
    assert_eq!(c.conn.pending_output(), 0);
}

#[test]
fn long_strings_from_the_broker_are_cut_not_panicking() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    let long = "é".repeat(300);
    let props = BasicProperties::default();
    let body = bytes(b"");
    c.conn.deliver(
        1,
        &long,
        1,
        false,
        Content { exchange: &long, routing_key: &long, properties: &props, body: &body },
    );
    let frames = c.recv();
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) = &frames[0] else {
        panic!("{frames:?}")
    };
    assert_eq!(d.consumer_tag.as_str().len(), 254);
    c.conn.channel_error(1, 404, &long, 0, 0);
    assert_eq!(c.expect_channel_close(1).1.len(), 254);
}

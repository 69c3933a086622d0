//! Protocol header, Start/Start-Ok (SASL), Tune/Tune-Ok, Open, handshake timeout.

use std::time::Duration;

use amq_protocol::auth::{Credentials, SASLMechanism};
use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{channel, connection, AMQPClass};
use amq_protocol::types::AMQPValue;

use super::client::{client_properties, Client};
use crate::connection::{CloseReason, Config, Event, ProtocolError};
use crate::frame::PROTOCOL_HEADER;

#[test]
fn start_after_header_byte_by_byte() {
    let mut c = Client::new(Config::default());
    for b in &PROTOCOL_HEADER[..7] {
        c.raw(&[*b]);
        assert!(c.recv().is_empty(), "partial header waits");
    }
    c.raw(&PROTOCOL_HEADER[7..]);
    let frames = c.recv();
    let [AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Start(s)))] = frames.as_slice() else {
        panic!("expected Start, got {frames:?}");
    };
    assert_eq!((s.version_major, s.version_minor), (0, 9));
    assert_eq!(s.mechanisms.as_bytes(), b"PLAIN AMQPLAIN");
    assert_eq!(s.locales.as_bytes(), b"en_US");
    let props = s.server_properties.inner();
    assert_eq!(props.get("product"), Some(&AMQPValue::LongString("FerryMQ".into())));
    assert_eq!(props.get("platform"), Some(&AMQPValue::LongString("Rust".into())));
    let Some(AMQPValue::FieldTable(caps)) = props.get("capabilities") else {
        panic!("capabilities");
    };
    for cap in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        assert_eq!(caps.inner().get(cap), Some(&AMQPValue::Boolean(true)), "{cap}");
    }
    assert!(c.events().is_empty());
}

#[test]
fn bad_headers_get_the_supported_header() {
    for bad in [
        &b"AMQP\x01\x01\x00\x09"[..],
        b"AMQP\x00\x00\x09\x00",
        b"AMQP\x00\x00\x08\x00",
        b"GET / HTTP/1.1\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01",
        b"\x00",
    ] {
        let mut c = Client::new(Config::default());
        c.raw(bad);
        let mut out = bytes::BytesMut::new();
        c.conn.poll_transmit(&mut out);
        assert_eq!(&out[..], PROTOCOL_HEADER, "{bad:?}");
        assert_eq!(c.events(), vec![Event::Closed(CloseReason::Error(ProtocolError::BadHeader))]);
        assert!(c.conn.is_closed());
        assert_eq!(c.conn.poll_timeout(), None);
    }
}

#[test]
fn login_plain_and_amqplain() {
    for (mechanism, response) in [
        ("PLAIN", Client::plain("alice", "pw")),
        (
            "AMQPLAIN",
            Credentials::new("alice".into(), "pw".into()).sasl_auth_string(SASLMechanism::AMQPlain).as_bytes().to_vec(),
        ),
    ] {
        let mut c = Client::new(Config::default());
        c.raw(PROTOCOL_HEADER);
        c.recv();
        c.start_ok(mechanism, response, false);
        assert_eq!(
            c.events(),
            vec![Event::Login {
                mechanism: mechanism.into(),
                username: "alice".into(),
                password: "pw".into(),
                client_properties: client_properties(false),
            }]
        );
        assert!(c.recv().is_empty(), "nothing sent before the broker decides");
        c.conn.accept_login();
        assert_eq!(
            c.recv_methods(),
            vec![(
                0,
                AMQPClass::Connection(connection::AMQPMethod::Tune(connection::Tune {
                    channel_max: 2047,
                    frame_max: 131_072,
                    heartbeat: 60,
                }))
            )]
        );
    }
}

#[test]
fn unsupported_mechanism_is_refused_with_403() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.recv();
    c.start_ok("EXTERNAL", Vec::new(), false);
    let text = c.expect_error(403, (10, 11));
    assert_eq!(text, "ACCESS_REFUSED - unsupported authentication mechanism 'EXTERNAL'");
}

#[test]
fn malformed_plain_response_is_refused() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.recv();
    c.start_ok("PLAIN", b"no-nul-here".to_vec(), false);
    c.expect_error(403, (10, 11));
}

#[test]
fn refused_login() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.recv();
    c.start_ok("PLAIN", Client::plain("bob", "wrong"), false);
    c.events();
    c.conn.refuse_login("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN");
    let (code, text, class, method) = c.expect_connection_close();
    assert_eq!((code, class, method), (403, 10, 11));
    assert!(text.starts_with("ACCESS_REFUSED - Login was refused"));
    assert!(!c.conn.is_closed(), "waits for Close-Ok");
    c.close_ok_and_expect(CloseReason::ServerClosed { code: 403 });
}

#[test]
fn refused_login_finishes_without_close_ok() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("bob", "wrong"), false);
    c.conn.refuse_login("no");
    c.events();
    let deadline = c.conn.poll_timeout().expect("close timeout");
    assert_eq!(deadline, c.now + crate::connection::CLOSE_TIMEOUT);
    c.advance(crate::connection::CLOSE_TIMEOUT);
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::ServerClosed { code: 403 })]);
}

fn tuned(channel_max: u16, frame_max: u32, heartbeat: u16) -> Client {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("u", "p"), false);
    c.events();
    c.conn.accept_login();
    c.recv();
    c.tune_ok(channel_max, frame_max, heartbeat);
    c
}

#[test]
fn tune_ok_negotiation() {
    let c = tuned(0, 0, 0);
    assert_eq!((c.conn.channel_max(), c.conn.frame_max(), c.conn.heartbeat()), (2047, 131_072, 0));
    let c = tuned(100, 4096, 30);
    assert_eq!((c.conn.channel_max(), c.conn.frame_max(), c.conn.heartbeat()), (100, 4096, 30));
    // The client's heartbeat wins, even above the server's proposal.
    let c = tuned(0, 0, 600);
    assert_eq!(c.conn.heartbeat(), 600);
}

#[test]
fn tune_ok_out_of_limits_is_530() {
    for (channel_max, frame_max, needle) in [
        (0, 4095, "frame_max = 4095 is lower than the minimum allowed value (4096)"),
        (0, 131_073, "frame_max = 131073 is higher than the maximum allowed value (131072)"),
        (2048, 0, "channel_max = 2048 is higher than the maximum allowed value (2047)"),
    ] {
        let mut c = tuned(channel_max, frame_max, 0);
        let text = c.expect_error(530, (10, 30));
        assert!(text.starts_with("NOT_ALLOWED - negotiated "), "{text}");
        assert!(text.contains(needle), "{text}");
    }
}

#[test]
fn frames_on_channels_before_open_ok_are_505() {
    let mut c = tuned(0, 0, 0);
    c.method(1, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})));
    c.expect_error(505, (0, 0));
}

#[test]
fn wrong_connection_method_is_504() {
    // Connection.Open before Tune-Ok.
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("u", "p"), false);
    c.events();
    c.conn.accept_login();
    c.recv();
    c.connection_open("/");
    let text = c.expect_error(504, (10, 40));
    assert_eq!(text, "CHANNEL_ERROR - unexpected method in connection state tuning");
    // Tune-Ok once running.
    let mut c = Client::open(Config::default());
    c.tune_ok(0, 0, 0);
    c.expect_error(504, (10, 31));
    // A channel method on channel 0.
    let mut c = Client::open(Config::default());
    c.method(0, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})));
    let text = c.expect_error(504, (20, 10));
    assert!(text.ends_with("state running"), "{text}");
}

#[test]
fn open_and_open_ok() {
    let mut c = tuned(0, 0, 0);
    c.connection_open("/prod");
    assert_eq!(c.events(), vec![Event::Open { vhost: "/prod".into() }]);
    assert!(c.recv().is_empty());
    c.conn.open_ok();
    assert_eq!(
        c.recv_methods(),
        vec![(0, AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})))]
    );
    assert_eq!(c.conn.poll_timeout(), None, "no handshake timer once open, no heartbeat");
}

#[test]
fn unknown_vhost_connection_error() {
    let mut c = tuned(0, 0, 0);
    c.connection_open("/nope");
    c.events();
    c.conn.connection_error(530, "NOT_ALLOWED - vhost /nope not found", 10, 40);
    let (code, text, class, method) = c.expect_connection_close();
    assert_eq!((code, class, method), (530, 10, 40));
    assert_eq!(text, "NOT_ALLOWED - vhost /nope not found");
    c.close_ok_and_expect(CloseReason::ServerClosed { code: 530 });
}

#[test]
fn pipelined_frames_wait_for_the_broker() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("u", "p"), false);
    c.events();
    c.conn.accept_login();
    c.recv();
    // Tune-Ok, Open, Channel.Open and a heartbeat in one go.
    let mut all = Vec::new();
    for f in [
        AMQPFrame::Method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
                channel_max: 0,
                frame_max: 0,
                heartbeat: 0,
            })),
        ),
        AMQPFrame::Method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open { virtual_host: "/".into() })),
        ),
        AMQPFrame::Method(1, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {}))),
        AMQPFrame::Heartbeat,
    ] {
        all.extend(super::client::encode(&f));
    }
    // Split in the middle of the Channel.Open frame.
    let cut = all.len() - 12;
    c.raw(&all[..cut]);
    assert_eq!(c.events(), vec![Event::Open { vhost: "/".into() }]);
    assert!(c.recv().is_empty());
    c.raw(&all[cut..]);
    assert!(c.events().is_empty(), "held until open_ok");
    c.conn.open_ok();
    assert_eq!(
        c.recv_methods(),
        vec![(0, AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})))]
    );
    assert_eq!(c.events(), vec![Event::ChannelOpened { channel: 1 }]);
    c.conn.channel_open_ok(1);
    assert_eq!(c.recv_methods(), vec![(1, AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})))]);
}

#[test]
fn too_much_input_while_waiting_is_refused() {
    let mut c = tuned(0, 4096, 0);
    c.connection_open("/");
    c.events();
    c.raw(&vec![8u8; 4096 * 4 + 1]);
    let (code, _, _, _) = c.expect_connection_close();
    assert_eq!(code, 505);
}

#[test]
fn handshake_timeout_drops_without_close() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.recv();
    let deadline = c.conn.poll_timeout().expect("handshake timer");
    assert_eq!(deadline, c.now + Duration::from_secs(10));
    c.advance(Duration::from_secs(9));
    assert!(c.events().is_empty());
    c.advance(Duration::from_secs(1));
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::Error(ProtocolError::HandshakeTimeout))]);
    assert!(c.recv().is_empty(), "no Connection.Close");
    assert!(c.conn.is_closed());
    // Also while waiting for the broker's Open-Ok.
    let mut c = tuned(0, 0, 0);
    c.connection_open("/");
    c.events();
    c.advance(Duration::from_secs(10));
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::Error(ProtocolError::HandshakeTimeout))]);
    // Calls after the end do nothing.
    c.conn.open_ok();
    c.conn.connection_error(320, "x", 0, 0);
    assert!(c.recv().is_empty() && c.events().is_empty());
}

#[test]
fn client_close_during_handshake() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.recv();
    c.method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: 200,
            reply_text: "bye".into(),
            class_id: 0,
            method_id: 0,
        })),
    );
    assert_eq!(
        c.recv_methods(),
        vec![(0, AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})))]
    );
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::ClientClosed { code: 200, text: "bye".into() })]);
}

//! Connection close both ways, frame errors, heartbeats, connection.blocked.

use std::time::Duration;

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{basic, connection, AMQPClass};

use super::client::Client;
use crate::connection::{CloseReason, Config, Event, ProtocolError, CLOSE_TIMEOUT};
use crate::frame::{FrameError, PROTOCOL_HEADER};

fn connection_close(code: u16) -> AMQPClass {
    AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
        reply_code: code,
        reply_text: "client bye".into(),
        class_id: 0,
        method_id: 0,
    }))
}

fn close_ok() -> AMQPClass {
    AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {}))
}

#[test]
fn client_close() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.method(0, connection_close(200));
    assert_eq!(c.recv_methods(), vec![(0, close_ok())]);
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::ClientClosed { code: 200, text: "client bye".into() })]);
    assert!(c.conn.is_closed());
    // Nothing more is consumed or produced.
    c.raw(b"garbage");
    c.conn.reply(1, AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})));
    assert!(c.recv().is_empty() && c.events().is_empty());
    assert_eq!(c.inbuf.len(), 7);
}

#[test]
fn server_close_waits_for_close_ok_and_discards_the_rest() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.conn.connection_error(320, "CONNECTION_FORCED - broker shutdown", 0, 0);
    assert_eq!(c.expect_connection_close(), (320, "CONNECTION_FORCED - broker shutdown".into(), 0, 0));
    assert!(!c.conn.is_closed());
    // Frames meanwhile are discarded, even invalid ones.
    c.publish(1, "k", b"abc", 1);
    c.method(9, AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos::default())));
    c.conn.reply(1, AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})));
    c.conn.blocked("x");
    assert!(c.events().is_empty() && c.recv().is_empty());
    assert!(c.inbuf.is_empty());
    c.close_ok_and_expect(CloseReason::ServerClosed { code: 320 });
}

#[test]
fn server_close_times_out() {
    let mut c = Client::open(Config::default());
    c.conn.connection_error(541, "INTERNAL_ERROR", 0, 0);
    c.recv();
    assert_eq!(c.conn.poll_timeout(), Some(c.now + CLOSE_TIMEOUT));
    c.advance(CLOSE_TIMEOUT - Duration::from_millis(1));
    assert!(c.events().is_empty());
    c.advance(Duration::from_millis(1));
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::ServerClosed { code: 541 })]);
    assert_eq!(c.conn.poll_timeout(), None);
}

#[test]
fn crossed_connection_close() {
    let mut c = Client::open(Config::default());
    c.conn.connection_error(320, "CONNECTION_FORCED - bye", 0, 0);
    c.recv();
    c.method(0, connection_close(200));
    assert_eq!(c.recv_methods(), vec![(0, close_ok())]);
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::ServerClosed { code: 320 })]);
}

#[test]
fn framing_error_while_closing_stops_looking_for_close_ok() {
    let mut c = Client::open(Config::default());
    c.conn.connection_error(320, "CONNECTION_FORCED - bye", 0, 0);
    c.recv();
    // An undelimitable frame: from now on everything is discarded (this looped forever
    // once).
    c.raw(&[9, 0, 0, 0, 0, 0, 0, 0xCE]);
    c.method(0, close_ok());
    assert!(c.inbuf.is_empty());
    assert!(c.events().is_empty());
    c.advance(CLOSE_TIMEOUT);
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::ServerClosed { code: 320 })]);
}

#[test]
fn connection_error_before_the_header_finishes_at_once() {
    let mut c = Client::new(Config::default());
    c.conn.connection_error(320, "x", 0, 0);
    assert!(c.recv().is_empty());
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::ServerClosed { code: 320 })]);
}

#[test]
fn oversized_frame_is_refused_from_its_header() {
    let mut c = Client::open(Config::default());
    // Header of a 200 KB body frame, no payload yet.
    c.raw(&[3, 0, 1, 0, 3, 0x0D, 0x40]);
    let (code, text, _, _) = c.expect_connection_close();
    assert_eq!(code, 501);
    assert_eq!(text, "FRAME_ERROR - frame of 200000 bytes exceeds frame_max 131072");
    // The stream is lost: all further input is discarded, even a Close-Ok.
    c.raw(&[0u8; 1000]);
    c.method(0, close_ok());
    assert!(c.inbuf.is_empty());
    assert!(c.events().is_empty());
    c.advance(CLOSE_TIMEOUT);
    assert_eq!(
        c.events(),
        vec![Event::Closed(CloseReason::Error(ProtocolError::Frame(FrameError::TooLarge {
            size: 200_000,
            max: 131_072
        })))]
    );
}

#[test]
fn bad_frame_end_and_unknown_type() {
    let mut c = Client::open(Config::default());
    c.raw(&[8, 0, 0, 0, 0, 0, 0, 0xCD]);
    assert_eq!(c.expect_connection_close().0, 501);
    let mut c = Client::open(Config::default());
    c.raw(&[9, 0, 0, 0, 0, 0, 0]);
    let (code, text, _, _) = c.expect_connection_close();
    assert_eq!((code, text.as_str()), (501, "FRAME_ERROR - malformed frame: unknown frame type 9"));
    // During the handshake too (frame_max is the server's until Tune-Ok).
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.recv();
    c.raw(&[1, 0, 0, 0, 2, 0, 1]);
    assert_eq!(c.expect_connection_close().0, 501);
}

fn with_heartbeat(heartbeat: u16) -> Client {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("u", "p"), false);
    c.conn.accept_login();
    c.tune_ok(0, 0, heartbeat);
    c.connection_open("/");
    c.conn.open_ok();
    c.recv();
    c.events();
    c
}

fn heartbeats(c: &mut Client) -> usize {
    c.recv().iter().filter(|f| matches!(f, AMQPFrame::Heartbeat)).count()
}

#[test]
fn heartbeats_are_sent_when_idle_for_half_the_interval() {
    let mut c = with_heartbeat(10);
    assert_eq!(c.conn.poll_timeout(), Some(c.now + Duration::from_secs(5)));
    c.advance(Duration::from_millis(4999));
    assert_eq!(heartbeats(&mut c), 0);
    c.advance(Duration::from_millis(1));
    assert_eq!(heartbeats(&mut c), 1);
    // Other output counts as traffic.
    c.advance(Duration::from_secs(3));
    c.open_channel(1);
    c.advance(Duration::from_secs(3));
    assert_eq!(heartbeats(&mut c), 0);
    c.advance(Duration::from_secs(2));
    assert_eq!(heartbeats(&mut c), 1);
}

#[test]
fn missed_heartbeats_close_without_close_method() {
    let mut c = with_heartbeat(10);
    // The client keeps sending something: alive.
    for _ in 0..5 {
        c.advance(Duration::from_secs(15));
        c.send(AMQPFrame::Heartbeat);
    }
    assert!(c.events().is_empty());
    c.recv();
    // Silence for two intervals.
    c.advance(Duration::from_secs(19));
    assert!(c.events().is_empty());
    c.advance(Duration::from_secs(1));
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::Error(ProtocolError::HeartbeatTimeout))]);
    assert!(c.recv().iter().all(|f| matches!(f, AMQPFrame::Heartbeat)), "no Connection.Close");
    assert!(c.conn.is_closed());
}

#[test]
fn partial_frames_count_as_traffic() {
    let mut c = with_heartbeat(1);
    // A method frame of 100 bytes, trickling in.
    for b in [1u8, 0, 0, 0, 0, 0, 100, 0, 0, 0] {
        c.advance(Duration::from_millis(1500));
        c.raw(&[b]);
    }
    assert!(c.events().is_empty());
    // Repeating the same partial buffer without new bytes does not.
    let mut buf = c.inbuf.clone();
    c.now += Duration::from_millis(1500);
    c.conn.handle_input(&mut buf, c.now);
    c.advance(Duration::from_millis(600));
    assert_eq!(c.events(), vec![Event::Closed(CloseReason::Error(ProtocolError::HeartbeatTimeout))]);
}

#[test]
fn no_heartbeat_when_disabled() {
    let mut c = with_heartbeat(0);
    assert_eq!(c.conn.poll_timeout(), None);
    c.advance(Duration::from_secs(3600));
    assert!(c.events().is_empty() && c.recv().is_empty());
}

#[test]
fn heartbeats_start_at_tune_ok() {
    let mut c = Client::new(Config::default());
    c.raw(PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("u", "p"), false);
    c.conn.accept_login();
    c.tune_ok(0, 0, 2);
    c.recv();
    assert_eq!(c.conn.poll_timeout(), Some(c.now + Duration::from_secs(1)));
    c.advance(Duration::from_secs(1));
    assert_eq!(heartbeats(&mut c), 1);
}

#[test]
fn blocked_only_with_the_capability() {
    let mut c = Client::new(Config::default());
    c.handshake(true);
    c.conn.blocked("low on memory");
    c.conn.blocked("again");
    assert_eq!(
        c.recv_methods(),
        vec![(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked {
                reason: "low on memory".into()
            }))
        )]
    );
    c.conn.unblocked();
    c.conn.unblocked();
    assert_eq!(
        c.recv_methods(),
        vec![(0, AMQPClass::Connection(connection::AMQPMethod::Unblocked(connection::Unblocked {})))]
    );
    let mut c = Client::new(Config::default());
    c.handshake(false);
    c.conn.blocked("low on memory");
    c.conn.unblocked();
    assert!(c.recv().is_empty());
}

#[test]
fn blocked_before_open_ok_is_sent_after_it() {
    let mut c = Client::new(Config::default());
    c.conn.blocked("disk");
    c.raw(PROTOCOL_HEADER);
    c.start_ok("PLAIN", Client::plain("u", "p"), true);
    c.conn.accept_login();
    c.tune_ok(0, 0, 0);
    c.connection_open("/");
    c.recv();
    c.conn.open_ok();
    assert_eq!(
        c.recv_methods(),
        vec![
            (0, AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {}))),
            (0, AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked { reason: "disk".into() }))),
        ]
    );
    // Unblocked before Open-Ok cancels it.
    let mut c = Client::new(Config::default());
    c.conn.blocked("disk");
    c.conn.unblocked();
    c.handshake(true);
    assert!(c.recv().is_empty());
}

#[test]
fn poll_transmit_appends() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.conn.reply(1, AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})));
    let n = c.conn.pending_output();
    assert!(n > 0);
    let mut out = bytes::BytesMut::from(&b"xy"[..]);
    assert!(c.conn.poll_transmit(&mut out));
    assert_eq!(out.len(), n + 2);
    assert!(!c.conn.poll_transmit(&mut out));
    assert_eq!(c.conn.pending_output(), 0);
}

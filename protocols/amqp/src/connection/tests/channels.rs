//! Channel lifecycle: open, close both ways, flow, channel 0 rules, forwarded methods.

use amq_protocol::frame::AMQPFrame;
use amq_protocol::protocol::{access, basic, channel, confirm, connection, exchange, queue, tx, AMQPClass};

use super::client::Client;
use crate::connection::{Config, Event};

fn channel_close(code: u16) -> AMQPClass {
    AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
        reply_code: code,
        reply_text: "bye".into(),
        class_id: 0,
        method_id: 0,
    }))
}

fn close_ok() -> AMQPClass {
    AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {}))
}

#[test]
fn open_and_client_close() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.open_channel(2047);
    assert!(c.conn.is_channel_open(1) && c.conn.is_channel_open(2047));
    c.method(1, channel_close(200));
    assert_eq!(c.recv_methods(), vec![(1, close_ok())]);
    assert_eq!(c.events(), vec![Event::ChannelClosed { channel: 1 }]);
    assert!(!c.conn.is_channel_open(1));
    // The number can be reused.
    c.open_channel(1);
}

#[test]
fn reopening_an_open_channel_is_504() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.method(1, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})));
    let text = c.expect_error(504, (20, 10));
    assert_eq!(text, "CHANNEL_ERROR - second 'channel.open' seen");
}

#[test]
fn channel_out_of_range_is_504() {
    let mut c = Client::open(Config::default());
    c.method(2048, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})));
    c.expect_error(504, (20, 10));
}

#[test]
fn method_on_a_closed_channel_is_504() {
    let mut c = Client::open(Config::default());
    c.method(
        3,
        AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare { queue: "q".into(), ..Default::default() })),
    );
    let text = c.expect_error(504, (50, 10));
    assert_eq!(text, "CHANNEL_ERROR - expected 'channel.open'");
}

#[test]
fn server_channel_error_waits_for_close_ok() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.conn.channel_error(1, 404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10);
    assert_eq!(c.expect_channel_close(1), (404, "NOT_FOUND - no queue 'q' in vhost '/'".into(), 50, 10));
    assert!(!c.conn.is_channel_open(1));
    // Everything but Close/Close-Ok is discarded meanwhile, content included.
    c.method(1, AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos { prefetch_count: 1, global: false })));
    c.publish(1, "k", b"body", 2);
    c.body(1, b"stray body");
    assert!(c.events().is_empty() && c.recv().is_empty());
    // Output for the channel is dropped.
    c.conn.reply(1, AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})));
    c.conn.channel_error(1, 406, "again", 0, 0);
    assert!(c.recv().is_empty());
    c.method(1, close_ok());
    assert_eq!(c.events(), vec![Event::ChannelClosed { channel: 1 }]);
    c.open_channel(1);
}

#[test]
fn crossed_channel_close() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.conn.channel_error(1, 406, "PRECONDITION_FAILED - x", 60, 80);
    c.recv();
    // The client closes at the same time: answered, and the channel is finished.
    c.method(1, channel_close(200));
    assert_eq!(c.recv_methods(), vec![(1, close_ok())]);
    assert_eq!(c.events(), vec![Event::ChannelClosed { channel: 1 }]);
    // Its Close-Ok for our Close arrives after: ignored.
    c.method(1, close_ok());
    assert!(c.events().is_empty() && c.recv().is_empty());
    c.open_channel(1);
}

#[test]
fn flow() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    for active in [false, true] {
        c.method(1, AMQPClass::Channel(channel::AMQPMethod::Flow(channel::Flow { active })));
        assert_eq!(
            c.recv_methods(),
            vec![(1, AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk { active })))]
        );
        assert_eq!(c.events(), vec![Event::ChannelFlow { channel: 1, active }]);
    }
}

#[test]
fn broker_methods_are_forwarded() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    let methods = vec![
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
            exchange: "x".into(),
            kind: "topic".into(),
            ..Default::default()
        })),
        AMQPClass::Exchange(exchange::AMQPMethod::Delete(exchange::Delete::default())),
        AMQPClass::Exchange(exchange::AMQPMethod::Bind(exchange::Bind::default())),
        AMQPClass::Exchange(exchange::AMQPMethod::Unbind(exchange::Unbind::default())),
        AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare::default())),
        AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind::default())),
        AMQPClass::Queue(queue::AMQPMethod::Purge(queue::Purge::default())),
        AMQPClass::Queue(queue::AMQPMethod::Delete(queue::Delete::default())),
        AMQPClass::Queue(queue::AMQPMethod::Unbind(queue::Unbind::default())),
        AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos { prefetch_count: 10, global: false })),
        AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
            queue: "q".into(),
            consumer_tag: "c".into(),
            ..Default::default()
        })),
        AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel { consumer_tag: "c".into(), nowait: false })),
        AMQPClass::Basic(basic::AMQPMethod::Get(basic::Get::default())),
        AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack { delivery_tag: 1, multiple: false })),
        AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack { delivery_tag: 2, multiple: true, requeue: true })),
        AMQPClass::Basic(basic::AMQPMethod::Reject(basic::Reject { delivery_tag: 3, requeue: false })),
        AMQPClass::Basic(basic::AMQPMethod::Recover(basic::Recover { requeue: true })),
        AMQPClass::Basic(basic::AMQPMethod::RecoverAsync(basic::RecoverAsync { requeue: true })),
        AMQPClass::Tx(tx::AMQPMethod::Select(tx::Select {})),
        AMQPClass::Tx(tx::AMQPMethod::Commit(tx::Commit {})),
        AMQPClass::Tx(tx::AMQPMethod::Rollback(tx::Rollback {})),
    ];
    for m in methods {
        c.method(1, m.clone());
        assert_eq!(c.events(), vec![Event::Method { channel: 1, method: Box::new(m) }]);
        assert!(c.recv().is_empty());
    }
    // The broker answers.
    c.conn.reply(1, AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})));
    assert_eq!(c.recv_methods(), vec![(1, AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})))]);
    // Access.Request is answered here.
    c.method(1, AMQPClass::Access(access::AMQPMethod::Request(access::Request::default())));
    assert_eq!(c.recv_methods(), vec![(1, AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})))]);
    assert!(c.events().is_empty());
}

#[test]
fn reply_with_close_goes_through_channel_error() {
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.conn.reply(
        1,
        AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
            reply_code: 404,
            reply_text: "NOT_FOUND - x".into(),
            class_id: 50,
            method_id: 10,
        })),
    );
    assert_eq!(c.expect_channel_close(1).0, 404);
    assert!(!c.conn.is_channel_open(1));
}

#[test]
fn server_only_methods_are_503() {
    for m in [
        AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver::default())),
        AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk::default())),
        AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk { active: true })),
        AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk::default())),
        AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
        AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked::default())),
    ] {
        let ids = (m.get_amqp_class_id(), m.get_amqp_method_id());
        let mut c = Client::open(Config::default());
        c.open_channel(1);
        c.method(1, m);
        let text = c.expect_error(503, ids);
        assert_eq!(text, "COMMAND_INVALID - unimplemented method");
    }
}

#[test]
fn unknown_and_undecodable_methods() {
    // basic.credit (60.200): not in 0-9-1 as amq-protocol knows it.
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.raw(&[1, 0, 1, 0, 0, 0, 4, 0, 60, 0, 200, 0xCE]);
    let text = c.expect_error(540, (60, 200));
    assert_eq!(text, "NOT_IMPLEMENTED - unknown method 60.200");
    // queue.declare cut short: 501 "cannot decode", as RabbitMQ.
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.raw(&[1, 0, 1, 0, 0, 0, 6, 0, 50, 0, 10, 0, 0, 0xCE]);
    let text = c.expect_error(501, (50, 10));
    assert_eq!(text, "FRAME_ERROR - cannot decode method 50.10");
    // Shorter than the ids.
    let mut c = Client::open(Config::default());
    c.raw(&[1, 0, 0, 0, 0, 0, 1, 0, 0xCE]);
    c.expect_error(501, (0, 0));
}

#[test]
fn channel_zero_rules() {
    // Content on channel 0.
    let mut c = Client::open(Config::default());
    c.body(0, b"x");
    let text = c.expect_error(505, (0, 0));
    assert_eq!(text, "UNEXPECTED_FRAME - content frame on channel 0");
    let mut c = Client::open(Config::default());
    c.header(0, 1, Default::default());
    c.expect_error(505, (0, 0));
    // Heartbeat on channel 1.
    let mut c = Client::open(Config::default());
    c.open_channel(1);
    c.raw(&[8, 0, 1, 0, 0, 0, 0, 0xCE]);
    c.expect_error(505, (0, 0));
    // Heartbeats on channel 0 are fine at any time.
    let mut c = Client::new(Config::default());
    c.raw(crate::frame::PROTOCOL_HEADER);
    c.send(AMQPFrame::Heartbeat);
    c.recv();
    assert!(c.events().is_empty() && !c.conn.is_closed());
}

#[test]
fn update_secret_is_forwarded_on_channel_0() {
    let mut c = Client::open(Config::default());
    let m = AMQPClass::Connection(connection::AMQPMethod::UpdateSecret(connection::UpdateSecret {
        new_secret: "token".into(),
        reason: "refresh".into(),
    }));
    c.method(0, m.clone());
    assert_eq!(c.events(), vec![Event::Method { channel: 0, method: Box::new(m) }]);
    c.conn.reply(0, AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(connection::UpdateSecretOk {})));
    assert_eq!(
        c.recv_methods(),
        vec![(0, AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(connection::UpdateSecretOk {})))]
    );
}

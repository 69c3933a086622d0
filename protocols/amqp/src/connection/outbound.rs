//! What the broker sends through the connection: method replies, Basic.Deliver, Get-Ok
//! and Return with their [`Content`] (method, content header and body frames split at the
//! negotiated `frame_max`), publisher confirms, and `connection.blocked`/`unblocked`.
//! Output for a channel that is not open, before Open-Ok or once closing is dropped.

use amq_protocol::protocol::{channel, connection};
use bytes::Bytes;

use super::{Connection, Phase};
use crate::{wire, AMQPClass, BasicProperties};

/// A message the broker sends to a consumer or as a Get-Ok / Return.
#[derive(Debug, Clone)]
pub struct Content<'a> {
    /// Exchange it was published to.
    pub exchange: &'a str,
    /// Routing key it was published with.
    pub routing_key: &'a str,
    /// Content header properties, written into the content header frame.
    pub properties: &'a BasicProperties,
    /// Body (written into body frames split at the negotiated frame_max).
    pub body: &'a Bytes,
}

/// Connection.Blocked state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Blocked {
    /// Not blocked: initially, and after [`Connection::unblocked`].
    No,
    /// [`Connection::blocked`] called before Open-Ok: sent then, with this reason.
    Pending(String),
    /// Connection.Blocked sent.
    Sent,
}

impl Connection {
    /// Sends a method on an open channel (an -Ok reply, Basic.Cancel from the server, ...),
    /// or a connection method on channel 0 (Update-Secret-Ok). Channel.Close goes through
    /// [`Connection::channel_error`] and Connection.Close through
    /// [`Connection::connection_error`]. Dropped before Open-Ok, once closing, or if the
    /// channel is not open.
    pub fn reply(&mut self, channel: u16, method: AMQPClass) {
        if self.phase != Phase::Running {
            return;
        }
        match &method {
            AMQPClass::Channel(channel::AMQPMethod::Close(c)) if channel != 0 => {
                self.channel_error(channel, c.reply_code, c.reply_text.as_str(), c.class_id, c.method_id);
                return;
            }
            AMQPClass::Connection(connection::AMQPMethod::Close(c)) => {
                self.connection_error(c.reply_code, c.reply_text.as_str(), c.class_id, c.method_id);
                return;
            }
            _ => {}
        }
        let allowed =
            if channel == 0 { matches!(method, AMQPClass::Connection(_)) } else { self.channels.is_open(channel) };
        if allowed {
            wire::put_method_frame(self.output(), channel, &method);
        }
    }

    /// Sends Basic.Deliver with the content.
    pub fn deliver(
        &mut self,
        channel: u16,
        consumer_tag: &str,
        delivery_tag: u64,
        redelivered: bool,
        content: Content<'_>,
    ) {
        if !self.is_channel_open(channel) {
            return;
        }
        let out = self.output();
        let at = wire::begin_frame(out, wire::FRAME_METHOD, channel);
        out.extend_from_slice(&[0, 60, 0, 60]);
        wire::put_deliver(out, consumer_tag, delivery_tag, redelivered, content.exchange, content.routing_key);
        wire::end_frame(out, at);
        self.put_content(channel, &content);
    }

    /// Sends Basic.Get-Ok with the content.
    pub fn get_ok(
        &mut self,
        channel: u16,
        delivery_tag: u64,
        redelivered: bool,
        message_count: u32,
        content: Content<'_>,
    ) {
        if !self.is_channel_open(channel) {
            return;
        }
        let out = self.output();
        let at = wire::begin_frame(out, wire::FRAME_METHOD, channel);
        out.extend_from_slice(&[0, 60, 0, 71]);
        wire::put_get_ok(out, delivery_tag, redelivered, content.exchange, content.routing_key, message_count);
        wire::end_frame(out, at);
        self.put_content(channel, &content);
    }

    /// Sends Basic.Return (e.g. 312 NO_ROUTE for a mandatory publish) with the content.
    pub fn basic_return(&mut self, channel: u16, reply_code: u16, reply_text: &str, content: Content<'_>) {
        if !self.is_channel_open(channel) {
            return;
        }
        let out = self.output();
        let at = wire::begin_frame(out, wire::FRAME_METHOD, channel);
        out.extend_from_slice(&[0, 60, 0, 50]);
        wire::put_return(out, reply_code, reply_text, content.exchange, content.routing_key);
        wire::end_frame(out, at);
        self.put_content(channel, &content);
    }

    fn put_content(&mut self, channel: u16, content: &Content<'_>) {
        let frame_max = self.frame_max;
        wire::put_content(self.output(), channel, content.properties, content.body, frame_max);
    }

    /// Sends a publisher confirm: Basic.Ack (`ack`) or Basic.Nack for `delivery_tag`
    /// (and every earlier one when `multiple`).
    pub fn confirm(&mut self, channel: u16, delivery_tag: u64, multiple: bool, ack: bool) {
        if !self.is_channel_open(channel) {
            return;
        }
        wire::put_confirm(self.output(), channel, delivery_tag, multiple, ack);
    }

    /// Sends Connection.Blocked (memory alarm) if the client announced the capability
    /// (before Open-Ok: sent right after it).
    pub fn blocked(&mut self, reason: &str) {
        match self.phase {
            Phase::Closing | Phase::Closed => {}
            Phase::Running => {
                if self.cap_blocked && self.blocked != Blocked::Sent {
                    wire::put_blocked(self.output(), reason);
                    self.blocked = Blocked::Sent;
                }
            }
            _ => self.blocked = Blocked::Pending(reason.to_owned()),
        }
    }

    /// Sends Connection.Unblocked if Blocked was sent.
    pub fn unblocked(&mut self) {
        if self.blocked == Blocked::Sent && self.phase == Phase::Running {
            wire::put_unblocked(self.output());
        }
        if self.phase != Phase::Closed {
            self.blocked = Blocked::No;
        }
    }
}

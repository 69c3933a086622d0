//! Method dispatch on channels 1 and up: Channel.Open (answered by the broker through
//! [`Connection::channel_open_ok`]), Channel.Close and Close-Ok, Channel.Flow,
//! Confirm.Select and Tx.Select (mutually exclusive), Access.Request, and the methods
//! that are the broker's business, forwarded as [`Event::Method`]. Basic.Publish starts
//! content assembly (`content`); methods only a server sends are refused with 503.

use amq_protocol::protocol::{access, basic, channel, confirm, tx};

use super::channels::{Channel, Mode};
use super::content::{Assembly, PUBLISH_IDS};
use super::fault::Fault;
use super::{Connection, Event, Phase, ProtocolError};
use crate::{decode, reply, wire, AMQPClass};

impl Connection {
    /// Answers the Channel.Open reported as [`Event::ChannelOpened`] with Open-Ok; held
    /// input is then processed.
    pub fn channel_open_ok(&mut self, channel: u16) {
        if self.opening != Some(channel) || self.phase != Phase::Running {
            return;
        }
        self.opening = None;
        wire::put_method_frame(
            self.output(),
            channel,
            &AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
        );
        self.resume();
    }

    /// A method on channel 1..=65535 of a running connection.
    pub(super) fn on_channel_method(&mut self, channel: u16, payload: &[u8]) {
        let ids = decode::method_ids(payload);
        let Some(ch) = self.channels.get(channel) else {
            // Not open: only Channel.Open; a stray Close-Ok (after crossed closes) is
            // ignored.
            match ids {
                Some((20, 41)) => {}
                Some((20, 10)) => {
                    if self.decode(payload).is_some() {
                        self.open_channel(channel);
                    }
                }
                _ => {
                    if let Some(m) = self.decode(payload) {
                        let ids = (m.get_amqp_class_id(), m.get_amqp_method_id());
                        self.fail(Fault::channel("expected 'channel.open'", ids));
                    }
                }
            }
            return;
        };
        if ch.closing {
            // Waiting for Close-Ok: everything else is discarded.
            match ids {
                Some((20, 40)) => {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                    );
                    self.close_channel(channel);
                }
                Some((20, 41)) => self.close_channel(channel),
                _ => {}
            }
            return;
        }
        match ch.content {
            Assembly::Idle => {}
            Assembly::Header(_) => {
                return self.fail(Fault::unexpected(
                    "expected content header for class 60, got non content header frame instead",
                    PUBLISH_IDS,
                ));
            }
            Assembly::Body(_) => {
                return self
                    .fail(Fault::unexpected("expected content body, got non content body frame instead", PUBLISH_IDS));
            }
        }
        let Some(method) = self.decode(payload) else {
            return;
        };
        self.on_open_channel_method(channel, method);
    }

    fn open_channel(&mut self, channel: u16) {
        if channel > self.channel_max {
            return self.fail(Fault::channel("channel number out of range", (20, 10)));
        }
        self.channels.insert(channel, Channel::new());
        self.opening = Some(channel);
        self.events.push_back(Event::ChannelOpened { channel });
    }

    fn close_channel(&mut self, channel: u16) {
        if self.channels.remove(channel).is_some() {
            self.events.push_back(Event::ChannelClosed { channel });
        }
    }

    /// A decoded method on an open channel with no content pending.
    fn on_open_channel_method(&mut self, channel: u16, method: AMQPClass) {
        let ids = (method.get_amqp_class_id(), method.get_amqp_method_id());
        let mode = self.channels.get(channel).map_or(Mode::Plain, |c| c.mode);
        match method {
            AMQPClass::Basic(basic::AMQPMethod::Publish(p)) => {
                if let Some(ch) = self.channels.get_mut(channel) {
                    ch.content = Assembly::Header(p);
                }
            }
            AMQPClass::Channel(m) => match m {
                channel::AMQPMethod::Open(_) => self.fail(Fault::channel("second 'channel.open' seen", ids)),
                channel::AMQPMethod::Close(_) => {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                    );
                    self.close_channel(channel);
                }
                channel::AMQPMethod::CloseOk(_) => {}
                channel::AMQPMethod::Flow(f) => {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk { active: f.active })),
                    );
                    self.events.push_back(Event::ChannelFlow { channel, active: f.active });
                }
                channel::AMQPMethod::OpenOk(_) | channel::AMQPMethod::FlowOk(_) => self.command_invalid(ids),
            },
            AMQPClass::Confirm(confirm::AMQPMethod::Select(s)) => {
                if mode == Mode::Tx {
                    let text = reply::text(reply::PRECONDITION_FAILED, "cannot switch from tx to confirm mode");
                    self.channel_error(channel, reply::PRECONDITION_FAILED, &text, ids.0, ids.1);
                    return;
                }
                if let Some(ch) = self.channels.get_mut(channel) {
                    if ch.mode == Mode::Plain {
                        ch.mode = Mode::Confirm { next: 1 };
                    }
                }
                if !s.nowait {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
                    );
                }
                self.events.push_back(Event::ConfirmSelected { channel });
            }
            AMQPClass::Tx(tx::AMQPMethod::Select(s)) => {
                if matches!(mode, Mode::Confirm { .. }) {
                    let text = reply::text(reply::PRECONDITION_FAILED, "cannot switch from confirm to tx mode");
                    self.channel_error(channel, reply::PRECONDITION_FAILED, &text, ids.0, ids.1);
                    return;
                }
                if let Some(ch) = self.channels.get_mut(channel) {
                    ch.mode = Mode::Tx;
                }
                self.forward(channel, AMQPClass::Tx(tx::AMQPMethod::Select(s)));
            }
            AMQPClass::Access(access::AMQPMethod::Request(_)) => {
                // Deprecated in 0-9-1; RabbitMQ answers with ticket 1.
                wire::put_method_frame(
                    self.output(),
                    channel,
                    &AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})),
                );
            }
            m if is_client_method(&m) => self.forward(channel, m),
            _ => self.command_invalid(ids),
        }
    }

    fn forward(&mut self, channel: u16, method: AMQPClass) {
        self.events.push_back(Event::Method { channel, method: Box::new(method) });
    }

    /// 503 for a method a client does not send on a channel.
    fn command_invalid(&mut self, ids: (u16, u16)) {
        self.fail(Fault::new(ProtocolError::CommandInvalid("unimplemented method"), "unimplemented method", ids));
    }
}

/// Methods a client sends on a channel that are the broker's business.
fn is_client_method(m: &AMQPClass) -> bool {
    use amq_protocol::protocol::{exchange, queue};
    match m {
        AMQPClass::Exchange(e) => matches!(
            e,
            exchange::AMQPMethod::Declare(_)
                | exchange::AMQPMethod::Delete(_)
                | exchange::AMQPMethod::Bind(_)
                | exchange::AMQPMethod::Unbind(_)
        ),
        AMQPClass::Queue(q) => matches!(
            q,
            queue::AMQPMethod::Declare(_)
                | queue::AMQPMethod::Bind(_)
                | queue::AMQPMethod::Purge(_)
                | queue::AMQPMethod::Delete(_)
                | queue::AMQPMethod::Unbind(_)
        ),
        AMQPClass::Basic(b) => matches!(
            b,
            basic::AMQPMethod::Qos(_)
                | basic::AMQPMethod::Consume(_)
                | basic::AMQPMethod::Cancel(_)
                | basic::AMQPMethod::Get(_)
                | basic::AMQPMethod::Ack(_)
                | basic::AMQPMethod::Reject(_)
                | basic::AMQPMethod::RecoverAsync(_)
                | basic::AMQPMethod::Recover(_)
                | basic::AMQPMethod::Nack(_)
        ),
        AMQPClass::Tx(t) => {
            matches!(t, tx::AMQPMethod::Select(_) | tx::AMQPMethod::Commit(_) | tx::AMQPMethod::Rollback(_))
        }
        _ => false,
    }
}

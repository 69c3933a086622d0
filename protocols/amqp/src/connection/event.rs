//! What the connection reports to the broker: the [`Event`]s polled from it, the
//! assembled [`Publish`] one of them carries, and the [`CloseReason`] of its end.

use bytes::Bytes;

#[cfg(doc)]
use super::Connection;
use super::ProtocolError;
use crate::{AMQPClass, BasicProperties, FieldTable, ShortString};

/// Why the connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The client sent Connection.Close (and got Close-Ok).
    ClientClosed {
        /// Reply code the client sent.
        code: u16,
        /// Reply text the client sent (free-form, for logs).
        text: String,
    },
    /// The broker closed it ([`Connection::connection_error`] or shutdown) and the
    /// handshake of the close finished or timed out.
    ServerClosed {
        /// Reply code of the broker's Connection.Close.
        code: u16,
    },
    /// A protocol error detected here (bad header, bad frame, heartbeat timeout, ...);
    /// Connection.Close with the matching code was queued when the protocol allows it.
    Error(ProtocolError),
}

/// What the connection reports to the broker.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Start-Ok arrived: check the credentials, then call [`Connection::accept_login`] or
    /// [`Connection::refuse_login`]. (An unsupported mechanism is refused here.)
    Login {
        /// `PLAIN` or `AMQPLAIN`.
        mechanism: String,
        /// User name from the SASL response (PLAIN authcid, AMQPLAIN `LOGIN`).
        username: String,
        /// Password from the SASL response, in clear (PLAIN passwd, AMQPLAIN `PASSWORD`).
        password: String,
        /// Client properties (capabilities, product, ...).
        client_properties: FieldTable,
    },
    /// Connection.Open: call [`Connection::open_ok`] or [`Connection::connection_error`]
    /// (530 NOT_ALLOWED for an unknown vhost).
    Open {
        /// Virtual host named in Connection.Open, as the client sent it (e.g. `/`).
        vhost: String,
    },
    /// Channel.Open: call [`Connection::channel_open_ok`] or
    /// [`Connection::connection_error`] (530 NOT_ALLOWED past a channel limit); input is
    /// held until then.
    ChannelOpened {
        /// Number of the channel just opened (1..=negotiated channel_max).
        channel: u16,
    },
    /// A channel ended: the client closed it (Close-Ok sent), or it acknowledged the
    /// broker's [`Connection::channel_error`]. Its consumers are gone and its unacked
    /// deliveries must be requeued; its delivery tags and confirm counter restart.
    ChannelClosed {
        /// Number of the channel that ended; a new Channel.Open may reuse it.
        channel: u16,
    },
    /// Channel.Flow from the client (Flow-Ok already sent): stop/resume deliveries.
    ChannelFlow {
        /// Channel whose deliveries stop or resume.
        channel: u16,
        /// True to resume.
        active: bool,
    },
    /// Confirm.Select (Select-Ok already sent unless nowait): from now on every publish on
    /// the channel carries a confirm sequence number.
    ConfirmSelected {
        /// Channel now in confirm mode: its publishes carry [`Publish::confirm_tag`].
        channel: u16,
    },
    /// A method for the broker on an open channel: exchange.*, queue.*, basic.qos/
    /// consume/cancel/get/ack/nack/reject/recover(-async), tx.*. The broker answers with
    /// [`Connection::reply`] (unless the method's `nowait` is set) or
    /// [`Connection::channel_error`]. Also Connection.Update-Secret on channel 0 (answer
    /// `reply(0, UpdateSecretOk)` or [`Connection::connection_error`]).
    ///
    /// Tx.Select is reported here after the connection checked that the channel is not
    /// in confirm mode; Confirm.Select likewise checks tx mode (406 channel error).
    Method {
        /// Channel the method arrived on (0 only for Connection.Update-Secret).
        channel: u16,
        /// The decoded method with its arguments.
        method: Box<AMQPClass>,
    },
    /// A complete message: Basic.Publish with its content header and body.
    Publish(Box<Publish>),
    /// The connection is finished: flush the output and close the socket. Reported once;
    /// every channel still open is gone with it (no [`Event::ChannelClosed`] for them).
    Closed(CloseReason),
}

/// A published message, assembled.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// Channel it was published on: confirms and Basic.Return go back there.
    pub channel: u16,
    /// Exchange name ("" = default exchange).
    pub exchange: ShortString,
    /// Routing key of Basic.Publish, matched against the exchange's bindings.
    pub routing_key: ShortString,
    /// Basic.Publish `mandatory`: an unroutable message comes back as Basic.Return (312 NO_ROUTE).
    pub mandatory: bool,
    /// Basic.Publish `immediate`; the broker refuses `true` with 540 NOT_IMPLEMENTED, as RabbitMQ.
    pub immediate: bool,
    /// Content header properties (content type, headers, delivery mode, expiration, ...).
    pub properties: BasicProperties,
    /// Body: the body frame's payload when it came in one frame (no copy), else the
    /// frames concatenated once.
    pub body: Bytes,
    /// Confirm sequence number (delivery tag of the confirm) when the channel is in
    /// confirm mode.
    pub confirm_tag: Option<u64>,
}

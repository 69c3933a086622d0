//! `ferrymq-mqtt`: MQTT 3.1, 3.1.1 and 5.0 for FerryMQ, sans-IO.
//!
//! Bytes in, events out; decisions in, bytes out. No sockets, no clocks (time is passed in),
//! no broker types. The broker's connection task owns one [`Connection`] per socket:
//!
//! ```text
//! socket bytes ─▶ Connection::handle_input ─▶ poll_event() ─▶ broker decides
//!                                                              │
//! socket ◀─ poll_transmit() ◀─ accept / ack_publish / send_publish / disconnect ◀┘
//! timers: poll_timeout() -> handle_timeout(now)   (CONNECT timeout, keep-alive x 1.5)
//! ```
//!
//! Packets are modelled once for all protocol levels ([`packet`]); [`codec`] reads and
//! writes them per level on top of `mqttbytes` 0.6, which we extend where it falls short:
//! (list kept current by the implementation)
//! - MQTT 3.1 (`MQIsdp`, level 3) CONNECT, which `mqttbytes` rejects;
//! - the MQTT 5 AUTH packet, which `mqttbytes` does not know;
//! - strict validation `mqttbytes` skips: reserved fixed-header flags, QoS 3, DUP on QoS 0,
//!   UTF-8 rules (no U+0000), wildcards in PUBLISH topics, packet size before buffering.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod codec;
pub mod connection;
pub mod packet;
pub mod reason;
pub mod topic;

pub use connection::{Accept, Config, Connection, Event, Outgoing, ProtocolError, SendError};
pub use packet::*;
pub use reason::ReasonCode;

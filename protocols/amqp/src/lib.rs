//! `ferrymq-amqp`: AMQP 0-9-1 for FerryMQ, sans-IO.
//!
//! Bytes in, events out; decisions in, bytes out. No sockets, no clocks (time is passed
//! in), no broker types. The broker's connection task owns one [`Connection`] per socket:
//!
//! ```text
//! socket bytes ─▶ Connection::handle_input ─▶ poll_event() ─▶ broker decides
//!                                                              │
//! socket ◀─ poll_transmit() ◀─ reply / deliver / confirm / channel_error ... ◀┘
//! timers: poll_timeout() -> handle_timeout(now)   (handshake timeout, heartbeats)
//! ```
//!
//! Methods and content headers are parsed and generated with `amq-protocol` (default
//! features off); frames are cut by our own reader, which enforces the negotiated
//! `frame_max` from the frame header before buffering the payload, and body frames are
//! sliced out of the read buffer without copying (`amq-protocol` would copy them into a
//! `Vec`). The broker sees `amq-protocol`'s method types, re-exported here.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod connection;
mod decode;
pub mod frame;
mod guard;
pub mod reply;
mod sasl;
mod wire;

pub use amq_protocol::protocol::{self as methods, AMQPClass};
pub use amq_protocol::protocol::basic::AMQPProperties as BasicProperties;
pub use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
pub use connection::{CloseReason, Config, Connection, Content, Event, ProtocolError, Publish};
pub use frame::{Frame, FrameError};

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
//!
//! Modules: [`frame`] (frame reader and writer), [`connection`] (the state machine),
//! [`reply`] (reply codes and RabbitMQ's reply-text convention); privately `wire`
//! (encoding), `decode` (method and header decoding), `guard` (field-table nesting
//! limit), `sasl` (PLAIN and AMQPLAIN).
//!
//! ## Behaviour, as RabbitMQ implements AMQP 0-9-1
//!
//! - Connection errors close with Connection.Close (code, RabbitMQ-style text
//!   `"NAME - explanation"`, offending class/method ids) and wait up to
//!   [`connection::CLOSE_TIMEOUT`] for Close-Ok; frames meanwhile are discarded (all of
//!   them after a framing error). Timeouts and a bad protocol header drop the connection
//!   without Close. See [`ProtocolError`] for the codes: 501 for frames that cannot be
//!   delimited and for payloads that do not decode ("cannot decode", as RabbitMQ, where
//!   502 might be expected), 504 for a method on channel 0 that is wrong in the
//!   connection's state and for channels not open, 505 for content out of sequence and
//!   for channel frames before Open-Ok, 503 for methods only a server sends, 540 for
//!   class/method ids 0-9-1 does not define, 530 for Tune-Ok values above the server's
//!   (or a `frame_max` under 4096; 0 takes the server's value), 403 for an unsupported
//!   SASL mechanism or a malformed response.
//! - Channel errors (406 for an oversized message or mixing tx and confirm modes; the
//!   broker's own through [`Connection::channel_error`]) close only the channel.
//! - Deviations: the 0-9 header `AMQP\x01\x01\x00\x09`, which RabbitMQ accepts as 0-9-1,
//!   is refused (the supported header is sent back); an unsupported mechanism gets
//!   Close 403 where RabbitMQ closes the socket without one.
//!
//! ## `amq-protocol` 10.6 shortcomings, and what this crate does instead
//!
//! - Framing: `parse_frame` waits for (and buffers) a payload of any announced size with
//!   no `frame_max`, copies body payloads into a `Vec`, and accepts heartbeats on any
//!   channel. [`frame`] cuts frames itself.
//! - Stack overflow: the field-table parser recurses without limit (about 8 KiB of stack
//!   per level in a debug build: a few kilobytes of nested tables abort the process).
//!   `guard` walks tables iteratively first and refuses nesting deeper than
//!   [`MAX_TABLE_DEPTH`] levels (in methods, the `headers` property and AMQPLAIN).
//! - Unknown class/method ids and undecodable arguments give the same error; the ids are
//!   checked first (540 versus 501).
//! - Allocation on hot paths: every bit-flag method is decoded through a
//!   `Vec<(String, bool)>` and encoded the same way, and generating into a `Vec` goes
//!   through a temporary `Vec` per length prefix. basic.publish, ack, nack and reject are
//!   decoded by hand; every method a server sends, field tables and properties are
//!   encoded by hand straight into the output buffer.
//! - Panics on encoding: `ShortString::from` panics (`expect`) above 255 bytes and
//!   `gen_short_string` `debug_assert!`s (truncating the length byte in release); strings
//!   from the broker (consumer tags, reply texts, names) are written as `&str` and cut at
//!   255 bytes on a character boundary. cookie-factory's slice writer panics
//!   (`split_at_mut`) instead of reporting a full buffer when fewer than 4 bytes are left
//!   at a length prefix; methods only a client sends are generated into a `Vec`.
//! - `AMQPValue::ShortString` is written with the type tag `'_'`, which no peer reads; it
//!   is written as a long string (`'S'`).
//! - No AMQPLAIN parser on the server side (only the client's encoder): `sasl` parses the
//!   table, sent without its length prefix as clients do (with one, too).
//! - Not worked around: short strings must be UTF-8 (`ShortString` is a `String`), so a
//!   name or routing key RabbitMQ would take as raw bytes fails to decode (501); field
//!   tables are `BTreeMap`s (duplicate keys collapse, key order is not kept on
//!   re-encoding); the content-header weight is not checked and a property-flags
//!   continuation bit makes the header fail to decode; with default features off the
//!   crate still pulls in `amq-protocol-tcp`/`-uri` (url, ICU, serde_json, tcp-stream).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod connection;
mod decode;
pub mod frame;
mod guard;
pub mod reply;
mod sasl;
mod wire;

pub use amq_protocol::protocol::basic::AMQPProperties as BasicProperties;
pub use amq_protocol::protocol::{self as methods, AMQPClass};
pub use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
pub use connection::{CloseReason, Config, Connection, Content, Event, ProtocolError, Publish};
pub use frame::{Frame, FrameError};
pub use guard::MAX_DEPTH as MAX_TABLE_DEPTH;

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
//! writes them per level.
//!
//! ## Why the codec is our own and not `mqttbytes` 0.6
//!
//! The workspace pins `mqttbytes` 0.6 (frozen). Every packet was checked against it; it
//! falls short on the decode and the encode path alike, so [`codec`] is written from the
//! specifications and `mqttbytes` is kept as a dev-dependency: the tests use it as an
//! independent implementation (its client packets decode with our codec, our server
//! packets decode with it). Shortcomings found, each handled by our code:
//! - MQTT 3.1 (`MQIsdp`, level 3) CONNECT is rejected (`InvalidProtocol`); we accept it
//!   when [`Config::allow_v3_1`] is set, without the 23-character client id limit.
//! - No MQTT 5 AUTH packet (type 15): we decode and encode it.
//! - Framing: `check` compares the *remaining* length (not the packet size) to the limit,
//!   and a truncated field inside a complete frame surfaces as `InsufficientBytes`, which a
//!   caller takes for "need more data" and waits forever; we frame in two steps and
//!   report every in-frame shortage as malformed.
//! - Reserved fixed-header flags are ignored (PUBREL/SUBSCRIBE/UNSUBSCRIBE `0010`, all
//!   others `0000`); DUP on QoS 0 is accepted; packet type 0 is not distinguished.
//! - CONNECT: reserved flag bit ignored; password without user name accepted for 3.1.1;
//!   the password is read as a UTF-8 `String` (it is binary data); an empty user name is
//!   dropped; trailing bytes ignored; will topic not checked for wildcards.
//! - UTF-8 strings: U+0000 accepted (MQTT-1.5.4-2).
//! - PUBLISH: wildcards in the topic name accepted.
//! - SUBSCRIBE: an empty filter list is accepted; reserved option bits and 3.x upper bits
//!   ignored. UNSUBSCRIBE without filters accepted.
//! - MQTT 5 properties: the reader is not bounded by the property length (a property may
//!   run into the payload), duplicates are accepted where forbidden, value ranges (0/1
//!   flags, receive maximum 0, maximum packet size 0, subscription identifier 0 in
//!   SUBSCRIBE) unchecked, auth data without method accepted.
//! - MQTT 5 reason codes: not validated per packet; a v5 DISCONNECT with remaining
//!   length 0 (normal disconnection, the common case) is rejected as `PayloadRequired`.
//! - Acks: 3.x acks with extra bytes accepted; packet id 0 accepted in acks, SUBSCRIBE and
//!   UNSUBSCRIBE.
//! - Encoding: strings and binary data longer than 65,535 bytes are silently truncated
//!   (`as u16`), `write` leaves a partial packet in the buffer when it fails (e.g. QoS 1
//!   PUBLISH with packet id 0), and topic matching (`matches`) slices `topic[..1]`,
//!   which panics on a topic starting with a multi-byte character.
//!
//! ## Strictness of our codec
//!
//! Beyond the above: remaining lengths of more than 4 bytes, QoS 3 (PUBLISH, will,
//! subscription options), retain handling 3, will QoS/retain without the will flag, zero
//! packet ids, properties not allowed in a packet, invalid reason codes per packet,
//! trailing bytes, and PING/3.x DISCONNECT bodies are all refused with
//! [`codec::DecodeError`]. Encoding is two-pass (count, then write), never writes a
//! partial packet, and writes a PUBLISH payload with a single copy into the output.
//!
//! The reserved fixed-header flags are a 3.1.1 rule: MQTT 3.1 sets DUP on retransmitted
//! PUBREL, SUBSCRIBE and UNSUBSCRIBE (`0x6A`, `0x8A`, `0xAA`) and leaves the flags of other
//! packets unused, so at level 3 only PUBLISH flags are checked (as Mosquitto does).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod client;
pub mod codec;
pub mod connection;
pub mod packet;
pub mod reason;
pub mod topic;

pub use client::{Client, ClientError, ClientEvent, ClientOptions};
pub use connection::idmap::IdMap;
pub use connection::{Accept, Config, Connection, Event, Outgoing, ProtocolError, SendError};
pub use packet::*;
pub use reason::ReasonCode;

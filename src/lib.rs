//! FerryMQ: one broker that speaks MQTT 3.1/3.1.1/5.0 and AMQP 0-9-1 to unmodified
//! clients and keeps every message in one durable core — a commit log of bodies plus
//! consume queues and keyed state in sled, the RocketMQ/Kafka model. MQTT topics and AMQP
//! exchanges are one routing table, so the two protocols see each other's messages.
//!
//! # Layout
//!
//! ```text
//!  ferrymq-mqtt / ferrymq-amqp (sans-IO protocol state machines)
//!            ▲
//!  mqtt::connection / amqp::connection      (one task per socket; crate::transport::socket helpers)
//!            │ publish, subscribe/bind, ack          ▲ deliveries, confirms
//!            ▼                                       │
//!  core::broker ──route──▶ core::router ──▶ connected clean sessions (fast path)
//!            │
//!            ├──append (body once, one pointer per queue)──▶ ferrymq-storage journal
//!            │                                                   │ completion
//!            │                                                   ▼
//!            │                                 core::shards (queue and stream owners)
//!            └── core::store (sessions, QoS 2 ids, entities, de-dup ids) ──▶ journal
//! ```
//!
//! `src/` is grouped by kind, so the path of a publish can be read off `ls src`:
//!
//! - [`frontends`] — the MQTT and AMQP front-ends (connection tasks, sessions, channels).
//! - [`transport`] — accepting sockets, socket buffers, TLS, WebSocket, browser origins.
//! - [`access`] — logins ([`access::auth`]) and what a client may do ([`access::authz`]).
//! - [`core`] — message, routing table, entities (declared queues, exchanges, bindings),
//!   queues, streams, scheduler, retained, stores, counters: everything both protocols
//!   and the management API share. Only the core calls the journal.
//! - [`links`] — MQTT bridges to other brokers and AMQP shovels.
//! - [`cluster`] — cluster members: peer links and the replicated metadata group (openraft).
//! - [`operations`] — the management HTTP API, metrics, dashboard, and `ferrymq ctl`.
//! - [`composition`] — configuration, start-up checks, the server, and shutdown.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(unreachable_pub)]
// The library is the broker's inside, not a published API: its documentation is built with
// `--document-private-items`, and links to crate-private modules are how it reads.
#![allow(rustdoc::private_intra_doc_links)]

pub mod access;
pub mod cluster;
pub mod composition;
pub mod core;
pub(crate) mod frontends;
pub(crate) mod links;
pub mod operations;
pub mod transport;

/// The commit this build is from (`git rev-parse --short HEAD` at build time; `unknown`
/// when built without git).
pub const COMMIT: &str = env!("FERRY_BUILD_COMMIT");

/// The version with its commit, as `ferrymq --version` and the start-up log say it:
/// `0.1.0 (abc1234)`.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("FERRY_BUILD_COMMIT"), ")");

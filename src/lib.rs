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
//!  mqtt::connection / amqp::connection      (one task per socket; crate::socket helpers)
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
//! - [`config`] — embedded default + environment + file + flags, read into typed data.
//! - [`preflight`] — start-up checks before anything starts (data directory lock, TLS
//!   files, rules, every listener bound).
//! - [`server`] — listeners, start-up restore, shutdown.
//! - [`accept`] — what the accept loops may take: connection caps and the open-files budget.
//! - [`shutdown`] — signals on a thread of their own; the shutdown deadline, and what a
//!   forced exit logs.
//! - [`core`] — message, routing table, entities (declared queues, exchanges, bindings),
//!   queues, streams, scheduler, retained, stores, counters: everything both protocols
//!   and the management API share. Only the core calls the journal.
//! - [`mqtt`] — the MQTT front-end (connections, sessions, shared groups, `$SYS`).
//! - [`amqp`] — the AMQP 0-9-1 front-end (connections, channels, methods).
//! - [`socket`] — buffer sizing and waits both front-ends' connection tasks share.
//! - [`auth`] — the user store both front-ends check logins against.
//! - [`authz`] — what a logged-in client may do: RabbitMQ permissions and MQTT topic
//!   rules in one policy, decided per connection with a cache.
//! - [`bridge`] — MQTT bridges to other brokers, Mosquitto's settings.
//! - [`tls`] — rustls acceptor from PEM files, client certificates.
//! - [`websocket`] — MQTT over WebSocket: the upgrade and a byte-stream adapter.
//! - [`origin`] — browser origins, as the API's cross-site check and the WebSocket
//!   listener's origin check compare them.
//! - [`ctl`] — `ferrymq ctl`, the admin CLI over the management API.
//! - [`http`] — the management HTTP API (RabbitMQ's paths) and Prometheus `/metrics`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod accept;
pub mod amqp;
pub mod auth;
pub mod authz;
pub mod bridge;
pub mod config;
pub mod core;
pub mod ctl;
pub mod http;
pub mod mqtt;
pub mod origin;
pub mod preflight;
pub mod server;
pub mod shutdown;
pub mod socket;
pub mod tls;
pub mod websocket;

/// The commit this build is from (`git rev-parse --short HEAD` at build time; `unknown`
/// when built without git).
pub const COMMIT: &str = env!("FERRY_BUILD_COMMIT");

/// The version with its commit, as `ferrymq --version` and the start-up log say it:
/// `0.1.0 (abc1234)`.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("FERRY_BUILD_COMMIT"), ")");

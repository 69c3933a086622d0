//! FerryMQ: one broker that speaks MQTT 3.1.1/5.0 (and AMQP 0-9-1, next) to unmodified
//! clients and keeps every message in one durable core — a commit log of bodies plus
//! consume queues in sled, the RocketMQ/Kafka model.
//!
//! # Layout
//!
//! ```text
//!  ferrymq-mqtt (sans-IO protocol)      ferrymq-storage (commit log + sled)
//!            ▲                                   ▲
//!  mqtt::connection ──▶ core::broker::publish ──▶ journal ──completion──▶ core::shards (queue owners)
//!    (one task per socket)   │ fast path                                        │
//!            ▲               └──▶ connected clean sessions                       │
//!            └──────────────────────────── queue deliveries ◀─────────────────────┘
//! ```
//!
//! - [`config`] — embedded default + environment + file + flags.
//! - [`server`] — listeners, connection limit, start-up restore, shutdown.
//! - [`core`] — message, routing table, queues, scheduler, retained, counters.
//! - [`mqtt`] — the MQTT front-end (connections, sessions, shared groups, `$SYS`).
//! - [`tls`] — rustls acceptor from PEM files.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod amqp;
pub mod auth;
pub mod config;
pub mod core;
pub mod mqtt;
pub mod server;
pub mod socket;
pub mod tls;

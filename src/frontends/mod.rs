//! The protocol front-ends: each turns a client socket into calls on the core, through
//! its sans-IO protocol crate (`ferrymq-mqtt`, `ferrymq-amqp`).
//!
//! - [`mqtt`] — MQTT 3.1/3.1.1/5.0: connections, sessions, shared groups, `$SYS`.
//! - [`amqp`] — AMQP 0-9-1: connections, channels, methods.

pub(crate) mod amqp;
pub(crate) mod mqtt;

//! FerryMQ's integration tests, one test binary (`cargo test --test integration`): the
//! real `ferrymq` binary on ephemeral ports, driven by real clients (`rumqttc`, `lapin`,
//! `reqwest`) or raw sockets, one folder per area. `common` is the harness they share.
//!
//! Run one area or one test by its path: `cargo test --test integration mqtt::v5::`,
//! `cargo test --test integration operations::startup::a_default_start_logs_no_warning`.

mod common;

mod access;
mod amqp;
mod cluster;
mod http;
mod links;
mod mqtt;
mod operations;

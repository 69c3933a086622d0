//! What operators use: the management HTTP API (RabbitMQ's paths), Prometheus metrics and
//! the dashboard on one listener, and `ferrymq ctl`, the CLI that is its client.
//!
//! - [`http`] — the management API, `/metrics`, the dashboard.
//! - [`ctl`] — `ferrymq ctl`, the admin CLI over the management API.

pub mod ctl;
pub mod http;

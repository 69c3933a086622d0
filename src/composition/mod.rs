//! The composition root: reads the configuration, checks what start-up needs, opens the
//! journal, builds the core and every listener on it, and stops them in order. The only
//! place outside [`crate::core`] that opens and configures storage.
//!
//! - [`config`] — embedded default + environment + file + flags, read into typed data.
//! - [`preflight`] — start-up checks before anything starts (data directory lock, TLS
//!   files, rules, every listener bound).
//! - [`server`] — listeners, start-up restore, shutdown.
//! - [`shutdown`] — signals on a thread of their own; the shutdown deadline, and what a
//!   forced exit logs.

pub mod config;
pub mod preflight;
pub mod server;
pub mod shutdown;

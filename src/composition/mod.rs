//! The composition root: reads the configuration, checks what start-up needs, has the core
//! open the data directory (`core::data_dir`), builds every listener on the core, and
//! stops them in order. It names no storage type: the configuration's `[storage]` section
//! is plain data the core turns into the journal's settings.
//!
//! - [`config`] — embedded default + environment + file + flags, read into typed data.
//! - [`preflight`] — start-up checks before anything starts (data directory lock, TLS
//!   files, rules, every listener bound).
//! - [`server`] — listeners, start-up restore, shutdown.
//! - [`member`] — a cluster member's registries, as its metadata group applies to them.
//! - [`shutdown`] — signals on a thread of their own; the shutdown deadline, and what a
//!   forced exit logs.

pub mod config;
pub mod member;
pub mod preflight;
pub mod server;
pub mod shutdown;

//! What the broker reports about itself: the counters behind `$SYS/broker/...`, `/metrics`
//! and the management API's rates, and its uptime.

use std::time::Duration;

use super::Broker;
use crate::core::stats::Stats;
use crate::core::store::Stores;

impl Broker {
    /// The broker-wide counters: connections add their counts to them in batches,
    /// `$SYS`, `/metrics` and the management API read them. Counters only, so counting
    /// is all a holder can do with them.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The typed stores of durable state other than messages: their (asynchronous) reads,
    /// and the commands their write methods build, which only [`Broker::commit`] (or a
    /// publish's `along`) applies.
    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// How long the core has been running (`$SYS/broker/uptime`, the overview's `uptime`).
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

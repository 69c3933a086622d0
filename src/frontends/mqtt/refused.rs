//! Messages the topic rules refused on a connection the broker made to itself — a
//! bridge's local side — counted for the bridge and logged once per direction, so that a
//! bridge whose local side may not publish or receive its topics never loses messages
//! silently.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use tracing::warn;

/// What one bridge's local side was refused, since start.
#[derive(Debug, Default)]
pub struct Refusals {
    /// The bridge's name (for the log).
    bridge: String,
    publish: AtomicU64,
    receive: AtomicU64,
    publish_logged: AtomicBool,
    receive_logged: AtomicBool,
    subscribe_logged: AtomicBool,
}

impl Refusals {
    /// Counters for the bridge `bridge`.
    pub fn new(bridge: &str) -> Refusals {
        Refusals { bridge: bridge.to_owned(), ..Refusals::default() }
    }

    /// Publishes refused: messages from the remote broker dropped (the bridge's `in`).
    pub fn publishes(&self) -> u64 {
        self.publish.load(Relaxed)
    }

    /// Deliveries refused: local messages not carried to the remote broker (`out`).
    pub fn deliveries(&self) -> u64 {
        self.receive.load(Relaxed)
    }

    /// Notes a refused subscription; true when one was noted before (it is logged once).
    pub fn subscription_refused(&self) -> bool {
        self.subscribe_logged.swap(true, Relaxed)
    }

    /// Counts a publish to `topic` the rules refused; the first is logged.
    pub(crate) fn publish_refused(&self, topic: &str) {
        self.publish.fetch_add(1, Relaxed);
        if !self.publish_logged.swap(true, Relaxed) {
            warn!(
                bridge = %self.bridge,
                topic,
                "the bridge's local side may not publish this topic on FerryMQ: messages from the remote broker \
                 on it are dropped (counted in refused_in of /api/ferrymq/bridges; later ones are not logged)"
            );
        }
    }

    /// Counts a delivery of `topic` the rules refused; the first is logged.
    pub(crate) fn delivery_refused(&self, topic: &str) {
        self.receive.fetch_add(1, Relaxed);
        if !self.receive_logged.swap(true, Relaxed) {
            warn!(
                bridge = %self.bridge,
                topic,
                "the bridge's local side may not receive this topic on FerryMQ: local messages on it are not \
                 carried to the remote broker (counted in refused_out of /api/ferrymq/bridges; later ones are \
                 not logged)"
            );
        }
    }
}

//! Retained messages through the door: MQTT SUBSCRIBE and the management API read them
//! read-only; they change by a retained publish ([`Broker::publish`]), an operator's
//! clear ([`Broker::clear_retained`]) and start-up's restore.

use std::sync::Arc;

use super::Broker;
use crate::core::message::Message;
use crate::core::retained::RetainedStore;

impl Broker {
    /// The retained messages in memory, read-only: those matching a filter, and how many.
    pub fn retained(&self) -> &RetainedStore {
        &self.retained
    }

    /// Sets (`Some`) or clears the retained message of `topic` (its routing key) in memory:
    /// a cluster member applying a committed change, whose durable copy the journal took.
    pub fn apply_retained(&self, topic: &str, msg: Option<crate::core::message::SharedMessage>) {
        self.retained.set(topic, msg);
    }

    /// Puts back the retained messages start-up read from the journal (`(routing key,
    /// message)`), which keeps their durable copy.
    pub fn restore_retained(&self, retained: Vec<(String, Message)>) {
        let n = retained.len();
        for (topic, msg) in retained {
            self.retained.set(&topic, Some(Arc::new(msg)));
        }
        if n > 0 {
            tracing::info!(retained = n, "restored retained messages");
        }
    }
}

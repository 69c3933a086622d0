//! The clients through the door: connections of both protocols register when their login
//! is accepted and unregister when they close; operations list them read-only. The
//! limits in force (RabbitMQ's per-virtual-host and per-user limits) are read by every
//! entry point and set by the management API and start-up.

use std::sync::Arc;

use super::Broker;
use crate::core::connections::{ConnectionInfo, Connections};
use crate::core::limits::{LimitScope, LimitValues, Limits};

impl Broker {
    /// The client connections of both protocols, read-only: list, find by name, count.
    /// (A listed connection can be closed through its [`ConnectionInfo::close`].)
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Lists a connection whose login was accepted (and whose virtual host is open).
    pub fn register_connection(&self, info: Arc<ConnectionInfo>) {
        self.connections.register(info);
    }

    /// Removes connection `id` from the list (it closed).
    pub fn unregister_connection(&self, id: u64) {
        self.connections.unregister(id);
    }

    /// The limits in force, read-only.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Replaces the limits of `owner` (a virtual host or a user, as `scope` says); an
    /// empty set removes them. Connections and channels already open are kept.
    pub fn set_limits(&self, scope: LimitScope, owner: &str, values: LimitValues) {
        self.limits.replace(scope, owner, values);
    }
}

//! Per-virtual-host and per-user limits, RabbitMQ's `set_vhost_limits` /
//! `set_user_limits`: `max-connections` and `max-queues` of a virtual host,
//! `max-connections` and `max-channels` of a user. A negative value means no limit, as in
//! RabbitMQ; an unset limit is no limit. The values live here, read by the front-ends at
//! connection.open / CONNECT, channel.open and queue.declare; they are stored with the
//! access records ([`crate::core::store::LimitsRecord`]) and set through the management
//! API (`/api/vhost-limits`, `/api/user-limits`) or an imported definitions file.
//!
//! What is counted against them is counted where it is admitted:
//! [`crate::core::broker::Broker::admit`] for connections and channels, the
//! entity registry ([`crate::core::entities`]) for queues.

use std::collections::{BTreeMap, HashMap};

use parking_lot::RwLock;

/// `max-connections`: concurrent client connections (of a virtual host, or of a user).
pub(crate) const MAX_CONNECTIONS: &str = "max-connections";
/// `max-queues`: queues of a virtual host.
pub(crate) const MAX_QUEUES: &str = "max-queues";
/// `max-channels`: AMQP channels open over all of a user's connections.
pub(crate) const MAX_CHANNELS: &str = "max-channels";

/// What a set of limits belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum LimitScope {
    /// A virtual host's limits.
    Vhost,
    /// A user's limits.
    User,
}

impl LimitScope {
    /// The limit names RabbitMQ knows for this scope.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            LimitScope::Vhost => &[MAX_CONNECTIONS, MAX_QUEUES],
            LimitScope::User => &[MAX_CONNECTIONS, MAX_CHANNELS],
        }
    }

    /// `vhost` or `user`, as the API's JSON names the owner.
    pub fn label(self) -> &'static str {
        match self {
            LimitScope::Vhost => "vhost",
            LimitScope::User => "user",
        }
    }
}

/// A set of limits by name (`max-connections` -> 10); negative values are kept as given.
pub(crate) type LimitValues = BTreeMap<String, i64>;

/// Why a limit cannot be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LimitError {
    /// The name is not a limit of that scope.
    #[error("'{name}' is not a {} limit (known: {})", scope.label(), scope.names().join(", "))]
    Unknown {
        /// The scope asked for.
        scope: LimitScope,
        /// The name given.
        name: String,
    },
    /// The value is not an integer.
    #[error("the value of '{name}' must be an integer")]
    NotInteger {
        /// The limit.
        name: String,
    },
}

/// Checks a limit's name for `scope` and its JSON value (an integer, or a string holding
/// one as `rabbitmqctl` accepts).
pub(crate) fn parse_limit(scope: LimitScope, name: &str, value: &serde_json::Value) -> Result<i64, LimitError> {
    if !scope.names().contains(&name) {
        return Err(LimitError::Unknown { scope, name: name.to_owned() });
    }
    let n = match value {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    n.ok_or_else(|| LimitError::NotInteger { name: name.to_owned() })
}

/// The limits in force, by virtual host and by user.
#[derive(Debug, Default)]
pub struct Limits {
    vhosts: RwLock<HashMap<String, LimitValues>>,
    users: RwLock<HashMap<String, LimitValues>>,
}

impl Limits {
    fn table(&self, scope: LimitScope) -> &RwLock<HashMap<String, LimitValues>> {
        match scope {
            LimitScope::Vhost => &self.vhosts,
            LimitScope::User => &self.users,
        }
    }

    /// The limit `limit` of `owner` when one is in force (set and not negative).
    pub fn get(&self, scope: LimitScope, owner: &str, limit: &str) -> Option<u64> {
        let table = self.table(scope).read();
        let value = *table.get(owner)?.get(limit)?;
        u64::try_from(value).ok()
    }

    /// Every limit set for `owner` (negative ones included).
    pub fn of(&self, scope: LimitScope, owner: &str) -> LimitValues {
        self.table(scope).read().get(owner).cloned().unwrap_or_default()
    }

    /// Every owner with limits, by name.
    pub fn all(&self, scope: LimitScope) -> Vec<(String, LimitValues)> {
        let mut all: Vec<_> = self.table(scope).read().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Replaces `owner`'s limits (an empty set removes them).
    pub(in crate::core) fn replace(&self, scope: LimitScope, owner: &str, values: LimitValues) {
        let mut table = self.table(scope).write();
        if values.is_empty() {
            table.remove(owner);
        } else {
            table.insert(owner.to_owned(), values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn negative_and_unset_limits_are_no_limit() {
        let limits = Limits::default();
        assert_eq!(limits.get(LimitScope::Vhost, "/", MAX_QUEUES), None);
        let set = LimitValues::from([(MAX_QUEUES.to_owned(), 3), (MAX_CONNECTIONS.to_owned(), -1)]);
        limits.replace(LimitScope::Vhost, "/", set.clone());
        assert_eq!(limits.get(LimitScope::Vhost, "/", MAX_QUEUES), Some(3));
        assert_eq!(limits.get(LimitScope::Vhost, "/", MAX_CONNECTIONS), None, "negative: no limit");
        assert_eq!(limits.of(LimitScope::Vhost, "/"), set, "kept as given");
        assert_eq!(limits.get(LimitScope::User, "/", MAX_QUEUES), None, "scopes are apart");
        limits.replace(LimitScope::Vhost, "/", LimitValues::new());
        assert!(limits.all(LimitScope::Vhost).is_empty());
    }

    #[test]
    fn names_and_values_are_checked_per_scope() {
        assert_eq!(parse_limit(LimitScope::User, MAX_CHANNELS, &json!(5)), Ok(5));
        assert_eq!(parse_limit(LimitScope::Vhost, MAX_QUEUES, &json!("-1")), Ok(-1));
        assert!(matches!(parse_limit(LimitScope::Vhost, MAX_CHANNELS, &json!(5)), Err(LimitError::Unknown { .. })));
        assert!(matches!(parse_limit(LimitScope::User, MAX_QUEUES, &json!(5)), Err(LimitError::Unknown { .. })));
        assert!(matches!(
            parse_limit(LimitScope::User, MAX_CONNECTIONS, &json!(1.5)),
            Err(LimitError::NotInteger { .. })
        ));
    }
}

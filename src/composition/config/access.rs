//! The access entries of `[auth]` as they are written in the configuration (and, for
//! permissions and rules, in the management API's JSON): users, RabbitMQ permissions and
//! topic permissions, MQTT topic rules. Plain data: `auth` and `authz` turn them into
//! users, permissions and rules and say what is wrong with one.

use serde::{Deserialize, Serialize};

/// One user of the user store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    /// User name, as sent at login (AMQP Start-Ok, MQTT CONNECT).
    pub name: String,
    /// Password in clear; hashed at load, never kept (or give `password_hash`).
    #[serde(default)]
    pub password: Option<String>,
    /// A password hash: RabbitMQ's (base64 of salt ++ digest) or `mosquitto_passwd`'s
    /// (`$7$...`, `$6$...`).
    #[serde(default)]
    pub password_hash: Option<String>,
    /// RabbitMQ's algorithm name of `password_hash` (`rabbit_password_hashing_sha256`,
    /// `_sha512`, `_md5`); unset: Mosquitto's for a `$` hash, else sha256.
    #[serde(default)]
    pub hashing_algorithm: Option<String>,
    /// Only connections from loopback addresses may use it.
    #[serde(default)]
    pub loopback_only: bool,
    /// RabbitMQ's user tags: `administrator`, `monitoring`, `management`, `policymaker`
    /// (what the management API lets the user do; none = no management access).
    #[serde(default)]
    pub tags: Vec<String>,
}

/// `auth.permissions[]`: a user's permissions in a virtual host (regular expressions).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionEntry {
    /// Virtual host.
    #[serde(default = "default_vhost")]
    pub vhost: String,
    /// User.
    pub user: String,
    /// Exchanges and queues the user may declare and delete.
    #[serde(default)]
    pub configure: String,
    /// Exchanges the user may publish to, queues it may bind.
    #[serde(default)]
    pub write: String,
    /// Queues the user may consume from, exchanges it may bind from.
    #[serde(default)]
    pub read: String,
}

/// `auth.topic_permissions[]`: a user's routing keys on a topic exchange.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TopicPermissionEntry {
    /// Virtual host.
    #[serde(default = "default_vhost")]
    pub vhost: String,
    /// User.
    pub user: String,
    /// The topic exchange.
    pub exchange: String,
    /// Routing keys the user may publish with (`{username}`, `{vhost}`, `{client_id}`).
    #[serde(default)]
    pub write: String,
    /// Routing keys the user may bind with.
    #[serde(default)]
    pub read: String,
}

fn default_vhost() -> String {
    "/".into()
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Permit {
    /// The action is allowed.
    Allow,
    /// The action is refused.
    Deny,
}

/// `[[auth.rules]]` in the configuration: one MQTT topic rule.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleEntry {
    /// `allow` or `deny`.
    pub permission: Permit,
    /// `publish`, `subscribe` (and receive), `receive`, or `all`.
    pub action: String,
    /// Topic filters (`%u`, `%c`, `${username}`, `${clientid}` name the client).
    pub topics: Vec<String>,
    /// Only this user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Only users with this tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Only client ids matching this glob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Only clients from this network (`10.0.0.0/8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Only clients whose certificate has this common name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_cn: Option<String>,
    /// Only clients without a user name.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anonymous: bool,
}

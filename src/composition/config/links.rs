//! The links of the configuration as they are written: `[[bridge.mqtt]]` (Mosquitto's
//! bridge settings) and `[[shovel]]` (RabbitMQ's shovel keys, also the JSON of a dynamic
//! shovel). Plain data: `bridge` turns them into running bridges and shovels and says
//! what is wrong with one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `[[bridge.mqtt]]`: one bridge to another MQTT broker; the names are Mosquitto's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttBridgeEntry {
    /// The bridge's name (Mosquitto's `connection`).
    pub connection: String,
    /// The remote broker, `host[:port]` (port 1883 when left out). Several (a list, or
    /// separated by spaces as in mosquitto.conf; `addresses` is the same key) are tried in
    /// turn when one fails.
    #[serde(alias = "addresses", deserialize_with = "addresses")]
    pub address: Vec<String>,
    /// With several addresses: `false` treats the first as the main one and returns to it
    /// once it accepts connections again; `true` stays on whichever works.
    #[serde(default)]
    pub round_robin: bool,
    /// Publish the bridge's state, retained: `1` when it connects, `0` when it goes down
    /// (at the remote through its will), on FerryMQ and at the remote broker.
    #[serde(default = "yes")]
    pub notifications: bool,
    /// Publish the state on FerryMQ only.
    #[serde(default)]
    pub notifications_local_only: bool,
    /// Where the state goes (default `$SYS/broker/connection/{remote_clientid}/state`).
    #[serde(default)]
    pub notification_topic: String,
    /// Topic lines: `pattern [[[out|in|both] qos] local-prefix remote-prefix]`.
    pub topic: Vec<String>,
    /// `mqttv311` or `mqttv50`.
    #[serde(default = "default_protocol")]
    pub bridge_protocol_version: String,
    /// Client id at the remote broker (default `ferrymq.{connection}`).
    #[serde(default)]
    pub remote_clientid: String,
    /// User name at the remote broker ("" = none).
    #[serde(default)]
    pub remote_username: String,
    /// Password at the remote broker.
    #[serde(default)]
    pub remote_password: String,
    /// Clean session / clean start at the remote broker (false: the remote keeps what
    /// arrives for the bridge while it is away).
    #[serde(default)]
    pub cleansession: bool,
    /// Keep-alive towards the remote broker, seconds.
    #[serde(default = "default_keepalive")]
    pub keepalive_interval: u16,
    /// Reconnect backoff `[base, cap]` in seconds: the wait doubles from `base` up to `cap`.
    #[serde(default = "default_restart")]
    pub restart_timeout: Vec<f64>,
    /// Client id of the bridge's session on FerryMQ (default `local.{connection}`).
    #[serde(default)]
    pub local_clientid: String,
    /// User the local side acts as (FerryMQ's topic rules apply to it; "" = none).
    #[serde(default)]
    pub local_username: String,
    /// Tell a 3.1.1 remote that this is a bridge (the protocol level's top bit, as
    /// Mosquitto): a Mosquitto or FerryMQ remote then sends back none of the bridge's own
    /// publishes. Turn off for a broker that refuses it.
    #[serde(default = "yes")]
    pub try_private: bool,
    /// QoS 1/2 messages in flight each way.
    #[serde(default = "default_inflight")]
    pub max_inflight: u16,
    /// CA certificates (PEM) the remote broker's certificate is checked against; set, the
    /// link is TLS.
    #[serde(default)]
    pub bridge_cafile: String,
    /// Client certificate (PEM) presented to the remote broker.
    #[serde(default)]
    pub bridge_certfile: String,
    /// Its private key (PEM).
    #[serde(default)]
    pub bridge_keyfile: String,
    /// Accept a remote certificate that does not name the host it is reached at (the
    /// chain is still checked against `bridge_cafile`).
    #[serde(default)]
    pub bridge_insecure: bool,
}

/// `address` as one string (addresses separated by spaces) or a list; each gets port 1883
/// when it names none.
fn addresses<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let list = match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s.split_whitespace().map(str::to_owned).collect(),
        OneOrMany::Many(v) => v,
    };
    Ok(list.into_iter().map(|a| with_port(a.trim())).collect())
}

/// `host` or `[v6]` without a port gets Mosquitto's default, 1883.
fn with_port(a: &str) -> String {
    let has_port = match a.strip_prefix('[') {
        Some(v6) => v6.contains("]:"),
        None => a.contains(':'),
    };
    if has_port {
        a.to_owned()
    } else {
        format!("{a}:1883")
    }
}

fn default_protocol() -> String {
    "mqttv311".into()
}
fn default_keepalive() -> u16 {
    60
}
fn default_restart() -> Vec<f64> {
    vec![5.0, 30.0]
}
fn yes() -> bool {
    true
}
fn default_inflight() -> u16 {
    20
}

/// `[bridge]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSection {
    /// MQTT bridges.
    #[serde(default)]
    pub mqtt: Vec<MqttBridgeEntry>,
}

/// One URI or several (RabbitMQ accepts both; several are tried in turn).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Uris {
    /// One URI.
    One(String),
    /// Several, tried in turn.
    Many(Vec<String>),
}

impl Uris {
    /// Every URI, in order.
    pub fn list(&self) -> Vec<String> {
        match self {
            Uris::One(u) => vec![u.clone()],
            Uris::Many(v) => v.clone(),
        }
    }
}

/// A shovel's definition, in RabbitMQ's keys (`src-uri`, `src-queue`, ...).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ShovelDefinition {
    /// Where messages come from.
    pub src_uri: Uris,
    /// The source queue (declared durable when missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_queue: Option<String>,
    /// Or a source exchange: a private queue is bound to it with `src-exchange-key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_exchange: Option<String>,
    /// The routing key of that binding (default `#`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_exchange_key: Option<String>,
    /// Unacknowledged messages at once (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_prefetch_count: Option<u16>,
    /// `amqp091` (the only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_protocol: Option<String>,
    /// `never` (default), `queue-length` (the source queue's length when the shovel
    /// starts) or a number of messages: moved that many, the shovel deletes itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_delete_after: Option<Value>,
    /// Where messages go.
    pub dest_uri: Uris,
    /// The destination queue (declared durable when missing; published to through the
    /// default exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_queue: Option<String>,
    /// Or a destination exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_exchange: Option<String>,
    /// The routing key at the destination exchange (default: the message's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_exchange_key: Option<String>,
    /// `amqp091` (the only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_protocol: Option<String>,
    /// `on-confirm` (default), `on-publish` or `no-ack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_mode: Option<String>,
    /// Seconds between reconnects (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_delay: Option<f64>,
    /// Add `x-shovelled` headers naming the shovel and both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_forward_headers: Option<bool>,
    /// Keys FerryMQ does not know: refused when the shovel is checked
    /// (`bridge::shovel::Plan`), never dropped.
    #[serde(flatten, skip_serializing)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[[shovel]]`: a shovel from the configuration (RabbitMQ's static shovels), in the
/// definition's keys.
#[derive(Debug, Clone, Deserialize)]
pub struct ShovelEntry {
    /// Its name.
    pub name: String,
    /// Its virtual host (default `/`).
    #[serde(default = "slash")]
    pub vhost: String,
    /// The definition.
    #[serde(flatten)]
    pub definition: ShovelDefinition,
}

fn slash() -> String {
    "/".into()
}

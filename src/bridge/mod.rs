//! Bridges: links from FerryMQ to other brokers, configured as Mosquitto's
//! (`[[bridge.mqtt]]`, one table per `connection` block, the same setting names).
//!
//! ```text
//!  local publishes ─▶ session `local.{name}` (persistent: its queue is the outgoing buffer)
//!        ▲                 │ in-process MQTT 5 link (no-local: what came in is not sent back)
//!        │                 ▼
//!        └──────────── bridge task ◀──── MQTT 3.1.1 / 5.0 (TCP or TLS) ────▶ remote broker
//! ```
//!
//! A bridge is two MQTT client connections glued together ([`ferrymq_mqtt::Client`] on
//! both): one to the remote broker, one to FerryMQ itself through an in-process pipe,
//! served by the same connection code as any client. A local message is acknowledged to
//! FerryMQ only after the remote broker acknowledged it (and a remote one to the remote
//! only once FerryMQ stored it), so a message is lost neither while the remote is away
//! (it waits in the local session's queue in the journal) nor when FerryMQ restarts.
//! Either link failing closes both; the bridge reconnects with exponential backoff.
//!
//! - [`topic`] — the `topic` lines and how topics cross the bridge.
//! - [`mqtt`] — the bridge task.
//! - [`shovel`] — AMQP shovels (RabbitMQ's dynamic shovels): definitions and workers.

pub mod mqtt;
pub mod shovel;
pub mod topic;

use std::sync::Arc;

use parking_lot::Mutex;
use serde::Deserialize;

use topic::TopicRule;

/// `[[bridge.mqtt]]`: one bridge to another MQTT broker; the names are Mosquitto's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttBridgeEntry {
    /// The bridge's name (Mosquitto's `connection`).
    pub connection: String,
    /// The remote broker, `host:port`.
    pub address: String,
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
}

impl MqttBridgeEntry {
    /// The topic lines parsed, after the other settings were checked.
    pub fn rules(&self) -> Result<Vec<TopicRule>, String> {
        if self.connection.is_empty() || self.address.rsplit_once(':').is_none() {
            return Err("a bridge needs a `connection` name and an `address` host:port".into());
        }
        if !matches!(self.bridge_protocol_version.as_str(), "mqttv311" | "mqttv50") {
            return Err("bridge_protocol_version is mqttv311 or mqttv50".into());
        }
        let t = &self.restart_timeout;
        if t.is_empty() || t.len() > 2 || t.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err("restart_timeout is [base] or [base, cap], seconds above 0".into());
        }
        if self.max_inflight == 0 {
            return Err("max_inflight must be at least 1".into());
        }
        if self.bridge_certfile.is_empty() != self.bridge_keyfile.is_empty() {
            return Err("bridge_certfile and bridge_keyfile go together".into());
        }
        if self.topic.is_empty() {
            return Err("a bridge needs at least one `topic` line".into());
        }
        self.topic.iter().map(|l| TopicRule::parse(l).map_err(|e| e.to_string())).collect()
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

/// Where a bridge is, as the management API shows it.
#[derive(Debug, Clone, Default)]
pub struct BridgeStatus {
    /// The bridge's name.
    pub name: String,
    /// The remote address.
    pub address: String,
    /// Both links are up.
    pub connected: bool,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// Times the bridge connected.
    pub connects: u64,
    /// Messages carried to the remote broker.
    pub sent: u64,
    /// Messages carried in from the remote broker.
    pub received: u64,
}

/// Every bridge's status.
#[derive(Debug, Default)]
pub struct Bridges {
    status: Mutex<Vec<Arc<Mutex<BridgeStatus>>>>,
}

impl Bridges {
    /// A slot for one more bridge.
    pub fn add(&self, name: &str, address: &str) -> Arc<Mutex<BridgeStatus>> {
        let s = Arc::new(Mutex::new(BridgeStatus {
            name: name.to_owned(),
            address: address.to_owned(),
            ..BridgeStatus::default()
        }));
        self.status.lock().push(s.clone());
        s
    }

    /// A snapshot of every bridge.
    pub fn list(&self) -> Vec<BridgeStatus> {
        self.status.lock().iter().map(|s| s.lock().clone()).collect()
    }
}

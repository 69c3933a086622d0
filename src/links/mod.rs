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

pub(crate) mod mqtt;
pub(crate) mod shovel;
pub(crate) mod topic;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::access::authz::{Authorizer, Identity, Reach};
pub(crate) use crate::composition::config::links::{BridgeSection, MqttBridgeEntry};
use crate::composition::config::{ConfigError, ShovelEntry};
use crate::frontends::mqtt::refused::Refusals;
use topic::TopicRule;

/// A bridge's topic lines parsed, after its other settings were checked; the error says
/// what is wrong.
pub(crate) fn topic_rules(cfg: &MqttBridgeEntry) -> Result<Vec<TopicRule>, String> {
    if cfg.connection.is_empty() || cfg.address.is_empty() {
        return Err("a bridge needs a `connection` name and an `address`".into());
    }
    if let Some(a) =
        cfg.address.iter().find(|a| a.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()))
    {
        return Err(format!("address `{a}` is not host[:port]"));
    }
    if !matches!(cfg.bridge_protocol_version.as_str(), "mqttv311" | "mqttv50") {
        return Err("bridge_protocol_version is mqttv311 or mqttv50".into());
    }
    let t = &cfg.restart_timeout;
    if t.is_empty() || t.len() > 2 || t.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return Err("restart_timeout is [base] or [base, cap], seconds above 0".into());
    }
    if cfg.max_inflight == 0 {
        return Err("max_inflight must be at least 1".into());
    }
    if cfg.bridge_certfile.is_empty() != cfg.bridge_keyfile.is_empty() {
        return Err("bridge_certfile and bridge_keyfile go together".into());
    }
    if cfg.topic.is_empty() {
        return Err("a bridge needs at least one `topic` line".into());
    }
    if cfg.notification_topic.contains(['+', '#']) {
        return Err("notification_topic is a topic name, without wildcards".into());
    }
    cfg.topic.iter().map(|l| TopicRule::parse(l).map_err(|e| e.to_string())).collect()
}

/// Checks `[[bridge.mqtt]]` and `[[shovel]]` as start-up runs them: bridge names are
/// unique, each bridge's settings and topic lines ([`topic_rules`]), each shovel's
/// definition ([`shovel::Plan::of`]). The error names the key and the entry.
pub(crate) fn check_entries(bridges: &BridgeSection, shovels: &[ShovelEntry]) -> Result<(), ConfigError> {
    let mut names = std::collections::HashSet::new();
    for b in &bridges.mqtt {
        if !names.insert(b.connection.as_str()) {
            return Err(ConfigError::invalid("bridge.mqtt", format!("two bridges are named `{}`", b.connection)));
        }
        topic_rules(b).map_err(|e| ConfigError::invalid("bridge.mqtt", format!("bridge `{}`: {e}", b.connection)))?;
    }
    for s in shovels {
        shovel::Plan::of(&s.definition)
            .map_err(|e| ConfigError::invalid("shovel", format!("shovel `{}`: {e}", s.name)))?;
    }
    Ok(())
}

/// Where a bridge is, as the management API shows it.
#[derive(Debug, Clone, Default)]
pub struct BridgeStatus {
    /// The bridge's name.
    pub name: String,
    /// The remote address in use (or tried last).
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
    /// The topic the bridge publishes its state on locally (`notifications`), so that the
    /// bridges view does not take it for a remote broker's bridge.
    pub state_topic: Option<String>,
}

/// The client id of a bridge's session on FerryMQ (`local_clientid`, default `local.{connection}`).
pub(crate) fn local_clientid(cfg: &MqttBridgeEntry) -> String {
    match cfg.local_clientid.as_str() {
        "" => format!("local.{}", cfg.connection),
        id => id.to_owned(),
    }
}

/// One bridge as the broker keeps it: where it is, what the rules refused its local side,
/// and who that side is.
#[derive(Debug)]
pub struct Bridge {
    /// Where it is (written by its task).
    pub status: Mutex<BridgeStatus>,
    /// What the rules refused its local side (counted by that side's connection).
    pub refusals: Arc<Refusals>,
    /// The local side's user (`local_username`; `None`: anonymous).
    local_user: Option<String>,
    /// The local side's client id.
    local_clientid: String,
    /// The topic lines.
    rules: Vec<TopicRule>,
}

impl Bridge {
    /// The bridge's name.
    pub fn name(&self) -> String {
        self.status.lock().name.clone()
    }

    /// The topic lines whose local topics the local side may not publish (`in`) or
    /// subscribe to and receive (`out`) under the rules in force now, one sentence each:
    /// a bridge that says `running` while the rules drop what it carries is named at
    /// start and in `/api/ferrymq/bridges`.
    pub fn warnings(&self, authz: &Authorizer) -> Vec<String> {
        let id = Identity {
            user: self.local_user.clone(),
            client_id: self.local_clientid.clone(),
            peer: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ..Identity::default()
        };
        let who = match &self.local_user {
            Some(u) => format!("user `{u}`, client id `{}`", self.local_clientid),
            None => format!("anonymous (no local_username), client id `{}`", self.local_clientid),
        };
        let mut out = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            let filter = rule.local_filter();
            let line = format!("topic line {} (`{filter}`, {})", i + 1, rule.direction.name());
            let mut check = |publish: bool, what: &str, lost: [&str; 2]| {
                let (reach, lost) = match authz.mqtt_reach(id.clone(), publish, &filter) {
                    Reach::All => return,
                    Reach::Part => ("only some of", lost[0]),
                    Reach::Nothing => ("none of", lost[1]),
                };
                out.push(format!("{line}: the local side ({who}) may {what} {reach} these topics on FerryMQ: {lost}"));
            };
            if rule.direction.inbound() {
                check(
                    true,
                    "publish",
                    [
                        "messages from the remote broker on the others are refused",
                        "every message from the remote broker is refused",
                    ],
                );
            }
            if rule.direction.out() {
                check(
                    false,
                    "receive",
                    [
                        "local messages on the others are not carried to the remote broker",
                        "no local message is carried to the remote broker",
                    ],
                );
            }
        }
        out
    }
}

/// Every bridge.
#[derive(Debug, Default)]
pub struct Bridges {
    all: Mutex<Vec<Arc<Bridge>>>,
}

impl Bridges {
    /// Registers a bridge (its topic lines already parsed).
    pub fn add(&self, cfg: &MqttBridgeEntry, rules: &[TopicRule]) -> Arc<Bridge> {
        let b = Arc::new(Bridge {
            status: Mutex::new(BridgeStatus {
                name: cfg.connection.clone(),
                address: cfg.address.first().cloned().unwrap_or_default(),
                ..BridgeStatus::default()
            }),
            refusals: Arc::new(Refusals::new(&cfg.connection)),
            local_user: (!cfg.local_username.is_empty()).then(|| cfg.local_username.clone()),
            local_clientid: local_clientid(cfg),
            rules: rules.to_vec(),
        });
        self.all.lock().push(b.clone());
        b
    }

    /// Every bridge.
    pub fn list(&self) -> Vec<Arc<Bridge>> {
        self.all.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(address: &str) -> Result<MqttBridgeEntry, config::ConfigError> {
        let toml = format!("connection = \"c\"\ntopic = [\"# out 1\"]\n{address}");
        config::Config::builder()
            .add_source(config::File::from_str(&toml, config::FileFormat::Toml))
            .build()?
            .try_deserialize()
    }

    #[test]
    fn addresses_are_one_string_or_a_list_and_get_the_default_port() {
        let e = entry("address = \"a.example b.example:8883 [::1]\"").unwrap();
        assert_eq!(e.address, ["a.example:1883", "b.example:8883", "[::1]:1883"]);
        let e = entry("addresses = [\"10.0.0.1\", \"[::1]:1884\"]").unwrap();
        assert_eq!(e.address, ["10.0.0.1:1883", "[::1]:1884"]);
        assert!(topic_rules(&e).is_ok() && e.notifications && !e.round_robin && !e.bridge_insecure);
        assert!(topic_rules(&entry("address = \"\"").unwrap()).unwrap_err().contains("address"));
        assert!(topic_rules(&entry("address = \"h:port\"").unwrap()).unwrap_err().contains("h:port"));
    }
}

//! `[cluster]`: the members of a FerryMQ cluster and how they reach each other. Without
//! the section FerryMQ is one node, exactly as before.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// `[cluster]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// `cluster.node_name`: this member's unique, stable name.
    pub node_name: String,
    /// `cluster.listen`: the peer listener (RabbitMQ's distribution port, 25672).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// `cluster.peers`: the other members, `"name@host:port"`.
    #[serde(default)]
    pub peers: Vec<PeerEntry>,
    /// `cluster.secret`: what every member proves to the others on the peer link.
    pub secret: String,
    /// `cluster.command_timeout_ms`: how long a metadata change waits for a majority's
    /// commit before it is refused.
    #[serde(default = "default_command_timeout", deserialize_with = "millis", rename = "command_timeout_ms")]
    pub command_timeout: Duration,
    /// `cluster.snapshot_interval_entries`: the metadata group takes a snapshot after this
    /// many entries, and keeps at most as many (up to 1,000) of the entries it holds.
    #[serde(default = "default_snapshot_interval")]
    pub snapshot_interval_entries: u64,
    /// `cluster.tls`: every peer link runs in TLS, both members presenting `tls.cert` and
    /// verifying the other's against `tls.client_ca` (the secret's proof runs inside).
    #[serde(default)]
    pub tls: bool,
}

/// One entry of `cluster.peers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntry {
    /// Its `cluster.node_name`.
    pub name: String,
    /// `host:port` of its `cluster.listen`.
    pub addr: String,
}

impl<'de> Deserialize<'de> for PeerEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PeerEntry, D::Error> {
        let text = String::deserialize(d)?;
        PeerEntry::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl PeerEntry {
    /// Parses `name@host:port`.
    pub fn parse(text: &str) -> Result<PeerEntry, String> {
        let (name, addr) =
            text.rsplit_once('@').ok_or_else(|| format!("`{text}` is not \"name@host:port\" (no `@`)"))?;
        let port = addr.rsplit_once(':').map(|(_, p)| p);
        if name.is_empty() || addr.is_empty() || port.and_then(|p| p.parse::<u16>().ok()).is_none() {
            return Err(format!("`{text}` is not \"name@host:port\""));
        }
        Ok(PeerEntry { name: name.to_owned(), addr: addr.to_owned() })
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 25672))
}

fn default_snapshot_interval() -> u64 {
    5000
}

fn default_command_timeout() -> Duration {
    Duration::from_secs(10)
}

fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    Ok(Duration::from_millis(u64::deserialize(d)?))
}

impl ClusterSection {
    /// Checks what serde cannot: a name, a secret long enough, distinct members.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.node_name.trim().is_empty() {
            return Err(ConfigError::invalid("cluster.node_name", "a member needs a name"));
        }
        if self.secret.len() < 16 {
            return Err(ConfigError::invalid(
                "cluster.secret",
                "must be at least 16 characters (every member holds the same one)",
            ));
        }
        let mut names = vec![self.node_name.as_str()];
        for p in &self.peers {
            if names.contains(&p.name.as_str()) {
                return Err(ConfigError::invalid(
                    "cluster.peers",
                    format!("member `{}` is named twice (or is this node)", p.name),
                ));
            }
            names.push(&p.name);
        }
        if self.command_timeout.is_zero() {
            return Err(ConfigError::invalid("cluster.command_timeout_ms", "must be more than 0"));
        }
        if self.snapshot_interval_entries < 10 {
            return Err(ConfigError::invalid("cluster.snapshot_interval_entries", "must be at least 10"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_name_at_host_port() {
        assert_eq!(
            PeerEntry::parse("b@10.0.0.2:25672").unwrap(),
            PeerEntry { name: "b".into(), addr: "10.0.0.2:25672".into() }
        );
        assert_eq!(PeerEntry::parse("rabbit@h@host:1").unwrap().name, "rabbit@h");
        for bad in ["b", "@h:1", "b@", "b@host", "b@host:x"] {
            assert!(PeerEntry::parse(bad).is_err(), "{bad}");
        }
    }
}

//! Persistent MQTT sessions and the inbound QoS 2 packet ids they wait to have released.
//!
//! Layout of the local implementation: `Space::Session` maps a client id to its
//! [`StoredSession`] as JSON; `Space::InboundQos2` holds one empty value per packet id,
//! keyed client id, `0`, packet id (u16 BE), so a session's ids share a prefix.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use ferrymq_storage::{Op, Space};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{JournalStore, StoreError, StoreWrite};
use crate::core::restore::{RecordKey, RecordKind, RestoreError};
use crate::core::router::MqttOptions;
use crate::core::tag_filter::TagFilter;

/// "Never expires" (MQTT's largest session expiry interval).
pub const NEVER: u32 = u32::MAX;

/// Options of one subscription, as granted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubOptions {
    /// The QoS granted in SUBACK; deliveries are downgraded to it.
    pub qos: u8,
    /// The client's own publishes are not delivered to it.
    pub no_local: bool,
    /// Deliveries keep the publisher's retain flag.
    pub retain_as_published: bool,
    /// Identifier the client gave the subscription (MQTT 5), echoed in deliveries.
    pub subscription_id: Option<u32>,
    /// Tag filter expression (MQTT 5 SUBSCRIBE user property `tag-filter`), validated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_filter: Option<String>,
}

impl SubOptions {
    /// The routing-table options of a subscription of `client_id` with these options.
    pub fn binding_options(&self, client_id: &Arc<str>) -> MqttOptions {
        MqttOptions {
            client_id: client_id.clone(),
            qos: self.qos,
            no_local: self.no_local,
            retain_as_published: self.retain_as_published,
            subscription_id: self.subscription_id,
            tag_filter: self.tag_filter.as_deref().and_then(|e| TagFilter::parse(e).ok()).map(Arc::new),
            share_group: None,
        }
    }
}

/// What survives of a persistent session while its client is away.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSession {
    /// Id of the session's consume queue.
    pub queue: u64,
    /// Session expiry interval, seconds ([`NEVER`] = never).
    pub expiry_secs: u32,
    /// Subscriptions by full filter (including `$share/...`).
    pub subscriptions: BTreeMap<String, SubOptions>,
    /// When the client last disconnected (ms since the epoch); `None` while connected.
    pub disconnected_at_ms: Option<u64>,
}

/// A change to persistent MQTT sessions and their inbound QoS 2 packet ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCommand {
    /// The session of `client_id` is stored (replacing the one it had).
    Save {
        /// The client.
        client_id: String,
        /// Its session.
        session: StoredSession,
    },
    /// The session of `client_id` is forgotten, with every inbound QoS 2 id it held.
    Remove {
        /// The client.
        client_id: String,
    },
    /// `pkid` of `client_id` was received (PUBREC sent); committed with its message.
    Qos2Received {
        /// The client.
        client_id: String,
        /// The packet id.
        pkid: u16,
    },
    /// `pkid` of `client_id` was released (PUBREL arrived).
    Qos2Released {
        /// The client.
        client_id: String,
        /// The packet id.
        pkid: u16,
    },
}

/// Persistent MQTT sessions by client id: reads, and the commands that change them.
pub trait SessionStore: fmt::Debug + Send + Sync {
    /// Every stored session; the first that cannot be read or decoded is the error
    /// (none is left out: its queues would look orphaned).
    fn load(&self) -> BoxFuture<'_, Result<Vec<(String, StoredSession)>, RestoreError>>;

    /// True when a session is stored for `client_id`.
    fn exists<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Stores (replaces) the session of `client_id`.
    fn save(&self, client_id: &str, session: &StoredSession) -> StoreWrite {
        StoreWrite::one(SessionCommand::Save { client_id: client_id.to_owned(), session: session.clone() })
    }

    /// Forgets the session of `client_id` with every inbound QoS 2 id it held.
    fn remove(&self, client_id: &str) -> StoreWrite {
        StoreWrite::one(SessionCommand::Remove { client_id: client_id.to_owned() })
    }
}

/// Inbound QoS 2 packet ids a persistent session received (PUBREC sent) and awaits the
/// PUBREL of: a resent PUBLISH with such an id is acknowledged, not routed again.
pub trait InboundQos2Store: fmt::Debug + Send + Sync {
    /// The ids `client_id` holds, read without blocking the calling thread (at CONNECT);
    /// an id that does not decode is an error, never left out (a re-sent message under it
    /// would be delivered twice).
    fn pending<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, Result<Vec<u16>, StoreError>>;

    /// Records `pkid` as received (committed with the message it came with).
    fn received(&self, client_id: &str, pkid: u16) -> StoreWrite {
        StoreWrite::one(SessionCommand::Qos2Received { client_id: client_id.to_owned(), pkid })
    }

    /// Forgets `pkid` (PUBREL arrived).
    fn released(&self, client_id: &str, pkid: u16) -> StoreWrite {
        StoreWrite::one(SessionCommand::Qos2Released { client_id: client_id.to_owned(), pkid })
    }
}

/// The journal operations of a session command (the local state machine's half).
pub(super) fn ops(command: &SessionCommand) -> Vec<Op> {
    match command {
        SessionCommand::Save { client_id, session } => vec![Op::Put {
            space: Space::Session,
            key: Bytes::copy_from_slice(client_id.as_bytes()),
            value: Bytes::from(serde_json::to_vec(session).unwrap_or_default()),
        }],
        SessionCommand::Remove { client_id } => vec![
            Op::Delete { space: Space::Session, key: Bytes::copy_from_slice(client_id.as_bytes()) },
            Op::DeletePrefix { space: Space::InboundQos2, prefix: qos2_prefix(client_id) },
        ],
        SessionCommand::Qos2Received { client_id, pkid } => {
            vec![Op::Put { space: Space::InboundQos2, key: qos2_key(client_id, *pkid), value: Bytes::new() }]
        }
        SessionCommand::Qos2Released { client_id, pkid } => {
            vec![Op::Delete { space: Space::InboundQos2, key: qos2_key(client_id, *pkid) }]
        }
    }
}

fn qos2_key(client_id: &str, pkid: u16) -> Bytes {
    let mut k = Vec::with_capacity(client_id.len() + 3);
    k.extend_from_slice(client_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&pkid.to_be_bytes());
    Bytes::from(k)
}

fn qos2_prefix(client_id: &str) -> Bytes {
    let mut k = Vec::with_capacity(client_id.len() + 1);
    k.extend_from_slice(client_id.as_bytes());
    k.push(0);
    Bytes::from(k)
}

impl SessionStore for JournalStore {
    fn load(&self) -> BoxFuture<'_, Result<Vec<(String, StoredSession)>, RestoreError>> {
        let kind = RecordKind::MqttSession;
        let scan = self.scan(Space::Session, Bytes::new());
        Box::pin(async move {
            let all = scan.await.map_err(|e| RestoreError::unreadable(kind, b"", e))?;
            let mut sessions = Vec::with_capacity(all.len());
            for (key, value) in all {
                let undecodable = |reason: String| RestoreError::undecodable(kind, RecordKey::bytes(&key), reason);
                let client_id =
                    std::str::from_utf8(&key).map_err(|_| undecodable("the client id is not UTF-8".into()))?;
                let session =
                    serde_json::from_slice::<StoredSession>(&value).map_err(|e| undecodable(e.to_string()))?;
                sessions.push((client_id.to_owned(), session));
            }
            Ok(sessions)
        })
    }

    fn exists<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let get = self.get(Space::Session, Bytes::copy_from_slice(client_id.as_bytes()));
        Box::pin(async move { Ok(get.await?.is_some()) })
    }
}

impl InboundQos2Store for JournalStore {
    fn pending<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, Result<Vec<u16>, StoreError>> {
        let prefix = qos2_prefix(client_id);
        let scan = self.scan(Space::InboundQos2, prefix.clone());
        Box::pin(async move {
            let stored = scan.await?;
            let mut ids = Vec::with_capacity(stored.len());
            for (k, _) in stored {
                match <[u8; 2]>::try_from(&k[prefix.len()..]) {
                    Ok(id) => ids.push(u16::from_be_bytes(id)),
                    Err(_) => {
                        let reason = format!("{} bytes after the client id, not a packet id", k.len() - prefix.len());
                        return Err(
                            RestoreError::undecodable(RecordKind::InboundQos2, RecordKey::bytes(&k), reason).into()
                        );
                    }
                }
            }
            Ok(ids)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{apply, apply_ops, open, read};
    use super::*;

    fn session(queue: u64) -> StoredSession {
        let mut subscriptions = BTreeMap::new();
        let opts = SubOptions {
            qos: 1,
            no_local: false,
            retain_as_published: true,
            subscription_id: Some(7),
            tag_filter: Some("a || b".into()),
        };
        subscriptions.insert("a/+".to_owned(), opts);
        StoredSession { queue, expiry_secs: 60, subscriptions, disconnected_at_ms: Some(5) }
    }

    /// The inbound QoS 2 ids of `client_id`, read as a connection does.
    fn pending(stores: &super::super::Stores, client_id: &str) -> Vec<u16> {
        try_pending(stores, client_id).unwrap()
    }

    /// [`pending`], with its error.
    fn try_pending(stores: &super::super::Stores, client_id: &str) -> Result<Vec<u16>, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(stores.inbound_qos2.pending(client_id))
    }

    #[test]
    fn sessions_round_trip_and_are_removed_with_their_qos2_ids() {
        let (_dir, journal, stores) = open();
        apply(&journal, stores.sessions.save("c1", &session(1)).and(stores.sessions.save("c2", &session(2))));
        apply(&journal, stores.inbound_qos2.received("c1", 1).and(stores.inbound_qos2.received("c1", 300)));
        apply(&journal, stores.inbound_qos2.received("c10", 9));
        let mut loaded = read(stores.sessions.load()).unwrap();
        loaded.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(loaded, vec![("c1".to_owned(), session(1)), ("c2".to_owned(), session(2))]);
        assert!(read(stores.sessions.exists("c1")).unwrap());
        let mut ids = pending(&stores, "c1");
        ids.sort();
        assert_eq!(ids, vec![1, 300], "a client's ids only (c10 shares no prefix with c1)");

        apply(&journal, stores.inbound_qos2.released("c1", 1));
        assert_eq!(pending(&stores, "c1"), vec![300]);
        apply(&journal, stores.sessions.remove("c1"));
        assert!(!read(stores.sessions.exists("c1")).unwrap());
        assert!(pending(&stores, "c1").is_empty(), "ids leave with the session");
        assert_eq!(pending(&stores, "c10"), vec![9]);
    }

    #[test]
    fn an_undecodable_session_is_named_not_left_out() {
        let (_dir, journal, stores) = open();
        let bad = Op::Put { space: Space::Session, key: Bytes::from_static(b"bad"), value: Bytes::from_static(b"{") };
        apply_ops(&journal, vec![bad]);
        apply(&journal, stores.sessions.save("good", &session(3)));
        let e = read(stores.sessions.load()).unwrap_err();
        assert_eq!(e.kind(), RecordKind::MqttSession);
        assert!(e.to_string().starts_with("the MQTT session record \"bad\" cannot be decoded"), "{e}");
    }

    #[test]
    fn an_undecodable_inbound_qos2_id_is_an_error_not_a_missing_id() {
        let (_dir, journal, stores) = open();
        apply(&journal, stores.inbound_qos2.received("c", 7));
        let bad =
            Op::Put { space: Space::InboundQos2, key: Bytes::from_static(b"c\0\x01\x02\x03"), value: Bytes::new() };
        apply_ops(&journal, vec![bad]);
        let e = try_pending(&stores, "c").unwrap_err();
        assert!(e.to_string().contains("inbound QoS 2 packet id record \"c\\x00\\x01\\x02\\x03\""), "{e}");
        assert!(pending(&stores, "d").is_empty());
    }
}

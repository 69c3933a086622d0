//! CONNECT: the client id (assigned when empty), credentials against the user store,
//! take-over of a connection holding the same id, and the session the connection
//! resumes or starts (clean, or persistent with its queue and inbound QoS 2 state).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_mqtt::topic::validate_topic_name;
use ferrymq_mqtt::{Accept, Connect, ProtocolLevel, ReasonCode};

use super::connection::{SessionState, Task};
use super::deliver::OFFSET_PKIDS;
use super::session::{Control, Online, Persistent, Subscriptions};
use super::{split_share, LoginRule, SESSION_QUEUE_PREFIX};
use crate::access::auth::AuthError;
use crate::access::authz::{Identity, Request, MQTT_VHOST};
use crate::core::broker::Commit;
use crate::core::connections::{ClientDetails, ConnectionInfo, Protocol};
use crate::core::message::now_ms;
use crate::core::router::Destination;
use crate::core::store::{StoreError, StoredSession, NEVER};

/// Longest wait for a taken-over connection to clean up.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);

impl Task {
    /// Checks CONNECT's user name and password as the listener's [`LoginRule`] asks: no
    /// user name where anonymous clients are refused is NOT_AUTHORIZED (Mosquitto), a
    /// wrong one BAD_USER_NAME_OR_PASSWORD, a loopback-only user from afar NOT_AUTHORIZED.
    /// An address (or user name from it) that failed too often waits before it is
    /// answered; one with too many logins under way is refused at once with
    /// CONNECTION_RATE_EXCEEDED (3.x: not authorized). With
    /// `mqtt.use_identity_as_username` (or `use_subject_as_username`) the user is the
    /// verified client certificate's common name (subject) instead, as Mosquitto; a client
    /// without one is NOT_AUTHORIZED; `c.username` becomes that name.
    async fn authenticate(&self, c: &mut Connect) -> Result<(), ReasonCode> {
        let cfg = &self.ctx.cfg;
        if cfg.use_identity_as_username || cfg.use_subject_as_username {
            let name = self.cert.as_ref().and_then(|cert| match cfg.use_subject_as_username {
                true => Some(cert.subject.clone()),
                false => cert.common_name.clone(),
            });
            let Some(name) = name else {
                conn_log!(info, self, "connection refused: no client certificate to take the user name from");
                return Err(ReasonCode::NOT_AUTHORIZED);
            };
            c.username = Some(name);
            c.password = None;
            return Ok(());
        }
        if self.listener.internal {
            return Ok(());
        }
        let LoginRule::Checked { anonymous } = self.ctx.logins.rule(self.listener.local_only) else { return Ok(()) };
        let Some(username) = c.username.as_deref() else {
            if anonymous {
                return Ok(());
            }
            conn_log!(info, self, "connection refused: no user name (anonymous clients are not allowed here)");
            return Err(ReasonCode::NOT_AUTHORIZED);
        };
        let password = c.password.as_deref().map(std::str::from_utf8).unwrap_or(Ok(""));
        let Ok(password) = password else {
            conn_log!(info, self, username, "connection refused: password is not UTF-8");
            return Err(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        };
        let login = self.ctx.logins.users.login(username, password, self.peer.ip(), "MQTT").await;
        login.map(drop).map_err(|e| {
            if e == AuthError::TooManyPending {
                // Logged once by the throttle, counted in /metrics.
                conn_log!(debug, self, username, error = %e, "connection refused");
            } else {
                conn_log!(info, self, username, error = %e, "connection refused");
            }
            match e {
                AuthError::BadCredentials(_) => ReasonCode::BAD_USER_NAME_OR_PASSWORD,
                AuthError::LoopbackOnly(_) => ReasonCode::NOT_AUTHORIZED,
                // MQTT 3.x: 5, not authorized.
                AuthError::TooManyPending => ReasonCode::CONNECTION_RATE_EXCEEDED,
            }
        })
    }

    /// Accepts or refuses CONNECT. Accepted: the previous holder of the client id is
    /// taken over, the session is resumed or started (and stored when persistent),
    /// CONNACK is queued, and the session's queues are attached.
    pub(super) async fn on_connect(&mut self, mut c: Connect) {
        self.level = c.level;
        self.bridge = c.bridge;
        let cfg = &self.ctx.cfg;
        let mut assigned = None;
        let client_id: Arc<str> = if c.client_id.is_empty() {
            if !may_assign_client_id(c.level, c.clean_start) {
                self.proto.refuse(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
                return;
            }
            let id = format!("ferrymq-{:016x}", rand_id(self.conn_id));
            if c.level.is_v5() {
                assigned = Some(id.clone());
            }
            Arc::from(id.as_str())
        } else {
            Arc::from(c.client_id.as_str())
        };
        if c.properties.authentication_method.is_some() {
            self.proto.refuse(ReasonCode::BAD_AUTHENTICATION_METHOD);
            return;
        }
        // The will is published as any topic is: no more levels than a PUBLISH may have.
        if c.will.as_ref().is_some_and(|w| validate_topic_name(&w.topic, cfg.max_topic_levels).is_err()) {
            conn_log!(info, self, "connection refused: invalid will topic (too many levels?)");
            self.proto.refuse(ReasonCode::TOPIC_NAME_INVALID);
            return;
        }
        let login = self.authenticate(&mut c).await;
        self.ctx.broker.stats().login(false, login.is_ok());
        if let Err(reason) = login {
            self.proto.refuse(reason);
            return;
        }
        if !self.listener.internal {
            // As RabbitMQ's MQTT plugin: 5.0 QUOTA_EXCEEDED, 3.x NOT_AUTHORIZED.
            match self.ctx.broker.admit(MQTT_VHOST, c.username.as_deref()) {
                Ok(admission) => self.admission = Some(Box::new(admission)),
                Err(limit) => {
                    conn_log!(info, self, ?limit, "connection refused at a limit");
                    self.proto.refuse(ReasonCode::QUOTA_EXCEEDED);
                    return;
                }
            }
        }
        if self.ctx.authz.mqtt_enabled() {
            let user = c.username.clone();
            let identity = Identity {
                groups: user.as_deref().and_then(|u| self.ctx.logins.users.get(u)).map(|u| u.tags).unwrap_or_default(),
                user,
                client_id: client_id.to_string(),
                peer: Some(self.peer.ip()),
                cert_cn: self.cert.as_ref().and_then(|cert| cert.common_name.clone()),
            };
            self.access = Some(Box::new(self.ctx.authz.access(identity, MQTT_VHOST)));
        }

        // Take over a connection that holds the same client id: on another cluster member
        // (closed there first), and here.
        self.ctx.broker.members_take_over(&client_id).await;
        let online = Online { conn_id: self.conn_id, signals: self.signals.clone() };
        let mut claim = self.ctx.sessions.claim(&client_id, online);
        if let Some(prev) = claim.previous.take() {
            claim.previous_existed = true;
            prev.signals.tell(Control::TakenOver);
            prev.signals.wait_finished(TAKEOVER_WAIT).await;
        }
        // The previous connection may have just updated the persistent state.
        let mut existing =
            if claim.previous_existed { self.ctx.sessions.persistent(&client_id) } else { claim.persistent };

        let expiry =
            session_expiry(c.level, c.clean_start, c.properties.session_expiry_interval, cfg.max_session_expiry_secs);

        if c.clean_start {
            if let Some(p) = existing.take() {
                self.ctx.discard_persistent(&client_id, &p).await;
                self.ctx.sessions.set_persistent(&client_id, None);
            }
        }
        let session_present = existing.is_some();
        let mut inbound_qos2 = Vec::new();

        let mut session = SessionState {
            client_id: client_id.clone(),
            link: None,
            persistent: None,
            expiry_secs: expiry,
            subs: Subscriptions::default(),
        };
        match existing {
            Some(mut p) => {
                // Read before the session changes: refused, it stays as it was.
                match self.load_inbound_qos2(&client_id).await {
                    Ok(ids) => inbound_qos2 = ids,
                    Err(e) => {
                        self.refuse_unreadable_state(&client_id, &p, &e);
                        return;
                    }
                }
                self.revoke_denied_subscriptions(&client_id, &mut p).await;
                session.subs = p.stored.subscriptions.iter().map(|(f, o)| (f.clone(), o.clone())).collect();
                p.stored.expiry_secs = expiry;
                p.stored.disconnected_at_ms = None;
                session.persistent = Some(p);
            }
            None if expiry > 0 => {
                let name = format!("{SESSION_QUEUE_PREFIX}{client_id}");
                match self.ctx.broker.stores().catalog.durable_queue_id(&name).await {
                    Ok(queue) => {
                        session.persistent = Some(Persistent {
                            queue,
                            stored: Box::new(StoredSession {
                                queue: queue.0,
                                expiry_secs: expiry,
                                subscriptions: BTreeMap::new(),
                                disconnected_at_ms: None,
                            }),
                        });
                    }
                    Err(e) => {
                        conn_log!(warn, self, error = %e, "cannot create session queue");
                        self.proto.refuse(ReasonCode::SERVER_UNAVAILABLE);
                        self.ctx.sessions.release(&client_id, self.conn_id, None, None);
                        return;
                    }
                }
            }
            // A clean session: its fast path is made at its first subscription.
            None => {}
        }
        if let Some(p) = &session.persistent {
            self.ctx.sessions.set_persistent(&client_id, Some(p.clone()));
            let write = self.ctx.broker.stores().sessions.save(&client_id, &p.stored);
            if let Err(e) = self.ctx.broker.commit(write, Commit::Durable).await {
                conn_log!(warn, self, error = %e, "cannot store session");
                self.proto.refuse(ReasonCode::SERVER_UNAVAILABLE);
                self.ctx.sessions.release(&client_id, self.conn_id, None, None);
                return;
            }
        }
        self.window = delivery_window(self.ctx.cfg.max_inflight, c.properties.receive_maximum);
        self.register_connection(&c, &client_id, expiry);
        self.will = c.will.map(Box::new);
        self.ctx.broker.stats().connected();
        tracing::info!(
            peer = %self.peer,
            client_id = &*client_id,
            level = ?c.level,
            clean_start = c.clean_start,
            session_present,
            expiry,
            "client connected"
        );
        self.proto.accept(Accept {
            session_present,
            assigned_client_id: assigned,
            session_expiry_interval: (c.level.is_v5() && c.properties.session_expiry_interval != Some(expiry))
                .then_some(expiry),
            inbound_qos2,
            properties: Default::default(),
        });
        // Resume consumption: own queue first, then shared groups of a resumed session.
        if let Some(p) = &session.persistent {
            self.attach(p.queue, 2);
        }
        let shared: Vec<(String, u8)> =
            session.subs.iter().filter(|(f, _)| f.starts_with("$share/")).map(|(f, o)| (f.clone(), o.qos)).collect();
        self.session = Some(session);
        for (filter, qos) in shared {
            if let Some((group, f)) = split_share(&filter) {
                if let Some(q) = self.ctx.groups.queue_of(group, f) {
                    self.consuming().group_filters.insert(q, filter.clone());
                    self.attach(q, qos);
                }
            }
        }
    }

    /// Checks a resumed session's subscriptions against this connection's permissions (the
    /// client id may be resumed by another user, or the rules narrowed since): those no
    /// longer allowed are dropped, as if unsubscribed, before anything is delivered; a
    /// shared one leaves its group (whose queue goes with its last member).
    async fn revoke_denied_subscriptions(&mut self, client_id: &str, p: &mut Persistent) {
        if self.access.is_none() {
            return;
        }
        let max_levels = self.ctx.cfg.max_topic_levels;
        let filters: Vec<String> = p.stored.subscriptions.keys().cloned().collect();
        for f in filters {
            let allowed = match ferrymq_mqtt::topic::parse_filter(&f, max_levels) {
                Ok(parsed) => self.permitted(Request::Subscribe(parsed.filter)),
                Err(_) => false,
            };
            if allowed {
                continue;
            }
            conn_log!(info, self, filter = %f, "stored subscription no longer allowed; dropped");
            match super::split_share(&f) {
                Some((group, inner)) => {
                    if let Some(q) = self.ctx.groups.leave(&self.ctx.broker, group, inner, client_id) {
                        self.ctx.broker.delete_queue(q).await;
                    }
                }
                None => {
                    self.ctx.broker.unsubscribe(&f, &Destination::Queue(p.queue));
                }
            }
            p.stored.subscriptions.remove(&f);
        }
    }

    /// The inbound QoS 2 ids a resumed persistent session still waits to have released,
    /// read once every earlier submission is applied: a PUBREL the previous connection
    /// queued just before it went must not leave its id looking pending (the client's
    /// next message under it would be taken for a re-send).
    async fn load_inbound_qos2(&self, client_id: &str) -> Result<Vec<u16>, StoreError> {
        self.ctx.broker.barrier().await;
        self.ctx.broker.stores().inbound_qos2.pending(client_id).await
    }

    /// Refuses a CONNECT whose session's inbound QoS 2 state cannot be read, with
    /// Server unavailable (5.0: 0x88, 3.1.1: 3): taken for "no pending ids", a message the
    /// client sends again would be delivered twice. The session stays as stored, its expiry
    /// clock running again. Counted in `ferrymq_mqtt_connect_state_unreadable_total`;
    /// the first is logged at warn, later ones at debug.
    fn refuse_unreadable_state(&mut self, client_id: &Arc<str>, p: &Persistent, error: &StoreError) {
        let refused = &self.ctx.broker.stats().mqtt_state_unreadable;
        let why = "connection refused (Server unavailable): the session's inbound QoS 2 state cannot be read";
        if refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
            tracing::warn!(
                peer = %self.peer,
                client_id = &**client_id,
                %error,
                "{why} (later ones at debug, counted in ferrymq_mqtt_connect_state_unreadable_total)"
            );
        } else {
            tracing::debug!(peer = %self.peer, client_id = &**client_id, %error, "{why}");
        }
        self.proto.refuse(ReasonCode::SERVER_UNAVAILABLE);
        let s = &p.stored;
        let expires =
            (s.expiry_secs != NEVER).then(|| s.disconnected_at_ms.unwrap_or_else(now_ms) + s.expiry_secs as u64 * 1000);
        self.ctx.sessions.release(client_id, self.conn_id, expires, None);
    }
}

/// A cheap unique-enough suffix for assigned client ids.
fn rand_id(seed: u64) -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    (t ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left(17)
}

/// Whether the broker may assign an id to a client that sent an empty one: always in 5.0,
/// in 3.1.1 only with a clean session (MQTT-3.1.3-7), never in 3.1.
fn may_assign_client_id(level: ProtocolLevel, clean_start: bool) -> bool {
    match level {
        ProtocolLevel::V5 => true,
        ProtocolLevel::V3_1_1 => clean_start,
        ProtocolLevel::V3_1 => false,
    }
}

/// The session expiry in effect, seconds: 5.0 asks for it (absent = 0); in 3.x a clean
/// session ends with the connection and a persistent one never expires. Capped by the
/// configured maximum.
fn session_expiry(level: ProtocolLevel, clean_start: bool, requested: Option<u32>, max_secs: u32) -> u32 {
    let asked = match level {
        ProtocolLevel::V5 => requested.unwrap_or(0),
        _ if clean_start => 0,
        _ => NEVER,
    };
    asked.min(max_secs)
}

/// Credit each attached queue gets: the smaller of the configured in-flight limit and
/// the client's receive maximum, within the packet ids derived from queue offsets.
fn delivery_window(max_inflight: u16, receive_maximum: Option<u16>) -> u32 {
    (max_inflight.min(receive_maximum.unwrap_or(u16::MAX)) as u32).clamp(1, OFFSET_PKIDS as u32)
}

impl Task {
    /// Lists the connection (its CONNECT was accepted) where operations see connections.
    fn register_connection(&mut self, c: &Connect, client_id: &Arc<str>, expiry_secs: u32) {
        let protocol = match c.level {
            ProtocolLevel::V3_1 => Protocol::Mqtt31,
            ProtocolLevel::V3_1_1 => Protocol::Mqtt311,
            ProtocolLevel::V5 => Protocol::Mqtt5,
        };
        let max = self.ctx.cfg.max_keepalive_secs;
        let keep_alive = if max > 0 && (c.keep_alive == 0 || c.keep_alive > max) { max } else { c.keep_alive };
        let signals = self.signals.clone();
        let info = Arc::new(ConnectionInfo::new(
            self.conn_id,
            protocol,
            self.peer,
            self.listener,
            c.username.clone().unwrap_or_default(),
            crate::core::router::MQTT_VHOST.to_owned(),
            ClientDetails::Mqtt { client_id: client_id.clone(), keep_alive, clean_start: c.clean_start, expiry_secs },
            Box::new(move |_reason: &str| signals.tell(Control::Kicked)),
        ));
        self.ctx.broker.register_connection(info.clone());
        self.info = Some(info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_client_ids_are_assigned_where_the_protocol_allows() {
        assert!(may_assign_client_id(ProtocolLevel::V5, false));
        assert!(may_assign_client_id(ProtocolLevel::V5, true));
        assert!(may_assign_client_id(ProtocolLevel::V3_1_1, true));
        assert!(!may_assign_client_id(ProtocolLevel::V3_1_1, false));
        assert!(!may_assign_client_id(ProtocolLevel::V3_1, true));
    }

    #[test]
    fn session_expiry_follows_the_protocol_level_and_the_cap() {
        assert_eq!(session_expiry(ProtocolLevel::V5, false, None, NEVER), 0, "5.0 without the property");
        assert_eq!(session_expiry(ProtocolLevel::V5, true, Some(60), NEVER), 60, "5.0 clean start may persist");
        assert_eq!(session_expiry(ProtocolLevel::V5, false, Some(NEVER), 3600), 3600, "capped");
        assert_eq!(session_expiry(ProtocolLevel::V3_1_1, true, Some(60), NEVER), 0, "3.x clean session");
        assert_eq!(session_expiry(ProtocolLevel::V3_1_1, false, None, NEVER), NEVER);
        assert_eq!(session_expiry(ProtocolLevel::V3_1, false, None, 10), 10);
    }

    #[test]
    fn the_delivery_window_is_bounded_both_ways() {
        assert_eq!(delivery_window(100, None), 100);
        assert_eq!(delivery_window(100, Some(5)), 5, "the client's receive maximum");
        assert_eq!(delivery_window(u16::MAX, None), OFFSET_PKIDS as u32, "offset-derived ids bound it");
        assert_eq!(delivery_window(0, Some(0)), 1, "never zero");
    }

    #[test]
    fn assigned_ids_differ_between_connections() {
        let ids: std::collections::HashSet<u64> = (0..1000).map(rand_id).collect();
        assert_eq!(ids.len(), 1000);
    }
}

//! The MQTT front-end: connects sockets to the core.
//!
//! ```text
//! socket ─▶ connection task (owns a ferrymq_mqtt::Connection) ─▶ Broker::publish ─▶ sessions / journal
//!    ▲                 ▲ direct channel (clean sessions, fast path)
//!    └─────────────────┴ queue deliveries (persistent session queue, shared groups)
//! ```
//!
//! - [`connection`] — one task per socket: the socket loop, protocol events dispatched to
//!   `connect` (CONNECT, auth, take-over), `publish` (inbound publishes and their acks),
//!   `deliver` (outbound deliveries), `subscribe` (SUBSCRIBE/UNSUBSCRIBE) and `close`
//!   (clean-up and will), private modules that extend the connection task.
//! - [`session`] — client ids, take-over, persistent sessions and their storage, expiry.
//! - [`shared`] — `$share/{group}/{filter}` groups as consume queues.
//! - [`sys`] — the `$SYS/broker/...` topics.
//! - [`refused`] — what the rules refused a bridge's local side, counted and logged once.
//! - [`convert`] — MQTT publish <-> core message.

/// Logs an event of a connection task (`$task`) with the connection's peer address and
/// client id as fields. A span per connection would give the same context, but costs more
/// in the subscriber's registry than all the rest of an idle connection.
macro_rules! conn_log {
    ($level:ident, $task:expr, $($arg:tt)+) => {
        tracing::$level!(peer = %$task.peer, client_id = $task.log_client_id(), $($arg)+)
    };
}

mod close;
mod connect;
pub(crate) mod connection;
pub(crate) mod convert;
mod deliver;
mod publish;
pub(crate) mod refused;
pub(crate) mod session;
pub(crate) mod shared;
mod subscribe;
pub(crate) mod sys;

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::access::auth::Users;
use crate::access::authz::Authorizer;
use crate::composition::config::MqttSection;
use crate::core::alarm::ResourceAlarm;
use crate::core::broker::{Broker, Commit};
use crate::core::message::now_ms;
use crate::core::restore::{RecordKey, RecordKind, RestoreError};
use crate::core::router::Destination;
use crate::core::store::{QueueId, StoredSession, NEVER};
use crate::core::tag_filter::TagFilter;
use crate::core::timer_wheel::TimerWheel;
use session::{ConnectionSignals, Persistent, Sessions};
use shared::SharedGroups;

/// The resolution of connections' deadlines (they fire at most this late).
const TIMER_TICK: Duration = Duration::from_millis(10);

/// Prefix of the queue names of persistent sessions.
pub(crate) const SESSION_QUEUE_PREFIX: &str = "mqtt-session/";

/// Who may connect over MQTT: the user store CONNECT is checked against and whether
/// passwords are checked everywhere (`auth.mqtt`, `auth.mosquitto_password_file`).
#[derive(Debug, Clone)]
pub struct MqttLogins {
    /// The users (the same store AMQP and the management API use).
    pub users: Users,
    /// Every CONNECT with a user name is checked, whatever the listener.
    pub check_passwords: bool,
    /// `mqtt.allow_anonymous`.
    pub allow_anonymous: Option<bool>,
}

/// What a listener asks of a CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginRule {
    /// Anyone comes in; user names and passwords are not looked at.
    Open,
    /// User names and passwords are checked; a CONNECT without a user name comes in only
    /// when `anonymous`.
    Checked {
        /// A CONNECT without a user name is accepted.
        anonymous: bool,
    },
}

impl MqttLogins {
    /// The rule on a listener (`local_only`: bound to a loopback address): anonymous
    /// clients as `mqtt.allow_anonymous` says, or, unset, only on a loopback listener
    /// while passwords are not checked (Mosquitto 2.0); where anonymous clients are
    /// refused, user names are checked, so that naming any user is no way around it.
    pub fn rule(&self, local_only: bool) -> LoginRule {
        let anonymous = self.allow_anonymous.unwrap_or(local_only && !self.check_passwords);
        match anonymous && !self.check_passwords {
            true => LoginRule::Open,
            false => LoginRule::Checked { anonymous },
        }
    }
}

/// Everything the MQTT front-end shares between connections.
#[derive(Debug)]
pub struct MqttContext {
    /// The core every connection publishes to and consumes from.
    pub broker: Arc<Broker>,
    /// `[mqtt]` settings.
    pub cfg: MqttSection,
    /// The protocol machine's settings (from `cfg`), shared by every connection.
    pub protocol: Arc<ferrymq_mqtt::Config>,
    /// Sessions by client id.
    pub sessions: Sessions,
    /// Shared-subscription groups.
    pub groups: SharedGroups,
    /// Who may connect: the user store and whether passwords are checked.
    pub logins: MqttLogins,
    /// What a connected client may publish, subscribe to and receive.
    pub authz: Arc<Authorizer>,
    /// The memory and disk alarms: connections that publish are not read while one is raised.
    pub alarm: Arc<ResourceAlarm>,
    /// Every connection's deadline (keep-alive, stall clock, alarm re-check).
    pub timers: Arc<TimerWheel<ConnectionSignals>>,
}

impl MqttContext {
    /// Builds the context and restores the persistent sessions start-up read (`stored`):
    /// their bindings go back into the routing table and their expiry clocks restart.
    /// Every session is checked before any is applied: a shared subscription that does
    /// not name a group and a filter, or a tag filter that does not parse, is the error
    /// (never left out, which would leave its group's queue looking orphaned).
    pub fn restore(
        broker: Arc<Broker>,
        cfg: MqttSection,
        logins: MqttLogins,
        authz: Arc<Authorizer>,
        alarm: Arc<ResourceAlarm>,
        stored: Vec<(String, StoredSession)>,
    ) -> Result<Arc<MqttContext>, RestoreError> {
        for (client_id, s) in &stored {
            check_stored_subscriptions(client_id, s)?;
        }
        let ctx = Arc::new(MqttContext {
            broker,
            protocol: Arc::new(connection::protocol_config(&cfg)),
            cfg,
            sessions: Sessions::default(),
            groups: SharedGroups::default(),
            logins,
            authz,
            alarm,
            timers: Arc::new(TimerWheel::new(TIMER_TICK)),
        });
        let now = now_ms();
        let mut restored = 0usize;
        for (client_id, s) in stored {
            let client_id: Arc<str> = Arc::from(client_id);
            let queue = QueueId(s.queue);
            for (filter, opts) in &s.subscriptions {
                if let Some((group, f)) = split_share(filter) {
                    match ctx.groups.rejoin(&ctx.broker, group, f, &client_id, opts.tag_filter.as_deref()) {
                        Ok(_) => {}
                        Err(shared::JoinError::Storage(e)) => {
                            let key = RecordKey::text(format!("client_id={client_id} filter={filter}"));
                            return Err(e.restoring(RecordKind::SharedSubscription, key));
                        }
                        // Members that disagree: this one stays out of the group (as a
                        // SUBSCRIBE would be refused); the group and its queue stay.
                        Err(e) => warn!(client_id = %client_id, filter, error = %e, "shared subscription not restored"),
                    }
                    continue;
                }
                ctx.broker.subscribe(filter, Destination::Queue(queue), opts.binding_options(&client_id));
            }
            let since = s.disconnected_at_ms.unwrap_or(now);
            let expires = (s.expiry_secs != NEVER).then(|| since + s.expiry_secs as u64 * 1000);
            ctx.sessions.restore(client_id, Persistent { queue, stored: Box::new(s) }, expires);
            restored += 1;
        }
        if restored > 0 {
            info!(sessions = restored, "restored persistent MQTT sessions");
        }
        Ok(ctx)
    }

    /// Deletes queues left behind by sessions or groups that no longer exist (e.g. the
    /// groups of clean sessions before a restart). Run once everything stored was
    /// restored: a session or group that could not be read stops start-up before this.
    pub async fn drop_orphan_queues(&self) {
        let queues = match self.broker.stores().catalog.queues().await {
            Ok(q) => q,
            Err(e) => {
                warn!(error = %e, "cannot list queues; none deleted as orphaned");
                return;
            }
        };
        let live_groups = self.groups.queue_names();
        for (name, id) in queues {
            let orphan = if let Some(client) = name.strip_prefix(SESSION_QUEUE_PREFIX) {
                matches!(self.broker.stores().sessions.exists(client).await, Ok(false))
            } else if name.starts_with("mqtt-share/") {
                !live_groups.contains(&name)
            } else if name.starts_with(crate::core::broker::SPILL_QUEUE_PREFIX) {
                // Clean sessions end with their connection: none survives a restart.
                true
            } else {
                false
            };
            if orphan {
                self.broker.delete_queue(id).await;
            }
        }
    }

    /// Ends expired persistent sessions: bindings, groups, queue and stored state.
    pub async fn expire_sessions(&self) {
        for (client_id, p) in self.sessions.take_expired(now_ms()) {
            info!(client_id = %client_id, "session expired");
            self.discard_persistent(&client_id, &p).await;
        }
    }

    /// Removes every trace of a persistent session.
    pub async fn discard_persistent(&self, client_id: &str, p: &Persistent) {
        for filter in p.stored.subscriptions.keys() {
            if let Some((group, f)) = split_share(filter) {
                if let Some(q) = self.groups.leave(&self.broker, group, f, client_id) {
                    self.broker.delete_queue(q).await;
                }
            } else {
                self.broker.unsubscribe(filter, &Destination::Queue(p.queue));
            }
        }
        self.broker.delete_queue(p.queue).await;
        if let Err(e) = self.broker.commit(self.broker.stores().sessions.remove(client_id), Commit::Queued).await {
            warn!(error = %e, "cannot delete stored session");
        }
    }

    /// Runs the session-expiry sweeper until the runtime stops.
    pub async fn run_expiry(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            self.expire_sessions().await;
        }
    }
}

/// A stored session's subscriptions as a SUBSCRIBE made them: a `$share/` filter names a
/// group and a filter, a tag filter parses.
fn check_stored_subscriptions(client_id: &str, s: &StoredSession) -> Result<(), RestoreError> {
    for (filter, opts) in &s.subscriptions {
        let shared = filter.starts_with("$share/");
        let kind = if shared { RecordKind::SharedSubscription } else { RecordKind::MqttSession };
        let undecodable = |reason: String| {
            RestoreError::undecodable(kind, RecordKey::text(format!("client_id={client_id} filter={filter}")), reason)
        };
        if shared && !split_share(filter).is_some_and(|(g, f)| !g.is_empty() && !f.is_empty()) {
            return Err(undecodable("a shared subscription without a group name and a topic filter".into()));
        }
        if let Some(Err(e)) = opts.tag_filter.as_deref().map(TagFilter::parse) {
            return Err(undecodable(format!("its tag filter does not parse: {e}")));
        }
    }
    Ok(())
}

/// Splits `$share/{group}/{filter}` into group and filter.
pub(crate) fn split_share(filter: &str) -> Option<(&str, &str)> {
    let rest = filter.strip_prefix("$share/")?;
    let (group, f) = rest.split_once('/')?;
    Some((group, f))
}

//! Inbound PUBLISH and its acknowledgement: checks (payload format, reserved and
//! `$delayed/{seconds}/` topics), routing through the connection's route cache, the
//! inbound QoS 2 id a persistent session keeps until PUBREL, and acks released in order
//! once the message is durable.

use std::sync::Arc;

use ferrymq_mqtt::topic::validate_topic_name;
use ferrymq_mqtt::{Publish, QoS, ReasonCode};

use super::connection::Task;
use super::convert::message_in;
use crate::access::authz::Request;
use crate::core::broker::{Commit, DurableSignal, RetainMode};
use crate::core::message::{now_ms, SharedMessage};
use crate::core::router::MQTT_VHOST;
use crate::core::stats::Stats;
use crate::core::store::StoreWrite;

/// Topic prefix of delayed publishes.
const DELAYED_PREFIX: &str = "$delayed/";
/// Longest delay of `$delayed/{seconds}/...`.
const MAX_DELAY_SECS: u64 = 4_294_967;

/// An inbound QoS 1/2 publish waiting for its ack.
pub(super) struct PendingAck {
    pkid: u16,
    /// Resolves when the message is durable; `None` when the ack needs no wait.
    pub(super) signal: Option<DurableSignal>,
    reason: ReasonCode,
}

impl PendingAck {
    /// The durability signal the ack waits for.
    pub(super) fn signal(&mut self) -> Option<&mut DurableSignal> {
        self.signal.as_mut()
    }
}

impl Task {
    /// The front pending ack's message is durable (`stored`) or failed to be stored
    /// (refused with 0x83 where the client can be told): acks it and those behind it that
    /// need no wait.
    pub(super) fn on_front_stored(&mut self, stored: bool) {
        if let Some(mut ack) = self.pending_acks.pop_front() {
            if !stored {
                conn_log!(warn, self, "message could not be stored; refusing it");
                ack.reason = ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR;
            }
            self.proto.ack_publish(ack.pkid, ack.reason);
        }
        self.release_ready_acks();
    }

    /// Sends the acks at the front of the queue that need no durability wait.
    pub(super) fn release_ready_acks(&mut self) {
        while self.pending_acks.front().is_some_and(|a| a.signal.is_none()) {
            if let Some(a) = self.pending_acks.pop_front() {
                self.proto.ack_publish(a.pkid, a.reason);
            }
        }
    }

    /// Routes and stores an inbound PUBLISH (or refuses it) and queues its ack, which
    /// is sent once the message is durable.
    pub(super) async fn on_publish(&mut self, mut p: Publish) {
        self.publishes_in += 1;
        self.publishing = true;
        let Some(session) = self.session.as_ref() else { return };
        let client_id = session.client_id.clone();
        let persistent = session.persistent.is_some();
        let (pkid, qos) = (p.pkid, p.qos);
        let now = now_ms();

        if p.properties.payload_format_indicator == Some(1) && std::str::from_utf8(&p.payload).is_err() {
            self.refuse_publish(pkid, qos, ReasonCode::PAYLOAD_FORMAT_INVALID, "payload is not UTF-8");
            return;
        }
        if let Some(rest) = p.topic.strip_prefix(DELAYED_PREFIX) {
            let parsed = parse_delayed(rest, self.ctx.cfg.max_topic_levels).map(|(secs, t)| (secs, t.to_owned()));
            let Some((secs, topic)) = parsed else {
                self.refuse_publish(pkid, qos, ReasonCode::TOPIC_NAME_INVALID, "malformed $delayed topic");
                return;
            };
            if !self.permitted(Request::Publish(&topic)) {
                self.refuse_unauthorized(pkid, qos, &topic);
                return;
            }
            let msg: SharedMessage = Arc::new(message_in(p, &topic, self.ctx.broker.routing().mqtt_exchange(), now));
            let signal = self.ctx.broker.schedule(MQTT_VHOST, &msg, now + secs * 1000, StoreWrite::none()).await;
            self.push_ack(pkid, qos, Some(signal), ReasonCode::SUCCESS);
            return;
        }
        if is_reserved(&p.topic, &client_id) {
            // Reserved for the broker: an MQTT 5 client is told (0x87, as Mosquitto), a 3.x
            // one gets its ack; the message is dropped and counted either way.
            Stats::add(&self.ctx.broker.stats().publish_dropped, 1);
            Stats::add(&self.ctx.broker.stats().dropped_not_authorized, 1);
            if let Some(r) = &self.refusals {
                r.publish_refused(&p.topic);
            }
            self.refuse_publish(pkid, qos, ReasonCode::NOT_AUTHORIZED, "publish to a topic reserved for the broker");
            return;
        }
        if !self.permitted(Request::Publish(&p.topic)) {
            self.refuse_unauthorized(pkid, qos, &p.topic);
            return;
        }
        let retain = if p.retain { RetainMode::Persist } else { RetainMode::None };
        let topic = std::mem::take(&mut p.topic);
        let msg: SharedMessage = Arc::new(message_in(p, &topic, self.ctx.broker.routing().mqtt_exchange(), now));
        let routes =
            self.ctx.broker.routing().resolve_cached(self.route_cache.get_or_insert_default(), &msg, &client_id);
        // A persistent session remembers the id until PUBREL, in the message's submission.
        let along = if qos == QoS::ExactlyOnce && persistent {
            self.ctx.broker.stores().inbound_qos2.received(&client_id, pkid)
        } else {
            StoreWrite::none()
        };
        let signal = self.ctx.broker.publish(&msg, &routes, retain, along).await;
        self.publishes_unrouted += routes.is_empty() as u64;
        let reason = if routes.is_empty() && self.level.is_v5() {
            ReasonCode::NO_MATCHING_SUBSCRIBERS
        } else {
            ReasonCode::SUCCESS
        };
        self.push_ack(pkid, qos, signal, reason);
    }

    /// Refuses a publish to `topic` the client may not make: 5.0 PUBACK/PUBREC 0x87, 3.x
    /// acked and dropped (as Mosquitto); counted (for a bridge's local side, for the bridge too).
    fn refuse_unauthorized(&mut self, pkid: u16, qos: QoS, topic: &str) {
        Stats::add(&self.ctx.broker.stats().publish_dropped, 1);
        Stats::add(&self.ctx.broker.stats().dropped_not_authorized, 1);
        if let Some(r) = &self.refusals {
            r.publish_refused(topic);
        }
        self.refuse_publish(pkid, qos, ReasonCode::NOT_AUTHORIZED, "publish not authorized");
    }

    /// Queues the ack of a QoS 1/2 publish behind the earlier ones.
    fn push_ack(&mut self, pkid: u16, qos: QoS, signal: Option<DurableSignal>, reason: ReasonCode) {
        if qos == QoS::AtMostOnce {
            return;
        }
        self.pending_acks.push_back(PendingAck { pkid, signal, reason });
    }

    /// Refuses a publish: a 5.0 client is told `reason`; QoS 0 and 3.x publishes are
    /// dropped and logged.
    fn refuse_publish(&mut self, pkid: u16, qos: QoS, reason: ReasonCode, why: &str) {
        if qos == QoS::AtMostOnce || !self.level.is_v5() {
            // The client is not told (QoS 0, or MQTT 3.x acks without a reason): log it,
            // at info the first time per connection (a client must not flood the log).
            self.dropped_publishes += 1;
            if self.dropped_publishes == 1 {
                conn_log!(info, self, why, "publish dropped (later drops on this connection are logged at debug)");
            } else {
                conn_log!(debug, self, why, dropped = self.dropped_publishes, "publish dropped");
            }
        } else {
            conn_log!(debug, self, why, "publish refused");
        }
        if let Some(reason) = refusal_ack(qos, self.level.is_v5(), reason) {
            self.pending_acks.push_back(PendingAck { pkid, signal: None, reason });
        }
    }

    /// PUBREL: a persistent session forgets the inbound QoS 2 id.
    pub(super) async fn on_pubrel(&mut self, pkid: u16) {
        let Some(s) = self.session.as_ref() else { return };
        if s.persistent.is_some() {
            // Durable: a stale pending id after a power cut would swallow the client's next
            // message that reuses it.
            let write = self.ctx.broker.stores().inbound_qos2.released(&s.client_id, pkid);
            if let Err(e) = self.ctx.broker.commit(write, Commit::Queued).await {
                conn_log!(warn, self, error = %e, "cannot clear inbound QoS 2 state");
            }
        }
    }
}

/// Splits what follows `$delayed/` into the delay in seconds and the topic to publish to;
/// `None` when the delay is not a number of seconds up to the maximum or the topic is not
/// a valid, non-reserved topic name.
fn parse_delayed(rest: &str, max_topic_levels: usize) -> Option<(u64, &str)> {
    let (secs, topic) = rest.split_once('/')?;
    let secs: u64 = secs.parse().ok().filter(|s| *s <= MAX_DELAY_SECS)?;
    validate_topic_name(topic, max_topic_levels).ok()?;
    (!topic.starts_with('$')).then_some((secs, topic))
}

/// Topics reserved for the broker: clients cannot publish to them, except a bridge's
/// state under its own client id (`$SYS/broker/connection/{client id}/state`, as
/// Mosquitto's bridges publish it), so that no client fakes another's.
pub(super) fn is_reserved(topic: &str, client_id: &str) -> bool {
    if let Some(rest) = topic.strip_prefix("$SYS/broker/connection/") {
        return rest.strip_suffix("/state") != Some(client_id) || client_id.contains('/');
    }
    topic.starts_with("$SYS") || topic.starts_with("$share/")
}

/// The ack of a refused publish: none for QoS 0; 5.0 carries the reason; 3.x acks carry
/// none, so the publish is acknowledged and dropped, as Mosquitto does.
fn refusal_ack(qos: QoS, v5: bool, reason: ReasonCode) -> Option<ReasonCode> {
    match qos {
        QoS::AtMostOnce => None,
        _ if v5 => Some(reason),
        _ => Some(ReasonCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delayed_topics_name_seconds_and_a_topic() {
        assert_eq!(parse_delayed("10/a/b", 16), Some((10, "a/b")));
        assert_eq!(parse_delayed("0/a", 16), Some((0, "a")));
        assert_eq!(parse_delayed(&format!("{MAX_DELAY_SECS}/a"), 16), Some((MAX_DELAY_SECS, "a")));
        assert_eq!(parse_delayed(&format!("{}/a", MAX_DELAY_SECS + 1), 16), None, "too long a delay");
        assert_eq!(parse_delayed("ten/a", 16), None);
        assert_eq!(parse_delayed("-1/a", 16), None);
        assert_eq!(parse_delayed("10", 16), None, "no topic");
        assert_eq!(parse_delayed("10/", 16), None, "empty topic");
        assert_eq!(parse_delayed("10/a/+", 16), None, "wildcards are not topic names");
        assert_eq!(parse_delayed("10/$SYS/x", 16), None, "reserved topics");
        assert_eq!(parse_delayed("10/a/b/c", 2), None, "too many levels");
    }

    #[test]
    fn reserved_topics() {
        let r = |t: &str| is_reserved(t, "edge-1");
        assert!(r("$SYS/broker/uptime"));
        assert!(r("$share/g/a"));
        assert!(!r("$delayed-not/a"));
        assert!(!r("a/$SYS"));
        assert!(!r("$SYS/broker/connection/edge-1/state"), "a bridge's own state");
        assert!(r("$SYS/broker/connection/edge-2/state"), "not another's");
        assert!(r("$SYS/broker/connection/edge-1/other"));
        assert!(is_reserved("$SYS/broker/connection/a/b/state", "a/b"));
    }

    #[test]
    fn a_refusal_tells_only_a_5_0_client() {
        let r = ReasonCode::PAYLOAD_FORMAT_INVALID;
        assert_eq!(refusal_ack(QoS::AtMostOnce, true, r), None);
        assert_eq!(refusal_ack(QoS::AtLeastOnce, true, r), Some(r));
        assert_eq!(refusal_ack(QoS::ExactlyOnce, true, r), Some(r));
        assert_eq!(refusal_ack(QoS::AtLeastOnce, false, r), Some(ReasonCode::SUCCESS));
    }
}

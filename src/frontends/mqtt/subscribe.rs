//! SUBSCRIBE and UNSUBSCRIBE: topic filters become bindings in the routing table (to
//! the connection for a clean session, to the session's queue for a persistent one),
//! `$share/{group}/...` filters join or leave a shared group, retained messages are sent
//! as the retain handling asks, and a persistent session's subscriptions are stored.

use std::sync::Arc;

use ferrymq_mqtt::topic::parse_filter;
use ferrymq_mqtt::{ReasonCode, Subscribe, Unsubscribe};

use super::connection::Task;
use super::convert::qos_u8;
use super::deliver::Pending;
use super::shared::JoinError;
use super::split_share;
use crate::access::authz::Request;
use crate::core::broker::Commit;
use crate::core::delivery::Direct;
use crate::core::router::mqtt_filter_to_pattern;
use crate::core::store::SubOptions;
use crate::core::tag_filter::{TagFilter, TagFilterError, MQTT_TAG_FILTER_PROPERTY};

impl Task {
    /// Applies each filter of a SUBSCRIBE (a binding, or a shared group membership),
    /// queues SUBACK and the retained messages the retain handling asks for, and stores
    /// a persistent session's subscriptions.
    pub(super) async fn on_subscribe(&mut self, s: Subscribe) {
        let Some(session) = self.session.as_ref() else { return };
        let client_id = session.client_id.clone();
        let mut reasons = Vec::with_capacity(s.filters.len());
        let mut retained: Vec<Direct> = Vec::new();
        let mut changed = false;
        // The user property `tag-filter` applies to every filter of the packet.
        let tag_filter = tag_filter_of(&s.user_properties);
        for f in &s.filters {
            let tag_filter = match &tag_filter {
                Ok(t) => t.clone(),
                Err(e) => {
                    conn_log!(debug, self, filter = %f.filter, error = %e, "invalid tag filter");
                    reasons.push(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR);
                    continue;
                }
            };
            let parsed = match parse_filter(&f.filter, self.ctx.cfg.max_topic_levels) {
                Ok(p) => p,
                Err(e) => {
                    conn_log!(debug, self, filter = %f.filter, error = %e, "invalid subscription filter");
                    reasons.push(ReasonCode::TOPIC_FILTER_INVALID);
                    continue;
                }
            };
            if parsed.share_group.is_some() && f.no_local {
                reasons.push(ReasonCode::PROTOCOL_ERROR);
                continue;
            }
            if !self.permitted(Request::Subscribe(parsed.filter)) {
                // 3.1.1: 0x80 (failure); 5.0: 0x87 Not authorized.
                conn_log!(info, self, filter = %f.filter, "subscription not authorized");
                reasons.push(ReasonCode::NOT_AUTHORIZED);
                continue;
            }
            let granted = qos_u8(f.qos).min(2);
            // A Mosquitto bridge (its CONNECT's bridge bit) is not sent its own publishes
            // back and sees retain flags as published, as Mosquitto treats one.
            let bridge = self.bridge && parsed.share_group.is_none();
            let opts = SubOptions {
                qos: granted,
                no_local: f.no_local || bridge,
                retain_as_published: f.retain_as_published || bridge,
                subscription_id: s.subscription_identifier,
                tag_filter: tag_filter.as_ref().map(|(expr, _)| expr.clone()),
            };
            let existed = self.session.as_ref().is_some_and(|s| s.subs.contains_key(&f.filter));
            if let Some(group) = parsed.share_group {
                let expr = tag_filter.as_ref().map(|(expr, _)| expr.as_str());
                match self.ctx.groups.join(&self.ctx.broker, group, parsed.filter, &client_id, expr).await {
                    Ok(queue) => {
                        if !existed {
                            self.consuming().group_filters.insert(queue, f.filter.clone());
                            self.attach(queue, granted);
                        } else {
                            // Granted QoS may have changed: re-attach with the new one.
                            self.detach(queue);
                            self.attach(queue, granted);
                        }
                    }
                    Err(e @ JoinError::TagFilterMismatch { .. }) => {
                        conn_log!(debug, self, filter = %f.filter, error = %e, "shared subscription refused");
                        reasons.push(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR);
                        continue;
                    }
                    Err(e) => {
                        conn_log!(warn, self, error = %e, "cannot create shared subscription queue");
                        reasons.push(ReasonCode::UNSPECIFIED_ERROR);
                        continue;
                    }
                }
            } else {
                let Some(dest) = self.subscription_dest() else { return };
                self.ctx.broker.subscribe(parsed.filter, dest, opts.binding_options(&client_id));
                let send_retained = sends_retained(f.retain_handling, existed);
                if send_retained {
                    for msg in self.ctx.broker.retained().matching(&mqtt_filter_to_pattern(parsed.filter)) {
                        if tag_filter.as_ref().is_some_and(|(_, f)| !f.matches(msg.tag())) {
                            continue;
                        }
                        if !self.permitted(Request::Receive(&msg.topic())) {
                            self.note_refused(&msg);
                            continue;
                        }
                        retained.push(Direct {
                            msg,
                            qos: granted,
                            retain_as_published: true,
                            subscription_ids: s.subscription_identifier.into_iter().collect(),
                        });
                    }
                }
            }
            if let Some(session) = self.session.as_mut() {
                session.subs.insert(f.filter.clone(), opts);
            }
            changed = true;
            reasons.push(ReasonCode(granted));
        }
        if changed {
            self.store_session().await;
            // On a cluster member: the other members forward what matches it from now on.
            self.ctx.broker.members_know_bindings().await;
        }
        self.proto.ack_subscribe(s.pkid, reasons);
        self.pending_out.extend(retained.into_iter().map(Pending::Direct));
    }

    /// Removes each filter of an UNSUBSCRIBE (a shared group's queue goes with its last
    /// member) and queues UNSUBACK.
    pub(super) async fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut reasons = Vec::with_capacity(u.filters.len());
        let mut changed = false;
        for filter in &u.filters {
            let Some(session) = self.session.as_mut() else { return };
            if session.subs.remove(filter).is_none() {
                reasons.push(ReasonCode::NO_SUBSCRIPTION_EXISTED);
                continue;
            }
            changed = true;
            let dest = session.dest();
            let client_id = session.client_id.clone();
            if let Some((group, f)) = split_share(filter) {
                if let Some(q) = self.ctx.groups.queue_of(group, f) {
                    if let Some(c) = self.consuming.as_mut() {
                        c.group_filters.remove(&q);
                    }
                    self.detach(q);
                }
                if let Some(q) = self.ctx.groups.leave(&self.ctx.broker, group, f, &client_id) {
                    self.ctx.broker.delete_queue(q).await;
                }
            } else if let Some(dest) = &dest {
                self.ctx.broker.unsubscribe(filter, dest);
            }
            reasons.push(ReasonCode::SUCCESS);
        }
        if changed {
            self.store_session().await;
        }
        self.proto.ack_unsubscribe(u.pkid, reasons);
    }

    /// Stores the persistent session's subscriptions.
    async fn store_session(&mut self) {
        let Some(s) = self.session.as_mut() else { return };
        let Some(p) = s.persistent.as_mut() else { return };
        p.stored.subscriptions = s.subs.to_map();
        self.ctx.sessions.update_stored(&s.client_id, &p.stored);
        let write = self.ctx.broker.stores().sessions.save(&s.client_id, &p.stored);
        if let Err(e) = self.ctx.broker.commit(write, Commit::Durable).await {
            conn_log!(warn, self, error = %e, "cannot store session");
        }
    }
}

/// The tag filter a SUBSCRIBE's user property `tag-filter` gives every filter of the
/// packet, with its expression; `Ok(None)` without the property.
fn tag_filter_of(user_properties: &[(String, String)]) -> Result<Option<(String, Arc<TagFilter>)>, TagFilterError> {
    match user_properties.iter().find(|(k, _)| k == MQTT_TAG_FILTER_PROPERTY) {
        None => Ok(None),
        Some((_, expr)) => TagFilter::parse(expr).map(|f| Some((expr.clone(), Arc::new(f)))),
    }
}

/// Whether a subscription gets the retained messages that match it: retain handling 0
/// always, 1 only when the subscription is new, 2 never.
fn sends_retained(retain_handling: u8, existed: bool) -> bool {
    match retain_handling {
        0 => true,
        1 => !existed,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_tag_filter_comes_from_the_user_property() {
        assert!(tag_filter_of(&props(&[("other", "x")])).unwrap().is_none());
        let (expr, f) =
            tag_filter_of(&props(&[("a", "b"), (MQTT_TAG_FILTER_PROPERTY, "red || blue")])).unwrap().unwrap();
        assert_eq!(expr, "red || blue");
        assert!(f.matches(Some("blue")));
        assert!(!f.matches(Some("green")));
        assert!(tag_filter_of(&props(&[(MQTT_TAG_FILTER_PROPERTY, "red ||")])).is_err());
    }

    #[test]
    fn retain_handling_decides_about_retained_messages() {
        assert!(sends_retained(0, false) && sends_retained(0, true));
        assert!(sends_retained(1, false) && !sends_retained(1, true));
        assert!(!sends_retained(2, false) && !sends_retained(2, true));
    }
}

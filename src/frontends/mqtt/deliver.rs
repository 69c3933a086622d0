//! Outbound delivery: fast-path deliveries of clean sessions and queue deliveries
//! (the session's own queue, shared groups) sent while the client's receive window has
//! room, their packet ids, and the acks (PUBACK, PUBREC, PUBCOMP) that settle them in
//! the core.

use ferrymq_mqtt::topic::matches;
use ferrymq_mqtt::{Outgoing, ReasonCode, SendError};

use super::connection::{Consuming, Task};
use super::convert::{properties_out, qos_of};
use super::session::Subscriptions;
use crate::core::delivery::{Direct, QueueDelivery};
use crate::core::message::{now_ms, Message};
use crate::core::queue::Consumer;
use crate::core::stats::Stats;
use crate::core::store::QueueId;

/// Packet ids of deliveries from the session's own queue are derived from the queue
/// offset, `1 + offset % OFFSET_PKIDS`, so a resumed session resends with the same ids;
/// the connection allocates the rest of the id space itself.
pub(super) const OFFSET_PKIDS: u64 = 32767;

/// Where an in-flight outbound packet id came from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Origin {
    /// Fast path: nothing to acknowledge in the core.
    Direct,
    /// A queue entry to ack when the client completes it.
    Queue(QueueId, u64),
}

/// Something waiting for room in the client's receive window.
#[derive(Debug)]
pub(super) enum Pending {
    /// A fast-path delivery to a clean session.
    Direct(Direct),
    /// A delivery from a queue the connection consumes.
    Queued(QueueDelivery),
}

impl Task {
    /// Takes a queue delivery into the send queue; one from the clean session's spill
    /// queue leaves the session's backlog.
    pub(super) fn take_queued(&mut self, q: QueueDelivery) {
        if self.consuming.as_ref().is_some_and(|c| c.spill_queue == Some(q.queue)) {
            if let Some(link) = self.session.as_ref().and_then(|s| s.link.as_ref()) {
                link.took_spilled(q.msg.payload.len() as u64);
            }
        }
        self.pending_out.push_back(Pending::Queued(q));
    }

    /// The clean session's link made its spill queue (consume it) or its backlog passed
    /// the limits (disconnect).
    pub(super) fn on_link_changed(&mut self) {
        let Some(link) = self.session.as_ref().and_then(|s| s.link.clone()) else { return };
        if link.is_slow() {
            self.slow_consumer("its backlog passed max_queued_messages or max_queued_bytes");
        }
        let attached = self.consuming.as_ref().and_then(|c| c.spill_queue);
        if let (None, Some(queue)) = (attached, link.spill_queue()) {
            self.consuming().spill_queue = Some(queue);
            self.attach(queue, 2);
        }
    }

    /// Disconnects a subscriber that does not keep up (MQTT 5 reason 0x97); counted once,
    /// and logged with the disconnect.
    pub(super) fn slow_consumer(&mut self, why: &str) {
        if std::mem::replace(&mut self.slow, true) {
            return;
        }
        self.ended_badly(format!("slow consumer: {why}"));
        Stats::add(&self.ctx.broker.stats().slow_consumers, 1);
        self.proto.disconnect(ReasonCode::QUOTA_EXCEEDED, Some("slow consumer"));
    }

    /// Consumes `queue` (the session's own, or a shared group's) with the connection's
    /// window as credit; deliveries above `max_qos` are downgraded.
    pub(super) fn attach(&mut self, queue: QueueId, max_qos: u8) {
        let consuming = self.consuming();
        consuming.attached.push(queue);
        let tx = consuming.tx.clone();
        // The channel is unbounded, and bounded by credit: a queue hands this consumer at
        // most the window it granted, plus one cancellation per queue.
        self.ctx
            .broker
            .attach_consumer(queue, Consumer { id: self.conn_id, tx, credit: self.window, max_qos, priority: 0 });
    }

    /// The queues consumed, made at the first attach.
    pub(super) fn consuming(&mut self) -> &mut Consuming {
        self.consuming.get_or_insert_with(Box::default)
    }

    /// Stops consuming `queue`; what it holds unacknowledged goes back to the queue.
    pub(super) fn detach(&mut self, queue: QueueId) {
        if let Some(c) = self.consuming.as_mut() {
            c.attached.retain(|q| *q != queue);
        }
        self.ctx.broker.detach_consumer(queue, self.conn_id);
    }

    /// PUBACK or PUBCOMP: the delivery is done; a queue entry is acknowledged.
    pub(super) fn on_outbound_complete(&mut self, pkid: u16) {
        self.progress = true;
        if let Some(Origin::Queue(queue, offset)) = self.inflight.remove(&pkid) {
            self.ctx.broker.ack(queue, offset);
        }
    }

    /// PUBREC: the client has the QoS 2 message; the session's own queue marks the entry
    /// released (a resumed session sends PUBREL, not the message again), and the PUBREL
    /// goes once that is durable: a crash before it makes the resumed session send the
    /// PUBLISH again, which the client, still holding the id, recognises.
    pub(super) fn on_pubrec(&mut self, pkid: u16) {
        self.progress = true;
        if let Some(Origin::Queue(queue, offset)) = self.inflight.get(&pkid).copied() {
            if self.own_queue() == Some(queue) {
                let (done, durable) = tokio::sync::oneshot::channel();
                self.ctx.broker.release(queue, offset, done);
                self.pending_releases.push_back((pkid, durable));
                return;
            }
            // Shared group: the member has the message; only the PUBREL/PUBCOMP exchange
            // is left, which belongs to this connection.
            self.inflight.insert(pkid, Origin::Direct);
            self.ctx.broker.ack(queue, offset);
        }
        self.proto.release(pkid);
    }

    /// Counts a delivery that was not sent, broker-wide by reason and for this client.
    fn count_drop(&mut self, why: Dropped) {
        let stats = self.ctx.broker.stats();
        Stats::add(&stats.publish_dropped, 1);
        match why {
            Dropped::Expired => Stats::add(&stats.dropped_expired, 1),
            Dropped::TooLarge => Stats::add(&stats.dropped_too_large, 1),
            Dropped::NotAuthorized => Stats::add(&stats.dropped_not_authorized, 1),
            Dropped::Unsendable => {}
        }
        self.dropped += 1;
    }

    /// True when the client may receive `msg` (its read rules; retained messages and
    /// `$SYS` included). Decided by routing key, so a cached answer costs no allocation.
    fn may_receive(&mut self, msg: &Message) -> bool {
        self.access.as_mut().is_none_or(|a| a.mqtt_receive(&msg.routing_key))
    }

    /// A delivery the rules refused a bridge's local side: counted for the bridge.
    pub(super) fn note_refused(&self, msg: &Message) {
        if let Some(r) = &self.refusals {
            r.delivery_refused(&msg.topic());
        }
    }

    /// The persistent session's own queue.
    fn own_queue(&self) -> Option<QueueId> {
        self.session.as_ref().and_then(|s| s.persistent.as_ref()).map(|p| p.queue)
    }

    /// Sends what waits in `pending_out` while the client's window has room.
    pub(super) fn drain_pending_out(&mut self) {
        while let Some(item) = self.pending_out.pop_front() {
            if let Err(item) = self.send_out(item) {
                self.pending_out.push_front(item);
                break;
            }
        }
        let sent = std::mem::take(&mut self.publishes_out);
        Stats::add(&self.ctx.broker.stats().publish_sent, sent);
        Stats::add(&self.ctx.broker.stats().messages_sent, sent);
    }

    /// Sends one delivery; gives it back when the window is full.
    fn send_out(&mut self, item: Pending) -> Result<(), Pending> {
        let now = now_ms();
        match item {
            Pending::Direct(d) => {
                if d.msg.is_expired(now) {
                    self.count_drop(Dropped::Expired);
                    return Ok(());
                }
                if !self.may_receive(&d.msg) {
                    self.count_drop(Dropped::NotAuthorized);
                    self.note_refused(&d.msg);
                    return Ok(());
                }
                let qos = d.msg.qos.min(d.qos);
                let out = outgoing(
                    &d.msg,
                    qos,
                    d.retain_as_published && d.msg.retain,
                    false,
                    None,
                    d.subscription_ids.clone(),
                    now,
                );
                match self.proto.send_publish(out) {
                    Ok(pkid) => {
                        self.publishes_out += 1;
                        if qos > 0 {
                            self.inflight.insert(pkid, Origin::Direct);
                        }
                        Ok(())
                    }
                    Err(SendError::WindowFull) | Err(SendError::PacketIdInUse) => Err(Pending::Direct(d)),
                    Err(e) => {
                        conn_log!(debug, self, error = %e, "delivery dropped");
                        self.count_drop(Dropped::from(&e));
                        Ok(())
                    }
                }
            }
            Pending::Queued(q) => {
                let own = self.own_queue() == Some(q.queue);
                let pkid = own.then(|| offset_pkid(q.offset));
                if q.msg.is_expired(now) && !q.released {
                    self.count_drop(Dropped::Expired);
                    self.ack_queue(q.queue, q.offset);
                    return Ok(());
                }
                if !q.released && !self.may_receive(&q.msg) {
                    self.count_drop(Dropped::NotAuthorized);
                    self.note_refused(&q.msg);
                    self.ack_queue(q.queue, q.offset);
                    return Ok(());
                }
                if q.released {
                    if let Some(pkid) = pkid {
                        return match self.proto.send_pubrel(pkid) {
                            Ok(()) => {
                                self.inflight.insert(pkid, Origin::Queue(q.queue, q.offset));
                                Ok(())
                            }
                            Err(SendError::WindowFull) | Err(SendError::PacketIdInUse) => Err(Pending::Queued(q)),
                            Err(_) => {
                                self.ack_queue(q.queue, q.offset);
                                Ok(())
                            }
                        };
                    }
                }
                let (sub_ids, rap) = self.delivery_options(&q);
                let out = outgoing(&q.msg, q.qos, rap && q.msg.retain, q.redelivered && q.qos > 0, pkid, sub_ids, now);
                match self.proto.send_publish(out) {
                    Ok(pkid) => {
                        self.publishes_out += 1;
                        if q.qos > 0 {
                            self.inflight.insert(pkid, Origin::Queue(q.queue, q.offset));
                        } else {
                            self.ack_queue(q.queue, q.offset);
                        }
                        Ok(())
                    }
                    Err(SendError::WindowFull) | Err(SendError::PacketIdInUse) => Err(Pending::Queued(q)),
                    Err(e) => {
                        conn_log!(debug, self, error = %e, "queued delivery dropped");
                        self.count_drop(Dropped::from(&e));
                        self.ack_queue(q.queue, q.offset);
                        Ok(())
                    }
                }
            }
        }
    }

    /// Settles a queue entry that needs no (more) acknowledgement from the client.
    fn ack_queue(&self, queue: QueueId, offset: u64) {
        self.ctx.broker.ack(queue, offset);
    }

    /// Subscription identifiers and retain-as-published for a queue delivery, from the
    /// session's current subscriptions.
    fn delivery_options(&self, q: &QueueDelivery) -> (Vec<u32>, bool) {
        let Some(s) = self.session.as_ref() else { return (Vec::new(), false) };
        // Most sessions' subscriptions carry neither: no need to match the topic.
        if !s.subs.iter().any(|(_, o)| o.subscription_id.is_some() || o.retain_as_published) {
            return (Vec::new(), false);
        }
        let group_filter = self.consuming.as_ref().and_then(|c| c.group_filters.get(&q.queue)).map(String::as_str);
        subscription_options(&s.subs, group_filter, &q.msg.topic())
    }
}

/// The packet id of the delivery of entry `offset` of the session's own queue: the same
/// for every resend, never one the connection allocates itself (those are above
/// [`OFFSET_PKIDS`]).
fn offset_pkid(offset: u64) -> u16 {
    1 + (offset % OFFSET_PKIDS) as u16
}

/// Subscription identifiers and retain-as-published of a delivery on `topic`: those of
/// the shared subscription `group_filter` when it came from a group's queue, else of
/// every non-shared subscription that matches (MQTT-3.3.4-3: overlapping subscriptions
/// deliver once, with all their identifiers).
fn subscription_options(subs: &Subscriptions, group_filter: Option<&str>, topic: &str) -> (Vec<u32>, bool) {
    if let Some(filter) = group_filter {
        return match subs.get(filter) {
            Some(o) => (o.subscription_id.into_iter().collect(), o.retain_as_published),
            None => (Vec::new(), false),
        };
    }
    let mut ids = Vec::new();
    let mut rap = false;
    for (filter, o) in subs.iter() {
        if !filter.starts_with("$share/") && matches(filter, topic) {
            ids.extend(o.subscription_id);
            rap |= o.retain_as_published;
        }
    }
    (ids, rap)
}

/// The PUBLISH that delivers `msg`.
fn outgoing(
    msg: &Message,
    qos: u8,
    retain: bool,
    dup: bool,
    pkid: Option<u16>,
    subscription_ids: Vec<u32>,
    now: u64,
) -> Outgoing {
    Outgoing {
        topic: msg.topic(),
        payload: msg.payload.clone(),
        qos: qos_of(qos),
        retain,
        dup,
        pkid,
        properties: properties_out(msg, subscription_ids, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::SubOptions;

    #[test]
    fn offset_packet_ids_repeat_for_resends_and_stay_below_the_connection_range() {
        assert_eq!(offset_pkid(0), 1);
        assert_eq!(offset_pkid(OFFSET_PKIDS - 1), OFFSET_PKIDS as u16);
        assert_eq!(offset_pkid(OFFSET_PKIDS), 1, "wraps");
        assert_eq!(offset_pkid(12345), offset_pkid(12345), "a resend reuses the id");
        for offset in [0, 1, 999, 32766, 32767, 65535, u64::MAX] {
            let id = offset_pkid(offset);
            assert!((1..=OFFSET_PKIDS as u16).contains(&id), "{offset} -> {id}");
        }
    }

    fn opts(id: Option<u32>, rap: bool) -> SubOptions {
        SubOptions { qos: 1, no_local: false, retain_as_published: rap, subscription_id: id, tag_filter: None }
    }

    #[test]
    fn overlapping_subscriptions_contribute_every_identifier() {
        let subs: Subscriptions = [
            ("a/+".to_owned(), opts(Some(1), false)),
            ("a/#".to_owned(), opts(Some(2), true)),
            ("a/c".to_owned(), opts(Some(3), false)),
            ("b".to_owned(), opts(None, false)),
            ("$share/g/a/b".to_owned(), opts(Some(9), true)),
        ]
        .into_iter()
        .collect();
        let (mut ids, rap) = subscription_options(&subs, None, "a/b");
        ids.sort();
        assert_eq!((ids, rap), (vec![1, 2], true), "shared subscriptions are not the session's own");
        assert_eq!(subscription_options(&subs, None, "b"), (vec![], false));
        assert_eq!(subscription_options(&subs, Some("$share/g/a/b"), "a/b"), (vec![9], true), "a group's delivery");
        assert_eq!(subscription_options(&subs, Some("$share/g/gone"), "a/b"), (vec![], false));
    }
}

/// Why a delivery was not sent.
#[derive(Debug, Clone, Copy)]
enum Dropped {
    /// Its message expiry passed before it could go out.
    Expired,
    /// It exceeds the client's maximum packet size.
    TooLarge,
    /// The client may not receive its topic.
    NotAuthorized,
    /// The protocol refused it otherwise (the connection is ending).
    Unsendable,
}

impl From<&SendError> for Dropped {
    fn from(e: &SendError) -> Self {
        match e {
            SendError::TooLarge => Dropped::TooLarge,
            _ => Dropped::Unsendable,
        }
    }
}

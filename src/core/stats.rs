//! Broker-wide counters behind the `$SYS/broker/...` topics and the management API's
//! message rates, fed by the connections of both protocols. They add their local counts in
//! batches (per read or write, not per message), so the hot path does not bounce these
//! cache lines per message.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters published under `$SYS/broker/...`.
#[derive(Debug, Default)]
pub struct Stats {
    /// MQTT clients connected now (CONNECT accepted, socket not yet closed).
    pub clients_connected: AtomicU64,
    /// Clients ever connected since start.
    pub clients_total: AtomicU64,
    /// Largest number of connected clients.
    pub clients_maximum: AtomicU64,
    /// Not maintained: `$SYS/broker/clients/disconnected` counts the offline sessions instead.
    pub clients_disconnected: AtomicU64,
    /// Every control packet received.
    pub messages_received: AtomicU64,
    /// Every control packet sent.
    pub messages_sent: AtomicU64,
    /// PUBLISH packets received.
    pub publish_received: AtomicU64,
    /// PUBLISH packets sent.
    pub publish_sent: AtomicU64,
    /// PUBLISH messages dropped (slow subscriber buffer full, queue full, too large).
    pub publish_dropped: AtomicU64,
    /// MQTT deliveries dropped because the subscriber's buffer was full or it was slow
    /// (EMQX's `delivery.dropped.queue_full`).
    pub dropped_queue_full: AtomicU64,
    /// MQTT deliveries dropped because the message expired before it could be sent.
    pub dropped_expired: AtomicU64,
    /// MQTT deliveries dropped because they exceed the client's maximum packet size.
    pub dropped_too_large: AtomicU64,
    /// MQTT publishes that matched no subscription (EMQX's `messages.dropped.no_subscribers`).
    pub dropped_no_subscribers: AtomicU64,
    /// MQTT publishes refused (a topic reserved for the broker).
    pub dropped_not_authorized: AtomicU64,
    /// Logins accepted, MQTT and AMQP (RabbitMQ's `auth_attempts_succeeded`).
    pub auth_allowed: [AtomicU64; 2],
    /// Logins refused, MQTT and AMQP (RabbitMQ's `auth_attempts_failed`).
    pub auth_denied: [AtomicU64; 2],
    /// Subscribers disconnected as slow consumers (unread socket, backlog past its limits).
    pub slow_consumers: AtomicU64,
    /// Publishes routed through the routing table rather than a connection's route cache.
    pub route_lookups: AtomicU64,
    /// Bytes read from MQTT connections (after TLS).
    pub bytes_received: AtomicU64,
    /// Bytes written to MQTT connections (before TLS).
    pub bytes_sent: AtomicU64,
    /// AMQP counters (the management API's `message_stats`).
    pub amqp: AmqpCounters,
    /// State-changing API requests refused as cross-site (403).
    pub http_cross_site_refused: AtomicU64,
    /// API requests refused for a body that is not JSON (415).
    pub http_not_json_refused: AtomicU64,
    /// MQTT WebSocket upgrades refused for their browser `Origin` (403).
    pub ws_origin_refused: AtomicU64,
    /// MQTT CONNECTs refused (Server unavailable) as the session's inbound QoS 2 state
    /// could not be read.
    pub mqtt_state_unreadable: AtomicU64,
    /// Delayed messages whose record could not be read when due: kept, and tried again
    /// [`UNREADABLE_RETRY`](crate::core::scheduler::UNREADABLE_RETRY) later.
    pub delayed_unreadable: AtomicU64,
}

/// What AMQP connections counted, in the management API's terms.
#[derive(Debug, Default)]
pub struct AmqpCounters {
    /// basic.publish received.
    pub published: AtomicU64,
    /// Publisher confirms (basic.ack) sent.
    pub confirmed: AtomicU64,
    /// Messages delivered to consumers or fetched with basic.get.
    pub delivered: AtomicU64,
    /// ... of which redelivered.
    pub redelivered: AtomicU64,
    /// Deliveries acknowledged by consumers.
    pub acked: AtomicU64,
}

/// A connection's local count of the [`AmqpCounters`], added to them once per turn.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct AmqpCounts {
    /// basic.publish received.
    pub published: u64,
    /// Confirms sent.
    pub confirmed: u64,
    /// Deliveries and basic.get-ok sent.
    pub delivered: u64,
    /// ... of which redelivered.
    pub redelivered: u64,
    /// Deliveries acknowledged.
    pub acked: u64,
}

impl AmqpCounts {
    /// Adds the counts to `to` and starts again from zero.
    pub(crate) fn flush(&mut self, to: &AmqpCounters) {
        let c = std::mem::take(self);
        Stats::add(&to.published, c.published);
        Stats::add(&to.confirmed, c.confirmed);
        Stats::add(&to.delivered, c.delivered);
        Stats::add(&to.redelivered, c.redelivered);
        Stats::add(&to.acked, c.acked);
    }
}

impl Stats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Counts an MQTT client whose CONNECT was accepted: now, total and maximum.
    pub fn connected(&self) {
        let now = self.clients_connected.fetch_add(1, Ordering::Relaxed) + 1;
        self.clients_total.fetch_add(1, Ordering::Relaxed);
        self.clients_maximum.fetch_max(now, Ordering::Relaxed);
    }

    /// Counts a login attempt (`amqp`: AMQP, else MQTT) and its outcome.
    pub fn login(&self, amqp: bool, allowed: bool) {
        let i = amqp as usize;
        let counter = if allowed { &self.auth_allowed[i] } else { &self.auth_denied[i] };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the end of a connection that [`Stats::connected`] counted.
    pub fn disconnected(&self) {
        self.clients_connected.fetch_sub(1, Ordering::Relaxed);
    }
}

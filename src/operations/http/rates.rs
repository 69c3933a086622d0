//! Message rates as RabbitMQ's management plugin shows them: the broker's counters are
//! sampled every `http.collect_statistics_interval` (5 s, RabbitMQ's default), and a rate is the change between the last two
//! samples per second. Sampling reads the counters the connections already batch; it
//! adds nothing to the publish path.

use std::collections::HashMap;
use std::time::Instant;

use crate::core::QueueId;
use parking_lot::Mutex;

use crate::core::broker::Broker;
use crate::core::queue::MessageCounts;
use crate::core::stats::Stats;

/// The message counters of both protocols at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    /// Messages published (AMQP basic.publish + MQTT PUBLISH received).
    pub publish: u64,
    /// Publisher confirms sent (AMQP).
    pub confirm: u64,
    /// Messages delivered or fetched (AMQP deliveries and basic.get + MQTT PUBLISH sent).
    pub deliver_get: u64,
    /// ... of which redelivered (AMQP).
    pub redeliver: u64,
    /// Deliveries acknowledged (AMQP).
    pub ack: u64,
    /// Bytes received from clients (MQTT; AMQP counts per connection).
    pub recv_oct: u64,
    /// Bytes sent to clients.
    pub send_oct: u64,
    /// Connections opened since start.
    pub connection_created: u64,
    /// Connections closed since start.
    pub connection_closed: u64,
}

impl Totals {
    /// The counters now.
    pub fn now(broker: &Broker) -> Totals {
        let s = broker.stats();
        let a = &s.amqp;
        let (mut recv, mut send) = (0, 0);
        for c in broker.connections().list() {
            if !c.protocol.is_mqtt() {
                recv += Stats::get(&c.recv_oct);
                send += Stats::get(&c.send_oct);
            }
        }
        let (connection_created, connection_closed) = broker.connections().churn();
        Totals {
            connection_created,
            connection_closed,
            publish: Stats::get(&a.published) + Stats::get(&s.publish_received),
            confirm: Stats::get(&a.confirmed),
            deliver_get: Stats::get(&a.delivered) + Stats::get(&s.publish_sent),
            redeliver: Stats::get(&a.redelivered),
            ack: Stats::get(&a.acked),
            recv_oct: Stats::get(&s.bytes_received) + recv,
            send_oct: Stats::get(&s.bytes_sent) + send,
        }
    }
}

/// Per-second rates of the [`Totals`] fields.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerSecond {
    /// Publishes per second.
    pub publish: f64,
    /// Confirms per second.
    pub confirm: f64,
    /// Deliveries per second.
    pub deliver_get: f64,
    /// Redeliveries per second.
    pub redeliver: f64,
    /// Acknowledgements per second.
    pub ack: f64,
    /// Connections opened per second.
    pub connection_created: f64,
    /// Connections closed per second.
    pub connection_closed: f64,
}

/// The last sample and the rates it gave.
#[derive(Debug, Default)]
pub struct Rates {
    last: Mutex<Option<(Instant, Totals, PerSecond)>>,
}

impl Rates {
    /// Takes a sample; the rates become the change since the previous one.
    pub fn sample(&self, now: &Totals) {
        self.sample_at(Instant::now(), now);
    }

    fn sample_at(&self, at: Instant, now: &Totals) {
        let mut last = self.last.lock();
        let rates = match *last {
            Some((then, before, _)) => {
                let secs = at.duration_since(then).as_secs_f64().max(1e-3);
                let r = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / secs;
                PerSecond {
                    publish: r(now.publish, before.publish),
                    confirm: r(now.confirm, before.confirm),
                    deliver_get: r(now.deliver_get, before.deliver_get),
                    redeliver: r(now.redeliver, before.redeliver),
                    ack: r(now.ack, before.ack),
                    connection_created: r(now.connection_created, before.connection_created),
                    connection_closed: r(now.connection_closed, before.connection_closed),
                }
            }
            None => PerSecond::default(),
        };
        *last = Some((at, *now, rates));
    }

    /// The rates of the last two samples (zero before the second).
    pub fn current(&self) -> PerSecond {
        self.last.lock().map(|(_, _, r)| r).unwrap_or_default()
    }
}

/// One queue at one sample: its message counters and depths.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueSample {
    /// The counters since start.
    pub counts: MessageCounts,
    /// Ready + unacknowledged messages.
    pub messages: u64,
    /// Ready messages.
    pub ready: u64,
}

impl QueueSample {
    /// The values the rates are taken of, in [`QueuePerSecond`]'s order.
    pub fn values(&self) -> [u64; 8] {
        let c = self.counts;
        [c.publish, c.deliver, c.get, c.redeliver, c.ack, self.messages, self.ready, self.messages - self.ready]
    }
}

/// A queue's rates between the last two samples, per second (depth rates may be negative).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueuePerSecond {
    /// Messages entering the queue.
    pub publish: f64,
    /// Deliveries to consumers.
    pub deliver: f64,
    /// basic.get answers.
    pub get: f64,
    /// Redeliveries.
    pub redeliver: f64,
    /// Acknowledgements.
    pub ack: f64,
    /// Change of the queue's depth.
    pub messages: f64,
    /// Change of its ready messages.
    pub ready: f64,
    /// Change of its unacknowledged messages.
    pub unacked: f64,
}

impl From<[f64; 8]> for QueuePerSecond {
    fn from(r: [f64; 8]) -> Self {
        let [publish, deliver, get, redeliver, ack, messages, ready, unacked] = r;
        QueuePerSecond { publish, deliver, get, redeliver, ack, messages, ready, unacked }
    }
}

/// Per-object rates (a queue's `message_stats` and `messages_details`, a connection's
/// `recv_oct_details`): `N` values per object sampled with the totals, each rate the change
/// between the last two samples per second; objects gone since the last sample are
/// forgotten.
#[derive(Debug)]
pub struct ObjectRates<K, const N: usize> {
    last: Mutex<(Option<Instant>, Samples<K, N>)>,
}

/// Each object's last values and the rates they gave.
type Samples<K, const N: usize> = HashMap<K, ([u64; N], [f64; N])>;

impl<K, const N: usize> Default for ObjectRates<K, N> {
    fn default() -> Self {
        ObjectRates { last: Mutex::new((None, HashMap::new())) }
    }
}

impl<K: std::hash::Hash + Eq, const N: usize> ObjectRates<K, N> {
    /// Takes a sample of every object.
    pub fn sample(&self, objects: impl Iterator<Item = (K, [u64; N])>) {
        self.sample_at(Instant::now(), objects);
    }

    fn sample_at(&self, at: Instant, objects: impl Iterator<Item = (K, [u64; N])>) {
        let mut last = self.last.lock();
        let secs = last.0.map(|then| at.duration_since(then).as_secs_f64().max(1e-3));
        let mut next = HashMap::with_capacity(last.1.len());
        for (key, now) in objects {
            let rates = match (secs, last.1.get(&key)) {
                (Some(secs), Some((before, _))) => std::array::from_fn(|i| (now[i] as f64 - before[i] as f64) / secs),
                _ => [0.0; N],
            };
            next.insert(key, (now, rates));
        }
        *last = (Some(at), next);
    }

    /// Looks rates up while held (one lock for a whole listing); zeros for an object not
    /// sampled twice yet.
    pub fn with<T>(&self, f: impl FnOnce(&dyn Fn(&K) -> [f64; N]) -> T) -> T {
        let last = self.last.lock();
        f(&|key| last.1.get(key).map(|(_, r)| *r).unwrap_or([0.0; N]))
    }
}

/// Per-queue rates, by queue id.
pub type QueueRates = ObjectRates<QueueId, 8>;

/// Per-connection byte rates (received, sent), by connection id.
pub type ConnectionRates = ObjectRates<u64, 2>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_rate_is_the_change_between_two_samples_per_second() {
        let rates = Rates::default();
        let t0 = Instant::now();
        rates.sample_at(t0, &Totals { publish: 100, ..Default::default() });
        assert_eq!(rates.current().publish, 0.0, "one sample has no rate");
        rates.sample_at(t0 + Duration::from_secs(5), &Totals { publish: 600, ack: 50, ..Default::default() });
        assert_eq!(rates.current().publish, 100.0);
        assert_eq!(rates.current().ack, 10.0);
    }

    #[test]
    fn queue_rates_follow_each_queue_and_forget_deleted_ones() {
        let rates = QueueRates::default();
        let t0 = Instant::now();
        let sample = |publish, messages| QueueSample {
            counts: MessageCounts { publish, ..Default::default() },
            messages,
            ready: messages,
        };
        rates.sample_at(t0, [(QueueId(1), sample(10, 10).values()), (QueueId(2), sample(0, 0).values())].into_iter());
        rates.sample_at(t0 + Duration::from_secs(5), [(QueueId(1), sample(60, 0).values())].into_iter());
        let r = rates.with(|of| (QueuePerSecond::from(of(&QueueId(1))), QueuePerSecond::from(of(&QueueId(2)))));
        assert_eq!(r.0.publish, 10.0);
        assert_eq!(r.0.messages, -2.0, "the depth went from 10 to 0 in 5 s");
        assert_eq!(r.1, QueuePerSecond::default(), "queue 2 is gone");
    }
}

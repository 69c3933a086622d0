//! Message rates as RabbitMQ's management plugin shows them: the broker's counters are
//! sampled every `http.collect_statistics_interval` (5 s, RabbitMQ's default), and a rate is the change between the last two
//! samples per second. Sampling reads the counters the connections already batch; it
//! adds nothing to the publish path.

use std::collections::HashMap;
use std::time::Instant;

use ferrymq_storage::QueueId;
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
}

impl Totals {
    /// The counters now.
    pub fn now(broker: &Broker) -> Totals {
        let s = &broker.stats;
        let a = &s.amqp;
        let (mut recv, mut send) = (0, 0);
        for c in broker.connections.list() {
            if !c.protocol.is_mqtt() {
                recv += Stats::get(&c.recv_oct);
                send += Stats::get(&c.send_oct);
            }
        }
        Totals {
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

/// Per-queue rates (RabbitMQ's queue `message_stats` and `messages_details`), sampled with
/// the totals; queues gone since the last sample are forgotten.
#[derive(Debug, Default)]
pub struct QueueRates {
    last: Mutex<(Option<Instant>, QueueSamples)>,
}

/// Each queue's last sample and the rates it gave.
type QueueSamples = HashMap<QueueId, (QueueSample, QueuePerSecond)>;

impl QueueRates {
    /// Takes a sample of every queue.
    pub fn sample(&self, queues: impl Iterator<Item = (QueueId, QueueSample)>) {
        self.sample_at(Instant::now(), queues);
    }

    fn sample_at(&self, at: Instant, queues: impl Iterator<Item = (QueueId, QueueSample)>) {
        let mut last = self.last.lock();
        let secs = last.0.map(|then| at.duration_since(then).as_secs_f64().max(1e-3));
        let mut next = HashMap::with_capacity(last.1.len());
        for (id, now) in queues {
            let rates = match (secs, last.1.get(&id)) {
                (Some(secs), Some((before, _))) => {
                    let r = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
                    let d = |a: u64, b: u64| (a as f64 - b as f64) / secs;
                    let (c, b) = (now.counts, before.counts);
                    QueuePerSecond {
                        publish: r(c.publish, b.publish),
                        deliver: r(c.deliver, b.deliver),
                        get: r(c.get, b.get),
                        redeliver: r(c.redeliver, b.redeliver),
                        ack: r(c.ack, b.ack),
                        messages: d(now.messages, before.messages),
                        ready: d(now.ready, before.ready),
                        unacked: d(now.messages - now.ready, before.messages - before.ready),
                    }
                }
                _ => QueuePerSecond::default(),
            };
            next.insert(id, (now, rates));
        }
        *last = (Some(at), next);
    }

    /// Looks rates up while held (one lock for a whole listing).
    pub fn with<T>(&self, f: impl FnOnce(&dyn Fn(QueueId) -> QueuePerSecond) -> T) -> T {
        let last = self.last.lock();
        f(&|id| last.1.get(&id).map(|(_, r)| *r).unwrap_or_default())
    }
}

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
        rates.sample_at(t0, [(QueueId(1), sample(10, 10)), (QueueId(2), sample(0, 0))].into_iter());
        rates.sample_at(t0 + Duration::from_secs(5), [(QueueId(1), sample(60, 0))].into_iter());
        let r = rates.with(|of| (of(QueueId(1)), of(QueueId(2))));
        assert_eq!(r.0.publish, 10.0);
        assert_eq!(r.0.messages, -2.0, "the depth went from 10 to 0 in 5 s");
        assert_eq!(r.1, QueuePerSecond::default(), "queue 2 is gone");
    }
}

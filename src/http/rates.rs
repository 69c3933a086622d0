//! Message rates as RabbitMQ's management plugin shows them: the broker's counters are
//! sampled every [`SAMPLE_INTERVAL`], and a rate is the change between the last two
//! samples per second. Sampling reads the counters the connections already batch; it
//! adds nothing to the publish path.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::core::broker::Broker;
use crate::core::stats::Stats;

/// How often the counters are sampled (RabbitMQ's default collection interval).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

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

#[cfg(test)]
mod tests {
    use super::*;

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
}

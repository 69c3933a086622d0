//! Generation counters that tell a route cache whether a change of the table may have
//! affected a cached route, without a lock and without a scan.
//!
//! Every change bumps the table's generation. A binding change on exchange `X` with key
//! `w1.w2...` also bumps one bucket counter, chosen by a hash of `X` and the key's first
//! two words — or of `X` and the first word when the second is a wildcard or absent, or
//! of `X` alone when the first is a wildcard (or the exchange does not route by key). A
//! route of routing key `k1.k2...` through `X` alone depends on the three buckets
//! `(X)`, `(X, k1)`, `(X, k1, k2)` and on the counter of exchange-level changes: the
//! cache keeps the sum of those four counters and the route is valid while the sum is
//! unchanged. So MQTT devices subscribing and leaving on `devices/<id>/cmd` leave a
//! publisher's route for `plant/line1` (or for `devices/<other id>/telemetry`, up to
//! bucket collisions) in its cache. Routes through more than one exchange (exchange-to-
//! exchange bindings, alternate exchanges) follow the table's generation instead.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use super::exchange::ExchangeKind;

/// Bucket counters (a power of two).
const BUCKETS: usize = 16 * 1024;

/// One change of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Change {
    /// A binding with key `key` was added to or removed from `exchange` (routed by `kind`).
    Binding { exchange: String, kind: ExchangeKind, key: String },
    /// Anything else (an exchange declared or deleted, a virtual host added): every cached
    /// route may be affected.
    Any,
}

/// The counters.
#[derive(Debug)]
pub(super) struct Generations {
    /// Every change.
    table: AtomicU64,
    /// Exchange-level changes.
    any: AtomicU64,
    buckets: Box<[AtomicU64]>,
    hasher: std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
}

impl Default for Generations {
    fn default() -> Self {
        Generations {
            table: AtomicU64::new(0),
            any: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            hasher: Default::default(),
        }
    }
}

/// What a cached route depends on: either three buckets of its one exchange, or (a route
/// through several exchanges) the table's generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dependency {
    /// A route through one exchange.
    Buckets([usize; 3]),
    /// A route through several exchanges.
    Table,
}

fn is_wildcard(word: &str) -> bool {
    word == "*" || word == "#"
}

impl Generations {
    fn bucket(&self, exchange: &str, words: &[&str]) -> usize {
        let mut h = self.hasher.build_hasher();
        exchange.hash(&mut h);
        words.hash(&mut h);
        (h.finish() as usize) & (BUCKETS - 1)
    }

    /// Records a change (after the table has changed).
    pub(super) fn record(&self, change: &Change) {
        match change {
            Change::Any => {
                self.any.fetch_add(1, Ordering::AcqRel);
            }
            Change::Binding { exchange, kind, key } => {
                let by_key = matches!(kind, ExchangeKind::Direct | ExchangeKind::Topic | ExchangeKind::DelayedMessage);
                let words: Vec<&str> = key.split('.').collect();
                let bucket = match (by_key, words.as_slice()) {
                    (true, [w1, ..]) if !is_wildcard(w1) => match words.get(1) {
                        Some(w2) if !is_wildcard(w2) => self.bucket(exchange, &[w1, w2]),
                        _ => self.bucket(exchange, &[w1]),
                    },
                    _ => self.bucket(exchange, &[]),
                };
                self.buckets[bucket].fetch_add(1, Ordering::AcqRel);
            }
        }
        self.table.fetch_add(1, Ordering::AcqRel);
    }

    /// The table's generation (changes on every change).
    pub(super) fn table(&self) -> u64 {
        self.table.load(Ordering::Acquire)
    }

    /// The counter of exchange-level changes.
    pub(super) fn any(&self) -> u64 {
        self.any.load(Ordering::Acquire)
    }

    /// What a route of `routing_key` through `exchange` alone depends on.
    pub(super) fn dependency(&self, exchange: &str, routing_key: &str) -> Dependency {
        let mut words = routing_key.split('.');
        let k1 = words.next().unwrap_or("");
        let k2 = words.next();
        let b0 = self.bucket(exchange, &[]);
        let b1 = self.bucket(exchange, &[k1]);
        let b2 = k2.map_or(b1, |k2| self.bucket(exchange, &[k1, k2]));
        Dependency::Buckets([b0, b1, b2])
    }

    /// The sum of the counters `dep` follows: unchanged while no change may affect it.
    pub(super) fn snapshot(&self, dep: Dependency) -> u64 {
        match dep {
            Dependency::Table => self.table(),
            Dependency::Buckets(b) => {
                b.iter().fold(self.any(), |sum, i| sum.wrapping_add(self.buckets[*i].load(Ordering::Acquire)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(exchange: &str, kind: ExchangeKind, key: &str) -> Change {
        Change::Binding { exchange: exchange.into(), kind, key: key.into() }
    }

    #[test]
    fn only_changes_that_can_match_move_a_route_snapshot() {
        let g = Generations::default();
        let route = g.dependency("amq.topic", "plant.line1");
        let at = g.snapshot(route);
        for unrelated in [
            binding("amq.topic", ExchangeKind::Topic, "devices.d1.cmd"),
            binding("amq.topic", ExchangeKind::Topic, "plant.line2.#"),
            binding("orders", ExchangeKind::Direct, "plant.line1"),
            binding("amq.fanout", ExchangeKind::Fanout, ""),
        ] {
            g.record(&unrelated);
            assert_eq!(g.snapshot(route), at, "{unrelated:?}");
        }
        for related in [
            binding("amq.topic", ExchangeKind::Topic, "plant.line1"),
            binding("amq.topic", ExchangeKind::Topic, "plant.*"),
            binding("amq.topic", ExchangeKind::Topic, "plant"),
            binding("amq.topic", ExchangeKind::Topic, "#"),
            binding("amq.topic", ExchangeKind::Topic, "*.line1"),
            Change::Any,
        ] {
            let before = g.snapshot(route);
            g.record(&related);
            assert_ne!(g.snapshot(route), before, "{related:?}");
        }
        let multi = g.snapshot(Dependency::Table);
        g.record(&binding("elsewhere", ExchangeKind::Topic, "x.y"));
        assert_ne!(g.snapshot(Dependency::Table), multi, "a route through several exchanges follows every change");
    }
}

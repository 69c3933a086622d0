//! The `x-consistent-hash` exchange type (the convention of RabbitMQ's
//! consistent-hash-exchange plugin): each binding's key is a weight, and a message goes to
//! exactly one binding chosen on a hash ring by the hash of its routing key, of the header
//! named by the exchange argument `hash-header`, or of the property named by
//! `hash-property` (`message_id`, `correlation_id`, `timestamp`).
//!
//! The ring is built when bindings change: a binding of weight `w` owns
//! `w x` [`POINTS_PER_WEIGHT`] points (virtual nodes, so that a few bindings of weight 1
//! still split the keys evenly), placed by a [stable hash](crate::core::stable_hash) of
//! (destination, key, point number): the same key reaches the same destination across
//! restarts, and adding one of N destinations moves about 1/N of the keys. Routing is one
//! hash and a binary search.

use super::exchange::{Binding, Destination};
use crate::core::message::Message;
use crate::core::stable_hash::hash64;
use crate::core::value::Value;

/// The exchange argument naming the header to hash.
pub const HASH_HEADER: &str = "hash-header";
/// The exchange argument naming the property to hash.
pub const HASH_PROPERTY: &str = "hash-property";
/// The largest weight one binding may have (its points on the ring are kept in memory).
pub const MAX_WEIGHT: u32 = 1_000;
/// Points on the ring per unit of weight.
pub const POINTS_PER_WEIGHT: u32 = 128;
/// The largest total weight of one exchange's bindings: bounds its ring (8,192 x 128
/// points, 16 MiB) and the work of rebuilding it on each bind.
pub const MAX_RING_WEIGHT: u64 = 8_192;

/// A message property the ring can hash on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashProperty {
    /// `message_id`.
    MessageId,
    /// `correlation_id`.
    CorrelationId,
    /// `timestamp` (seconds).
    Timestamp,
}

/// What a consistent-hash exchange hashes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HashOn {
    /// The publish's routing key (the exchange's default).
    #[default]
    RoutingKey,
    /// A header's value; a message without it is not routed.
    Header(String),
    /// A property; a message without it is not routed.
    Property(HashProperty),
}

/// Why exchange arguments or a binding of a consistent-hash exchange are refused (406
/// PRECONDITION_FAILED, with the plugin's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashArgError {
    /// Both `hash-header` and `hash-property` are set.
    #[error("hash-header and hash-property are mutually exclusive")]
    BothSet,
    /// `hash-property` names a property the exchange cannot hash.
    #[error("Unsupported property: {0}")]
    UnsupportedProperty(String),
    /// `hash-header` / `hash-property` is not a string.
    #[error("{0} must be a string")]
    NotAString(&'static str),
    /// The binding key is not an integer.
    #[error("The binding key must be an integer: <<\"{0}\">>")]
    NotAnInteger(String),
    /// The binding key is below 1.
    #[error("The binding key must be greater than 0")]
    NotPositive,
    /// The binding key is above [`MAX_WEIGHT`].
    #[error("The binding key must be at most {}", MAX_WEIGHT)]
    TooLarge,
    /// The exchange's bindings would weigh more than [`MAX_RING_WEIGHT`] together.
    #[error("The bindings of this exchange may weigh at most {} together", MAX_RING_WEIGHT)]
    RingFull,
}

impl HashOn {
    /// Reads `hash-header` / `hash-property` from exchange arguments.
    pub fn from_arguments(args: &[(String, Value)]) -> Result<HashOn, HashArgError> {
        let find = |name: &'static str| -> Result<Option<&str>, HashArgError> {
            match args.iter().find(|(k, _)| k == name) {
                None => Ok(None),
                Some((_, v)) => v.as_str().map(Some).ok_or(HashArgError::NotAString(name)),
            }
        };
        match (find(HASH_HEADER)?, find(HASH_PROPERTY)?) {
            (None, None) => Ok(HashOn::RoutingKey),
            (Some(h), None) => Ok(HashOn::Header(h.to_owned())),
            (None, Some(p)) => Ok(HashOn::Property(match p {
                "message_id" => HashProperty::MessageId,
                "correlation_id" => HashProperty::CorrelationId,
                "timestamp" => HashProperty::Timestamp,
                other => return Err(HashArgError::UnsupportedProperty(other.to_owned())),
            })),
            (Some(_), Some(_)) => Err(HashArgError::BothSet),
        }
    }

    /// The hash of what this exchange hashes in `msg`; `None` when the message lacks the
    /// header or property (it is then not routed).
    pub fn hash(&self, msg: &Message) -> Option<u64> {
        match self {
            HashOn::RoutingKey => Some(hash64(&[msg.routing_key.as_bytes()])),
            HashOn::Header(name) => msg.props.header(name).map(|v| match v.as_str() {
                Some(s) => hash64(&[s.as_bytes()]),
                None => hash64(&[v.to_text().as_bytes()]),
            }),
            HashOn::Property(HashProperty::MessageId) => {
                msg.props.message_id.as_deref().map(|s| hash64(&[s.as_bytes()]))
            }
            HashOn::Property(HashProperty::CorrelationId) => {
                msg.props.correlation_data.as_deref().map(|s| hash64(&[s]))
            }
            HashOn::Property(HashProperty::Timestamp) => {
                msg.props.timestamp.map(|t| hash64(&[t.to_string().as_bytes()]))
            }
        }
    }

    /// True when the hash depends only on the routing key (the route may be cached).
    pub fn is_routing_key(&self) -> bool {
        matches!(self, HashOn::RoutingKey)
    }
}

/// The weight a binding key stands for.
pub fn parse_weight(key: &str) -> Result<u32, HashArgError> {
    let n: i64 = key.trim().parse().map_err(|_| HashArgError::NotAnInteger(key.to_owned()))?;
    if n < 1 {
        return Err(HashArgError::NotPositive);
    }
    u32::try_from(n).ok().filter(|w| *w <= MAX_WEIGHT).ok_or(HashArgError::TooLarge)
}

/// The points of every binding, sorted: (position, index of the binding).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// Builds the ring of `bindings` (keys already validated as weights).
    pub fn build(bindings: &[Binding]) -> Ring {
        let points_of = |b: &Binding| parse_weight(&b.key).unwrap_or(0) * POINTS_PER_WEIGHT;
        let mut points = Vec::with_capacity(bindings.iter().map(|b| points_of(b) as usize).sum());
        for (idx, b) in bindings.iter().enumerate() {
            let dest = destination_id(&b.dest);
            for i in 0..points_of(b) {
                let pos = hash64(&[dest.as_bytes(), b"\0", b.key.as_bytes(), b"\0", &i.to_be_bytes()]);
                points.push((pos, idx as u32));
            }
        }
        points.sort_unstable();
        Ring { points }
    }

    /// The index of the binding owning `hash`: the first point at or after it, wrapping.
    pub fn pick(&self, hash: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let at = self.points.partition_point(|(p, _)| *p < hash);
        let (_, idx) = self.points[if at == self.points.len() { 0 } else { at }];
        Some(idx as usize)
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when there are no bindings.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

/// A stable name of a destination for placing its points.
fn destination_id(dest: &Destination) -> String {
    match dest {
        Destination::Queue(q) => format!("q:{}", q.0),
        Destination::Exchange(x) => format!("x:{x}"),
        Destination::Session(link) => format!("s:{:p}", std::sync::Arc::as_ptr(link)),
        Destination::Member(m) => format!("m:{m}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrymq_storage::QueueId;

    fn ring(weights: &[(u64, &str)]) -> (Vec<Binding>, Ring) {
        let bindings: Vec<Binding> = weights.iter().map(|(q, w)| Binding::queue(QueueId(*q), w, vec![])).collect();
        let ring = Ring::build(&bindings);
        (bindings, ring)
    }

    fn owner(bindings: &[Binding], ring: &Ring, key: &str) -> u64 {
        match &bindings[ring.pick(hash64(&[key.as_bytes()])).unwrap()].dest {
            Destination::Queue(q) => q.0,
            _ => unreachable!(),
        }
    }

    #[test]
    fn weights_are_validated_as_the_plugin_does() {
        assert_eq!(parse_weight("10"), Ok(10));
        assert_eq!(parse_weight("0"), Err(HashArgError::NotPositive));
        assert_eq!(parse_weight("-3"), Err(HashArgError::NotPositive));
        assert!(matches!(parse_weight("abc"), Err(HashArgError::NotAnInteger(_))));
        assert!(matches!(parse_weight(""), Err(HashArgError::NotAnInteger(_))));
        assert_eq!(parse_weight("1000"), Ok(1000));
        assert_eq!(parse_weight("1001"), Err(HashArgError::TooLarge));
    }

    #[test]
    fn arguments_are_validated_as_the_plugin_does() {
        let s = |v: &str| Value::Str(v.into());
        assert_eq!(HashOn::from_arguments(&[]), Ok(HashOn::RoutingKey));
        assert_eq!(HashOn::from_arguments(&[(HASH_HEADER.into(), s("h"))]), Ok(HashOn::Header("h".into())));
        assert_eq!(
            HashOn::from_arguments(&[(HASH_PROPERTY.into(), s("timestamp"))]),
            Ok(HashOn::Property(HashProperty::Timestamp))
        );
        assert_eq!(
            HashOn::from_arguments(&[(HASH_PROPERTY.into(), s("app_id"))]),
            Err(HashArgError::UnsupportedProperty("app_id".into()))
        );
        assert_eq!(
            HashOn::from_arguments(&[(HASH_HEADER.into(), s("h")), (HASH_PROPERTY.into(), s("message_id"))]),
            Err(HashArgError::BothSet)
        );
        assert_eq!(
            HashOn::from_arguments(&[(HASH_HEADER.into(), Value::Int(1))]),
            Err(HashArgError::NotAString(HASH_HEADER))
        );
    }

    #[test]
    fn distribution_follows_weights() {
        let (b, r) = ring(&[(1, "1"), (2, "1"), (3, "2")]);
        assert_eq!(r.len(), 4 * POINTS_PER_WEIGHT as usize);
        let mut counts = [0u32; 4];
        for i in 0..40_000 {
            counts[owner(&b, &r, &format!("key-{i}")) as usize] += 1;
        }
        // Expected 10k / 10k / 20k; 128 points per weight keep within ~15%.
        for (q, expected) in [(1, 10_000.0), (2, 10_000.0), (3, 20_000.0)] {
            let ratio = counts[q] as f64 / expected;
            assert!((0.85..1.15).contains(&ratio), "queue {q}: {} of {expected}", counts[q]);
        }
    }

    #[test]
    fn adding_a_destination_moves_about_one_in_n_keys() {
        let (b3, r3) = ring(&[(1, "1"), (2, "1"), (3, "1")]);
        let (b4, r4) = ring(&[(1, "1"), (2, "1"), (3, "1"), (4, "1")]);
        let keys = 20_000;
        let mut moved = 0;
        for i in 0..keys {
            let k = format!("order-{i}");
            let (before, after) = (owner(&b3, &r3, &k), owner(&b4, &r4, &k));
            if before != after {
                assert_eq!(after, 4, "a key only moves to the new queue");
                moved += 1;
            }
        }
        let share = moved as f64 / keys as f64;
        assert!((0.18..0.32).contains(&share), "moved {share}");
    }

    #[test]
    fn ring_is_stable_and_order_independent() {
        let (b1, r1) = ring(&[(1, "5"), (2, "7")]);
        let (b2, r2) = ring(&[(2, "7"), (1, "5")]);
        for i in 0..1000 {
            let k = i.to_string();
            assert_eq!(owner(&b1, &r1, &k), owner(&b2, &r2, &k));
        }
        assert_eq!(Ring::default().pick(7), None);
    }
}

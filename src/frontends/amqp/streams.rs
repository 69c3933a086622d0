//! Streams over AMQP 0-9-1, as RabbitMQ 3.9+ exposes them: the `x-stream-offset`,
//! `x-consumer-group`, `x-super-stream` and `x-single-active-consumer` consume arguments
//! and the partitions of a super stream — with RabbitMQ's reply texts. Which declarations
//! make a stream is entity management, in [`crate::core::entities`].

use crate::core::store::QueueId;

use crate::core::broker::RoutingView;
use crate::core::message::now_ms;
use crate::core::router::Destination;
use crate::core::stream::{parse_age, StreamOffset};
use crate::core::value::Value;

use crate::core::entities::Entities;

/// The consume argument naming where a stream consumer starts.
pub(crate) const OFFSET_ARG: &str = "x-stream-offset";

/// The consume argument naming a stream consumer's group.
pub(crate) const GROUP_ARG: &str = "x-consumer-group";

/// Reads `x-consumer-group` from consume arguments: a non-empty string of at most 255
/// bytes, or absent.
pub(crate) fn consumer_group(args: &[(String, Value)]) -> Result<Option<String>, String> {
    match args.iter().find(|(k, _)| k == GROUP_ARG).map(|(_, v)| v) {
        None => Ok(None),
        Some(Value::Str(s)) if !s.is_empty() && s.len() <= 255 => Ok(Some(s.clone())),
        Some(other) => Err(format!("invalid '{GROUP_ARG}' {}: a name of 1 to 255 bytes", other.to_text())),
    }
}

/// The consume argument naming the super stream whose partition a group member reads.
pub(crate) const SUPER_STREAM_ARG: &str = "x-super-stream";
/// The consume argument making a group read by one member at a time.
pub(crate) const SINGLE_ACTIVE_ARG: &str = "x-single-active-consumer";
/// The binding argument ordering a super stream's partitions (RabbitMQ's).
pub(crate) const PARTITION_ORDER_ARG: &str = "x-stream-partition-order";

/// How the members of a consumer group share a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// Each entry to one member, round robin (the default).
    Split,
    /// One member at a time reads, in order; the next takes over when it goes
    /// (`x-single-active-consumer: true`).
    SingleActive,
    /// The stream is a partition of this super stream; its partitions are spread over the
    /// group's members, one member per partition (`x-super-stream: NAME`).
    Partition(String),
}

/// Reads `x-super-stream` and `x-single-active-consumer` from consume arguments; both
/// need an `x-consumer-group`.
pub(crate) fn sharing(args: &[(String, Value)], group: Option<&str>) -> Result<Sharing, String> {
    let find = |name: &str| args.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let sharing = match (find(SUPER_STREAM_ARG), find(SINGLE_ACTIVE_ARG)) {
        (Some(Value::Str(s)), _) if !s.is_empty() && s.len() <= 255 => Sharing::Partition(s.clone()),
        (Some(other), _) => return Err(format!("invalid '{SUPER_STREAM_ARG}' {}: an exchange name", other.to_text())),
        (None, Some(Value::Bool(true))) => Sharing::SingleActive,
        (None, Some(Value::Bool(false)) | None) => Sharing::Split,
        (None, Some(other)) => return Err(format!("invalid '{SINGLE_ACTIVE_ARG}' {}: a boolean", other.to_text())),
    };
    match (&sharing, group) {
        (Sharing::Partition(_), None) => Err(format!("'{SUPER_STREAM_ARG}' needs '{GROUP_ARG}'")),
        (Sharing::SingleActive, None) => Err(format!("'{SINGLE_ACTIVE_ARG}' needs '{GROUP_ARG}'")),
        _ => Ok(sharing),
    }
}

/// The order of a partition among its super stream's bindings: the binding's
/// `x-stream-partition-order` (any integer), else after every ordered one.
pub(crate) fn partition_order(binding_args: &[(String, Value)]) -> i64 {
    binding_args.iter().find(|(k, _)| k == PARTITION_ORDER_ARG).and_then(|(_, v)| v.as_i64()).unwrap_or(i64::MAX)
}

/// The partitions of super stream `name` (the streams bound to exchange `name`), in
/// partition order (`x-stream-partition-order`, then name); `None` when no such exchange.
pub(crate) fn partitions_of(
    router: RoutingView<'_>,
    entities: &Entities,
    vhost: &str,
    name: &str,
) -> Option<Vec<QueueId>> {
    router.exchange(vhost, name)?;
    let mut found: Vec<(i64, String, QueueId)> = Vec::new();
    let streams: Vec<_> = entities.all().into_iter().filter(|q| q.vhost == vhost && q.is_stream()).collect();
    for b in router.bindings_of(vhost, name) {
        let Destination::Queue(id) = b.dest else { continue };
        let Some(q) = streams.iter().find(|q| q.id == id) else { continue };
        if !found.iter().any(|(_, _, f)| *f == id) {
            found.push((partition_order(&b.args), q.name.clone(), id));
        }
    }
    found.sort();
    Some(found.into_iter().map(|(_, _, id)| id).collect())
}

/// Reads `x-stream-offset` from consume arguments: `first`, `last`, `next` (the default),
/// an absolute offset (any integer type), a timestamp (AMQP timestamp, seconds), or an age
/// such as `1h` (RabbitMQ's interval form: messages stored within that time).
pub(crate) fn stream_offset(args: &[(String, Value)]) -> Result<StreamOffset, String> {
    let Some((_, v)) = args.iter().find(|(k, _)| k == OFFSET_ARG) else { return Ok(StreamOffset::Next) };
    match v {
        Value::Str(s) => match s.as_str() {
            "first" => Ok(StreamOffset::First),
            "last" => Ok(StreamOffset::Last),
            "next" => Ok(StreamOffset::Next),
            other => parse_age(other)
                .map(|age| StreamOffset::Timestamp(now_ms().saturating_sub(age)))
                .ok_or_else(|| format!("invalid '{OFFSET_ARG}' '{other}'")),
        },
        Value::Timestamp(secs) => Ok(StreamOffset::Timestamp(secs.saturating_mul(1000))),
        Value::Int8(_)
        | Value::UInt8(_)
        | Value::Int16(_)
        | Value::UInt16(_)
        | Value::Int32(_)
        | Value::UInt32(_)
        | Value::Int(_) => match v.as_i64().map(u64::try_from) {
            Some(Ok(o)) => Ok(StreamOffset::Offset(o)),
            _ => Err(format!("invalid '{OFFSET_ARG}' {}: negative", v.to_text())),
        },
        Value::UInt(o) => Ok(StreamOffset::Offset(*o)),
        other => Err(format!("invalid '{OFFSET_ARG}' {}", other.to_text())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn offsets() {
        let at = |v: Value| stream_offset(&args(&[(OFFSET_ARG, v)]));
        assert_eq!(stream_offset(&[]), Ok(StreamOffset::Next));
        assert_eq!(at(Value::Str("first".into())), Ok(StreamOffset::First));
        assert_eq!(at(Value::Str("last".into())), Ok(StreamOffset::Last));
        assert_eq!(at(Value::Str("next".into())), Ok(StreamOffset::Next));
        assert_eq!(at(Value::Int(42)), Ok(StreamOffset::Offset(42)));
        assert_eq!(at(Value::Int32(7)), Ok(StreamOffset::Offset(7)));
        assert_eq!(at(Value::Timestamp(1_700_000_000)), Ok(StreamOffset::Timestamp(1_700_000_000_000)));
        assert!(matches!(at(Value::Str("1h".into())), Ok(StreamOffset::Timestamp(_))));
        assert!(at(Value::Int(-1)).is_err());
        assert!(at(Value::Str("sometime".into())).is_err());
        assert!(at(Value::Bool(true)).is_err());
        let group = |v: Value| consumer_group(&args(&[(GROUP_ARG, v)]));
        assert_eq!(consumer_group(&[]), Ok(None));
        assert_eq!(group(Value::Str("billing".into())), Ok(Some("billing".into())));
        assert!(group(Value::Str(String::new())).is_err());
        assert!(group(Value::Int(1)).is_err());
    }

    #[test]
    fn sharing_arguments() {
        let g = Some("billing");
        assert_eq!(sharing(&[], g), Ok(Sharing::Split));
        assert_eq!(
            sharing(&args(&[(SUPER_STREAM_ARG, Value::Str("orders".into()))]), g),
            Ok(Sharing::Partition("orders".into()))
        );
        assert_eq!(sharing(&args(&[(SINGLE_ACTIVE_ARG, Value::Bool(true))]), g), Ok(Sharing::SingleActive));
        assert_eq!(sharing(&args(&[(SINGLE_ACTIVE_ARG, Value::Bool(false))]), g), Ok(Sharing::Split));
        assert!(sharing(&args(&[(SINGLE_ACTIVE_ARG, Value::Int(1))]), g).is_err());
        assert!(sharing(&args(&[(SUPER_STREAM_ARG, Value::Str(String::new()))]), g).is_err());
        assert!(sharing(&args(&[(SUPER_STREAM_ARG, Value::Str("orders".into()))]), None)
            .unwrap_err()
            .contains("x-consumer-group"));
        assert!(sharing(&args(&[(SINGLE_ACTIVE_ARG, Value::Bool(true))]), None)
            .unwrap_err()
            .contains("x-consumer-group"));
        assert_eq!(partition_order(&args(&[(PARTITION_ORDER_ARG, Value::Int(2))])), 2);
        assert_eq!(partition_order(&[]), i64::MAX);
    }
}

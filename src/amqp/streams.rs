//! Streams over AMQP 0-9-1, as RabbitMQ 3.9+ exposes them: which declarations make a
//! stream (`x-queue-type: stream`, durable, not exclusive, not auto-delete), its
//! retention arguments, and the `x-stream-offset` consume argument — with RabbitMQ's
//! reply texts.

use crate::core::message::now_ms;
use crate::core::stream::{parse_age, StreamConfig, StreamOffset};
use crate::core::value::Value;

use super::entities::ArgumentError;

/// The consume argument naming where a stream consumer starts.
pub const OFFSET_ARG: &str = "x-stream-offset";

/// Queue arguments of classic and quorum queues that a stream refuses (RabbitMQ lists the
/// arguments each queue type supports; these are not among the stream's).
const NOT_FOR_STREAMS: &[&str] = &[
    "x-max-length",
    "x-message-ttl",
    "x-expires",
    "x-overflow",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-priority",
    "x-delivery-limit",
    "x-single-active-consumer",
    "x-queue-mode",
    "x-queue-master-locator",
];

/// True when the declaration arguments ask for a stream.
pub fn is_stream(args: &[(String, Value)]) -> bool {
    args.iter().any(|(k, v)| k == "x-queue-type" && v.as_str() == Some("stream"))
}

/// Checks a stream declaration and turns its arguments into retention settings.
pub fn stream_config(
    vhost: &str,
    name: &str,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    args: &[(String, Value)],
) -> Result<StreamConfig, ArgumentError> {
    let property = |p: &str| ArgumentError(format!("PRECONDITION_FAILED - invalid property '{p}' for queue '{name}' in vhost '{vhost}'"));
    if auto_delete {
        return Err(property("auto-delete"));
    }
    if exclusive {
        return Err(property("exclusive-owner"));
    }
    if !durable {
        return Err(property("non-durable"));
    }
    let invalid = |arg: &str, why: String| ArgumentError::invalid(vhost, name, arg, why);
    let refused = |k: &str| NOT_FOR_STREAMS.contains(&k) || super::retry_args::RETRY_ARGUMENTS.contains(&k);
    if let Some((k, _)) = args.iter().find(|(k, _)| refused(k)) {
        return Err(ArgumentError(format!(
            "PRECONDITION_FAILED - invalid arg '{k}' for queue '{name}' in vhost '{vhost}' of queue type rabbit_stream_queue"
        )));
    }
    let mut c = StreamConfig::new(name, vhost);
    for (k, v) in args {
        match k.as_str() {
            "x-max-age" => {
                let text = v.as_str().unwrap_or_default();
                c.max_age_ms = Some(parse_age(text).ok_or_else(|| invalid(k, format!("{{invalid_max_age,<<\"{}\">>}}", v.to_text())))?);
            }
            "x-max-length-bytes" => match v.as_i64() {
                Some(n) if n >= 0 && !matches!(v, Value::Timestamp(_)) => c.max_bytes = Some(n as u64),
                _ => return Err(invalid(k, format!("{{value_negative,{}}}", v.to_text()))),
            },
            _ => {}
        }
    }
    Ok(c)
}

/// The consume argument naming a stream consumer's group.
pub const GROUP_ARG: &str = "x-consumer-group";

/// Reads `x-consumer-group` from consume arguments: a non-empty string of at most 255
/// bytes, or absent.
pub fn consumer_group(args: &[(String, Value)]) -> Result<Option<String>, String> {
    match args.iter().find(|(k, _)| k == GROUP_ARG).map(|(_, v)| v) {
        None => Ok(None),
        Some(Value::Str(s)) if !s.is_empty() && s.len() <= 255 => Ok(Some(s.clone())),
        Some(other) => Err(format!("invalid '{GROUP_ARG}' {}: a name of 1 to 255 bytes", other.to_text())),
    }
}

/// Reads `x-stream-offset` from consume arguments: `first`, `last`, `next` (the default),
/// an absolute offset (any integer type), a timestamp (AMQP timestamp, seconds), or an age
/// such as `1h` (RabbitMQ's interval form: messages stored within that time).
pub fn stream_offset(args: &[(String, Value)]) -> Result<StreamOffset, String> {
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
        Value::Int8(_) | Value::UInt8(_) | Value::Int16(_) | Value::UInt16(_) | Value::Int32(_) | Value::UInt32(_) | Value::Int(_) => {
            match v.as_i64().map(u64::try_from) {
                Some(Ok(o)) => Ok(StreamOffset::Offset(o)),
                _ => Err(format!("invalid '{OFFSET_ARG}' {}: negative", v.to_text())),
            }
        }
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
    fn stream_declarations() {
        let stream = Value::Str("stream".into());
        let ok = args(&[("x-queue-type", stream.clone()), ("x-max-age", Value::Str("7D".into())), ("x-max-length-bytes", Value::Int(1000))]);
        assert!(is_stream(&ok));
        let c = stream_config("/", "s", true, false, false, &ok).unwrap();
        assert_eq!((c.max_age_ms, c.max_bytes), (Some(7 * 86_400_000), Some(1000)));
        assert!(stream_config("/", "s", false, false, false, &ok).unwrap_err().0.contains("non-durable"));
        assert!(stream_config("/", "s", true, true, false, &ok).unwrap_err().0.contains("exclusive-owner"));
        assert!(stream_config("/", "s", true, false, true, &ok).unwrap_err().0.contains("auto-delete"));
        let bad_age = args(&[("x-queue-type", stream.clone()), ("x-max-age", Value::Str("7X".into()))]);
        assert!(stream_config("/", "s", true, false, false, &bad_age).unwrap_err().0.contains("x-max-age"));
        let max_len = args(&[("x-queue-type", stream), ("x-max-length", Value::Int(5))]);
        assert!(stream_config("/", "s", true, false, false, &max_len).unwrap_err().0.contains("rabbit_stream_queue"));
        let retry = args(&[("x-queue-type", Value::Str("stream".into())), ("x-retry-backoff", Value::Str("1s".into()))]);
        assert!(stream_config("/", "s", true, false, false, &retry).unwrap_err().0.contains("x-retry-backoff"));
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
}

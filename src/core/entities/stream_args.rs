//! Stream declarations, as RabbitMQ 3.9+ takes them: which declarations make a stream
//! (`x-queue-type: stream`, durable, not exclusive, not auto-delete), the queue arguments
//! a stream refuses, and its retention arguments (`x-max-age`, `x-max-length-bytes`) —
//! with RabbitMQ's `PRECONDITION_FAILED` texts.

use crate::core::stream::{parse_age, StreamConfig};
use crate::core::value::Value;

use super::arguments::ArgumentError;

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
    crate::core::dedup::QUEUE_ARGUMENT,
];

/// True when the declaration arguments ask for a stream.
pub(crate) fn is_stream(args: &[(String, Value)]) -> bool {
    args.iter().any(|(k, v)| k == "x-queue-type" && v.as_str() == Some("stream"))
}

/// Checks a stream declaration and turns its arguments into retention settings.
pub(crate) fn stream_config(
    vhost: &str,
    name: &str,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    args: &[(String, Value)],
) -> Result<StreamConfig, ArgumentError> {
    let property = |p: &str| {
        ArgumentError(format!("PRECONDITION_FAILED - invalid property '{p}' for queue '{name}' in vhost '{vhost}'"))
    };
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
                c.max_age_ms = Some(
                    parse_age(text)
                        .ok_or_else(|| invalid(k, format!("{{invalid_max_age,<<\"{}\">>}}", v.to_text())))?,
                );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn stream_declarations() {
        let stream = Value::Str("stream".into());
        let ok = args(&[
            ("x-queue-type", stream.clone()),
            ("x-max-age", Value::Str("7D".into())),
            ("x-max-length-bytes", Value::Int(1000)),
        ]);
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
        let retry =
            args(&[("x-queue-type", Value::Str("stream".into())), ("x-retry-backoff", Value::Str("1s".into()))]);
        assert!(stream_config("/", "s", true, false, false, &retry).unwrap_err().0.contains("x-retry-backoff"));
    }
}

//! Queue declaration arguments (`x-message-ttl`, `x-max-length`, `x-overflow`,
//! `x-dead-letter-exchange`, `x-delivery-limit`, `x-queue-type`, `x-max-priority`, ...):
//! checked as RabbitMQ checks them and turned into a [`QueueConfig`], with RabbitMQ's
//! `PRECONDITION_FAILED` texts.

use crate::core::queue::{DeadLetterTarget, Overflow, QueueConfig};
use crate::core::value::Value;

use super::retry_args::retry_policy;

/// Why queue arguments are refused (406 PRECONDITION_FAILED, RabbitMQ's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArgumentError(pub String);

impl ArgumentError {
    /// RabbitMQ's `PRECONDITION_FAILED - invalid arg ...` text for argument `key` of queue
    /// `name` in `vhost`.
    pub fn invalid(vhost: &str, name: &str, key: &str, why: impl std::fmt::Display) -> ArgumentError {
        ArgumentError(format!("PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {why}"))
    }
}

/// Reads a non-negative integer argument.
pub(crate) fn arg_u64(args: &[(String, Value)], name: &str) -> Option<u64> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_i64()).and_then(|v| u64::try_from(v).ok())
}

pub(super) fn arg_str<'a>(args: &'a [(String, Value)], name: &str) -> Option<&'a str> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_str())
}

pub(super) fn arg_bool(args: &[(String, Value)], name: &str) -> Option<bool> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
        Value::Bool(b) => Some(*b),
        other => other.as_i64().map(|i| i != 0),
    })
}

/// Checks queue arguments and turns them into a configuration.
pub(crate) fn queue_config(
    vhost: &str,
    name: &str,
    durable: bool,
    args: &[(String, Value)],
) -> Result<QueueConfig, ArgumentError> {
    let mut c = QueueConfig::new(name, vhost);
    c.keep_transient = false;
    let int = |key: &str| -> Result<Option<u64>, ArgumentError> {
        match args.iter().find(|(k, _)| k == key) {
            None => Ok(None),
            Some((_, v)) => match v.as_i64() {
                Some(i) if i >= 0 => Ok(Some(i as u64)),
                _ => Err(ArgumentError::invalid(vhost, name, key, format!("{{value_negative,{}}}", v.to_text()))),
            },
        }
    };
    c.message_ttl = int("x-message-ttl")?;
    c.max_len = int("x-max-length")?.unwrap_or(0);
    c.max_bytes = int("x-max-length-bytes")?.unwrap_or(0);
    if let Some(0) = int("x-expires")? {
        return Err(ArgumentError::invalid(vhost, name, "x-expires", "{value_zero,0}"));
    }
    c.delivery_limit = int("x-delivery-limit")?.map(|v| v.min(u32::MAX as u64) as u32);
    c.retry = retry_policy(vhost, name, args)?;
    c.count_deliveries = c.delivery_limit.is_some() || c.retry.is_some();
    c.single_active_consumer = arg_bool(args, "x-single-active-consumer").unwrap_or(false);
    c.dedup = arg_bool(args, crate::core::dedup::QUEUE_ARGUMENT).unwrap_or(false);
    c.overflow = match arg_str(args, "x-overflow") {
        None | Some("drop-head") => Overflow::DropHead,
        Some("reject-publish") => Overflow::RejectPublish,
        Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
        Some(other) => {
            return Err(ArgumentError::invalid(
                vhost,
                name,
                "x-overflow",
                format!("{{unknown_overflow_type,<<\"{other}\">>}}"),
            ))
        }
    };
    if let Some(exchange) = arg_str(args, "x-dead-letter-exchange") {
        c.dead_letter = Some(DeadLetterTarget {
            exchange: exchange.to_owned(),
            routing_key: arg_str(args, "x-dead-letter-routing-key").map(str::to_owned),
        });
    }
    if c.delivery_limit.is_some() && c.dead_letter.is_none() && crate::core::dead_letter::dlq_name(name).len() > 255 {
        // Its `%DLQ%` queue could not be named by any client (a short string).
        return Err(ArgumentError::invalid(vhost, name, "x-delivery-limit", "{dead_letter_queue_name_too_long}"));
    }
    match arg_str(args, "x-queue-type") {
        None | Some("classic") => {}
        Some("quorum") => {
            c.count_deliveries = true;
            if !durable {
                return Err(ArgumentError(format!(
                    "PRECONDITION_FAILED - invalid property 'non-durable' for queue '{name}' in vhost '{vhost}'"
                )));
            }
        }
        Some(other) => {
            return Err(ArgumentError::invalid(
                vhost,
                name,
                "x-queue-type",
                format!("{{unsupported_queue_type,<<\"{other}\">>}}"),
            ))
        }
    }
    if let Some(p) = int("x-max-priority")? {
        if p > 255 {
            return Err(ArgumentError::invalid(vhost, name, "x-max-priority", format!("{{value_too_large,{p}}}")));
        }
        // Up to 15 levels are kept apart (RabbitMQ recommends at most 10).
        c.max_priority = Some(p.min(15) as u8);
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
    fn queue_arguments_become_a_configuration() {
        let c = queue_config(
            "/",
            "q",
            true,
            &args(&[
                ("x-message-ttl", Value::Int32(1000)),
                ("x-max-length", Value::Int(5)),
                ("x-overflow", Value::Str("reject-publish".into())),
                ("x-dead-letter-exchange", Value::Str("dlx".into())),
                ("x-dead-letter-routing-key", Value::Str("dead".into())),
                ("x-delivery-limit", Value::Int(3)),
                ("x-single-active-consumer", Value::Bool(true)),
                ("x-queue-type", Value::Str("quorum".into())),
            ]),
        )
        .unwrap();
        assert_eq!(c.message_ttl, Some(1000));
        assert_eq!(c.max_len, 5);
        assert_eq!(c.overflow, Overflow::RejectPublish);
        assert_eq!(c.dead_letter, Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: Some("dead".into()) }));
        assert_eq!(c.delivery_limit, Some(3));
        assert!(c.single_active_consumer);
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(queue_config("/", "q", true, &args(&[("x-message-ttl", Value::Int(-1))])).is_err());
        assert!(queue_config("/", "q", true, &args(&[("x-overflow", Value::Str("nope".into()))])).is_err());
        assert!(queue_config("/", "q", false, &args(&[("x-queue-type", Value::Str("quorum".into()))])).is_err());
        assert!(queue_config("/", "q", true, &args(&[("x-queue-type", Value::Str("stream".into()))])).is_err());
        assert!(queue_config("/", "q", true, &args(&[("x-expires", Value::Int(0))])).is_err());
        // A delivery limit without a dead-letter exchange needs a `%DLQ%` name that fits.
        let long = "q".repeat(251);
        let limit = args(&[("x-delivery-limit", Value::Int(1))]);
        assert!(queue_config("/", &long, true, &limit).unwrap_err().0.contains("x-delivery-limit"));
        assert!(queue_config("/", &"q".repeat(250), true, &limit).is_ok());
        let with_dlx =
            args(&[("x-delivery-limit", Value::Int(1)), ("x-dead-letter-exchange", Value::Str("dlx".into()))]);
        assert!(queue_config("/", &long, true, &with_dlx).is_ok());
    }
}

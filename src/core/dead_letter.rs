//! Dead-lettering: messages leaving a queue (rejected, expired, dropped from a full queue,
//! past the delivery limit) are republished to the queue's dead-letter exchange with an
//! `x-death` header, as RabbitMQ writes it: an array of tables, newest first, one per
//! (queue, reason) with `count`, `reason`, `queue`, `time`, `exchange` and
//! `routing-keys` (and `original-expiration` when the message had a per-message TTL,
//! which is removed), plus `x-first-death-queue`, `-reason` and `-exchange`.
//!
//! A message past the delivery limit of a queue without a dead-letter exchange goes to the
//! queue `%DLQ%{queue}` (RocketMQ's naming), created on demand by the queue registry
//! ([`DeadLetterQueues`], implemented by [`crate::core::entities::Entities`]); it keeps its
//! exchange and routing key.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use ferrymq_storage::{Op, QueueId};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::broker::{Broker, RetainMode};
use super::message::{now_ms, Message, SharedMessage};
use super::queue::{DeadLetter, DeadLetterTarget, DeathReason};
use super::router::{QueueRoute, Routes};
use super::value::Value;

/// The name of the dead-letter queue of `queue` (RocketMQ's `%DLQ%` prefix).
pub(crate) fn dlq_name(queue: &str) -> String {
    format!("%DLQ%{queue}")
}

/// Finds or creates `%DLQ%` queues (implemented by the queue registry,
/// [`crate::core::entities::Entities`], which owns queue declaration).
pub(crate) trait DeadLetterQueues: Send + Sync {
    /// The id of `%DLQ%{source}` in `vhost`, declared if missing (durable when the source
    /// queue is); `None` if it cannot be created.
    fn dead_letter_queue<'a>(
        &'a self,
        vhost: &'a str,
        source: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<QueueId>> + Send + 'a>>;
}

/// Where the dead-letter task finds `%DLQ%` queues (set once the queue registry started).
pub(crate) type DeadLetterQueuesHook = std::sync::OnceLock<Weak<dyn DeadLetterQueues>>;

/// Republishes dead letters until the channel closes.
pub(crate) async fn run(broker: Arc<Broker>, mut rx: mpsc::UnboundedReceiver<DeadLetter>) {
    while let Some(mut d) = rx.recv().await {
        // The source queue's removal goes with the republication (or alone when the
        // message has nowhere to go).
        let removal = std::mem::take(&mut d.removal);
        let removal = match d.config.dead_letter.clone() {
            Some(target) => to_exchange(&broker, &d, &target, removal).await,
            None if d.reason == DeathReason::DeliveryLimit => to_dlq(&broker, &d, removal).await,
            None => removal,
        };
        if !removal.is_empty() {
            drop(broker.submit(removal, Vec::new(), false).await);
        }
    }
}

/// Republishes to `%DLQ%{queue}`, keeping the message's exchange and routing key.
/// Returns `removal` if it was not submitted.
async fn to_dlq(broker: &Broker, d: &DeadLetter, removal: Vec<Op>) -> Vec<Op> {
    let queues = broker.dead_letter_queues.get().and_then(Weak::upgrade);
    let id = match queues {
        Some(q) => q.dead_letter_queue(&d.config.vhost, &d.config.name).await,
        None => None,
    };
    let Some(id) = id else {
        warn!(queue = %d.config.name, "no dead-letter queue for a message past the delivery limit; dropped");
        return removal;
    };
    debug!(queue = %d.config.name, "delivery limit reached: to the %DLQ% queue");
    let msg = Arc::new(dead_lettered(d));
    let routes = Routes { queues: vec![QueueRoute { queue: id, qos: 2, reserved: false }], ..Routes::default() };
    if let Some(signal) = broker.publish_with_ops(&msg, &routes, RetainMode::None, removal).await {
        drop(signal);
    }
    Vec::new()
}

/// Republishes to the dead-letter exchange; returns `removal` if it was not submitted.
async fn to_exchange(broker: &Broker, d: &DeadLetter, target: &DeadLetterTarget, removal: Vec<Op>) -> Vec<Op> {
    let mut msg = dead_lettered(d);
    if let Some(key) = &target.routing_key {
        msg.routing_key = key.clone();
    }
    msg.exchange = target.exchange.clone();
    let msg = Arc::new(msg);
    debug!(queue = %d.config.name, reason = d.reason.as_str(), exchange = %target.exchange, "dead-lettering");
    match broker.router.route(&d.config.vhost, &target.exchange, &msg, "") {
        Ok((routes, _)) => {
            if let Some(signal) = broker.publish_with_ops(&msg, &routes, RetainMode::None, removal).await {
                drop(signal);
            }
            Vec::new()
        }
        Err(e) => {
            warn!(queue = %d.config.name, error = %e, "cannot route to the dead-letter exchange (gone, or the key is too long); message dropped");
            removal
        }
    }
}

/// The message as it is republished: `x-death` updated, expiration moved into it.
fn dead_lettered(d: &DeadLetter) -> Message {
    let original: &SharedMessage = &d.msg;
    let mut msg = Message::clone(original);
    let now = now_ms();
    msg.timestamp_ms = now;
    let expiration = msg.props.expiration_ms.take();
    msg.props.expires_at_ms = None;
    let routing_keys = Value::Array(vec![Value::Str(original.routing_key.clone())]);
    let mut deaths: Vec<Value> = match msg.props.header("x-death") {
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    let reason = d.reason.as_str();
    let same = |t: &Value| match t {
        Value::Table(fields) => {
            let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v);
            get("queue").and_then(Value::as_str) == Some(d.config.name.as_str())
                && get("reason").and_then(Value::as_str) == Some(reason)
        }
        _ => false,
    };
    let count = match deaths.iter().position(same) {
        Some(i) => {
            let previous = deaths.remove(i);
            let c = match previous {
                Value::Table(fields) => {
                    fields.iter().find(|(n, _)| n == "count").and_then(|(_, v)| v.as_i64()).unwrap_or(0)
                }
                _ => 0,
            };
            c + 1
        }
        None => 1,
    };
    let mut entry = vec![
        ("count".to_owned(), Value::Int(count)),
        ("reason".to_owned(), Value::Str(reason.to_owned())),
        ("queue".to_owned(), Value::Str(d.config.name.clone())),
        ("time".to_owned(), Value::Timestamp(now / 1000)),
        ("exchange".to_owned(), Value::Str(original.exchange.clone())),
        ("routing-keys".to_owned(), routing_keys),
    ];
    if let Some(ms) = expiration {
        entry.push(("original-expiration".to_owned(), Value::Str(ms.to_string())));
    }
    deaths.insert(0, Value::Table(entry));
    let first = !msg.props.headers.iter().any(|(k, _)| k == "x-first-death-queue");
    msg.props.headers.retain(|(k, _)| k != "x-death");
    msg.props.headers.push(("x-death".to_owned(), Value::Array(deaths)));
    if first {
        msg.props.headers.push(("x-first-death-exchange".to_owned(), Value::Str(original.exchange.clone())));
        msg.props.headers.push(("x-first-death-queue".to_owned(), Value::Str(d.config.name.clone())));
        msg.props.headers.push(("x-first-death-reason".to_owned(), Value::Str(reason.to_owned())));
    }
    msg
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::core::message::Properties;
    use crate::core::queue::QueueConfig;

    #[test]
    fn x_death_is_written_and_counted() {
        let mut config = QueueConfig::new("work", "/");
        config.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
        let config = Arc::new(config);
        let msg = Arc::new(Message {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            payload: Bytes::from_static(b"x"),
            qos: 2,
            retain: false,
            props: Properties { expiration_ms: Some(500), expires_at_ms: Some(1), ..Properties::default() },
            timestamp_ms: 0,
        });
        let once = dead_lettered(&DeadLetter {
            msg: msg.clone(),
            reason: DeathReason::Rejected,
            config: config.clone(),
            removal: Vec::new(),
        });
        assert_eq!(once.props.expiration_ms, None);
        let Some(Value::Array(deaths)) = once.props.header("x-death") else { panic!("no x-death") };
        let Value::Table(t) = &deaths[0] else { panic!() };
        let get = |k: &str| t.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("count"), Some(Value::Int(1)));
        assert_eq!(get("reason"), Some(Value::Str("rejected".into())));
        assert_eq!(get("queue"), Some(Value::Str("work".into())));
        assert_eq!(get("exchange"), Some(Value::Str("ex".into())));
        assert_eq!(get("routing-keys"), Some(Value::Array(vec![Value::Str("rk".into())])));
        assert_eq!(get("original-expiration"), Some(Value::Str("500".into())));
        assert_eq!(once.props.header("x-first-death-reason"), Some(&Value::Str("rejected".into())));
        let twice = dead_lettered(&DeadLetter {
            msg: Arc::new(once),
            reason: DeathReason::Rejected,
            config,
            removal: Vec::new(),
        });
        let Some(Value::Array(deaths)) = twice.props.header("x-death") else { panic!() };
        assert_eq!(deaths.len(), 1, "same queue and reason: one entry, counted");
        let Value::Table(t) = &deaths[0] else { panic!() };
        assert!(t.contains(&("count".to_owned(), Value::Int(2))));
        assert_eq!(twice.props.headers.iter().filter(|(k, _)| k == "x-first-death-queue").count(), 1);
    }
}

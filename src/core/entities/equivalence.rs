//! RabbitMQ's equivalence checks: a redeclaration of an existing queue or exchange must
//! name the same flags and defining arguments, else it is refused with
//! `inequivalent arg` ([`EntityError::Inequivalent`]).

use super::error::{EntityError, EntityKind};
use super::queue::QueueEntity;
use super::retry_args::RETRY_ARGUMENTS;
use crate::core::router::{ExchangeDef, ExchangeKind};
use crate::core::value::Value;

fn inequivalent(
    arg: &str,
    what: EntityKind,
    name: &str,
    vhost: &str,
    received: String,
    current: String,
) -> EntityError {
    EntityError::Inequivalent {
        arg: arg.to_owned(),
        what,
        name: name.to_owned(),
        vhost: vhost.to_owned(),
        received,
        current,
    }
}

/// Refuses a redeclaration of an exchange whose type, flags or arguments differ.
pub(crate) fn check_equivalent_exchange(
    current: &ExchangeDef,
    wanted: &ExchangeDef,
    vhost: &str,
) -> Result<(), EntityError> {
    let n = &current.name;
    if current.kind != wanted.kind {
        return Err(inequivalent(
            "type",
            EntityKind::Exchange,
            n,
            vhost,
            wanted.kind.name().into(),
            current.kind.name().into(),
        ));
    }
    if current.durable != wanted.durable {
        return Err(inequivalent(
            "durable",
            EntityKind::Exchange,
            n,
            vhost,
            wanted.durable.to_string(),
            current.durable.to_string(),
        ));
    }
    if current.auto_delete != wanted.auto_delete {
        return Err(inequivalent(
            "auto_delete",
            EntityKind::Exchange,
            n,
            vhost,
            wanted.auto_delete.to_string(),
            current.auto_delete.to_string(),
        ));
    }
    if current.internal != wanted.internal {
        return Err(inequivalent(
            "internal",
            EntityKind::Exchange,
            n,
            vhost,
            wanted.internal.to_string(),
            current.internal.to_string(),
        ));
    }
    if current.kind == ExchangeKind::DelayedMessage && current.delayed_type() != wanted.delayed_type() {
        let name = |d: &ExchangeDef| d.delayed_type().map_or("none", ExchangeKind::name).to_owned();
        return Err(inequivalent("x-delayed-type", EntityKind::Exchange, n, vhost, name(wanted), name(current)));
    }
    Ok(())
}

/// Refuses a redeclaration whose flags or defining arguments differ (406, RabbitMQ's text).
pub(crate) fn check_equivalent_queue(
    q: &QueueEntity,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    args: &[(String, Value)],
) -> Result<(), EntityError> {
    let (n, v) = (&q.name, &q.vhost);
    let current_durable = q.durable || (q.exclusive_owner.is_some() && durable);
    if current_durable != durable {
        return Err(inequivalent("durable", EntityKind::Queue, n, v, durable.to_string(), q.durable.to_string()));
    }
    if q.exclusive_owner.is_some() != exclusive {
        return Err(inequivalent(
            "exclusive",
            EntityKind::Queue,
            n,
            v,
            exclusive.to_string(),
            q.exclusive_owner.is_some().to_string(),
        ));
    }
    check_equivalent_durable_queue(n, v, (q.auto_delete, &q.arguments), (auto_delete, args))
}

/// Refuses a redeclaration of durable queue `name` whose `auto_delete` flag or defining
/// arguments (`wanted`) differ from the `current` ones (406, RabbitMQ's text). A cluster's
/// metadata group judges committed declarations with it, on records rather than queues.
pub(crate) fn check_equivalent_durable_queue(
    name: &str,
    vhost: &str,
    current: (bool, &[(String, Value)]),
    wanted: (bool, &[(String, Value)]),
) -> Result<(), EntityError> {
    let (n, v) = (name, vhost);
    let (auto_delete, args) = wanted;
    if current.0 != auto_delete {
        return Err(inequivalent(
            "auto_delete",
            EntityKind::Queue,
            n,
            v,
            auto_delete.to_string(),
            current.0.to_string(),
        ));
    }
    // Arguments that define the queue must match (RabbitMQ compares the x- arguments it knows).
    for key in [
        "x-message-ttl",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-overflow",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-priority",
        "x-queue-type",
        "x-single-active-consumer",
        "x-delivery-limit",
        "x-max-age",
    ]
    .into_iter()
    .chain(RETRY_ARGUMENTS)
    {
        let get = |t: &[(String, Value)]| t.iter().find(|(k, _)| k == key).map(|(_, v)| v.to_text());
        let (wanted, current) = (get(args), get(current.1));
        let defaulted_type =
            key == "x-queue-type" && wanted.as_deref().unwrap_or("classic") == current.as_deref().unwrap_or("classic");
        if wanted != current && !defaulted_type {
            return Err(inequivalent(
                key,
                EntityKind::Queue,
                n,
                v,
                wanted.unwrap_or_else(|| "none".into()),
                current.unwrap_or_else(|| "none".into()),
            ));
        }
    }
    Ok(())
}

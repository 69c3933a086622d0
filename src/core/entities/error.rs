//! Why an entity operation is refused: one typed error for every entry point, whose text
//! is RabbitMQ's reply text. Each front-end maps it to its own answer (the AMQP reply code
//! and whether the channel or the connection closes; the management API's HTTP status).

use std::fmt;

use super::arguments::ArgumentError;
use crate::core::router::RouteError;
use crate::core::store::StoreError;

/// What kind of entity an error names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityKind {
    /// A queue (or stream).
    Queue,
    /// An exchange.
    Exchange,
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntityKind::Queue => "queue",
            EntityKind::Exchange => "exchange",
        })
    }
}

/// A refused declaration, deletion or binding, displayed as RabbitMQ's reply text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntityError {
    /// The queue or exchange does not exist (AMQP 404).
    #[error("NOT_FOUND - no {what} '{name}' in vhost '{vhost}'")]
    NotFound {
        /// Queue or exchange.
        what: EntityKind,
        /// Its name.
        name: String,
        /// Its virtual host.
        vhost: String,
    },
    /// A redeclaration whose flag or defining argument `arg` differs from the entity's (AMQP 406).
    #[error(
        "PRECONDITION_FAILED - inequivalent arg '{arg}' for {what} '{name}' in vhost '{vhost}': \
         received '{received}' but current is '{current}'"
    )]
    Inequivalent {
        /// The flag or argument that differs (`durable`, `x-message-ttl`, ...).
        arg: String,
        /// Queue or exchange.
        what: EntityKind,
        /// Its name.
        name: String,
        /// Its virtual host.
        vhost: String,
        /// The value the redeclaration asked for (`none` when absent).
        received: String,
        /// The entity's value (`none` when absent).
        current: String,
    },
    /// The virtual host holds its `max-queues` already (AMQP 406).
    #[error(
        "PRECONDITION_FAILED - cannot declare queue '{name}': queue limit in vhost '{vhost}' ({limit}) is reached"
    )]
    QueueLimit {
        /// The queue that was not declared.
        name: String,
        /// Its virtual host.
        vhost: String,
        /// The virtual host's limit.
        limit: u64,
    },
    /// Queue arguments or properties refused (AMQP 406).
    #[error(transparent)]
    InvalidArgument(#[from] ArgumentError),
    /// A deletion `if-unused` of an entity in use (AMQP 406).
    #[error("PRECONDITION_FAILED - {what} '{name}' in vhost '{vhost}' in use")]
    InUse {
        /// Queue or exchange.
        what: EntityKind,
        /// Its name.
        name: String,
        /// Its virtual host.
        vhost: String,
    },
    /// The virtual host does not exist (AMQP closes the connection with 530).
    #[error("NOT_ALLOWED - vhost {0} not found")]
    NoVhost(String),
    /// The routing table refused an exchange's or a binding's arguments or key (AMQP 406).
    #[error("PRECONDITION_FAILED - {0}")]
    Route(RouteError),
    /// The durable record could not be written (AMQP closes the connection with 541).
    #[error("INTERNAL_ERROR - {0}")]
    Storage(StoreError),
}

impl From<StoreError> for EntityError {
    /// A change a cluster's metadata group refused as itself ([`StoreError::Refused`]);
    /// any other store failure as [`EntityError::Storage`].
    fn from(e: StoreError) -> EntityError {
        match e {
            StoreError::Refused(refusal) => *refusal,
            other => EntityError::Storage(other),
        }
    }
}

impl From<RouteError> for EntityError {
    /// A missing exchange or virtual host as such; the routing table's other refusals
    /// (arguments, key lengths) as [`EntityError::Route`].
    fn from(e: RouteError) -> EntityError {
        match e {
            RouteError::NoExchange(name, vhost) => EntityError::NotFound { what: EntityKind::Exchange, name, vhost },
            RouteError::NoVhost(vhost) => EntityError::NoVhost(vhost),
            other => EntityError::Route(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_rabbitmqs() {
        let e = EntityError::Inequivalent {
            arg: "durable".into(),
            what: EntityKind::Queue,
            name: "q".into(),
            vhost: "/".into(),
            received: "true".into(),
            current: "false".into(),
        };
        assert_eq!(
            e.to_string(),
            "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
        );
        let missing = EntityError::from(RouteError::NoExchange("x".into(), "v".into()));
        assert_eq!(missing.to_string(), "NOT_FOUND - no exchange 'x' in vhost 'v'");
        assert_eq!(EntityError::from(RouteError::NoVhost("v".into())).to_string(), "NOT_ALLOWED - vhost v not found");
        assert_eq!(
            EntityError::from(RouteError::BindingKeyTooLong(300)).to_string(),
            "PRECONDITION_FAILED - binding key of 300 words: a topic exchange takes at most 256"
        );
        let limit = EntityError::QueueLimit { name: "q".into(), vhost: "/".into(), limit: 2 };
        assert_eq!(
            limit.to_string(),
            "PRECONDITION_FAILED - cannot declare queue 'q': queue limit in vhost '/' (2) is reached"
        );
        let in_use = EntityError::InUse { what: EntityKind::Exchange, name: "x".into(), vhost: "/".into() };
        assert_eq!(in_use.to_string(), "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use");
    }
}

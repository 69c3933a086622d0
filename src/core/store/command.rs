//! [`Command`]: one change to durable state, by kind. Each kind's commands are defined
//! with the store that reads that state back ([`EntityCommand`], [`AccessCommand`],
//! [`SessionCommand`], [`DedupCommand`]); the small kinds the core writes for itself
//! (a retained message set or removed, a stream group's cursor) are here.

use super::{AccessCommand, DedupCommand, EntityCommand, QueueId, SessionCommand};
use crate::core::stream::group::GroupCursor;

/// One change to durable state, applied by the [`StateMachine`](super::StateMachine) in
/// the order of its batch ([`StoreWrite`](super::StoreWrite)). A command says what
/// changes, never how it is stored, so that a replicated log can carry it and every
/// replica can apply it to the same effect.
#[derive(Debug, Clone)]
pub enum Command {
    /// Exchanges, queues and bindings.
    Entity(EntityCommand),
    /// Users, virtual hosts, permissions, rules, parameters, limits.
    Access(AccessCommand),
    /// Persistent MQTT sessions and their inbound QoS 2 packet ids.
    Session(SessionCommand),
    /// Publisher de-duplication ids.
    Dedup(DedupCommand),
    /// The retained message of a topic (its routing key) is removed. (On a single node a
    /// retained message is stored by the publish that carries it, with its body.)
    ClearRetained {
        /// The topic, as its routing key.
        topic: String,
    },
    /// `message` becomes the retained message of its topic (its routing key): a cluster
    /// member's retained publish, which the metadata group applies on every member.
    SetRetained {
        /// The message, body included.
        message: crate::core::message::SharedMessage,
    },
    /// A stream consumer group's cursor is stored (replacing the one it had).
    SetGroupCursor {
        /// The stream.
        stream: QueueId,
        /// The group.
        group: String,
        /// Its progress.
        cursor: GroupCursor,
    },
    /// Every consumer group cursor of a stream is forgotten (the stream is deleted).
    ForgetGroupCursors {
        /// The stream.
        stream: QueueId,
    },
}

impl From<EntityCommand> for Command {
    fn from(c: EntityCommand) -> Command {
        Command::Entity(c)
    }
}

impl From<AccessCommand> for Command {
    fn from(c: AccessCommand) -> Command {
        Command::Access(c)
    }
}

impl From<SessionCommand> for Command {
    fn from(c: SessionCommand) -> Command {
        Command::Session(c)
    }
}

impl From<DedupCommand> for Command {
    fn from(c: DedupCommand) -> Command {
        Command::Dedup(c)
    }
}

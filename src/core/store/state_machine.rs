//! The state machine: where every [`Command`] is applied, in one order. [`StateMachine`]
//! is the seam a replicated log implements (replicate the batch, apply it on every
//! replica, answer once a majority holds it); [`JournalStore`] is the single-node one,
//! which turns each batch into one journal submission.

use std::fmt;

use ferrymq_storage::Op;
use futures_util::future::BoxFuture;

use super::{access, dedup, entities, sessions, Command, JournalStore, StoreError, StoreWrite};
use crate::core::stream::group;

/// How long [`StateMachine::apply`] waits for a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Until it is durable under the fsync policy.
    Durable,
    /// Until it is queued behind every earlier submission: it becomes durable with the
    /// next group commit, and anything submitted later is applied after it.
    Queued,
    /// Until it is queued, without asking for an fsync (state that a power loss may take
    /// back harmlessly, e.g. forgetting expired ids).
    Relaxed,
}

/// Applies batches of commands: each batch's commands in order, batches in the order
/// they are submitted, all of a batch or none of it.
pub trait StateMachine: fmt::Debug + Send + Sync {
    /// Applies `write`, resolving as `wait` says; an error means none of it was applied.
    fn apply(&self, write: StoreWrite, wait: Commit) -> BoxFuture<'_, Result<(), StoreError>>;
}

impl StateMachine for JournalStore {
    fn apply(&self, write: StoreWrite, wait: Commit) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let ops = self.ops(write).await?;
            if ops.is_empty() {
                return Ok(());
            }
            match wait {
                Commit::Durable => self.journal.write(ops).await.map(drop)?,
                Commit::Queued => self.journal.submit(ops, None).await?,
                Commit::Relaxed => self.journal.submit_relaxed(ops, None).await?,
            }
            Ok(())
        })
    }
}

impl JournalStore {
    /// The journal operations of `write`'s commands, in order (what the single-node state
    /// machine submits). Removals of queues and exchanges read the binding records they
    /// take with them first, off the runtime's workers.
    pub(crate) async fn ops(&self, write: StoreWrite) -> Result<Vec<Op>, StoreError> {
        let mut ops = Vec::with_capacity(write.commands().len());
        for command in write.into_commands() {
            match &command {
                Command::Entity(c) if c.reads() => ops.extend(self.entity_ops(c).await?),
                _ => command_ops(&command, &mut ops),
            }
        }
        Ok(ops)
    }

    /// [`JournalStore::ops`] for a batch that reads nothing first (what goes along with a
    /// publish: inbound QoS 2 ids, de-duplication ids); `None` when a command would read.
    pub(crate) fn ops_now(write: &StoreWrite) -> Option<Vec<Op>> {
        let mut ops = Vec::with_capacity(write.commands().len());
        for command in write.commands() {
            if matches!(command, Command::Entity(c) if c.reads()) {
                return None;
            }
            command_ops(command, &mut ops);
        }
        Some(ops)
    }
}

/// The journal operations of a command that reads nothing first, appended to `ops`.
pub(crate) fn command_ops(command: &Command, ops: &mut Vec<Op>) {
    match command {
        Command::Entity(c) => ops.extend(entities::ops_without_reads(c)),
        Command::Access(c) => ops.extend(access::ops(c)),
        Command::Session(c) => ops.extend(sessions::ops(c)),
        Command::Dedup(c) => ops.extend(dedup::ops(c)),
        Command::ClearRetained { topic } => ops.push(Op::DeleteRetained { topic: topic.clone() }),
        Command::SetRetained { message } => ops.push(Op::Append(ferrymq_storage::Append {
            record: ferrymq_storage::Record { header: message.encode_header(), body: message.payload.clone() },
            queues: Vec::new(),
            retained_topic: Some(message.routing_key.clone()),
            timer: None,
            keys: None,
        })),
        Command::SetGroupCursor { stream, group, cursor } => ops.push(group::store_cursor(*stream, group, cursor)),
        Command::ForgetGroupCursors { stream } => ops.push(group::forget_cursors(*stream)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::open;
    use super::*;
    use crate::core::store::{SessionCommand, StoredSession};

    #[test]
    fn a_batch_is_applied_in_order() {
        let (_dir, _journal, stores) = open();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let session =
            StoredSession { queue: 1, expiry_secs: 5, subscriptions: Default::default(), disconnected_at_ms: None };
        // Saved, removed, saved again: the last command wins because order is kept.
        let write = stores
            .sessions
            .save("c", &session)
            .and(stores.sessions.remove("c"))
            .and(StoreWrite::one(SessionCommand::Save { client_id: "d".into(), session: session.clone() }));
        assert!(JournalStore::ops_now(&write).is_some(), "sessions read nothing first");
        rt.block_on(stores.state.apply(write, Commit::Durable)).unwrap();
        assert!(!rt.block_on(stores.sessions.exists("c")).unwrap());
        assert!(rt.block_on(stores.sessions.exists("d")).unwrap());
        let removal = stores.entities.remove_queue("/", "q", super::super::QueueId(3));
        assert!(JournalStore::ops_now(&removal).is_none(), "a queue's removal reads its bindings first");
    }
}

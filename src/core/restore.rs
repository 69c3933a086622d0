//! What start-up reads back from the data directory, all of it before anything is applied
//! or cleaned up, and why it refuses to start: a [`RestoreError`] naming the kind of
//! record and its key.
//!
//! [`load`] reads every record restored at start-up — users, virtual hosts, permissions,
//! rules, parameters and limits; MQTT sessions; exchanges, queues and bindings;
//! de-duplication values; retained messages with their commit-log records — and checks
//! the core's own keyspaces that queue and stream owners read later (retry records and
//! delivery watermarks, stream group cursors, timers, queue names). It only reads: a
//! record that cannot be read or decoded stops start-up before anything was written, so
//! the data directory is left as it was, to be restored from a backup. Nothing is skipped
//! or replaced by a default: a record left out would let a deleted user come back from
//! the configuration, or have its session's queues deleted as orphans.
//!
//! The front-ends check what only they can decode (shared-subscription filters, password
//! hashes, queue arguments) with the same error before they apply anything.

use std::fmt;

use ferrymq_storage::{Journal, JournalError, Space};

use super::message::Message;
use super::retry;
use super::store::{AccessRecords, EntityRecords, StoredSession, Stores};
use super::stream::group::GroupCursor;

/// Timers checked per read of the timer index.
const TIMER_PAGE: usize = 4096;

/// The kind of stored record a [`RestoreError`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A user (or its tombstone).
    User,
    /// A virtual host (or its tombstone).
    Vhost,
    /// A user's permissions in a virtual host.
    Permission,
    /// A user's topic permissions on an exchange.
    TopicPermission,
    /// The MQTT rules set through the management API.
    MqttRules,
    /// A runtime parameter (a shovel's definition).
    Parameter,
    /// The limits of a virtual host or a user.
    Limits,
    /// A global parameter (`cluster_name`).
    GlobalParameter,
    /// A durable exchange.
    Exchange,
    /// A durable queue.
    Queue,
    /// A durable binding.
    Binding,
    /// A de-duplication value of a disk-persistent exchange.
    DedupValue,
    /// A persistent MQTT session.
    MqttSession,
    /// A shared subscription (`$share/{group}/{filter}`) of a persistent MQTT session.
    SharedSubscription,
    /// An inbound QoS 2 packet id of a persistent MQTT session.
    InboundQos2,
    /// An entry of the retained-message index.
    RetainedIndex,
    /// The commit-log record of a retained message.
    RetainedMessage,
    /// A timer (a delayed message or a retry).
    Timer,
    /// The retry record of a queue entry.
    RetryRecord,
    /// A queue's delivery watermark.
    DeliveryWatermark,
    /// The committed offset of a stream consumer group.
    StreamGroupCursor,
    /// The name of a consume queue.
    QueueName,
    /// An entry of another of the journal's indexes.
    JournalIndex,
    /// A record of the commit log (a message body or a batch's changes).
    LogRecord,
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordKind::User => "user",
            RecordKind::Vhost => "virtual host",
            RecordKind::Permission => "permission",
            RecordKind::TopicPermission => "topic permission",
            RecordKind::MqttRules => "MQTT rules",
            RecordKind::Parameter => "runtime parameter",
            RecordKind::Limits => "limits",
            RecordKind::GlobalParameter => "global parameter",
            RecordKind::Exchange => "exchange",
            RecordKind::Queue => "queue",
            RecordKind::Binding => "binding",
            RecordKind::DedupValue => "de-duplication value",
            RecordKind::MqttSession => "MQTT session",
            RecordKind::SharedSubscription => "shared subscription of an MQTT session",
            RecordKind::InboundQos2 => "inbound QoS 2 packet id",
            RecordKind::RetainedIndex => "retained message index",
            RecordKind::RetainedMessage => "retained message",
            RecordKind::Timer => "timer",
            RecordKind::RetryRecord => "retry",
            RecordKind::DeliveryWatermark => "delivery watermark",
            RecordKind::StreamGroupCursor => "stream consumer group cursor",
            RecordKind::QueueName => "queue name",
            RecordKind::JournalIndex => "journal index",
            RecordKind::LogRecord => "commit-log",
        })
    }
}

/// A stored key in printable form: text as it is, other bytes escaped (`\x00`), quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordKey(String);

impl RecordKey {
    /// The key's bytes, escaped where not printable ASCII.
    pub fn bytes(key: &[u8]) -> RecordKey {
        RecordKey(key.escape_ascii().to_string())
    }

    /// A key described in words (for binary keys such as a timer's).
    pub fn text(description: impl Into<String>) -> RecordKey {
        RecordKey(description.into())
    }
}

impl fmt::Display for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

/// Why state stored in the data directory cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// The journal failed to read the records (sled, a commit-log record's checksum, I/O).
    #[error("the {kind} record {key} cannot be read: {error}")]
    Unreadable {
        /// What was being read.
        kind: RecordKind,
        /// Its key (or the prefix of the keys being read).
        key: RecordKey,
        /// What the journal said.
        error: JournalError,
    },
    /// A record was read but is not one this build wrote or can use.
    #[error("the {kind} record {key} cannot be decoded: {reason}")]
    Undecodable {
        /// What the record is.
        kind: RecordKind,
        /// Its key.
        key: RecordKey,
        /// What is wrong with it.
        reason: String,
    },
}

impl RestoreError {
    /// A record that does not decode.
    pub fn undecodable(kind: RecordKind, key: RecordKey, reason: impl Into<String>) -> RestoreError {
        RestoreError::Undecodable { kind, key, reason: reason.into() }
    }

    /// A failed read of the records of `kind` under `key` (a key or a prefix); an entry
    /// of one of the journal's own indexes that does not decode is named by its key.
    pub fn unreadable(kind: RecordKind, key: &[u8], error: JournalError) -> RestoreError {
        match error {
            JournalError::Malformed { tree, key } => RestoreError::malformed_index(tree, &key),
            error => RestoreError::Unreadable { kind, key: RecordKey::bytes(key), error },
        }
    }

    /// A commit-log record below the end the last clean stop recorded that does not read
    /// back (the journal refused to open rather than cut it away).
    pub fn damaged_log(pos: u64) -> RestoreError {
        RestoreError::Undecodable {
            kind: RecordKind::LogRecord,
            key: RecordKey::text(format!("at log position {pos}")),
            reason: "it lies below the end of the log the last clean stop recorded, and does not read back \
                     (damaged or cut short since); nothing was cut"
                .into(),
        }
    }

    /// An entry of the journal's index `tree` (sled) that does not decode.
    pub fn malformed_index(tree: &str, key: &[u8]) -> RestoreError {
        let kind = match tree {
            "retained" => RecordKind::RetainedIndex,
            "timer" => RecordKind::Timer,
            "queue_names" => RecordKind::QueueName,
            _ => RecordKind::JournalIndex,
        };
        let reason = format!("malformed entry in the journal's `{tree}` index");
        RestoreError::Undecodable { kind, key: RecordKey::bytes(key), reason }
    }

    /// The kind of record.
    pub fn kind(&self) -> RecordKind {
        match self {
            RestoreError::Unreadable { kind, .. } | RestoreError::Undecodable { kind, .. } => *kind,
        }
    }
}

/// Everything restored at start-up, read and decoded.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    /// Users, virtual hosts, permissions, rules, parameters, limits.
    pub access: AccessRecords,
    /// Persistent MQTT sessions by client id.
    pub sessions: Vec<(String, StoredSession)>,
    /// Durable exchanges, queues and bindings.
    pub entities: EntityRecords,
    /// De-duplication values: scope, id, expiry (ms).
    pub dedup: Vec<(String, String, u64)>,
    /// Retained messages by topic (as its routing key).
    pub retained: Vec<(String, Message)>,
}

/// Reads and decodes everything start-up restores, and checks the keyspaces the queue
/// and stream owners read later; writes nothing. The stores' records are read through
/// their (asynchronous) reads; the commit-log records of retained messages and the
/// keyspaces only checked here are read in full on the blocking pool.
pub(crate) async fn load(journal: &Journal) -> Result<Stored, RestoreError> {
    let stores = Stores::local(journal);
    let access = stores.access.load().await?;
    let sessions = stores.sessions.load().await?;
    let entities = stores.entities.load().await?;
    let dedup = stores.dedup.load().await?;
    let journal = journal.clone();
    let checked = crate::core::blocking::spawn(move || {
        let retained = retained(&journal)?;
        journal.queues().map_err(|e| RestoreError::unreadable(RecordKind::QueueName, b"", e))?;
        check_retry_space(&journal)?;
        check_cursors(&journal)?;
        check_timers(&journal)?;
        Ok::<_, RestoreError>(retained)
    })
    .await;
    // The blocking task itself failing (it panicked) says nothing of one record: an index.
    let retained = checked.map_err(|e| {
        RestoreError::unreadable(RecordKind::JournalIndex, b"", ferrymq_storage::JournalError::Io(e.to_string()))
    })??;
    Ok(Stored { access, sessions, entities, dedup, retained })
}

/// Every retained message, its commit-log record read and decoded.
fn retained(journal: &Journal) -> Result<Vec<(String, Message)>, RestoreError> {
    let index = journal.retained().map_err(|e| RestoreError::unreadable(RecordKind::RetainedIndex, b"", e))?;
    let mut messages = Vec::with_capacity(index.len());
    for (topic, pos) in index {
        let record = journal
            .read(pos)
            .map_err(|e| RestoreError::unreadable(RecordKind::RetainedMessage, topic.as_bytes(), e))?;
        let msg = Message::decode(record.header, record.body).map_err(|e| {
            RestoreError::undecodable(
                RecordKind::RetainedMessage,
                RecordKey::bytes(topic.as_bytes()),
                format!("the record at log position {} does not decode: {e}", pos.0),
            )
        })?;
        messages.push((topic, msg));
    }
    Ok(messages)
}

/// Every key of the retry keyspace: retry records, delivery watermarks and the marker
/// that the directory stores watermarks (see [`retry`]).
fn check_retry_space(journal: &Journal) -> Result<(), RestoreError> {
    let all = journal.scan(Space::Retry, b"").map_err(|e| RestoreError::unreadable(RecordKind::RetryRecord, b"", e))?;
    for (key, value) in all {
        let (kind, ok) = match key.len() {
            16 => (RecordKind::RetryRecord, retry::decode_record(&key, &value).is_some()),
            9 if key[8] == b'w' => (RecordKind::DeliveryWatermark, value.len() == 8),
            _ if &key[..] == retry::WATERMARKS_COMPLETE => continue,
            _ => (RecordKind::RetryRecord, false),
        };
        if !ok {
            let reason = format!("a value of {} bytes under a key of {} bytes", value.len(), key.len());
            return Err(RestoreError::undecodable(kind, RecordKey::bytes(&key), reason));
        }
    }
    Ok(())
}

/// Every stream consumer group's cursor.
fn check_cursors(journal: &Journal) -> Result<(), RestoreError> {
    let all = journal
        .scan(Space::Cursor, b"")
        .map_err(|e| RestoreError::unreadable(RecordKind::StreamGroupCursor, b"", e))?;
    for (key, value) in all {
        if key.len() < 8 || GroupCursor::decode(&value).is_none() {
            let reason = format!("not a stream id and a committed offset ({} bytes)", value.len());
            return Err(RestoreError::undecodable(RecordKind::StreamGroupCursor, RecordKey::bytes(&key), reason));
        }
    }
    Ok(())
}

/// Every timer: its index entry, and a target that names a virtual host (a delayed
/// message) or a queue entry (a retry).
fn check_timers(journal: &Journal) -> Result<(), RestoreError> {
    let mut after = None;
    loop {
        let page =
            journal.timers_after(after, TIMER_PAGE).map_err(|e| RestoreError::unreadable(RecordKind::Timer, b"", e))?;
        for t in &page {
            let ok = match retry::is_tagged(&t.target) {
                true => retry::decode_target(&t.target).is_some(),
                false => std::str::from_utf8(&t.target).is_ok(),
            };
            if !ok {
                let key = RecordKey::text(format!("due at {} ms, log position {}", t.due_ms, t.pos.0));
                let reason =
                    format!("its target ({}) is neither a virtual host nor a queue entry", t.target.escape_ascii());
                return Err(RestoreError::undecodable(RecordKind::Timer, key, reason));
            }
        }
        match page.last() {
            Some(t) if page.len() == TIMER_PAGE => after = Some((t.due_ms, t.pos)),
            _ => return Ok(()),
        }
    }
}

//! The committed catalogue: the durable queues and exchanges the metadata group has
//! committed, as every member's state machine holds them. Each entry's commands are judged
//! against it, in log order, before they are applied: a redeclaration that differs from
//! one committed before it, or a binding whose queue or exchange was deleted before it, is
//! refused, and nothing of its entry is applied. The judgement reads only committed state
//! (never a member's memory, which also holds its transient entities), so every member
//! reaches the same verdict; the member that proposed the entry reads it from
//! [`Refusals`] once it applied the entry, and answers its client with it.
//!
//! Kept in the state machine's tree beside the applied log id and written with it in one
//! batch, so that an entry applied again after a crash is judged against the same state.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::metadata::{untable, MetaCommand};
use crate::core::entities::{check_equivalent_durable_queue, check_equivalent_exchange, EntityError, EntityKind};
use crate::core::router::{ExchangeDef, ExchangeKind, STANDARD_EXCHANGES};
use crate::core::store::AccessCommand;

/// The first byte of a catalogue key in the state machine's tree.
const PREFIX: u8 = 1;

/// A committed durable queue or exchange, as its declaration gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Declared {
    /// A queue: `auto-delete` and its arguments (an AMQP field table).
    Queue { auto_delete: bool, arguments: Vec<u8> },
    /// An exchange: its type, flags and arguments.
    Exchange { kind: String, auto_delete: bool, internal: bool, arguments: Vec<u8> },
}

/// Whether a key names a queue or an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Kind {
    Queue,
    Exchange,
}

/// A catalogue entry's key: what, virtual host, name.
type Key = (Kind, String, String);

/// The committed durable queues and exchanges.
#[derive(Debug, Default)]
pub(super) struct Catalogue {
    entries: BTreeMap<Key, Declared>,
    /// Keys changed since they were last written.
    changed: BTreeSet<Key>,
}

impl Catalogue {
    /// The catalogue kept in `tree`. Blocking (start-up).
    pub(super) fn load(tree: &sled::Tree) -> Result<Catalogue, String> {
        let mut entries = BTreeMap::new();
        for item in tree.scan_prefix([PREFIX]) {
            let (key, value) = item.map_err(|e| e.to_string())?;
            let key: Key = serde_json::from_slice(&key[1..]).map_err(|e| format!("catalogue key undecodable: {e}"))?;
            let value = serde_json::from_slice(&value).map_err(|e| format!("catalogue entry undecodable: {e}"))?;
            entries.insert(key, value);
        }
        Ok(Catalogue { entries, changed: BTreeSet::new() })
    }

    /// Judges one entry's `commands` in order and, when every one is accepted, records
    /// their effect; the first refusal otherwise (and nothing recorded).
    pub(super) fn judge(&mut self, commands: &[MetaCommand]) -> Result<(), EntityError> {
        let mut undo = Vec::new();
        for command in commands {
            if let Err(refusal) = self.judge_one(command, &mut undo) {
                for (key, before) in undo.into_iter().rev() {
                    match before {
                        Some(d) => self.entries.insert(key, d),
                        None => self.entries.remove(&key),
                    };
                }
                return Err(refusal);
            }
        }
        self.changed.extend(undo.into_iter().map(|(key, _)| key));
        Ok(())
    }

    /// Adds the changes made since the last call to `batch`.
    pub(super) fn write_changes(&mut self, batch: &mut sled::Batch) {
        for key in std::mem::take(&mut self.changed) {
            let mut k = vec![PREFIX];
            k.extend(serde_json::to_vec(&key).expect("a tuple of strings encodes"));
            match self.entries.get(&key) {
                Some(d) => batch.insert(k, serde_json::to_vec(d).expect("plain data encodes")),
                None => batch.remove(k),
            }
        }
    }

    fn judge_one(&mut self, command: &MetaCommand, undo: &mut Vec<(Key, Option<Declared>)>) -> Result<(), EntityError> {
        match command {
            MetaCommand::PutQueue { vhost, name, auto_delete, arguments } => {
                let key = (Kind::Queue, vhost.clone(), name.clone());
                if let Some(Declared::Queue { auto_delete: current, arguments: current_args }) = self.entries.get(&key)
                {
                    // Arguments are this module's own encoding; an undecodable table fails
                    // the entry's application after this, on every member alike.
                    let (current_args, args) =
                        (untable(current_args).unwrap_or_default(), untable(arguments).unwrap_or_default());
                    return check_equivalent_durable_queue(
                        name,
                        vhost,
                        (*current, &current_args),
                        (*auto_delete, &args),
                    );
                }
                let declared = Declared::Queue { auto_delete: *auto_delete, arguments: arguments.clone() };
                self.set(key, Some(declared), undo);
            }
            MetaCommand::RemoveQueue { vhost, name } => {
                self.set((Kind::Queue, vhost.clone(), name.clone()), None, undo)
            }
            MetaCommand::PutExchange { vhost, name, kind, auto_delete, internal, arguments } => {
                let key = (Kind::Exchange, vhost.clone(), name.clone());
                if let Some(current) = self.entries.get(&key) {
                    let (Some(current), Some(wanted)) =
                        (exchange_def(name, current), exchange_def(name, &command_declared(command)))
                    else {
                        return Ok(());
                    };
                    return check_equivalent_exchange(&current, &wanted, vhost);
                }
                let declared = Declared::Exchange {
                    kind: kind.clone(),
                    auto_delete: *auto_delete,
                    internal: *internal,
                    arguments: arguments.clone(),
                };
                self.set(key, Some(declared), undo);
            }
            MetaCommand::RemoveExchange { vhost, name } => {
                self.set((Kind::Exchange, vhost.clone(), name.clone()), None, undo)
            }
            MetaCommand::Binding { put: true, vhost, exchange, to_queue, destination, .. } => {
                let missing =
                    |what, name: &str| EntityError::NotFound { what, name: name.to_owned(), vhost: vhost.clone() };
                if !self.has_exchange(vhost, exchange) {
                    return Err(missing(EntityKind::Exchange, exchange));
                }
                match to_queue {
                    true if !self.entries.contains_key(&(Kind::Queue, vhost.clone(), destination.clone())) => {
                        return Err(missing(EntityKind::Queue, destination));
                    }
                    false if !self.has_exchange(vhost, destination) => {
                        return Err(missing(EntityKind::Exchange, destination));
                    }
                    _ => {}
                }
            }
            MetaCommand::Binding { put: false, .. } => {}
            MetaCommand::Access(AccessCommand::RemoveVhost { name }) => self.forget_vhost(name, undo),
            MetaCommand::Access(AccessCommand::PutVhost(record)) if record.deleted => {
                self.forget_vhost(&record.name, undo)
            }
            MetaCommand::Access(_) => {}
        }
        Ok(())
    }

    /// Sets (or removes) `key`, remembering what it was.
    fn set(&mut self, key: Key, to: Option<Declared>, undo: &mut Vec<(Key, Option<Declared>)>) {
        let before = match to {
            Some(d) => self.entries.insert(key.clone(), d),
            None => self.entries.remove(&key),
        };
        undo.push((key, before));
    }

    /// Forgets every queue and exchange of virtual host `vhost`.
    fn forget_vhost(&mut self, vhost: &str, undo: &mut Vec<(Key, Option<Declared>)>) {
        let keys: Vec<Key> = self.entries.keys().filter(|(_, v, _)| v == vhost).cloned().collect();
        for key in keys {
            self.set(key, None, undo);
        }
    }

    /// Exchange `name` of `vhost` is committed, or is one every virtual host has.
    fn has_exchange(&self, vhost: &str, name: &str) -> bool {
        STANDARD_EXCHANGES.iter().any(|(x, _)| *x == name)
            || self.entries.contains_key(&(Kind::Exchange, vhost.to_owned(), name.to_owned()))
    }
}

/// What an exchange declaration declares.
fn command_declared(command: &MetaCommand) -> Declared {
    match command {
        MetaCommand::PutExchange { kind, auto_delete, internal, arguments, .. } => Declared::Exchange {
            kind: kind.clone(),
            auto_delete: *auto_delete,
            internal: *internal,
            arguments: arguments.clone(),
        },
        _ => unreachable!("only exchange declarations are compared as exchanges"),
    }
}

/// Exchange `name` as the routing table defines it (`None` for a type no member knows: its
/// application fails on every member alike).
fn exchange_def(name: &str, declared: &Declared) -> Option<ExchangeDef> {
    let Declared::Exchange { kind, auto_delete, internal, arguments } = declared else {
        return None;
    };
    Some(ExchangeDef {
        name: name.to_owned(),
        kind: ExchangeKind::parse(kind)?,
        durable: true,
        auto_delete: *auto_delete,
        internal: *internal,
        arguments: untable(arguments).unwrap_or_default(),
    })
}

/// Refusals of entries by log index, kept (the latest [`Refusals::KEPT`]) for the member
/// that proposed an entry to read once it applied it.
#[derive(Debug, Default)]
pub(super) struct Refusals(parking_lot::Mutex<BTreeMap<u64, EntityError>>);

impl Refusals {
    /// How many refusals are kept: far more than writes wait at once.
    const KEPT: usize = 4096;

    /// Records that the entry at `index` was refused.
    pub(super) fn record(&self, index: u64, refusal: EntityError) {
        let mut kept = self.0.lock();
        kept.insert(index, refusal);
        while kept.len() > Self::KEPT {
            kept.pop_first();
        }
    }

    /// Why the entry at `index` was refused, if it was.
    pub(super) fn take(&self, index: u64) -> Option<EntityError> {
        self.0.lock().remove(&index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::VhostRecord;

    fn queue(name: &str, ttl: Option<i64>) -> MetaCommand {
        let args: Vec<(String, crate::core::value::Value)> =
            ttl.map(|t| ("x-message-ttl".to_owned(), crate::core::value::Value::Int(t))).into_iter().collect();
        let mut b = bytes::BytesMut::new();
        crate::core::value::encode_table(&args, &mut b);
        MetaCommand::PutQueue { vhost: "/".into(), name: name.into(), auto_delete: false, arguments: b.to_vec() }
    }

    fn bind(queue: &str) -> MetaCommand {
        MetaCommand::Binding {
            put: true,
            vhost: "/".into(),
            exchange: "amq.topic".into(),
            to_queue: true,
            destination: queue.into(),
            key: "k".into(),
            arguments: vec![],
        }
    }

    #[test]
    fn a_differing_redeclaration_is_refused_and_the_first_stays() {
        let mut c = Catalogue::default();
        c.judge(&[queue("q", Some(1000))]).unwrap();
        c.judge(&[queue("q", Some(1000))]).expect("the same declaration again is accepted");
        let refused = c.judge(&[queue("q", Some(2000))]).unwrap_err();
        assert!(matches!(&refused, EntityError::Inequivalent { arg, .. } if arg == "x-message-ttl"), "{refused}");
        assert!(refused.to_string().starts_with("PRECONDITION_FAILED - inequivalent arg 'x-message-ttl'"), "{refused}");
        c.judge(&[queue("q", Some(1000))]).expect("the first declaration stayed");
    }

    #[test]
    fn a_binding_after_its_queue_was_deleted_is_refused_with_nothing_of_its_entry() {
        let mut c = Catalogue::default();
        c.judge(&[queue("q", None), bind("q")]).unwrap();
        c.judge(&[MetaCommand::RemoveQueue { vhost: "/".into(), name: "q".into() }]).unwrap();
        let refused = c.judge(&[queue("other", None), bind("q")]).unwrap_err();
        assert_eq!(refused.to_string(), "NOT_FOUND - no queue 'q' in vhost '/'");
        // The refused entry's first command was taken back with it.
        assert!(c.judge(&[bind("other")]).is_err());
        let missing_exchange = MetaCommand::Binding {
            put: true,
            vhost: "/".into(),
            exchange: "nowhere".into(),
            to_queue: true,
            destination: "q".into(),
            key: "k".into(),
            arguments: vec![],
        };
        c.judge(&[queue("q", None)]).unwrap();
        assert!(matches!(c.judge(&[missing_exchange]), Err(EntityError::NotFound { what: EntityKind::Exchange, .. })));
    }

    #[test]
    fn a_deleted_vhost_takes_its_entities_and_the_catalogue_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let tree = db.open_tree("t").unwrap();
        let mut c = Catalogue::default();
        c.judge(&[queue("a", None), queue("b", Some(5))]).unwrap();
        let tombstone = VhostRecord { name: "/".into(), description: String::new(), tags: vec![], deleted: true };
        c.judge(&[MetaCommand::Access(AccessCommand::PutVhost(tombstone))]).unwrap();
        c.judge(&[queue("b", Some(6))]).expect("declared anew after its vhost went");
        let mut batch = sled::Batch::default();
        c.write_changes(&mut batch);
        tree.apply_batch(batch).unwrap();
        let mut reloaded = Catalogue::load(&tree).unwrap();
        assert!(reloaded.judge(&[bind("a")]).is_err(), "a went with its vhost");
        assert!(reloaded.judge(&[queue("b", Some(5))]).is_err(), "b is the later declaration");
        reloaded.judge(&[queue("b", Some(6))]).unwrap();
    }
}

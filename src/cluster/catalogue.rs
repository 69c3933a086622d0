//! The committed catalogue: everything the metadata group has committed, as every
//! member's state machine holds it — each replicated thing (a virtual host, a user, a
//! permission, an exchange, a queue, a binding, ...) under its key, with the last command
//! that put it. Two uses:
//!
//! - **Judging.** Each entry's commands are judged against it, in log order, before they
//!   are applied: a redeclaration that differs from one committed before it, or a binding
//!   whose queue or exchange was deleted before it, is refused, and nothing of its entry is
//!   applied. The judgement reads only committed state (never a member's memory, which also
//!   holds its transient entities), so every member reaches the same verdict; the member
//!   that proposed the entry reads it from [`Refusals`] once it applied the entry, and
//!   answers its client with it.
//! - **Snapshots.** The catalogue *is* the metadata group's snapshot: its commands, in key
//!   order (virtual hosts before users, exchanges before queues before bindings), rebuild
//!   the state on a member that installs it ([`Catalogue::changes_to`]).
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

/// What a replicated command puts or removes. The order of the variants is the order a
/// snapshot is applied in (what a later kind refers to comes first).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Key {
    /// A virtual host (or its tombstone).
    Vhost(String),
    /// A user (or its tombstone).
    User(String),
    /// A user's permissions in a virtual host.
    Permission { vhost: String, user: String },
    /// A user's topic permissions on an exchange.
    TopicPermission { vhost: String, user: String, exchange: String },
    /// The limits of a virtual host or user (scope, owner).
    Limits { scope: String, owner: String },
    /// The MQTT rules set through the API.
    Rules,
    /// A global parameter.
    Global(String),
    /// A durable exchange.
    Exchange { vhost: String, name: String },
    /// A durable queue.
    Queue { vhost: String, name: String },
    /// A binding between durable entities.
    Binding { vhost: String, exchange: String, to_queue: bool, destination: String, key: String, arguments: Vec<u8> },
    /// The retained message of a topic (its routing key).
    Retained(String),
}

/// The key `command` puts (`true`) or removes (`false`); `None` for what is not kept.
fn key_of(command: &MetaCommand) -> Option<(Key, bool)> {
    let (vh, n) = (String::clone, String::clone);
    Some(match command {
        MetaCommand::PutExchange { vhost, name, .. } => (Key::Exchange { vhost: vh(vhost), name: n(name) }, true),
        MetaCommand::RemoveExchange { vhost, name } => (Key::Exchange { vhost: vh(vhost), name: n(name) }, false),
        MetaCommand::PutQueue { vhost, name, .. } => (Key::Queue { vhost: vh(vhost), name: n(name) }, true),
        MetaCommand::RemoveQueue { vhost, name } => (Key::Queue { vhost: vh(vhost), name: n(name) }, false),
        MetaCommand::Binding { put, vhost, exchange, to_queue, destination, key, arguments } => (
            Key::Binding {
                vhost: vhost.clone(),
                exchange: exchange.clone(),
                to_queue: *to_queue,
                destination: destination.clone(),
                key: key.clone(),
                arguments: arguments.clone(),
            },
            *put,
        ),
        MetaCommand::Access(c) => match c {
            AccessCommand::PutUser(r) => (Key::User(r.name.clone()), true),
            AccessCommand::RemoveUser { name } => (Key::User(name.clone()), false),
            AccessCommand::PutVhost(r) => (Key::Vhost(r.name.clone()), true),
            AccessCommand::RemoveVhost { name } => (Key::Vhost(name.clone()), false),
            AccessCommand::PutPermission(p) => (Key::Permission { vhost: p.vhost.clone(), user: p.user.clone() }, true),
            AccessCommand::RemovePermission { vhost, user } => {
                (Key::Permission { vhost: vhost.clone(), user: user.clone() }, false)
            }
            AccessCommand::PutTopicPermission(p) => (
                Key::TopicPermission { vhost: p.vhost.clone(), user: p.user.clone(), exchange: p.exchange.clone() },
                true,
            ),
            AccessCommand::RemoveTopicPermission { vhost, user, exchange } => {
                (Key::TopicPermission { vhost: vhost.clone(), user: user.clone(), exchange: exchange.clone() }, false)
            }
            AccessCommand::PutLimits(r) => {
                (Key::Limits { scope: format!("{:?}", r.scope), owner: r.owner.clone() }, true)
            }
            AccessCommand::PutMqttRules { .. } => (Key::Rules, true),
            AccessCommand::PutGlobalParameter { name, .. } => (Key::Global(name.clone()), true),
            AccessCommand::PutParameter(_) | AccessCommand::RemoveParameter { .. } => return None,
        },
        MetaCommand::Retained { topic, message } => (Key::Retained(topic.clone()), message.is_some()),
    })
}

/// The command that takes away what `key` names, for a member installing a snapshot that no
/// longer has it (`None` for kinds no command removes: the snapshot still has them).
fn removal(key: &Key) -> Option<MetaCommand> {
    Some(match key.clone() {
        Key::Vhost(name) => MetaCommand::Access(AccessCommand::RemoveVhost { name }),
        Key::User(name) => MetaCommand::Access(AccessCommand::RemoveUser { name }),
        Key::Permission { vhost, user } => MetaCommand::Access(AccessCommand::RemovePermission { vhost, user }),
        Key::TopicPermission { vhost, user, exchange } => {
            MetaCommand::Access(AccessCommand::RemoveTopicPermission { vhost, user, exchange })
        }
        Key::Exchange { vhost, name } => MetaCommand::RemoveExchange { vhost, name },
        Key::Queue { vhost, name } => MetaCommand::RemoveQueue { vhost, name },
        Key::Binding { vhost, exchange, to_queue, destination, key, arguments } => {
            MetaCommand::Binding { put: false, vhost, exchange, to_queue, destination, key, arguments }
        }
        Key::Retained(topic) => MetaCommand::Retained { topic, message: None },
        Key::Limits { .. } | Key::Rules | Key::Global(_) => return None,
    })
}

/// Everything committed, by key.
#[derive(Debug, Default)]
pub(super) struct Catalogue {
    entries: BTreeMap<Key, MetaCommand>,
    /// Keys changed since they were last written.
    changed: BTreeSet<Key>,
}

/// A change to one key: what it was before (to undo a refused entry).
type Undo = Vec<(Key, Option<MetaCommand>)>;

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

    /// The catalogue a snapshot's `commands` make (as [`Catalogue::commands`] gave them).
    pub(super) fn of_snapshot(commands: Vec<MetaCommand>) -> Catalogue {
        let entries = commands.into_iter().filter_map(|c| key_of(&c).map(|(k, _)| (k, c))).collect();
        Catalogue { entries, changed: BTreeSet::new() }
    }

    /// Every command kept, in key order: the snapshot's content.
    pub(super) fn commands(&self) -> Vec<MetaCommand> {
        self.entries.values().cloned().collect()
    }

    /// The commands that turn this catalogue's state into `target`'s (removals first, last
    /// kind first; then puts in key order, only where they differ), and marks every key
    /// they touch as changed in `target`.
    pub(super) fn changes_to(&self, target: &mut Catalogue) -> Vec<MetaCommand> {
        let mut commands: Vec<MetaCommand> = self
            .entries
            .keys()
            .rev()
            .filter(|k| !target.entries.contains_key(*k))
            .filter_map(|k| {
                target.changed.insert(k.clone());
                removal(k)
            })
            .collect();
        for (key, command) in &target.entries {
            if self.entries.get(key) != Some(command) {
                commands.push(command.clone());
                target.changed.insert(key.clone());
            }
        }
        commands
    }

    /// Judges one entry's `commands` in order and, when every one is accepted, records
    /// their effect; the first refusal otherwise (and nothing recorded).
    pub(super) fn judge(&mut self, commands: &[MetaCommand]) -> Result<(), EntityError> {
        let mut undo = Undo::new();
        for command in commands {
            if let Err(refusal) = self.judge_one(command, &mut undo) {
                for (key, before) in undo.into_iter().rev() {
                    match before {
                        Some(c) => self.entries.insert(key, c),
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
            k.extend(serde_json::to_vec(&key).expect("plain data encodes"));
            match self.entries.get(&key) {
                Some(c) => batch.insert(k, serde_json::to_vec(c).expect("plain data encodes")),
                None => batch.remove(k),
            }
        }
    }

    fn judge_one(&mut self, command: &MetaCommand, undo: &mut Undo) -> Result<(), EntityError> {
        let Some((key, put)) = key_of(command) else {
            return Ok(());
        };
        match (command, self.entries.get(&key)) {
            (
                MetaCommand::PutQueue { vhost, name, auto_delete, arguments },
                Some(MetaCommand::PutQueue { auto_delete: current, arguments: current_args, .. }),
            ) => {
                // Arguments are this module's own encoding; an undecodable table fails the
                // entry's application after this, on every member alike.
                let (current_args, args) =
                    (untable(current_args).unwrap_or_default(), untable(arguments).unwrap_or_default());
                // An equivalent redeclaration changes nothing: the first declaration stays.
                return check_equivalent_durable_queue(name, vhost, (*current, &current_args), (*auto_delete, &args));
            }
            (MetaCommand::PutExchange { vhost, .. }, Some(current)) => {
                let (Some(current), Some(wanted)) = (exchange_def(current), exchange_def(command)) else {
                    return Ok(());
                };
                return check_equivalent_exchange(&current, &wanted, vhost);
            }
            (MetaCommand::Binding { put: true, vhost, exchange, to_queue, destination, .. }, _) => {
                let missing =
                    |what, name: &str| EntityError::NotFound { what, name: name.to_owned(), vhost: vhost.clone() };
                if !self.has_exchange(vhost, exchange) {
                    return Err(missing(EntityKind::Exchange, exchange));
                }
                let queue = Key::Queue { vhost: vhost.clone(), name: destination.clone() };
                match to_queue {
                    true if !self.entries.contains_key(&queue) => return Err(missing(EntityKind::Queue, destination)),
                    false if !self.has_exchange(vhost, destination) => {
                        return Err(missing(EntityKind::Exchange, destination))
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        let tombstone = matches!(command, MetaCommand::Access(AccessCommand::PutVhost(r)) if r.deleted);
        match put {
            true => self.set(key.clone(), Some(command.clone()), undo),
            false => self.set(key.clone(), None, undo),
        }
        if !put || tombstone {
            self.cascade(&key, undo);
        }
        Ok(())
    }

    /// What goes with a removed queue, exchange or virtual host: the bindings to or from it
    /// (the routing table drops them with it); with a virtual host, its entities too.
    fn cascade(&mut self, removed: &Key, undo: &mut Undo) {
        let gone: Vec<Key> = self
            .entries
            .keys()
            .filter(|k| match (removed, k) {
                (Key::Queue { vhost, name }, Key::Binding { vhost: v, to_queue: true, destination, .. }) => {
                    v == vhost && destination == name
                }
                (Key::Exchange { vhost, name }, Key::Binding { vhost: v, exchange, to_queue, destination, .. }) => {
                    v == vhost && (exchange == name || (!to_queue && destination == name))
                }
                (
                    Key::Vhost(vhost),
                    Key::Exchange { vhost: v, .. } | Key::Queue { vhost: v, .. } | Key::Binding { vhost: v, .. },
                ) => v == vhost,
                _ => false,
            })
            .cloned()
            .collect();
        for key in gone {
            self.set(key, None, undo);
        }
    }

    /// Sets (or removes) `key`, remembering what it was.
    fn set(&mut self, key: Key, to: Option<MetaCommand>, undo: &mut Undo) {
        let before = match to {
            Some(c) => self.entries.insert(key.clone(), c),
            None => self.entries.remove(&key),
        };
        undo.push((key, before));
    }

    /// Exchange `name` of `vhost` is committed, or is one every virtual host has.
    fn has_exchange(&self, vhost: &str, name: &str) -> bool {
        STANDARD_EXCHANGES.iter().any(|(x, _)| *x == name)
            || self.entries.contains_key(&Key::Exchange { vhost: vhost.to_owned(), name: name.to_owned() })
    }
}

/// The exchange a declaration declares, as the routing table defines it (`None` for a type
/// no member knows: its application fails on every member alike).
fn exchange_def(command: &MetaCommand) -> Option<ExchangeDef> {
    let MetaCommand::PutExchange { name, kind, auto_delete, internal, arguments, .. } = command else {
        return None;
    };
    Some(ExchangeDef {
        name: name.clone(),
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
    fn a_snapshot_is_reached_by_removals_last_kind_first_then_the_puts_that_differ() {
        let mut behind = Catalogue::default();
        behind.judge(&[queue("kept", None), queue("gone", None), bind("gone")]).unwrap();
        let mut ahead = Catalogue::default();
        ahead.judge(&[queue("kept", None), queue("gone", None), bind("gone")]).unwrap();
        ahead.judge(&[MetaCommand::RemoveQueue { vhost: "/".into(), name: "gone".into() }]).unwrap();
        ahead.judge(&[queue("new", Some(5)), bind("new")]).unwrap();
        let mut target = Catalogue::of_snapshot(ahead.commands());
        let changes = behind.changes_to(&mut target);
        // The binding goes before its queue; nothing is said of what is already equal.
        assert_eq!(changes.len(), 4, "{changes:?}");
        assert!(matches!(&changes[0], MetaCommand::Binding { put: false, destination, .. } if destination == "gone"));
        assert!(matches!(&changes[1], MetaCommand::RemoveQueue { name, .. } if name == "gone"));
        assert!(matches!(&changes[2], MetaCommand::PutQueue { name, .. } if name == "new"));
        assert!(matches!(&changes[3], MetaCommand::Binding { put: true, destination, .. } if destination == "new"));
        // Both removed and put keys are written with the installed catalogue.
        let mut batch = sled::Batch::default();
        target.write_changes(&mut batch);
        assert_eq!(target.changed.len(), 0);
        assert_eq!(target.commands(), ahead.commands());
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

//! Durable AMQP entities: exchanges, queues and bindings, restored at start-up.
//!
//! Layout of the local implementation: records in `Space::Meta` are typed tables
//! ([`crate::core::value`]), keyed `q\0vhost\0name` (queues), `x\0vhost\0name`
//! (exchanges) and `b\0vhost\0exchange\0destination\0key\0args` (bindings; the
//! destination is `q:{id}` or `x:{name}`, the arguments the hex of their encoded table).

use std::fmt;

use bytes::{Bytes, BytesMut};
use ferrymq_storage::{JournalError, Op, QueueId, Space};
use futures_util::future::BoxFuture;

use super::{JournalStore, StoreWrite};
use crate::core::restore::{RecordKey, RecordKind, RestoreError};
use crate::core::router::{Binding, Destination, ExchangeDef, ExchangeKind};
use crate::core::value::{decode_table, encode_table, Value};

/// A durable queue as stored: what it takes to declare it again.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRecord {
    /// Virtual host the queue lives in.
    pub vhost: String,
    /// The queue's AMQP name.
    pub name: String,
    /// Id of the consume queue holding its messages (the catalog's id for its storage name).
    pub id: QueueId,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Declaration arguments, as the client sent them.
    pub arguments: Vec<(String, Value)>,
}

/// A durable exchange as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeRecord {
    /// Virtual host the exchange lives in.
    pub vhost: String,
    /// The exchange's declaration.
    pub def: ExchangeDef,
}

/// A durable binding as stored (its destination is a queue or an exchange).
#[derive(Debug, Clone)]
pub struct BindingRecord {
    /// Virtual host of the binding.
    pub vhost: String,
    /// Name of the exchange the binding routes from.
    pub exchange: String,
    /// Destination, key and arguments.
    pub binding: Binding,
}

/// Everything [`EntityStore::load`] found.
#[derive(Debug, Default)]
pub struct EntityRecords {
    /// Durable exchanges of every vhost, declared again before the queues and bindings.
    pub exchanges: Vec<ExchangeRecord>,
    /// Durable queues of every vhost, with the ids of their consume queues.
    pub queues: Vec<QueueRecord>,
    /// Bindings between durable entities.
    pub bindings: Vec<BindingRecord>,
}

/// A change to durable exchanges, queues and bindings.
#[derive(Debug, Clone)]
pub enum EntityCommand {
    /// A durable queue is stored.
    PutQueue(QueueRecord),
    /// A durable queue is forgotten, with every binding to it.
    RemoveQueue {
        /// Its virtual host.
        vhost: String,
        /// Its name.
        name: String,
        /// Its consume queue (what bindings to it name).
        id: QueueId,
    },
    /// A durable exchange is stored.
    PutExchange {
        /// Its virtual host.
        vhost: String,
        /// Its declaration.
        def: ExchangeDef,
    },
    /// A durable exchange is forgotten, with every binding from or to it.
    RemoveExchange {
        /// Its virtual host.
        vhost: String,
        /// Its name.
        name: String,
    },
    /// A binding is stored (nothing for an MQTT session destination, never durable).
    PutBinding {
        /// Its virtual host.
        vhost: String,
        /// The exchange it routes from.
        exchange: String,
        /// Destination, key and arguments.
        binding: Binding,
    },
    /// A binding is forgotten.
    RemoveBinding {
        /// Its virtual host.
        vhost: String,
        /// The exchange it routes from.
        exchange: String,
        /// Destination, key and arguments.
        binding: Binding,
    },
}

impl EntityCommand {
    /// True when applying it reads stored records first (the bindings a removal takes
    /// with it).
    pub(super) fn reads(&self) -> bool {
        matches!(self, EntityCommand::RemoveQueue { .. } | EntityCommand::RemoveExchange { .. })
    }
}

/// Durable exchanges, queues and bindings: reads, and the commands that change them.
pub trait EntityStore: fmt::Debug + Send + Sync {
    /// Every stored entity; the first record that cannot be read or decoded is the error
    /// (none is left out: its queue's messages would be deleted as an orphan's).
    fn load(&self) -> BoxFuture<'_, Result<EntityRecords, RestoreError>>;

    /// Stores a durable queue.
    fn put_queue(&self, queue: &QueueRecord) -> StoreWrite {
        StoreWrite::one(EntityCommand::PutQueue(queue.clone()))
    }

    /// Forgets a durable queue and every binding to it.
    fn remove_queue(&self, vhost: &str, name: &str, id: QueueId) -> StoreWrite {
        StoreWrite::one(EntityCommand::RemoveQueue { vhost: vhost.to_owned(), name: name.to_owned(), id })
    }

    /// Stores a durable exchange.
    fn put_exchange(&self, vhost: &str, def: &ExchangeDef) -> StoreWrite {
        StoreWrite::one(EntityCommand::PutExchange { vhost: vhost.to_owned(), def: def.clone() })
    }

    /// Forgets a durable exchange and every binding from or to it.
    fn remove_exchange(&self, vhost: &str, name: &str) -> StoreWrite {
        StoreWrite::one(EntityCommand::RemoveExchange { vhost: vhost.to_owned(), name: name.to_owned() })
    }

    /// Stores a binding (nothing for an MQTT session destination, which is never durable).
    fn put_binding(&self, vhost: &str, exchange: &str, binding: &Binding) -> StoreWrite {
        if matches!(binding.dest, Destination::Session(_)) {
            return StoreWrite::none();
        }
        let (vhost, exchange, binding) = (vhost.to_owned(), exchange.to_owned(), binding.clone());
        StoreWrite::one(EntityCommand::PutBinding { vhost, exchange, binding })
    }

    /// Forgets a binding.
    fn remove_binding(&self, vhost: &str, exchange: &str, binding: &Binding) -> StoreWrite {
        if matches!(binding.dest, Destination::Session(_)) {
            return StoreWrite::none();
        }
        let (vhost, exchange, binding) = (vhost.to_owned(), exchange.to_owned(), binding.clone());
        StoreWrite::one(EntityCommand::RemoveBinding { vhost, exchange, binding })
    }
}

fn meta_key(kind: u8, parts: &[&str]) -> Bytes {
    let mut k = vec![kind];
    for p in parts {
        k.push(0);
        k.extend_from_slice(p.as_bytes());
    }
    Bytes::from(k)
}

fn table_bytes(fields: &[(&str, Value)]) -> Bytes {
    let owned: Vec<(String, Value)> = fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let mut b = BytesMut::new();
    encode_table(&owned, &mut b);
    b.freeze()
}

fn read_table(bytes: &Bytes) -> Option<Vec<(String, Value)>> {
    decode_table(&mut bytes.clone(), 0).ok()
}

fn field<'a>(t: &'a [(String, Value)], name: &str) -> Option<&'a Value> {
    t.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn field_str(t: &[(String, Value)], name: &str) -> Option<String> {
    field(t, name).and_then(Value::as_str).map(str::to_owned)
}

fn field_bool(t: &[(String, Value)], name: &str) -> bool {
    matches!(field(t, name), Some(Value::Bool(true)))
}

fn field_table(t: &[(String, Value)], name: &str) -> Vec<(String, Value)> {
    match field(t, name) {
        Some(Value::Table(v)) => v.clone(),
        _ => Vec::new(),
    }
}

fn queue_record(q: &QueueRecord) -> Bytes {
    table_bytes(&[
        ("vhost", Value::Str(q.vhost.clone())),
        ("name", Value::Str(q.name.clone())),
        ("id", Value::Int(q.id.0 as i64)),
        ("auto_delete", Value::Bool(q.auto_delete)),
        ("arguments", Value::Table(q.arguments.clone())),
    ])
}

fn queue_from_record(value: &Bytes) -> Option<QueueRecord> {
    let t = read_table(value)?;
    Some(QueueRecord {
        vhost: field_str(&t, "vhost")?,
        name: field_str(&t, "name")?,
        id: QueueId(u64::try_from(field(&t, "id")?.as_i64()?).ok()?),
        auto_delete: field_bool(&t, "auto_delete"),
        arguments: field_table(&t, "arguments"),
    })
}

fn exchange_record(vhost: &str, def: &ExchangeDef) -> Bytes {
    table_bytes(&[
        ("vhost", Value::Str(vhost.to_owned())),
        ("name", Value::Str(def.name.clone())),
        ("type", Value::Str(def.kind.name().to_owned())),
        ("auto_delete", Value::Bool(def.auto_delete)),
        ("internal", Value::Bool(def.internal)),
        ("arguments", Value::Table(def.arguments.clone())),
    ])
}

fn exchange_from_record(value: &Bytes) -> Option<ExchangeRecord> {
    let t = read_table(value)?;
    let def = ExchangeDef {
        name: field_str(&t, "name")?,
        kind: ExchangeKind::parse(&field_str(&t, "type")?)?,
        durable: true,
        auto_delete: field_bool(&t, "auto_delete"),
        internal: field_bool(&t, "internal"),
        arguments: field_table(&t, "arguments"),
    };
    Some(ExchangeRecord { vhost: field_str(&t, "vhost")?, def })
}

fn destination_name(dest: &Destination) -> Option<String> {
    match dest {
        Destination::Queue(q) => Some(format!("q:{}", q.0)),
        Destination::Exchange(x) => Some(format!("x:{x}")),
        Destination::Session(_) | Destination::Member(_) => None,
    }
}

/// The key of a binding record and its destination's stored name; `None` for a session.
fn binding_key(vhost: &str, exchange: &str, binding: &Binding) -> Option<(Bytes, String)> {
    let dest = destination_name(&binding.dest)?;
    let mut args = BytesMut::new();
    encode_table(&binding.args, &mut args);
    let args_hex: String = args.iter().map(|b| format!("{b:02x}")).collect();
    Some((meta_key(b'b', &[vhost, exchange, &dest, &binding.key, &args_hex]), dest))
}

fn binding_from_record(value: &Bytes) -> Option<BindingRecord> {
    let t = read_table(value)?;
    let dest = field_str(&t, "dest")?;
    let dest = if let Some(id) = dest.strip_prefix("q:") {
        Destination::Queue(QueueId(id.parse().ok()?))
    } else {
        Destination::Exchange(dest.strip_prefix("x:")?.to_owned())
    };
    let binding =
        Binding { dest, key: field_str(&t, "key")?, args: field_table(&t, "arguments"), mqtt: None, filter: None };
    Some(BindingRecord { vhost: field_str(&t, "vhost")?, exchange: field_str(&t, "exchange")?, binding })
}

impl JournalStore {
    /// Deletes of the binding records of `vhost` that `doomed` picks (by their table),
    /// read off the runtime's workers. A scan that fails is the command's error: a binding
    /// record left behind would come back at restart without its queue.
    async fn remove_bindings_where(
        &self,
        vhost: &str,
        doomed: impl Fn(&[(String, Value)]) -> bool,
    ) -> Result<Vec<Op>, JournalError> {
        let records = self.scan(Space::Meta, meta_key(b'b', &[vhost, ""])).await?;
        Ok(records
            .into_iter()
            .filter(|(_, value)| read_table(value).is_some_and(|t| doomed(&t)))
            .map(|(key, _)| Op::Delete { space: Space::Meta, key })
            .collect())
    }

    /// The journal operations of an entity command (the local state machine's half):
    /// a removal reads the binding records it takes with it.
    pub(super) async fn entity_ops(&self, command: &EntityCommand) -> Result<Vec<Op>, JournalError> {
        match command {
            EntityCommand::RemoveQueue { vhost, name, id } => {
                let mut ops = vec![Op::Delete { space: Space::Meta, key: meta_key(b'q', &[vhost, name]) }];
                let dest = format!("q:{}", id.0);
                ops.extend(
                    self.remove_bindings_where(vhost, |t| field_str(t, "dest").is_some_and(|d| d == dest)).await?,
                );
                Ok(ops)
            }
            EntityCommand::RemoveExchange { vhost, name } => {
                let mut ops = vec![Op::Delete { space: Space::Meta, key: meta_key(b'x', &[vhost, name]) }];
                let dest = format!("x:{name}");
                let doomed = self.remove_bindings_where(vhost, |t| {
                    field_str(t, "exchange").as_deref() == Some(name.as_str())
                        || field_str(t, "dest").is_some_and(|d| d == dest)
                });
                ops.extend(doomed.await?);
                Ok(ops)
            }
            other => Ok(ops_without_reads(other)),
        }
    }
}

/// The journal operations of an entity command that reads nothing first (every one but
/// the removals of queues and exchanges, which yield nothing here).
pub(super) fn ops_without_reads(command: &EntityCommand) -> Vec<Op> {
    match command {
        EntityCommand::PutQueue(queue) => {
            let key = meta_key(b'q', &[&queue.vhost, &queue.name]);
            vec![Op::Put { space: Space::Meta, key, value: queue_record(queue) }]
        }
        EntityCommand::PutExchange { vhost, def } => {
            let key = meta_key(b'x', &[vhost, &def.name]);
            vec![Op::Put { space: Space::Meta, key, value: exchange_record(vhost, def) }]
        }
        EntityCommand::PutBinding { vhost, exchange, binding } => {
            let Some((key, dest)) = binding_key(vhost, exchange, binding) else { return Vec::new() };
            let record = table_bytes(&[
                ("vhost", Value::Str(vhost.clone())),
                ("exchange", Value::Str(exchange.clone())),
                ("dest", Value::Str(dest)),
                ("key", Value::Str(binding.key.clone())),
                ("arguments", Value::Table(binding.args.clone())),
            ]);
            vec![Op::Put { space: Space::Meta, key, value: record }]
        }
        EntityCommand::RemoveBinding { vhost, exchange, binding } => {
            let Some((key, _)) = binding_key(vhost, exchange, binding) else { return Vec::new() };
            vec![Op::Delete { space: Space::Meta, key }]
        }
        EntityCommand::RemoveQueue { .. } | EntityCommand::RemoveExchange { .. } => Vec::new(),
    }
}

impl EntityStore for JournalStore {
    fn load(&self) -> BoxFuture<'_, Result<EntityRecords, RestoreError>> {
        Box::pin(async move {
            let mut found = EntityRecords::default();
            for (prefix, kind) in [(b'x', RecordKind::Exchange), (b'q', RecordKind::Queue), (b'b', RecordKind::Binding)]
            {
                let records = self
                    .scan(Space::Meta, Bytes::copy_from_slice(&[prefix, 0]))
                    .await
                    .map_err(|e| RestoreError::unreadable(kind, &[prefix], e))?;
                for (key, value) in records {
                    let undecodable = |reason: &str| RestoreError::undecodable(kind, RecordKey::bytes(&key), reason);
                    if let Err(e) = decode_table(&mut value.clone(), 0) {
                        return Err(undecodable(&format!("not a field table: {e}")));
                    }
                    let missing = "a field is missing or of the wrong type";
                    match prefix {
                        b'x' => found.exchanges.push(exchange_from_record(&value).ok_or_else(|| undecodable(missing))?),
                        b'q' => found.queues.push(queue_from_record(&value).ok_or_else(|| undecodable(missing))?),
                        _ => found.bindings.push(binding_from_record(&value).ok_or_else(|| undecodable(missing))?),
                    }
                }
            }
            Ok(found)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{apply, open, read};
    use super::*;

    fn args(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    fn exchange(name: &str) -> ExchangeDef {
        ExchangeDef {
            name: name.into(),
            kind: ExchangeKind::Topic,
            durable: true,
            auto_delete: true,
            internal: false,
            arguments: args(&[("alternate-exchange", Value::Str("alt".into()))]),
        }
    }

    fn queue(name: &str, id: u64) -> QueueRecord {
        QueueRecord {
            vhost: "/".into(),
            name: name.into(),
            id: QueueId(id),
            auto_delete: false,
            arguments: args(&[("x-max-length", Value::Int(5))]),
        }
    }

    fn bound(dest: Destination, key: &str) -> Binding {
        Binding {
            dest,
            key: key.into(),
            args: args(&[("x-match", Value::Str("all".into()))]),
            mqtt: None,
            filter: None,
        }
    }

    fn summary(r: &EntityRecords) -> Vec<String> {
        let mut v: Vec<String> = r.exchanges.iter().map(|x| format!("x {} {}", x.vhost, x.def.name)).collect();
        v.extend(r.queues.iter().map(|q| format!("q {} {} {}", q.vhost, q.name, q.id.0)));
        v.extend(
            r.bindings.iter().map(|b| format!("b {} {} {:?} {}", b.vhost, b.exchange, b.binding.dest, b.binding.key)),
        );
        v.sort();
        v
    }

    #[test]
    fn entities_round_trip() {
        let (_dir, journal, stores) = open();
        let e = &stores.entities;
        apply(&journal, e.put_exchange("/", &exchange("x")).and(e.put_queue(&queue("q", 4))));
        apply(&journal, e.put_binding("/", "x", &bound(Destination::Queue(QueueId(4)), "a.#")));
        let loaded = read(e.load()).unwrap();
        assert_eq!(loaded.exchanges, vec![ExchangeRecord { vhost: "/".into(), def: exchange("x") }]);
        assert_eq!(loaded.queues, vec![queue("q", 4)]);
        assert_eq!(loaded.bindings.len(), 1);
        assert_eq!(loaded.bindings[0].binding.args, bound(Destination::Queue(QueueId(4)), "a.#").args);
        apply(&journal, e.remove_binding("/", "x", &bound(Destination::Queue(QueueId(4)), "a.#")));
        assert!(read(e.load()).unwrap().bindings.is_empty());
    }

    #[test]
    fn removing_an_entity_removes_its_bindings() {
        let (_dir, journal, stores) = open();
        let e = &stores.entities;
        let writes = e
            .put_exchange("/", &exchange("x"))
            .and(e.put_exchange("/", &exchange("y")))
            .and(e.put_queue(&queue("q1", 1)))
            .and(e.put_queue(&queue("q2", 2)))
            .and(e.put_binding("/", "x", &bound(Destination::Queue(QueueId(1)), "k1")))
            .and(e.put_binding("/", "x", &bound(Destination::Queue(QueueId(2)), "k2")))
            .and(e.put_binding("/", "y", &bound(Destination::Exchange("x".into()), "k3")))
            .and(e.put_binding("/other", "x", &bound(Destination::Queue(QueueId(1)), "k4")));
        apply(&journal, writes);
        apply(&journal, e.remove_queue("/", "q1", QueueId(1)));
        let left = summary(&read(e.load()).unwrap());
        assert!(!left.iter().any(|s| s.contains("q / q1") || s.contains("k1")), "{left:?}");
        assert!(left.iter().any(|s| s.contains("k4")), "another vhost's binding stays: {left:?}");
        apply(&journal, e.remove_exchange("/", "x"));
        let left = summary(&read(e.load()).unwrap());
        assert_eq!(left, vec!["b /other x Queue(QueueId(1)) k4", "q / q2 2", "x / y"], "from and to x go");
    }

    #[test]
    fn session_bindings_are_never_stored() {
        let (_dir, _journal, stores) = open();
        let link = std::sync::Arc::new(crate::core::delivery::SessionLink::new(
            1,
            "c".into(),
            1,
            crate::core::delivery::SpillLimits { messages: 1, bytes: 1 },
            std::sync::Arc::new(tokio::sync::Notify::new()),
        ));
        assert!(stores.entities.put_binding("/", "amq.topic", &bound(Destination::Session(link), "a")).is_empty());
    }
}

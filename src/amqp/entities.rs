//! AMQP entities: the queue registry (name -> consume queue, durability, exclusivity,
//! arguments turned into a [`QueueConfig`]) and the durable metadata of exchanges,
//! queues and bindings in the journal's `meta` keyspace, restored at start-up.
//!
//! Meta records are typed tables (`core::value`), keyed `q\0vhost\0name`,
//! `x\0vhost\0name` and `b\0vhost\0exchange\0destination\0key\0args`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ferrymq_storage::{Op, QueueId, Space};
use parking_lot::{Mutex, RwLock};
use tracing::{info, warn};

use crate::core::broker::Broker;
use crate::core::message::now_ms;
use crate::core::queue::{DeadLetterTarget, Overflow, QueueConfig};
use crate::core::router::{Binding, Destination, ExchangeDef, ExchangeKind};
use crate::core::shards::ShardCmd;
use crate::core::stream::StreamConfig;
use crate::core::value::{decode_table, encode_table, Value};

use super::retry_args::retry_policy;
use super::streams::{is_stream, stream_config};

/// Prefix of the storage names of AMQP queues (`amqp/{vhost}/{name}`).
pub const QUEUE_PREFIX: &str = "amqp/";

/// A declared queue.
#[derive(Debug)]
pub struct QueueEntity {
    /// Virtual host.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// Consume queue id.
    pub id: QueueId,
    /// Survives restarts.
    pub durable: bool,
    /// Owning connection of an exclusive queue.
    pub exclusive_owner: Option<u64>,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Declaration arguments.
    pub arguments: Vec<(String, Value)>,
    /// Behaviour derived from the arguments.
    pub config: Arc<QueueConfig>,
    /// Retention of a stream (`x-queue-type: stream`); `None` for other queues.
    pub stream: Option<Arc<StreamConfig>>,
    /// Has had a consumer (auto-delete only deletes after one went away).
    pub had_consumer: AtomicBool,
    /// Consumer holding it exclusively (basic.consume exclusive).
    pub exclusive_consumer: Mutex<Option<u64>>,
    /// Consumers now (kept by the connections, so checks do not race the queue's shard).
    pub consumers: AtomicU64,
    /// Last use (declare, consume, get), ms: for `x-expires`.
    pub last_used_ms: AtomicU64,
}

impl QueueEntity {
    /// `x-expires` in ms.
    pub fn expires_ms(&self) -> Option<u64> {
        arg_u64(&self.arguments, "x-expires")
    }

    /// True for a stream (`x-queue-type: stream`).
    pub fn is_stream(&self) -> bool {
        self.stream.is_some()
    }

    /// Marks the queue used now.
    pub fn touch(&self) {
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
    }
}

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
pub fn arg_u64(args: &[(String, Value)], name: &str) -> Option<u64> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_i64()).and_then(|v| u64::try_from(v).ok())
}

fn arg_str<'a>(args: &'a [(String, Value)], name: &str) -> Option<&'a str> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_str())
}

fn arg_bool(args: &[(String, Value)], name: &str) -> Option<bool> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
        Value::Bool(b) => Some(*b),
        other => other.as_i64().map(|i| i != 0),
    })
}

/// Checks queue arguments and turns them into a configuration.
pub fn queue_config(
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

/// Every declared AMQP queue.
#[derive(Debug, Default)]
pub struct Entities {
    queues: RwLock<HashMap<(String, String), Arc<QueueEntity>>>,
    /// Configurations of queues that refuse publishes when full, by id (publishers check
    /// them before storing).
    rejecting: RwLock<HashMap<QueueId, Arc<QueueConfig>>>,
    any_rejecting: AtomicBool,
}

impl Entities {
    /// The configurations of the queues among `ids` that refuse publishes when full, in
    /// order (`None` for the others); `None` when there is none (one lock, no allocation
    /// while no such queue exists).
    pub fn overflow_configs(&self, ids: impl Iterator<Item = QueueId>) -> Option<Vec<Option<Arc<QueueConfig>>>> {
        if !self.any_rejecting.load(Ordering::Relaxed) {
            return None;
        }
        let rejecting = self.rejecting.read();
        let configs: Vec<_> = ids.map(|id| rejecting.get(&id).cloned()).collect();
        configs.iter().any(Option::is_some).then_some(configs)
    }

    /// The queue `name` of `vhost`.
    pub fn queue(&self, vhost: &str, name: &str) -> Option<Arc<QueueEntity>> {
        self.queues.read().get(&(vhost.to_owned(), name.to_owned())).cloned()
    }

    /// Every queue.
    pub fn all(&self) -> Vec<Arc<QueueEntity>> {
        self.queues.read().values().cloned().collect()
    }

    /// Creates a queue (its consume queue, configuration, default-exchange binding and,
    /// when durable, its meta record). The caller checked it does not exist.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_queue(
        &self,
        broker: &Broker,
        vhost: &str,
        name: &str,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: Vec<(String, Value)>,
        config: QueueConfig,
        stream: Option<StreamConfig>,
    ) -> Result<Arc<QueueEntity>, String> {
        let id = broker.journal.queue_id(&storage_name(vhost, name)).map_err(|e| e.to_string())?;
        let entity = Arc::new(QueueEntity {
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            id,
            durable,
            exclusive_owner,
            auto_delete,
            arguments,
            config: Arc::new(config),
            stream: stream.map(Arc::new),
            had_consumer: AtomicBool::new(false),
            exclusive_consumer: Mutex::new(None),
            consumers: AtomicU64::new(0),
            last_used_ms: AtomicU64::new(now_ms()),
        });
        self.install(broker, entity.clone());
        if durable {
            let op = Op::Put { space: Space::Meta, key: meta_key(b'q', &[vhost, name]), value: queue_record(&entity) };
            broker.journal.write(vec![op]).await.map_err(|e| e.to_string())?;
        }
        Ok(entity)
    }

    fn install(&self, broker: &Broker, entity: Arc<QueueEntity>) {
        match &entity.stream {
            Some(stream) => broker.shards.send(ShardCmd::ConfigureStream { queue: entity.id, config: stream.clone() }),
            None => broker.shards.send(ShardCmd::Configure { queue: entity.id, config: entity.config.clone() }),
        }
        if matches!(entity.config.overflow, Overflow::RejectPublish | Overflow::RejectPublishDlx) {
            self.rejecting.write().insert(entity.id, entity.config.clone());
            self.any_rejecting.store(true, Ordering::Relaxed);
        }
        let _ = broker.router.bind(&entity.vhost, "", Binding::queue(entity.id, &entity.name, Vec::new()));
        self.queues.write().insert((entity.vhost.clone(), entity.name.clone()), entity);
    }

    /// Deletes a queue: bindings, consume queue, meta records. Returns the message count.
    pub async fn delete_queue(&self, broker: &Broker, entity: &QueueEntity) -> u64 {
        self.queues.write().remove(&(entity.vhost.clone(), entity.name.clone()));
        self.rejecting.write().remove(&entity.id);
        broker.router.unbind_all(&entity.vhost, &Destination::Queue(entity.id));
        let count = broker.shards.delete(entity.id).await;
        if entity.durable {
            let mut ops = vec![Op::Delete { space: Space::Meta, key: meta_key(b'q', &[&entity.vhost, &entity.name]) }];
            // The queue's binding records: found by scanning the vhost's bindings.
            if let Ok(records) = broker.journal.scan(Space::Meta, &meta_key(b'b', &[&entity.vhost, ""])) {
                for (key, value) in records {
                    if binding_points_to_queue(&value, entity.id) {
                        ops.push(Op::Delete { space: Space::Meta, key });
                    }
                }
            }
            if let Err(e) = broker.journal.write(ops).await {
                warn!(error = %e, "cannot delete queue metadata");
            }
        }
        count
    }

    /// Restores durable exchanges, queues and bindings from the journal and deletes the
    /// consume queues of AMQP queues that were not durable.
    pub async fn restore(&self, broker: &Broker) {
        let records = match broker.journal.scan(Space::Meta, b"") {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "cannot read AMQP metadata");
                return;
            }
        };
        let (mut exchanges, mut queues, mut bindings) = (0, 0, 0);
        for (key, value) in &records {
            if key.first() == Some(&b'x') {
                if let Some((vhost, def)) = exchange_from_record(value) {
                    broker.router.add_vhost(&vhost);
                    if broker.router.declare_exchange(&vhost, def).is_ok() {
                        exchanges += 1;
                    }
                }
            }
        }
        for (key, value) in &records {
            if key.first() == Some(&b'q') {
                if let Some(entity) = queue_from_record(value) {
                    broker.router.add_vhost(&entity.vhost);
                    self.install(broker, Arc::new(entity));
                    queues += 1;
                }
            }
        }
        for (key, value) in &records {
            if key.first() == Some(&b'b') {
                if let Some((vhost, exchange, binding)) = binding_from_record(value) {
                    if broker.router.bind(&vhost, &exchange, binding).is_ok() {
                        bindings += 1;
                    }
                }
            }
        }
        // Consume queues of AMQP queues that did not survive (transient ones).
        if let Ok(all) = broker.journal.queues() {
            let live: std::collections::HashSet<QueueId> = self.all().iter().map(|q| q.id).collect();
            for (name, id) in all {
                if name.starts_with(QUEUE_PREFIX) && !live.contains(&id) {
                    broker.shards.delete(id).await;
                }
            }
        }
        if exchanges + queues + bindings > 0 {
            info!(exchanges, queues, bindings, "restored AMQP entities");
        }
    }

    /// Deletes queues whose `x-expires` passed without use.
    pub async fn expire_unused(&self, broker: &Broker) {
        let now = now_ms();
        let due: Vec<Arc<QueueEntity>> = self
            .all()
            .into_iter()
            .filter(|q| {
                q.expires_ms().is_some_and(|ms| {
                    q.consumers.load(Ordering::Relaxed) == 0
                        && q.last_used_ms.load(Ordering::Relaxed).saturating_add(ms) <= now
                })
            })
            .collect();
        for q in due {
            info!(queue = %q.name, vhost = %q.vhost, "queue expired (x-expires)");
            self.delete_queue(broker, &q).await;
        }
    }
}

/// Stores a durable exchange.
pub async fn store_exchange(broker: &Broker, vhost: &str, def: &ExchangeDef) {
    let record = table_bytes(&[
        ("vhost", Value::Str(vhost.to_owned())),
        ("name", Value::Str(def.name.clone())),
        ("type", Value::Str(def.kind.name().to_owned())),
        ("auto_delete", Value::Bool(def.auto_delete)),
        ("internal", Value::Bool(def.internal)),
        ("arguments", Value::Table(def.arguments.clone())),
    ]);
    let op = Op::Put { space: Space::Meta, key: meta_key(b'x', &[vhost, &def.name]), value: record };
    if let Err(e) = broker.journal.write(vec![op]).await {
        warn!(error = %e, "cannot store exchange");
    }
}

/// Forgets a durable exchange and its binding records.
pub async fn forget_exchange(broker: &Broker, vhost: &str, name: &str) {
    let mut ops = vec![Op::Delete { space: Space::Meta, key: meta_key(b'x', &[vhost, name]) }];
    if let Ok(records) = broker.journal.scan(Space::Meta, &meta_key(b'b', &[vhost, ""])) {
        for (key, value) in records {
            if binding_involves_exchange(&value, name) {
                ops.push(Op::Delete { space: Space::Meta, key });
            }
        }
    }
    if let Err(e) = broker.journal.write(ops).await {
        warn!(error = %e, "cannot delete exchange metadata");
    }
}

/// Stores (`store`) or forgets a durable binding.
pub async fn persist_binding(broker: &Broker, vhost: &str, exchange: &str, binding: &Binding, store: bool) {
    let dest = match &binding.dest {
        Destination::Queue(q) => format!("q:{}", q.0),
        Destination::Exchange(x) => format!("x:{x}"),
        Destination::Session(_) => return,
    };
    let mut args = BytesMut::new();
    encode_table(&binding.args, &mut args);
    let args_hex: String = args.iter().map(|b| format!("{b:02x}")).collect();
    let key = meta_key(b'b', &[vhost, exchange, &dest, &binding.key, &args_hex]);
    let op = if store {
        let record = table_bytes(&[
            ("vhost", Value::Str(vhost.to_owned())),
            ("exchange", Value::Str(exchange.to_owned())),
            ("dest", Value::Str(dest)),
            ("key", Value::Str(binding.key.clone())),
            ("arguments", Value::Table(binding.args.clone())),
        ]);
        Op::Put { space: Space::Meta, key, value: record }
    } else {
        Op::Delete { space: Space::Meta, key }
    };
    if let Err(e) = broker.journal.write(vec![op]).await {
        warn!(error = %e, "cannot store binding");
    }
}

fn storage_name(vhost: &str, name: &str) -> String {
    format!("{QUEUE_PREFIX}{vhost}/{name}")
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

fn queue_record(q: &QueueEntity) -> Bytes {
    table_bytes(&[
        ("vhost", Value::Str(q.vhost.clone())),
        ("name", Value::Str(q.name.clone())),
        ("id", Value::Int(q.id.0 as i64)),
        ("auto_delete", Value::Bool(q.auto_delete)),
        ("arguments", Value::Table(q.arguments.clone())),
    ])
}

fn queue_from_record(value: &Bytes) -> Option<QueueEntity> {
    let t = read_table(value)?;
    let vhost = field_str(&t, "vhost")?;
    let name = field_str(&t, "name")?;
    let id = QueueId(u64::try_from(field(&t, "id")?.as_i64()?).ok()?);
    let arguments = field_table(&t, "arguments");
    let auto_delete = field_bool(&t, "auto_delete");
    let (config, stream) = if is_stream(&arguments) {
        let stream = stream_config(&vhost, &name, true, false, auto_delete, &arguments).ok()?;
        (QueueConfig::new(&name, &vhost), Some(Arc::new(stream)))
    } else {
        (queue_config(&vhost, &name, true, &arguments).ok()?, None)
    };
    Some(QueueEntity {
        vhost,
        name,
        id,
        durable: true,
        exclusive_owner: None,
        auto_delete,
        arguments,
        config: Arc::new(config),
        stream,
        had_consumer: AtomicBool::new(false),
        exclusive_consumer: Mutex::new(None),
        consumers: AtomicU64::new(0),
        last_used_ms: AtomicU64::new(now_ms()),
    })
}

fn exchange_from_record(value: &Bytes) -> Option<(String, ExchangeDef)> {
    let t = read_table(value)?;
    let def = ExchangeDef {
        name: field_str(&t, "name")?,
        kind: ExchangeKind::parse(&field_str(&t, "type")?)?,
        durable: true,
        auto_delete: field_bool(&t, "auto_delete"),
        internal: field_bool(&t, "internal"),
        arguments: field_table(&t, "arguments"),
    };
    Some((field_str(&t, "vhost")?, def))
}

fn binding_from_record(value: &Bytes) -> Option<(String, String, Binding)> {
    let t = read_table(value)?;
    let dest = field_str(&t, "dest")?;
    let dest = if let Some(id) = dest.strip_prefix("q:") {
        Destination::Queue(QueueId(id.parse().ok()?))
    } else {
        Destination::Exchange(dest.strip_prefix("x:")?.to_owned())
    };
    let binding =
        Binding { dest, key: field_str(&t, "key")?, args: field_table(&t, "arguments"), mqtt: None, filter: None };
    Some((field_str(&t, "vhost")?, field_str(&t, "exchange")?, binding))
}

fn binding_points_to_queue(value: &Bytes, id: QueueId) -> bool {
    read_table(value).and_then(|t| field_str(&t, "dest")).is_some_and(|d| d == format!("q:{}", id.0))
}

fn binding_involves_exchange(value: &Bytes, name: &str) -> bool {
    read_table(value).is_some_and(|t| {
        field_str(&t, "exchange").as_deref() == Some(name)
            || field_str(&t, "dest").is_some_and(|d| d == format!("x:{name}"))
    })
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

    #[test]
    fn records_round_trip() {
        let def = ExchangeDef {
            name: "x".into(),
            kind: ExchangeKind::Topic,
            durable: true,
            auto_delete: true,
            internal: false,
            arguments: args(&[("alternate-exchange", Value::Str("alt".into()))]),
        };
        let record = table_bytes(&[
            ("vhost", Value::Str("/".into())),
            ("name", Value::Str("x".into())),
            ("type", Value::Str("topic".into())),
            ("auto_delete", Value::Bool(true)),
            ("internal", Value::Bool(false)),
            ("arguments", Value::Table(def.arguments.clone())),
        ]);
        assert_eq!(exchange_from_record(&record), Some(("/".into(), def)));
    }
}

//! Metadata commands as the metadata group's log carries them ([`MetaCommand`]): the
//! core's durable entity and access commands, naming queues by virtual host and name,
//! never by a member's local consume-queue ids (each member's catalog hands out its own).
//!
//! Replicated (the first slices of issue 26): durable exchanges, queues and bindings; users,
//! virtual hosts, permissions and topic permissions, MQTT rules, limits, the cluster name;
//! retained messages. Every other command (MQTT sessions, inbound QoS 2 ids,
//! de-duplication ids, stream cursors, runtime parameters) stays on the member that made
//! it, as on a single node (`docs/cluster.md`, "What is replicated today").

use std::sync::Arc;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::core::entities::registry::storage_name;
use crate::core::message::Message;
use crate::core::router::{Binding, Destination, ExchangeDef, ExchangeKind};
use crate::core::store::{AccessCommand, Command, EntityCommand, QueueCatalog, QueueId, QueueRecord, StoreError};
use crate::core::value::{decode_table, encode_table, Value};

/// One replicated change to metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MetaCommand {
    /// A durable exchange is declared.
    PutExchange {
        /// Its virtual host.
        vhost: String,
        /// Its name.
        name: String,
        /// Its type (`direct`, `topic`, ...).
        kind: String,
        /// `auto-delete`.
        auto_delete: bool,
        /// `internal`.
        internal: bool,
        /// Its arguments as an AMQP field table.
        arguments: Vec<u8>,
    },
    /// A durable exchange is deleted, with its bindings.
    RemoveExchange {
        /// Its virtual host.
        vhost: String,
        /// Its name.
        name: String,
    },
    /// A durable queue is declared.
    PutQueue {
        /// Its virtual host.
        vhost: String,
        /// Its name.
        name: String,
        /// `auto-delete`.
        auto_delete: bool,
        /// Its arguments as an AMQP field table.
        arguments: Vec<u8>,
    },
    /// A durable queue is deleted, with the bindings to it.
    RemoveQueue {
        /// Its virtual host.
        vhost: String,
        /// Its name.
        name: String,
    },
    /// A binding between durable entities is made (`true`) or removed (`false`).
    Binding {
        /// Made or removed.
        put: bool,
        /// Its virtual host.
        vhost: String,
        /// The exchange it routes from.
        exchange: String,
        /// The queue (`true`) or exchange (`false`) it routes to.
        to_queue: bool,
        /// The destination's name.
        destination: String,
        /// The binding key.
        key: String,
        /// Its arguments as an AMQP field table.
        arguments: Vec<u8>,
    },
    /// A change to users, virtual hosts or permissions.
    Access(AccessCommand),
    /// The retained message of an MQTT topic (its routing key) is set (`Some`) or cleared.
    Retained {
        /// The topic, as its routing key.
        topic: String,
        /// The message: its record header and body.
        message: Option<RetainedMessage>,
    },
}

/// A message as a log carries it (a retained message in the metadata group's, a stream's
/// in the data group's): the message's record header (everything but the body) and its
/// body, each in base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedMessage {
    /// The record header, base64.
    pub header: String,
    /// The body, base64.
    pub body: String,
}

impl RetainedMessage {
    /// `msg` as the log carries it.
    pub(super) fn of(msg: &Message) -> RetainedMessage {
        RetainedMessage { header: B64.encode(msg.encode_header()), body: B64.encode(&msg.payload) }
    }

    /// The message again.
    pub(super) fn message(&self) -> Result<Message, MetaError> {
        let bytes = |s: &str| B64.decode(s).map_err(|e| MetaError::Arguments(format!("retained message: {e}")));
        let (header, body) = (bytes(&self.header)?, bytes(&self.body)?);
        Message::decode(header.into(), body.into())
            .map_err(|e| MetaError::Arguments(format!("retained message: {e:?}")))
    }
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// True for the access commands the metadata group replicates: every one but runtime
/// parameters (a dynamic shovel runs on the member it was made on; replicated, it would run
/// on every member at once).
fn is_replicated(c: &AccessCommand) -> bool {
    !matches!(c, AccessCommand::PutParameter(_) | AccessCommand::RemoveParameter { .. })
}

/// Names the local queue ids of commands the proposing member made.
pub trait QueueNames: Send + Sync {
    /// The virtual host and name of the declared queue whose consume queue is `id`.
    fn queue_name(&self, id: QueueId) -> Option<(String, String)>;
}

/// Why a command cannot be replicated.
#[derive(Debug, thiserror::Error)]
pub(super) enum MetaError {
    /// A binding names a queue this member does not know.
    #[error("binding to an unknown queue (id {0})")]
    UnknownQueue(u64),
    /// A replicated field table cannot be decoded.
    #[error("undecodable arguments: {0}")]
    Arguments(String),
    /// The member's catalog could not give a queue its id.
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub(super) fn table(args: &[(String, Value)]) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_table(args, &mut b);
    b.to_vec()
}

pub(super) fn untable(bytes: &[u8]) -> Result<Vec<(String, Value)>, MetaError> {
    let mut b = Bytes::copy_from_slice(bytes);
    decode_table(&mut b, 0).map_err(|e| MetaError::Arguments(format!("{e:?}")))
}

/// The replicated form of `command`: `Ok(None)` for what stays local.
pub(super) fn replicated(command: &Command, names: &dyn QueueNames) -> Result<Option<MetaCommand>, MetaError> {
    let binding = |put: bool, vhost: &str, exchange: &str, b: &Binding| -> Result<Option<MetaCommand>, MetaError> {
        let (to_queue, destination) = match &b.dest {
            Destination::Queue(id) => (true, names.queue_name(*id).ok_or(MetaError::UnknownQueue(id.0))?.1),
            Destination::Exchange(x) => (false, x.clone()),
            Destination::Session(_) | Destination::Member(_) => return Ok(None),
        };
        Ok(Some(MetaCommand::Binding {
            put,
            vhost: vhost.to_owned(),
            exchange: exchange.to_owned(),
            to_queue,
            destination,
            key: b.key.clone(),
            arguments: table(&b.args),
        }))
    };
    Ok(match command {
        Command::Entity(EntityCommand::PutExchange { vhost, def }) => Some(MetaCommand::PutExchange {
            vhost: vhost.clone(),
            name: def.name.clone(),
            kind: def.kind.name().to_owned(),
            auto_delete: def.auto_delete,
            internal: def.internal,
            arguments: table(&def.arguments),
        }),
        Command::Entity(EntityCommand::RemoveExchange { vhost, name }) => {
            Some(MetaCommand::RemoveExchange { vhost: vhost.clone(), name: name.clone() })
        }
        Command::Entity(EntityCommand::PutQueue(r)) => Some(MetaCommand::PutQueue {
            vhost: r.vhost.clone(),
            name: r.name.clone(),
            auto_delete: r.auto_delete,
            arguments: table(&r.arguments),
        }),
        Command::Entity(EntityCommand::RemoveQueue { vhost, name, .. }) => {
            Some(MetaCommand::RemoveQueue { vhost: vhost.clone(), name: name.clone() })
        }
        Command::Entity(EntityCommand::PutBinding { vhost, exchange, binding: b }) => {
            binding(true, vhost, exchange, b)?
        }
        Command::Entity(EntityCommand::RemoveBinding { vhost, exchange, binding: b }) => {
            binding(false, vhost, exchange, b)?
        }
        Command::Access(c) if is_replicated(c) => Some(MetaCommand::Access(c.clone())),
        Command::SetRetained { message } => Some(MetaCommand::Retained {
            topic: message.routing_key.clone(),
            message: Some(RetainedMessage::of(message)),
        }),
        Command::ClearRetained { topic } => Some(MetaCommand::Retained { topic: topic.clone(), message: None }),
        _ => None,
    })
}

/// `command` as this member's core command: queues get this member's consume-queue ids
/// (allocated on first sight).
pub(super) async fn local(command: MetaCommand, catalog: &dyn QueueCatalog) -> Result<Command, MetaError> {
    Ok(match command {
        MetaCommand::PutExchange { vhost, name, kind, auto_delete, internal, arguments } => {
            let kind =
                ExchangeKind::parse(&kind).ok_or_else(|| MetaError::Arguments(format!("exchange type '{kind}'")))?;
            let def = ExchangeDef { name, kind, durable: true, auto_delete, internal, arguments: untable(&arguments)? };
            EntityCommand::PutExchange { vhost, def }.into()
        }
        MetaCommand::RemoveExchange { vhost, name } => EntityCommand::RemoveExchange { vhost, name }.into(),
        MetaCommand::PutQueue { vhost, name, auto_delete, arguments } => {
            let id = catalog.durable_queue_id(&storage_name(&vhost, &name)).await?;
            EntityCommand::PutQueue(QueueRecord { vhost, name, id, auto_delete, arguments: untable(&arguments)? })
                .into()
        }
        MetaCommand::RemoveQueue { vhost, name } => {
            let id = catalog.queue_id(&storage_name(&vhost, &name)).await?;
            EntityCommand::RemoveQueue { vhost, name, id }.into()
        }
        MetaCommand::Binding { put, vhost, exchange, to_queue, destination, key, arguments } => {
            let args = untable(&arguments)?;
            let binding = if to_queue {
                let id = catalog.queue_id(&storage_name(&vhost, &destination)).await?;
                Binding::queue(id, &key, args)
            } else {
                Binding::exchange(&destination, &key, args)
            };
            match put {
                true => EntityCommand::PutBinding { vhost, exchange, binding },
                false => EntityCommand::RemoveBinding { vhost, exchange, binding },
            }
            .into()
        }
        MetaCommand::Access(c) => c.into(),
        MetaCommand::Retained { topic, message: None } => Command::ClearRetained { topic },
        MetaCommand::Retained { message: Some(m), .. } => Command::SetRetained { message: Arc::new(m.message()?) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::UserRecord;

    struct Names;
    impl QueueNames for Names {
        fn queue_name(&self, id: QueueId) -> Option<(String, String)> {
            (id.0 == 7).then(|| ("/".to_owned(), "orders".to_owned()))
        }
    }

    #[test]
    fn bindings_name_their_queue_and_session_bindings_stay_local() {
        let b = Binding::queue(QueueId(7), "k", vec![("x-match".into(), Value::Str("all".into()))]);
        let c = Command::Entity(EntityCommand::PutBinding { vhost: "/".into(), exchange: "x".into(), binding: b });
        let Some(MetaCommand::Binding { destination, to_queue: true, .. }) = replicated(&c, &Names).unwrap() else {
            panic!("not a queue binding")
        };
        assert_eq!(destination, "orders");
        let unknown = Binding::queue(QueueId(8), "k", vec![]);
        let c =
            Command::Entity(EntityCommand::PutBinding { vhost: "/".into(), exchange: "x".into(), binding: unknown });
        assert!(matches!(replicated(&c, &Names), Err(MetaError::UnknownQueue(8))));
    }

    #[tokio::test]
    async fn a_retained_message_crosses_the_log_whole_and_its_clearing_too() {
        let msg = Message {
            exchange: "amq.topic".into(),
            routing_key: "home.lamp".into(),
            payload: Bytes::from_static(b"\x00on\xff"),
            qos: 1,
            retain: true,
            props: crate::core::message::Properties { content_type: Some("text/plain".into()), ..Default::default() },
            timestamp_ms: 1_700_000_000_000,
        };
        let set = Command::SetRetained { message: Arc::new(msg.clone()) };
        let m = replicated(&set, &Names).unwrap().unwrap();
        let m: MetaCommand = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        let (_dir, journal, _stores) = crate::core::store::test_support::open();
        let catalog = crate::core::store::JournalStore::new(&journal);
        let Command::SetRetained { message } = local(m, &catalog).await.unwrap() else {
            panic!("not a retained message")
        };
        assert_eq!(*message, msg);
        let clear = replicated(&Command::ClearRetained { topic: "home.lamp".into() }, &Names).unwrap().unwrap();
        assert!(matches!(&clear, MetaCommand::Retained { topic, message: None } if topic == "home.lamp"));
    }

    #[test]
    fn users_replicate_and_shovel_parameters_stay_local() {
        let user = UserRecord {
            name: "u".into(),
            password_hash: "h".into(),
            hashing_algorithm: "rabbit_password_hashing_sha256".into(),
            tags: vec![],
            deleted: false,
        };
        let c = Command::Access(AccessCommand::PutUser(user));
        let m = replicated(&c, &Names).unwrap().unwrap();
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<MetaCommand>(&json).unwrap(), m);
        let c = Command::Access(AccessCommand::RemoveParameter {
            component: "shovel".into(),
            vhost: "/".into(),
            name: "s".into(),
        });
        assert!(replicated(&c, &Names).unwrap().is_none());
    }
}

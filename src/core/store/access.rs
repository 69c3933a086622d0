//! Durable users, virtual hosts and permissions made at runtime (the management API, an
//! imported definitions file), restored at start-up over the configured ones.
//!
//! Layout of the local implementation: typed tables in `Space::Meta` keyed `u\0name`
//! (users), `v\0name` (virtual hosts), `p\0vhost\0user` (permissions),
//! `t\0vhost\0user\0exchange` (topic permissions), `r\0mqtt` (the MQTT rules set
//! through the API, JSON), `a\0component\0vhost\0name` (runtime parameters),
//! `g\0name` (global parameters, JSON values) and `l\0v\0vhost` / `l\0u\0user` (limits).
//! Deleting a user or a virtual host that the configuration
//! names leaves a record with `deleted` set, so it stays deleted after a restart.

use std::fmt;

use bytes::{Bytes, BytesMut};
use ferrymq_storage::{Op, Space};

use futures_util::future::BoxFuture;

use super::{JournalStore, StoreWrite};
use crate::core::restore::{RecordKey, RecordKind, RestoreError};
use crate::core::value::{decode_table, encode_table, Value};

/// A stored user.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UserRecord {
    /// User name.
    pub name: String,
    /// RabbitMQ's password hash (base64 of salt ++ digest).
    pub password_hash: String,
    /// RabbitMQ's hashing module name.
    pub hashing_algorithm: String,
    /// User tags.
    pub tags: Vec<String>,
    /// Deleted (a tombstone over a configured user).
    pub deleted: bool,
}

/// A stored virtual host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VhostRecord {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Deleted (a tombstone over a configured virtual host).
    pub deleted: bool,
}

/// A user's permissions in one virtual host (regular expressions over resource names).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PermissionRecord {
    /// Virtual host.
    pub vhost: String,
    /// User.
    pub user: String,
    /// Resources the user may declare and delete.
    pub configure: String,
    /// Resources the user may publish to.
    pub write: String,
    /// Resources the user may consume from.
    pub read: String,
    /// A tombstone (`DELETE /api/permissions`): no permissions, so that a configured
    /// default does not come back at restart. Three empty expressions are permissions
    /// too, as RabbitMQ's: the vhost may be opened, nothing in it used.
    pub cleared: bool,
}

/// A user's topic permissions on one exchange (regular expressions over routing keys).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopicPermissionRecord {
    /// Virtual host.
    pub vhost: String,
    /// User.
    pub user: String,
    /// Exchange.
    pub exchange: String,
    /// Routing keys the user may publish with.
    pub write: String,
    /// Routing keys the user may bind with.
    pub read: String,
}

/// A runtime parameter (RabbitMQ's `/api/parameters/{component}/{vhost}/{name}`), such as
/// a shovel's definition.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParameterRecord {
    /// Component (`shovel`).
    pub component: String,
    /// Virtual host.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// The value, JSON.
    pub value: String,
}

/// The limits of a virtual host or a user (RabbitMQ's `vhost-limits` / user `limits`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LimitsRecord {
    /// Whose limits.
    pub scope: crate::core::limits::LimitScope,
    /// The virtual host or user.
    pub owner: String,
    /// The limits by name, negative values kept as given.
    pub values: crate::core::limits::LimitValues,
}

/// Everything stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRecords {
    /// Users (and tombstones).
    pub users: Vec<UserRecord>,
    /// Virtual hosts (and tombstones).
    pub vhosts: Vec<VhostRecord>,
    /// Permissions.
    pub permissions: Vec<PermissionRecord>,
    /// Topic permissions.
    pub topic_permissions: Vec<TopicPermissionRecord>,
    /// The MQTT rules set through the management API (JSON), if ever set.
    pub mqtt_rules: Option<String>,
    /// Runtime parameters.
    pub parameters: Vec<ParameterRecord>,
    /// Limits of virtual hosts and users.
    pub limits: Vec<LimitsRecord>,
    /// Global parameters (RabbitMQ's `global_parameters`: `cluster_name`): name and JSON value.
    pub global_parameters: Vec<(String, String)>,
}

/// A change to users, virtual hosts, permissions, rules, parameters or limits.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AccessCommand {
    /// A user is stored (or its tombstone).
    PutUser(UserRecord),
    /// A user's record is forgotten.
    RemoveUser {
        /// The user.
        name: String,
    },
    /// A virtual host is stored (or its tombstone).
    PutVhost(VhostRecord),
    /// A virtual host's record is forgotten.
    RemoveVhost {
        /// The virtual host.
        name: String,
    },
    /// A user's permissions in a virtual host are stored.
    PutPermission(PermissionRecord),
    /// A user's permissions record in a virtual host is forgotten.
    RemovePermission {
        /// The virtual host.
        vhost: String,
        /// The user.
        user: String,
    },
    /// A user's topic permissions on an exchange are stored.
    PutTopicPermission(TopicPermissionRecord),
    /// A user's topic permissions on an exchange are forgotten.
    RemoveTopicPermission {
        /// The virtual host.
        vhost: String,
        /// The user.
        user: String,
        /// The exchange.
        exchange: String,
    },
    /// The MQTT rules set through the API are stored (JSON).
    PutMqttRules {
        /// The rules, JSON.
        json: String,
    },
    /// A runtime parameter is stored.
    PutParameter(ParameterRecord),
    /// A runtime parameter is forgotten.
    RemoveParameter {
        /// Component (`shovel`).
        component: String,
        /// Virtual host.
        vhost: String,
        /// Name.
        name: String,
    },
    /// The limits of a virtual host or user are stored (none: forgotten).
    PutLimits(LimitsRecord),
    /// A global parameter is stored (JSON value).
    PutGlobalParameter {
        /// Name.
        name: String,
        /// Value, JSON.
        value: String,
    },
}

/// Users, virtual hosts and permissions, durable: reads, and the commands that change them.
pub trait AccessStore: fmt::Debug + Send + Sync {
    /// Everything stored; the first record that cannot be read or decoded is the error
    /// (a user deleted at run time must not come back from the configuration).
    fn load(&self) -> BoxFuture<'_, Result<AccessRecords, RestoreError>>;

    /// Stores a user (or its tombstone).
    fn put_user(&self, user: &UserRecord) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutUser(user.clone()))
    }
    /// Stores a virtual host (or its tombstone).
    fn put_vhost(&self, vhost: &VhostRecord) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutVhost(vhost.clone()))
    }
    /// Forgets a virtual host's record.
    fn remove_vhost(&self, name: &str) -> StoreWrite {
        StoreWrite::one(AccessCommand::RemoveVhost { name: name.to_owned() })
    }
    /// Forgets a user's record.
    fn remove_user(&self, name: &str) -> StoreWrite {
        StoreWrite::one(AccessCommand::RemoveUser { name: name.to_owned() })
    }
    /// Stores a user's permissions in a virtual host.
    fn put_permission(&self, p: &PermissionRecord) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutPermission(p.clone()))
    }
    /// Forgets a user's permissions in a virtual host.
    fn remove_permission(&self, vhost: &str, user: &str) -> StoreWrite {
        StoreWrite::one(AccessCommand::RemovePermission { vhost: vhost.to_owned(), user: user.to_owned() })
    }
    /// Stores a user's topic permissions on an exchange.
    fn put_topic_permission(&self, p: &TopicPermissionRecord) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutTopicPermission(p.clone()))
    }
    /// Forgets a user's topic permissions on an exchange.
    fn remove_topic_permission(&self, vhost: &str, user: &str, exchange: &str) -> StoreWrite {
        StoreWrite::one(AccessCommand::RemoveTopicPermission {
            vhost: vhost.to_owned(),
            user: user.to_owned(),
            exchange: exchange.to_owned(),
        })
    }
    /// Stores the MQTT rules set through the API (JSON).
    fn put_mqtt_rules(&self, json: &str) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutMqttRules { json: json.to_owned() })
    }
    /// Stores a runtime parameter.
    fn put_parameter(&self, p: &ParameterRecord) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutParameter(p.clone()))
    }
    /// Forgets a runtime parameter.
    fn remove_parameter(&self, component: &str, vhost: &str, name: &str) -> StoreWrite {
        StoreWrite::one(AccessCommand::RemoveParameter {
            component: component.to_owned(),
            vhost: vhost.to_owned(),
            name: name.to_owned(),
        })
    }
    /// Stores the limits of a virtual host or user (no limits: forgets them).
    fn put_limits(&self, limits: &LimitsRecord) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutLimits(limits.clone()))
    }
    /// Stores a global parameter (JSON value).
    fn put_global_parameter(&self, name: &str, value: &str) -> StoreWrite {
        StoreWrite::one(AccessCommand::PutGlobalParameter { name: name.to_owned(), value: value.to_owned() })
    }
}

fn limits_key(scope: crate::core::limits::LimitScope, owner: &str) -> Bytes {
    let tag = match scope {
        crate::core::limits::LimitScope::Vhost => "v",
        crate::core::limits::LimitScope::User => "u",
    };
    key(b'l', &[tag, owner])
}

fn key(kind: u8, parts: &[&str]) -> Bytes {
    let mut k = vec![kind];
    for p in parts {
        k.push(0);
        k.extend_from_slice(p.as_bytes());
    }
    Bytes::from(k)
}

fn table(fields: Vec<(&str, Value)>) -> Bytes {
    let owned: Vec<(String, Value)> = fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let mut b = BytesMut::new();
    encode_table(&owned, &mut b);
    b.freeze()
}

fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().map(|s| Value::Str(s.clone())).collect())
}

/// A stored record's fields; reading one that is there with another type is an error.
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn read(bytes: &Bytes) -> Result<Fields, String> {
        decode_table(&mut bytes.clone(), 0).map(Fields).map_err(|e| format!("not a field table: {e}"))
    }
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
    /// A text field that must be there.
    fn required(&self, name: &str) -> Result<String, String> {
        match self.get(name) {
            Some(v) => v.as_str().map(str::to_owned).ok_or_else(|| format!("field `{name}` is not text")),
            None => Err(format!("field `{name}` is missing")),
        }
    }
    /// A text field, empty when it is not there.
    fn text(&self, name: &str) -> Result<String, String> {
        match self.get(name) {
            Some(_) => self.required(name),
            None => Ok(String::new()),
        }
    }
    fn flag(&self, name: &str) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(format!("field `{name}` is not a boolean")),
        }
    }
    fn list(&self, name: &str) -> Result<Vec<String>, String> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("field `{name}` holds a value that is not text"))
                })
                .collect(),
            Some(_) => Err(format!("field `{name}` is not a list")),
        }
    }
}

/// The kind of record a `Space::Meta` key prefix of this store holds.
fn kind_of(prefix: u8) -> RecordKind {
    match prefix {
        b'u' => RecordKind::User,
        b'v' => RecordKind::Vhost,
        b'p' => RecordKind::Permission,
        b't' => RecordKind::TopicPermission,
        b'r' => RecordKind::MqttRules,
        b'a' => RecordKind::Parameter,
        b'l' => RecordKind::Limits,
        _ => RecordKind::GlobalParameter,
    }
}

/// Decodes one record of kind `prefix` into `found`.
fn decode_into(found: &mut AccessRecords, prefix: u8, value: &Bytes) -> Result<(), String> {
    use crate::core::limits::LimitScope;
    let f = Fields::read(value)?;
    match prefix {
        b'u' => found.users.push(UserRecord {
            name: f.required("name")?,
            password_hash: f.text("password_hash")?,
            hashing_algorithm: f.text("hashing_algorithm")?,
            tags: f.list("tags")?,
            deleted: f.flag("deleted")?,
        }),
        b'v' => found.vhosts.push(VhostRecord {
            name: f.required("name")?,
            description: f.text("description")?,
            tags: f.list("tags")?,
            deleted: f.flag("deleted")?,
        }),
        b't' => found.topic_permissions.push(TopicPermissionRecord {
            vhost: f.required("vhost")?,
            user: f.required("user")?,
            exchange: f.required("exchange")?,
            write: f.text("write")?,
            read: f.text("read")?,
        }),
        b'r' => found.mqtt_rules = Some(f.required("rules")?),
        b'l' => {
            let scope = match f.required("scope")?.as_str() {
                "user" => LimitScope::User,
                "vhost" => LimitScope::Vhost,
                other => return Err(format!("`{other}` is not a scope of limits")),
            };
            let values = match f.get("limits") {
                Some(Value::Table(t)) => t
                    .iter()
                    .map(|(k, v)| {
                        v.as_i64().map(|n| (k.clone(), n)).ok_or_else(|| format!("limit `{k}` is not a number"))
                    })
                    .collect::<Result<_, _>>()?,
                _ => return Err("field `limits` is not a table".into()),
            };
            found.limits.push(LimitsRecord { scope, owner: f.required("owner")?, values })
        }
        b'g' => found.global_parameters.push((f.required("name")?, f.required("value")?)),
        b'a' => found.parameters.push(ParameterRecord {
            component: f.required("component")?,
            vhost: f.required("vhost")?,
            name: f.required("name")?,
            value: f.required("value")?,
        }),
        _ => {
            let (configure, write, read) = (f.text("configure")?, f.text("write")?, f.text("read")?);
            // Records written before tombstones had a flag marked one as three empty
            // expressions.
            let legacy = f.get("cleared").is_none() && configure.is_empty() && write.is_empty() && read.is_empty();
            found.permissions.push(PermissionRecord {
                vhost: f.required("vhost")?,
                user: f.required("user")?,
                configure,
                write,
                read,
                cleared: f.flag("cleared")? || legacy,
            })
        }
    }
    Ok(())
}

fn put(key: Bytes, value: Bytes) -> Vec<Op> {
    vec![Op::Put { space: Space::Meta, key, value }]
}

fn delete(key: Bytes) -> Vec<Op> {
    vec![Op::Delete { space: Space::Meta, key }]
}

impl AccessStore for JournalStore {
    fn load(&self) -> BoxFuture<'_, Result<AccessRecords, RestoreError>> {
        Box::pin(async move {
            let mut found = AccessRecords::default();
            for prefix in [b'u', b'v', b'p', b't', b'r', b'a', b'l', b'g'] {
                let kind = kind_of(prefix);
                let records = self
                    .scan(Space::Meta, Bytes::copy_from_slice(&[prefix, 0]))
                    .await
                    .map_err(|e| RestoreError::unreadable(kind, &[prefix], e))?;
                for (key, value) in records {
                    decode_into(&mut found, prefix, &value)
                        .map_err(|reason| RestoreError::undecodable(kind, RecordKey::bytes(&key), reason))?;
                }
            }
            Ok(found)
        })
    }
}

/// The journal operations of an access command (the local state machine's half).
pub(super) fn ops(command: &AccessCommand) -> Vec<Op> {
    match command {
        AccessCommand::PutUser(u) => {
            let value = table(vec![
                ("name", Value::Str(u.name.clone())),
                ("password_hash", Value::Str(u.password_hash.clone())),
                ("hashing_algorithm", Value::Str(u.hashing_algorithm.clone())),
                ("tags", strings(&u.tags)),
                ("deleted", Value::Bool(u.deleted)),
            ]);
            put(key(b'u', &[&u.name]), value)
        }
        AccessCommand::PutVhost(v) => {
            let value = table(vec![
                ("name", Value::Str(v.name.clone())),
                ("description", Value::Str(v.description.clone())),
                ("tags", strings(&v.tags)),
                ("deleted", Value::Bool(v.deleted)),
            ]);
            put(key(b'v', &[&v.name]), value)
        }
        AccessCommand::RemoveVhost { name } => delete(key(b'v', &[name])),
        AccessCommand::RemoveUser { name } => delete(key(b'u', &[name])),
        AccessCommand::PutPermission(p) => {
            let value = table(vec![
                ("vhost", Value::Str(p.vhost.clone())),
                ("user", Value::Str(p.user.clone())),
                ("configure", Value::Str(p.configure.clone())),
                ("write", Value::Str(p.write.clone())),
                ("read", Value::Str(p.read.clone())),
                ("cleared", Value::Bool(p.cleared)),
            ]);
            put(key(b'p', &[&p.vhost, &p.user]), value)
        }
        AccessCommand::RemovePermission { vhost, user } => delete(key(b'p', &[vhost, user])),
        AccessCommand::PutTopicPermission(p) => {
            let value = table(vec![
                ("vhost", Value::Str(p.vhost.clone())),
                ("user", Value::Str(p.user.clone())),
                ("exchange", Value::Str(p.exchange.clone())),
                ("write", Value::Str(p.write.clone())),
                ("read", Value::Str(p.read.clone())),
            ]);
            put(key(b't', &[&p.vhost, &p.user, &p.exchange]), value)
        }
        AccessCommand::RemoveTopicPermission { vhost, user, exchange } => delete(key(b't', &[vhost, user, exchange])),
        AccessCommand::PutMqttRules { json } => {
            put(key(b'r', &["mqtt"]), table(vec![("rules", Value::Str(json.to_owned()))]))
        }
        AccessCommand::PutParameter(p) => {
            let value = table(vec![
                ("component", Value::Str(p.component.clone())),
                ("vhost", Value::Str(p.vhost.clone())),
                ("name", Value::Str(p.name.clone())),
                ("value", Value::Str(p.value.clone())),
            ]);
            put(key(b'a', &[&p.component, &p.vhost, &p.name]), value)
        }
        AccessCommand::RemoveParameter { component, vhost, name } => delete(key(b'a', &[component, vhost, name])),
        AccessCommand::PutLimits(l) => {
            let key = limits_key(l.scope, &l.owner);
            if l.values.is_empty() {
                return delete(key);
            }
            let values = l.values.iter().map(|(k, v)| (k.clone(), Value::Int(*v))).collect();
            let value = table(vec![
                ("scope", Value::Str(l.scope.label().to_owned())),
                ("owner", Value::Str(l.owner.clone())),
                ("limits", Value::Table(values)),
            ]);
            put(key, value)
        }
        AccessCommand::PutGlobalParameter { name, value } => {
            let value = table(vec![("name", Value::Str(name.to_owned())), ("value", Value::Str(value.to_owned()))]);
            put(key(b'g', &[name]), value)
        }
    }
}

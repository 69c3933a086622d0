//! Exchanges and bindings as declared: what an exchange is, where a binding delivers and
//! what an MQTT subscription adds to one.

use std::sync::Arc;

use ferrymq_storage::QueueId;

use crate::core::delivery::SessionLink;
use crate::core::tag_filter::{TagFilter, TagFilterError};
use crate::core::value::Value;

/// Where a binding delivers.
#[derive(Debug, Clone)]
pub enum Destination {
    /// A connected clean MQTT session (fast path).
    Session(Arc<SessionLink>),
    /// A consume queue: the message is stored for it.
    Queue(QueueId),
    /// Another exchange of the same virtual host.
    Exchange(String),
    /// Another member of the cluster (by node name), where a subscriber or a transient
    /// queue matches: the message is forwarded to it, which routes it to its own.
    Member(Arc<str>),
}

impl PartialEq for Destination {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Destination::Session(a), Destination::Session(b)) => Arc::ptr_eq(a, b),
            (Destination::Queue(a), Destination::Queue(b)) => a == b,
            (Destination::Exchange(a), Destination::Exchange(b)) => a == b,
            (Destination::Member(a), Destination::Member(b)) => a == b,
            _ => false,
        }
    }
}

/// MQTT subscription options carried by a binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttOptions {
    /// Client id of the subscriber, for no-local.
    pub client_id: Arc<str>,
    /// QoS granted to the subscription: the most a delivery through it gets.
    pub qos: u8,
    /// No Local: the subscriber's own publishes do not take this binding.
    pub no_local: bool,
    /// Retain As Published: deliveries keep the publish's RETAIN flag.
    pub retain_as_published: bool,
    /// Subscription Identifier, sent with every delivery through this subscription.
    pub subscription_id: Option<u32>,
    /// Tag filter of the subscription (MQTT 5 user property `tag-filter`).
    pub tag_filter: Option<Arc<TagFilter>>,
    /// The shared-subscription group whose queue the binding leads to (`$share/{group}/`).
    pub share_group: Option<Arc<str>>,
}

/// The binding argument that names an MQTT shared-subscription group on a binding to
/// another cluster member (its members there): each group takes a message once,
/// cluster-wide.
pub const SHARE_GROUP_ARG: &str = "x-mqtt-share-group";

impl Binding {
    /// The MQTT shared-subscription group this binding serves: a group's queue here, or
    /// its members on another cluster member.
    pub fn share_group(&self) -> Option<&str> {
        match &self.dest {
            Destination::Member(_) => {
                self.args.iter().find(|(k, _)| k == SHARE_GROUP_ARG).and_then(|(_, v)| v.as_str())
            }
            _ => self.mqtt.as_ref().and_then(|o| o.share_group.as_deref()),
        }
    }
}

/// One binding. Its identity is (destination, key, arguments).
#[derive(Debug, Clone)]
pub struct Binding {
    /// Where matching messages go.
    pub dest: Destination,
    /// Binding key as given (AMQP pattern syntax for topic exchanges).
    pub key: String,
    /// Binding arguments (headers-exchange match arguments, ...).
    pub args: Vec<(String, Value)>,
    /// MQTT options when the binding is an MQTT subscription.
    pub mqtt: Option<MqttOptions>,
    /// The tag filter, compiled by [`Router::bind`](super::Router::bind) from the
    /// `x-tag-filter` argument or the MQTT options; messages it rejects do not take this
    /// binding.
    pub filter: Option<Arc<TagFilter>>,
}

impl Binding {
    /// A binding to a queue without MQTT options (AMQP queue.bind, the default exchange).
    pub fn queue(queue: QueueId, key: &str, args: Vec<(String, Value)>) -> Binding {
        Binding { dest: Destination::Queue(queue), key: key.to_owned(), args, mqtt: None, filter: None }
    }

    /// A binding to another exchange (exchange-to-exchange).
    pub fn exchange(exchange: &str, key: &str, args: Vec<(String, Value)>) -> Binding {
        Binding {
            dest: Destination::Exchange(exchange.to_owned()),
            key: key.to_owned(),
            args,
            mqtt: None,
            filter: None,
        }
    }

    /// Compiles the tag filter: the `x-tag-filter` argument, else the MQTT options' one.
    pub(super) fn compile_filter(&mut self) -> Result<(), TagFilterError> {
        self.filter = match TagFilter::from_arguments(&self.args)? {
            Some(f) => Some(Arc::new(f)),
            None => self.mqtt.as_ref().and_then(|o| o.tag_filter.clone()),
        };
        Ok(())
    }

    /// True when this binding has the identity (destination, key, arguments).
    pub(super) fn same(&self, dest: &Destination, key: &str, args: &[(String, Value)]) -> bool {
        self.dest == *dest && self.key == key && self.args == args
    }
}

/// Adds `b`, or replaces the binding of the same identity; true if it is new.
pub(super) fn upsert(list: &mut Vec<Binding>, b: Binding) -> bool {
    if let Some(existing) = list.iter_mut().find(|e| e.same(&b.dest, &b.key, &b.args)) {
        *existing = b;
        false
    } else {
        list.push(b);
        true
    }
}

/// Removes the bindings `pred` selects; returns how many.
pub(super) fn retain_count(list: &mut Vec<Binding>, pred: &dyn Fn(&Binding) -> bool) -> usize {
    let before = list.len();
    list.retain(|b| !pred(b));
    before - list.len()
}

/// The AMQP exchange types: how an exchange picks the bindings a message takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// The bindings whose key is the routing key.
    Direct,
    /// Every binding, whatever its key.
    Fanout,
    /// Word patterns with `*` and `#`.
    Topic,
    /// Header matching (`x-match` all/any).
    Headers,
    /// One binding per message, by consistent hashing (`x-consistent-hash`).
    ConsistentHash,
    /// `x-delayed-message` (the delayed-message plugin's type): a publish with a positive
    /// `x-delay` header is stored and routed when its time comes, by the rules of the
    /// exchange's `x-delayed-type`.
    DelayedMessage,
    /// `x-message-deduplication` (the message-deduplication plugin's type): routes as a
    /// fanout exchange, but a message whose `x-deduplication-header` value is in the
    /// exchange's cache is routed nowhere (see [`crate::core::dedup`]).
    MessageDeduplication,
}

impl ExchangeKind {
    /// Parses an AMQP exchange type name.
    pub fn parse(name: &str) -> Option<ExchangeKind> {
        match name {
            "direct" => Some(ExchangeKind::Direct),
            "fanout" => Some(ExchangeKind::Fanout),
            "topic" => Some(ExchangeKind::Topic),
            "headers" => Some(ExchangeKind::Headers),
            "x-consistent-hash" => Some(ExchangeKind::ConsistentHash),
            "x-delayed-message" => Some(ExchangeKind::DelayedMessage),
            crate::core::dedup::EXCHANGE_TYPE => Some(ExchangeKind::MessageDeduplication),
            _ => None,
        }
    }

    /// The type name as exchange.declare spells it (the inverse of [`ExchangeKind::parse`]).
    pub fn name(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
            ExchangeKind::ConsistentHash => "x-consistent-hash",
            ExchangeKind::DelayedMessage => "x-delayed-message",
            ExchangeKind::MessageDeduplication => crate::core::dedup::EXCHANGE_TYPE,
        }
    }
}

/// What an exchange is, as declared.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeDef {
    /// The exchange's name in its virtual host ("" is the default exchange).
    pub name: String,
    /// The declared type (see [`ExchangeDef::routing_kind`] for the rules that route).
    pub kind: ExchangeKind,
    /// Declared durable: kept in the entity store and restored at start-up.
    pub durable: bool,
    /// Deleted when its last binding goes.
    pub auto_delete: bool,
    /// Cannot be published to directly.
    pub internal: bool,
    /// Declaration arguments (`alternate-exchange`, ...).
    pub arguments: Vec<(String, Value)>,
}

impl ExchangeDef {
    /// The `alternate-exchange` argument: where a message goes that this exchange
    /// delivers nowhere.
    pub fn alternate(&self) -> Option<&str> {
        self.argument("alternate-exchange").and_then(Value::as_str)
    }

    /// The `x-delayed-type` argument of an `x-delayed-message` exchange: the type whose
    /// routing rules its bindings follow. `None` when absent or not a plain type.
    pub fn delayed_type(&self) -> Option<ExchangeKind> {
        self.argument("x-delayed-type")
            .and_then(Value::as_str)
            .and_then(ExchangeKind::parse)
            .filter(|k| !matches!(k, ExchangeKind::DelayedMessage | ExchangeKind::MessageDeduplication))
    }

    /// The kind whose rules route through this exchange's bindings: the `x-delayed-type`
    /// of a delayed-message exchange (direct when missing), else its own kind.
    pub fn routing_kind(&self) -> ExchangeKind {
        match self.kind {
            ExchangeKind::DelayedMessage => self.delayed_type().unwrap_or(ExchangeKind::Direct),
            ExchangeKind::MessageDeduplication => ExchangeKind::Fanout,
            kind => kind,
        }
    }

    fn argument(&self, name: &str) -> Option<&Value> {
        self.arguments.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

/// Names and types of the exchanges every virtual host has.
pub const STANDARD_EXCHANGES: [(&str, ExchangeKind); 6] = [
    ("", ExchangeKind::Direct),
    ("amq.direct", ExchangeKind::Direct),
    ("amq.fanout", ExchangeKind::Fanout),
    ("amq.topic", ExchangeKind::Topic),
    ("amq.headers", ExchangeKind::Headers),
    ("amq.match", ExchangeKind::Headers),
];

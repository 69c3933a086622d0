//! What the AMQP methods do: exchange.*, queue.*, basic.*, tx.*, and basic.publish —
//! with RabbitMQ's checks, reply codes and texts.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferrymq_amqp::connection::{Content, Publish};
use ferrymq_amqp::methods::{basic, connection, exchange, queue, tx};
use ferrymq_amqp::AMQPClass;

use tracing::info;

use super::channel::{ChannelConsumer, Settle, TxPublish};
use super::connection::{PendingConfirm, Task, NO_ACK_CREDIT};
use super::convert::{properties_in, properties_out, qos_of, short, table_in};
use super::streams::{consumer_group, partitions_of, sharing, stream_offset, Sharing};
use crate::access::authz::{BindingRequest, BoundTo, Permission, Refused, ResourceKind, RouteRefused};
use crate::core::broker::{RetainMode, StreamSubscription};
use crate::core::connections::ConsumerInfo;
use crate::core::entities::{check_equivalent_queue, EntityError, QueueEntity};
use crate::core::message::{now_ms, Message, SharedMessage};
use crate::core::queue::Consumer;
use crate::core::router::{Binding, ExchangeDef, ExchangeKind, RouteError};
use crate::core::store::{QueueId, StoreWrite};
use crate::core::stream::assignment::{GroupKey, MemberId, Scope};
use crate::core::stream::StreamOffset;
use crate::core::tag_filter::TagFilter;
use crate::core::value::Value;

/// A channel or connection exception to send.
/// A refused method: the reply code and text, and whether it closes the connection (else the channel).
#[derive(Debug)]
pub(crate) struct Fail {
    /// AMQP reply code (404, 405, 406, 541, ...).
    pub code: u16,
    /// Reply text, as RabbitMQ words it.
    pub text: String,
    /// A connection error (else a channel error).
    pub connection: bool,
}

impl From<EntityError> for Fail {
    /// A refused entity operation as RabbitMQ answers it: 404 for a missing queue or
    /// exchange, 530 (connection) for a missing virtual host, 541 (connection) when storage
    /// failed, 406 for every other refusal; the text is the error's.
    fn from(e: EntityError) -> Fail {
        let (code, connection) = match &e {
            EntityError::NotFound { .. } => (404, false),
            EntityError::NoVhost(_) => (530, true),
            EntityError::Storage(_) => (541, true),
            EntityError::Inequivalent { .. }
            | EntityError::QueueLimit { .. }
            | EntityError::InvalidArgument(_)
            | EntityError::InUse { .. }
            | EntityError::Route(_) => (406, false),
        };
        Fail { code, text: e.to_string(), connection }
    }
}

fn channel_fail(code: u16, text: String) -> Fail {
    Fail { code, text, connection: false }
}

fn not_found(what: &str, name: &str, vhost: &str) -> Fail {
    channel_fail(404, format!("NOT_FOUND - no {what} '{name}' in vhost '{vhost}'"))
}

fn refused(r: Refused) -> Fail {
    channel_fail(403, format!("ACCESS_REFUSED - {}", r.0))
}

fn route_refused(r: RouteRefused) -> Fail {
    channel_fail(403, format!("ACCESS_REFUSED - {}", r.text()))
}

fn reply(method: AMQPClass) -> Result<Option<AMQPClass>, Fail> {
    Ok(Some(method))
}

impl Task {
    /// Connection.Update-Secret (RabbitMQ 3.8+, e.g. an OAuth token refresh): the user is
    /// checked again and the connection kept (Update-Secret-Ok), or closed with 530.
    fn on_update_secret(&mut self, reason: &str) -> Result<Option<AMQPClass>, Fail> {
        match self.ctx.users.update_secret(&self.user) {
            Ok(()) => {
                info!(reason, "secret updated");
                reply(AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(connection::UpdateSecretOk {})))
            }
            Err(e) => Err(Fail {
                code: 530,
                text: format!("NOT_ALLOWED - Secret update was refused for user '{}': {e}", self.user),
                connection: true,
            }),
        }
    }

    pub(super) async fn on_method(&mut self, channel: u16, method: AMQPClass) {
        let (class_id, method_id) = (method.get_amqp_class_id(), method.get_amqp_method_id());
        if matches!(method, AMQPClass::Queue(_) | AMQPClass::Basic(basic::AMQPMethod::Get(_))) {
            self.settle_publishes().await;
        }
        let outcome = match method {
            AMQPClass::Exchange(m) => self.on_exchange(m).await,
            AMQPClass::Queue(m) => self.on_queue(channel, m).await,
            AMQPClass::Basic(m) => self.on_basic(channel, m).await,
            AMQPClass::Tx(m) => self.on_tx(channel, m).await,
            AMQPClass::Connection(connection::AMQPMethod::UpdateSecret(u)) => self.on_update_secret(u.reason.as_str()),
            _ => Err(Fail { code: 540, text: "NOT_IMPLEMENTED - method not supported".into(), connection: true }),
        };
        match outcome {
            Ok(Some(answer)) => self.proto.reply(channel, answer),
            Ok(None) => {}
            Err(f) if f.connection => self.close_connection(f.code, &f.text, class_id, method_id),
            Err(f) => {
                self.proto.channel_error(channel, f.code, &f.text, class_id, method_id);
            }
        }
    }

    // ----- exchanges -----------------------------------------------------------------

    async fn on_exchange(&mut self, m: exchange::AMQPMethod) -> Result<Option<AMQPClass>, Fail> {
        let vhost = self.vhost.clone();
        let ctx = self.ctx.clone();
        let router = ctx.broker.routing();
        match m {
            exchange::AMQPMethod::Declare(d) => {
                let name = d.exchange.as_str().to_owned();
                let existing = router.exchange(&vhost, &name);
                if d.passive {
                    return match existing {
                        Some(_) => ok_unless(
                            d.nowait,
                            AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {})),
                        ),
                        None => Err(not_found("exchange", &name, &vhost)),
                    };
                }
                if name.is_empty() {
                    return Err(channel_fail(
                        403,
                        "ACCESS_REFUSED - operation not permitted on the default exchange".into(),
                    ));
                }
                self.access.resource(ResourceKind::Exchange, &name, Permission::Configure).map_err(refused)?;
                let Some(kind) = ExchangeKind::parse(d.kind.as_str()) else {
                    return Err(Fail {
                        code: 503,
                        text: format!("COMMAND_INVALID - unknown exchange type '{}'", d.kind.as_str()),
                        connection: true,
                    });
                };
                // The amq.* exchanges may be redeclared equivalently; new amq.* names are reserved.
                if name.starts_with("amq.") && existing.is_none() {
                    return Err(channel_fail(
                        403,
                        format!("ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'"),
                    ));
                }
                let def = ExchangeDef {
                    name: name.clone(),
                    kind,
                    durable: d.durable,
                    auto_delete: d.auto_delete,
                    internal: d.internal,
                    arguments: table_in(&d.arguments),
                };
                if kind == ExchangeKind::DelayedMessage && def.delayed_type().is_none() {
                    return Err(channel_fail(
                        406,
                        "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"
                            .into(),
                    ));
                }
                if let Some(ae) = def.alternate() {
                    self.route_into_permitted(ae)?;
                }
                ctx.entities.declare_exchange(&vhost, def).await?;
                ok_unless(d.nowait, AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {})))
            }
            exchange::AMQPMethod::Delete(d) => {
                let name = d.exchange.as_str();
                if name.is_empty() {
                    return Err(channel_fail(
                        403,
                        "ACCESS_REFUSED - operation not permitted on the default exchange".into(),
                    ));
                }
                if name.starts_with("amq.") {
                    return Err(channel_fail(
                        403,
                        format!("ACCESS_REFUSED - operation not permitted on exchange '{name}' in vhost '{vhost}'"),
                    ));
                }
                self.access.resource(ResourceKind::Exchange, name, Permission::Configure).map_err(refused)?;
                match ctx.entities.delete_exchange(&vhost, name, d.if_unused).await {
                    Ok(()) => {}
                    // RabbitMQ 3.x: deleting an exchange that does not exist succeeds.
                    Err(EntityError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                ok_unless(d.nowait, AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {})))
            }
            exchange::AMQPMethod::Bind(b) => {
                self.exchange_binding(
                    b.source.as_str(),
                    b.destination.as_str(),
                    b.routing_key.as_str(),
                    table_in(&b.arguments),
                    true,
                )
                .await?;
                ok_unless(b.nowait, AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {})))
            }
            exchange::AMQPMethod::Unbind(b) => {
                self.exchange_binding(
                    b.source.as_str(),
                    b.destination.as_str(),
                    b.routing_key.as_str(),
                    table_in(&b.arguments),
                    false,
                )
                .await?;
                ok_unless(b.nowait, AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {})))
            }
            _ => Err(Fail { code: 540, text: "NOT_IMPLEMENTED - method not supported".into(), connection: true }),
        }
    }

    async fn exchange_binding(
        &mut self,
        source: &str,
        dest: &str,
        key: &str,
        args: Vec<(String, Value)>,
        bind: bool,
    ) -> Result<(), Fail> {
        let vhost = self.vhost.clone();
        let ctx = self.ctx.clone();
        let router = ctx.broker.routing();
        if source.is_empty() || dest.is_empty() {
            return Err(channel_fail(403, "ACCESS_REFUSED - operation not permitted on the default exchange".into()));
        }
        let (src, dst) = match (router.exchange(&vhost, source), router.exchange(&vhost, dest)) {
            (Some(src), Some(dst)) => (src, dst),
            // Unbinding is idempotent: an exchange that is gone has no binding left.
            _ if !bind => return Ok(()),
            (None, _) => return Err(not_found("exchange", source, &vhost)),
            (_, None) => return Err(not_found("exchange", dest, &vhost)),
        };
        let request = BindingRequest {
            source,
            topic: src.kind == ExchangeKind::Topic,
            destination: BoundTo::Exchange(dest),
            key,
            bind,
        };
        self.access.binding(&request).map_err(route_refused)?;
        let binding = Binding::exchange(dest, key, args);
        let durable = src.durable && dst.durable;
        match bind {
            true => ctx.entities.bind(&vhost, source, &binding, durable).await?,
            false => ctx.entities.unbind(&vhost, source, &binding, durable).await?,
        }
        Ok(())
    }

    // ----- queues ----------------------------------------------------------------------

    /// The queue `name` for an operation by this connection: 404 when missing, 405 when
    /// another connection holds it exclusively.
    fn usable_queue(&self, name: &str) -> Result<Arc<QueueEntity>, Fail> {
        let Some(q) = self.ctx.entities.queue(&self.vhost, name) else {
            return Err(not_found("queue", name, &self.vhost));
        };
        if q.exclusive_owner.is_some_and(|owner| owner != self.id) {
            return Err(channel_fail(
                405,
                format!("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.", self.vhost),
            ));
        }
        Ok(q)
    }

    /// A route into `exchange` the client sets up (an alternate or dead-letter exchange):
    /// the check the management API makes too ([`crate::access::authz::Access::route_into`]).
    fn route_into_permitted(&mut self, exchange: &str) -> Result<(), Fail> {
        self.access.route_into(exchange).map_err(route_refused)
    }

    /// The checks for binding a queue (or unbinding it), the management API's too
    /// ([`crate::access::authz::Access::binding`]).
    fn binding_permitted(
        &mut self,
        queue: &str,
        exchange: &str,
        kind: ExchangeKind,
        key: &str,
        bind: bool,
    ) -> Result<(), Fail> {
        let request = BindingRequest {
            source: exchange,
            topic: kind == ExchangeKind::Topic,
            destination: BoundTo::Queue(queue),
            key,
            bind,
        };
        self.access.binding(&request).map_err(route_refused)
    }

    async fn on_queue(&mut self, channel: u16, m: queue::AMQPMethod) -> Result<Option<AMQPClass>, Fail> {
        let vhost = self.vhost.clone();
        match m {
            queue::AMQPMethod::Declare(d) => {
                let mut name = d.queue.as_str().to_owned();
                if d.passive {
                    let q = self.usable_queue(&name)?;
                    q.touch();
                    return ok_unless(d.nowait, declare_ok(&self.ctx.broker, &q).await);
                }
                if name.is_empty() {
                    name = generated_name("amq.gen-");
                } else if name.starts_with("amq.") {
                    return Err(channel_fail(
                        403,
                        format!("ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'"),
                    ));
                }
                self.access.resource(ResourceKind::Queue, &name, Permission::Configure).map_err(refused)?;
                let arguments = table_in(&d.arguments);
                let dlx = arguments.iter().find(|(k, _)| k == "x-dead-letter-exchange").and_then(|(_, v)| v.as_str());
                if let Some(dlx) = dlx.map(str::to_owned) {
                    self.route_into_permitted(&dlx)?;
                }
                if let Some(existing) = self.ctx.entities.queue(&vhost, &name) {
                    let q = self.usable_queue(&name)?;
                    check_equivalent_queue(&existing, d.durable, d.exclusive, d.auto_delete, &arguments)?;
                    q.touch();
                    return ok_unless(d.nowait, declare_ok(&self.ctx.broker, &q).await);
                }
                let owner = d.exclusive.then_some(self.id);
                let q =
                    self.ctx.entities.create_queue(&vhost, &name, d.durable, owner, d.auto_delete, arguments).await?;
                if d.exclusive {
                    self.exclusive.push(q.clone());
                }
                if !q.durable {
                    // On a cluster member: publishes through the others reach it from now on.
                    self.ctx.broker.members_know_bindings().await;
                }
                let _ = channel;
                ok_unless(d.nowait, declare_ok(&self.ctx.broker, &q).await)
            }
            queue::AMQPMethod::Bind(b) => {
                let q = self.usable_queue(b.queue.as_str())?;
                let exchange = b.exchange.as_str();
                let Some(x) = self.ctx.broker.routing().exchange(&vhost, exchange) else {
                    return Err(not_found("exchange", exchange, &vhost));
                };
                if exchange.is_empty() {
                    return Err(channel_fail(
                        403,
                        "ACCESS_REFUSED - operation not permitted on the default exchange".into(),
                    ));
                }
                self.binding_permitted(&q.name, exchange, x.kind, b.routing_key.as_str(), true)?;
                let binding = Binding::queue(q.id, b.routing_key.as_str(), table_in(&b.arguments));
                self.ctx.entities.bind(&vhost, exchange, &binding, x.durable && q.durable).await?;
                if !q.durable {
                    self.ctx.broker.members_know_bindings().await;
                }
                ok_unless(b.nowait, AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})))
            }
            queue::AMQPMethod::Unbind(b) => {
                let exchange = b.exchange.as_str();
                if exchange.is_empty() {
                    return Err(channel_fail(
                        403,
                        "ACCESS_REFUSED - operation not permitted on the default exchange".into(),
                    ));
                }
                let unbind_ok = AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {}));
                // Unbinding is idempotent, as in RabbitMQ: a queue or exchange that is gone
                // (an auto-delete queue whose last consumer left) has no binding left.
                if self.ctx.entities.queue(&vhost, b.queue.as_str()).is_none() {
                    return reply(unbind_ok);
                }
                let q = self.usable_queue(b.queue.as_str())?;
                let Some(x) = self.ctx.broker.routing().exchange(&vhost, exchange) else { return reply(unbind_ok) };
                self.binding_permitted(&q.name, exchange, x.kind, b.routing_key.as_str(), false)?;
                let binding = Binding::queue(q.id, b.routing_key.as_str(), table_in(&b.arguments));
                self.ctx.entities.unbind(&vhost, exchange, &binding, x.durable && q.durable).await?;
                reply(unbind_ok)
            }
            queue::AMQPMethod::Purge(p) => {
                let q = self.usable_queue(p.queue.as_str())?;
                self.access.resource(ResourceKind::Queue, &q.name, Permission::Read).map_err(refused)?;
                let n = self.ctx.broker.purge_queue(q.id).await;
                ok_unless(
                    p.nowait,
                    AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk {
                        message_count: n.min(u32::MAX as u64) as u32,
                    })),
                )
            }
            queue::AMQPMethod::Delete(d) => {
                let name = d.queue.as_str();
                let q = match self.usable_queue(name) {
                    Ok(q) => q,
                    // RabbitMQ: deleting a queue that does not exist succeeds with count 0.
                    Err(f) if f.code == 404 => {
                        return ok_unless(
                            d.nowait,
                            AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk { message_count: 0 })),
                        )
                    }
                    Err(f) => return Err(f),
                };
                self.access.resource(ResourceKind::Queue, name, Permission::Configure).map_err(refused)?;
                if d.if_unused && q.consumers.load(Ordering::Relaxed) > 0 {
                    return Err(channel_fail(
                        406,
                        format!("PRECONDITION_FAILED - queue '{name}' in vhost '{vhost}' in use"),
                    ));
                }
                if d.if_empty && self.ctx.broker.queue_counts(q.id).await.0 > 0 {
                    return Err(channel_fail(
                        406,
                        format!("PRECONDITION_FAILED - queue '{name}' in vhost '{vhost}' not empty"),
                    ));
                }
                let n = self.ctx.entities.delete_queue(&q).await?;
                self.exclusive.retain(|e| !Arc::ptr_eq(e, &q));
                ok_unless(
                    d.nowait,
                    AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
                        message_count: n.min(u32::MAX as u64) as u32,
                    })),
                )
            }
            _ => Err(Fail { code: 540, text: "NOT_IMPLEMENTED - method not supported".into(), connection: true }),
        }
    }

    // ----- basic -----------------------------------------------------------------------

    async fn on_basic(&mut self, channel: u16, m: basic::AMQPMethod) -> Result<Option<AMQPClass>, Fail> {
        match m {
            basic::AMQPMethod::Qos(q) => {
                let ch = self.channel(channel)?;
                if q.global {
                    ch.global_prefetch = q.prefetch_count;
                } else {
                    ch.prefetch = q.prefetch_count;
                }
                self.flush_held(channel);
                reply(AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})))
            }
            basic::AMQPMethod::Consume(c) => {
                let q = self.usable_queue(c.queue.as_str())?;
                self.access.resource(ResourceKind::Queue, &q.name, Permission::Read).map_err(refused)?;
                let tag = if c.consumer_tag.as_str().is_empty() {
                    generated_name("amq.ctag-")
                } else {
                    c.consumer_tag.as_str().to_owned()
                };
                if self.channels.values().any(|ch| ch.consumers.values().any(|x| x.tag == tag)) {
                    return Err(Fail {
                        code: 530,
                        text: format!("NOT_ALLOWED - attempt to reuse consumer tag '{tag}'"),
                        connection: true,
                    });
                }
                let args = table_in(&c.arguments);
                let stream_start = match q.is_stream() {
                    true => Some(self.stream_consume_checks(channel, &q, c.no_ack, &args)?),
                    false => None,
                };
                let assigned = match &stream_start {
                    Some((_, Some(group), _, sharing)) => self.assigned_group(&q, group, sharing)?,
                    _ => None,
                };
                // Last of the checks: a refused consume must not leave the queue locked.
                {
                    let mut exclusive = q.exclusive_consumer.lock();
                    if exclusive.is_some() || (c.exclusive && q.consumers.load(Ordering::Relaxed) > 0) {
                        return Err(channel_fail(
                            403,
                            format!("ACCESS_REFUSED - queue '{}' in vhost '{}' in exclusive use", q.name, self.vhost),
                        ));
                    }
                    if c.exclusive {
                        *exclusive = Some(self.id);
                    }
                }
                let priority =
                    args.iter().find(|(k, _)| k == "x-priority").and_then(|(_, v)| v.as_i64()).unwrap_or(0) as i32;
                let id = self.ctx.broker.next_id();
                let unlimited = self.ctx.cfg.max_unacked_without_prefetch.max(1);
                let ch = self.channel(channel)?;
                let credit = if c.no_ack {
                    NO_ACK_CREDIT
                } else if ch.prefetch > 0 {
                    ch.prefetch as u32
                } else if ch.global_prefetch > 0 {
                    ch.global_prefetch as u32
                } else {
                    unlimited
                };
                ch.consumers.insert(
                    id,
                    ChannelConsumer {
                        tag: tag.clone(),
                        queue: q.id,
                        queue_name: q.name.clone(),
                        no_ack: c.no_ack,
                        stream: stream_start.is_some(),
                        assigned: assigned.is_some(),
                    },
                );
                self.consumer_channels.insert(id, channel);
                if let Some(info) = &self.info {
                    info.consumer_added(ConsumerInfo {
                        id,
                        tag: tag.clone(),
                        queue: q.name.clone(),
                        channel,
                        ack_required: !c.no_ack,
                        exclusive: c.exclusive,
                        prefetch: if c.no_ack { 0 } else { credit },
                        arguments: args.clone(),
                    });
                }
                q.had_consumer.store(true, Ordering::Relaxed);
                q.consumers.fetch_add(1, Ordering::Relaxed);
                q.touch();
                let consumer = Consumer { id, tx: self.events_tx.clone(), credit, max_qos: 2, priority };
                // Consume-ok goes out before the first delivery can.
                if !c.nowait {
                    self.proto.reply(
                        channel,
                        AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk { consumer_tag: short(&tag) })),
                    );
                }
                let broker = &self.ctx.broker;
                match stream_start {
                    Some((start, group, filter, _)) => {
                        let how = StreamSubscription { start, group, filter, exclusive: assigned.is_some() };
                        broker.attach_stream_consumer(q.id, consumer, how)
                    }
                    None => broker.attach_consumer(q.id, consumer),
                }
                if let Some((key, partitions)) = assigned {
                    let member = MemberId { connection: self.id, channel };
                    broker.join_stream_group(key, partitions, member, q.id, id);
                }
                Ok(None)
            }
            basic::AMQPMethod::Cancel(c) => {
                let tag = c.consumer_tag.as_str().to_owned();
                let ch = self.channel(channel)?;
                let found = ch.consumers.iter().find(|(_, x)| x.tag == tag).map(|(id, x)| (*id, x.clone()));
                if let Some((id, consumer)) = found {
                    ch.consumers.remove(&id);
                    self.consumer_channels.remove(&id);
                    if let Some(info) = &self.info {
                        info.consumer_removed(id);
                    }
                    self.ctx.broker.cancel_consumer(consumer.queue, id);
                    if consumer.assigned {
                        self.ctx.broker.leave_stream_group(id);
                    }
                    self.consumer_left(&consumer.queue_name);
                    // Deleted before Cancel-Ok, as RabbitMQ: the client's next method
                    // (a passive declare, an unbind) sees the queue gone.
                    if let Some(q) = self.orphaned_auto_delete(&consumer.queue_name) {
                        self.ctx.entities.delete_queue_logged(&q).await;
                    }
                }
                ok_unless(
                    c.nowait,
                    AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk { consumer_tag: short(&tag) })),
                )
            }
            basic::AMQPMethod::Get(g) => {
                let q = self.usable_queue(g.queue.as_str())?;
                self.access.resource(ResourceKind::Queue, &q.name, Permission::Read).map_err(refused)?;
                if q.is_stream() {
                    return Err(Fail {
                        code: 540,
                        text: format!(
                            "NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{}' in vhost '{}'",
                            q.name, q.vhost
                        ),
                        connection: true,
                    });
                }
                q.touch();
                let get_id = self.channel(channel)?.get_consumer;
                match self.ctx.broker.get_message(q.id, get_id, g.no_ack).await {
                    None => reply(AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {}))),
                    Some(got) => {
                        let ch = self.channel(channel)?;
                        let tag = ch.take_tag();
                        if !g.no_ack {
                            ch.unacked.insert(
                                tag,
                                super::channel::Unacked {
                                    queue: q.id,
                                    offset: got.delivery.offset,
                                    consumer: get_id,
                                    stream: false,
                                },
                            );
                        }
                        let d = &got.delivery;
                        let extra = super::connection::delivery_headers(d);
                        let props = properties_out(&d.msg, now_ms(), &extra);
                        let content = Content {
                            exchange: &d.msg.exchange,
                            routing_key: &d.msg.routing_key,
                            properties: &props,
                            body: &d.msg.payload,
                        };
                        self.counts.delivered += 1;
                        self.counts.redelivered += u64::from(d.redelivered);
                        self.proto.get_ok(
                            channel,
                            tag,
                            d.redelivered,
                            got.remaining.min(u32::MAX as u64) as u32,
                            content,
                        );
                        Ok(None)
                    }
                }
            }
            basic::AMQPMethod::Ack(a) => self.settle_method(channel, a.delivery_tag, a.multiple, Settle::Ack),
            basic::AMQPMethod::Nack(n) => {
                let how = if n.requeue { Settle::Requeue } else { Settle::Discard };
                self.settle_method(channel, n.delivery_tag, n.multiple, how)
            }
            basic::AMQPMethod::Reject(r) => {
                let how = if r.requeue { Settle::Requeue } else { Settle::Discard };
                self.settle_method(channel, r.delivery_tag, false, how)
            }
            basic::AMQPMethod::Recover(_) => {
                self.recover(channel)?;
                reply(AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {})))
            }
            basic::AMQPMethod::RecoverAsync(_) => {
                self.recover(channel)?;
                Ok(None)
            }
            _ => Err(Fail { code: 540, text: "NOT_IMPLEMENTED - method not supported".into(), connection: true }),
        }
    }

    /// The rules for a stream consumer: a consumer prefetch (basic.qos > 0 first) and manual
    /// acks, else 406 PRECONDITION_FAILED on the channel (RabbitMQ closes the connection with 540 for
    /// no-ack); returns where it starts, the consumer group it joins (`x-consumer-group`),
    /// its tag filter and how the group's members share the stream.
    fn stream_consume_checks(
        &mut self,
        channel: u16,
        q: &QueueEntity,
        no_ack: bool,
        args: &[(String, Value)],
    ) -> Result<(StreamOffset, Option<String>, Option<TagFilter>, Sharing), Fail> {
        let queue = format!("queue '{}' in vhost '{}'", q.name, q.vhost);
        if self.channel(channel)?.prefetch == 0 {
            return Err(channel_fail(
                406,
                format!("PRECONDITION_FAILED - consumer prefetch count is not set for '{queue}'"),
            ));
        }
        if no_ack {
            return Err(channel_fail(
                406,
                format!("PRECONDITION_FAILED - automatic acknowledgement not supported by stream queues {queue}"),
            ));
        }
        let start = stream_offset(args)
            .map_err(|e| channel_fail(406, format!("PRECONDITION_FAILED - {e} for consumer of {queue}")))?;
        let group = consumer_group(args)
            .map_err(|e| channel_fail(406, format!("PRECONDITION_FAILED - {e} for consumer of {queue}")))?;
        let filter = TagFilter::from_arguments(args)
            .map_err(|e| channel_fail(406, format!("PRECONDITION_FAILED - {e} for consumer of {queue}")))?;
        let sharing = sharing(args, group.as_deref())
            .map_err(|e| channel_fail(406, format!("PRECONDITION_FAILED - {e} for consumer of {queue}")))?;
        Ok((start, group, filter, sharing))
    }

    /// For a member of a partitioned (`x-super-stream`) or single-active group: the group
    /// and the partitions it spreads over its members; 404 for an unknown super stream,
    /// 406 when `q` is not one of its partitions.
    fn assigned_group(
        &self,
        q: &QueueEntity,
        group: &str,
        sharing: &Sharing,
    ) -> Result<Option<(GroupKey, Vec<QueueId>)>, Fail> {
        let key = |scope| GroupKey { vhost: self.vhost.clone(), scope, group: group.to_owned() };
        match sharing {
            Sharing::Split => Ok(None),
            Sharing::SingleActive => Ok(Some((key(Scope::Stream(q.id)), vec![q.id]))),
            Sharing::Partition(name) => {
                let Some(partitions) = partitions_of(self.ctx.broker.routing(), &self.ctx.entities, &self.vhost, name)
                else {
                    return Err(not_found("exchange", name, &self.vhost));
                };
                if !partitions.contains(&q.id) {
                    return Err(channel_fail(
                        406,
                        format!("PRECONDITION_FAILED - queue '{}' in vhost '{}' is not a partition of super stream '{name}'", q.name, self.vhost),
                    ));
                }
                Ok(Some((key(Scope::SuperStream(name.clone())), partitions)))
            }
        }
    }

    fn channel(&mut self, channel: u16) -> Result<&mut super::channel::Channel, Fail> {
        self.channels.get_mut(&channel).ok_or(Fail {
            code: 504,
            text: "CHANNEL_ERROR - channel not open".into(),
            connection: true,
        })
    }

    fn settle_method(
        &mut self,
        channel: u16,
        tag: u64,
        multiple: bool,
        how: Settle,
    ) -> Result<Option<AMQPClass>, Fail> {
        let ch = self.channel(channel)?;
        if ch.tx {
            ch.tx_settles.push((tag, multiple, how));
            return Ok(None);
        }
        let Some(covered) = ch.settle(tag, multiple) else {
            return Err(channel_fail(406, format!("PRECONDITION_FAILED - unknown delivery tag {tag}")));
        };
        self.settle(channel, covered, how);
        Ok(None)
    }

    fn recover(&mut self, channel: u16) -> Result<(), Fail> {
        let ch = self.channel(channel)?;
        let all: Vec<_> = std::mem::take(&mut ch.unacked).into_values().collect();
        self.settle(channel, all, Settle::Requeue);
        Ok(())
    }

    // ----- transactions ------------------------------------------------------------------

    async fn on_tx(&mut self, channel: u16, m: tx::AMQPMethod) -> Result<Option<AMQPClass>, Fail> {
        match m {
            tx::AMQPMethod::Select(_) => {
                self.channel(channel)?.tx = true;
                reply(AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})))
            }
            tx::AMQPMethod::Commit(_) => {
                let ch = self.channel(channel)?;
                if !ch.tx {
                    return Err(channel_fail(406, "PRECONDITION_FAILED - channel is not transactional".into()));
                }
                let publishes = std::mem::take(&mut ch.tx_publishes);
                let settles = std::mem::take(&mut ch.tx_settles);
                let mut signals = Vec::new();
                for p in publishes {
                    if let Some(due_ms) = p.due_ms {
                        signals.push(self.ctx.broker.schedule(&self.vhost, &p.msg, due_ms, StoreWrite::none()).await);
                        continue;
                    }
                    let (routes, _) = self.ctx.entities.admit(&p.msg, &p.routes);
                    if let Some(signal) =
                        self.ctx.broker.publish(&p.msg, &routes, RetainMode::None, StoreWrite::none()).await
                    {
                        signals.push(signal);
                    }
                }
                for signal in signals {
                    let _ = signal.await;
                }
                for (tag, multiple, how) in settles {
                    let ch = self.channel(channel)?;
                    let Some(covered) = ch.settle(tag, multiple) else {
                        return Err(channel_fail(406, format!("PRECONDITION_FAILED - unknown delivery tag {tag}")));
                    };
                    self.settle(channel, covered, how);
                }
                reply(AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})))
            }
            tx::AMQPMethod::Rollback(_) => {
                let ch = self.channel(channel)?;
                if !ch.tx {
                    return Err(channel_fail(406, "PRECONDITION_FAILED - channel is not transactional".into()));
                }
                ch.tx_publishes.clear();
                ch.tx_settles.clear();
                reply(AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})))
            }
            _ => Err(Fail { code: 540, text: "NOT_IMPLEMENTED - method not supported".into(), connection: true }),
        }
    }

    // ----- publish ---------------------------------------------------------------------

    pub(super) async fn on_publish(&mut self, p: Publish) {
        self.publishing = true;
        self.counts.published += 1;
        let channel = p.channel;
        let (class_id, method_id) = (60, 40);
        let vhost = self.vhost.clone();
        let exchange = p.exchange.as_str();
        if p.immediate {
            self.close_connection(540, "NOT_IMPLEMENTED - immediate=true", class_id, method_id);
            return;
        }
        let Some((kind, internal)) = self.ctx.broker.routing().exchange_cached(&mut self.route_cache, &vhost, exchange)
        else {
            let text = format!("NOT_FOUND - no exchange '{exchange}' in vhost '{vhost}'");
            self.proto.channel_error(channel, 404, &text, class_id, method_id);
            return;
        };
        if internal {
            let text = format!("ACCESS_REFUSED - cannot publish to internal exchange '{exchange}' in vhost '{vhost}'");
            self.proto.channel_error(channel, 403, &text, class_id, method_id);
            return;
        }
        if let Err(r) = self.access.publish(exchange, kind == ExchangeKind::Topic, p.routing_key.as_str()) {
            let f = refused(r);
            self.proto.channel_error(channel, f.code, &f.text, class_id, method_id);
            return;
        }
        if let Some(e) = p.properties.expiration() {
            if e.as_str().trim().parse::<u64>().is_err() {
                let text = format!("PRECONDITION_FAILED - invalid expiration '{}': no_integer", e.as_str());
                self.proto.channel_error(channel, 406, &text, class_id, method_id);
                return;
            }
        }
        if let Some(user_id) = p.properties.user_id() {
            if user_id.as_str() != self.user {
                let text = format!(
                    "PRECONDITION_FAILED - user_id property set to '{}' but authenticated user was '{}'",
                    user_id.as_str(),
                    self.user
                );
                self.proto.channel_error(channel, 406, &text, class_id, method_id);
                return;
            }
        }
        let now = now_ms();
        let msg: SharedMessage = Arc::new(Message {
            exchange: exchange.to_owned(),
            routing_key: p.routing_key.as_str().to_owned(),
            qos: qos_of(&p.properties),
            retain: false,
            props: properties_in(&p.properties, now),
            payload: p.body,
            timestamp_ms: now,
        });
        if kind == ExchangeKind::DelayedMessage {
            if let Some(delay) = delay_of(&msg) {
                self.publish_delayed(channel, p.confirm_tag, msg, now + delay).await;
                return;
            }
        }
        let routes = match self.ctx.broker.routing().route_cached(&mut self.route_cache, &vhost, exchange, &msg, "") {
            Ok(r) => r,
            Err(e) => {
                let f = route_fail(e);
                self.proto.channel_error(channel, f.code, &f.text, class_id, method_id);
                return;
            }
        };
        if routes.is_empty() && p.mandatory {
            let props = properties_out(&msg, now, &[]);
            let content = Content {
                exchange: &msg.exchange,
                routing_key: &msg.routing_key,
                properties: &props,
                body: &msg.payload,
            };
            self.proto.basic_return(channel, 312, "NO_ROUTE", content);
        }
        let Some(ch) = self.channels.get_mut(&channel) else { return };
        if ch.tx {
            ch.tx_publishes.push(TxPublish { msg, routes, due_ms: None });
            return;
        }
        let confirm = p.confirm_tag;
        let (routes, refused) = self.ctx.entities.admit(&msg, &routes);
        let signal = self.ctx.broker.publish(&msg, &routes, RetainMode::None, StoreWrite::none()).await;
        self.unsettled = true;
        if let Some(tag) = confirm {
            self.confirms.push_back(PendingConfirm { channel, tag, signal, ack: !refused });
        }
    }

    /// A publish to a delayed-message exchange with a positive `x-delay`: stored with a
    /// timer and routed by the scheduler at `due_ms`; the confirm follows the store (the
    /// delayed-message plugin's semantics), `mandatory` cannot be honoured (as there).
    async fn publish_delayed(&mut self, channel: u16, confirm: Option<u64>, msg: SharedMessage, due_ms: u64) {
        let vhost = self.vhost.clone();
        let Some(ch) = self.channels.get_mut(&channel) else { return };
        if ch.tx {
            ch.tx_publishes.push(TxPublish { msg, routes: Arc::default(), due_ms: Some(due_ms) });
            return;
        }
        let signal = self.ctx.broker.schedule(&vhost, &msg, due_ms, StoreWrite::none()).await;
        self.unsettled = true;
        if let Some(tag) = confirm {
            self.confirms.push_back(PendingConfirm { channel, tag, signal: Some(signal), ack: true });
        }
    }
}

fn ok_unless(nowait: bool, method: AMQPClass) -> Result<Option<AMQPClass>, Fail> {
    Ok((!nowait).then_some(method))
}

/// Declare-ok with the counts as the queue's owner sees them after every earlier command
/// (a publish confirmed before the declare is counted).
async fn declare_ok(broker: &crate::core::broker::Broker, q: &QueueEntity) -> AMQPClass {
    let (ready, _) = broker.queue_counts(q.id).await;
    AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
        queue: short(&q.name),
        message_count: ready.min(u32::MAX as u64) as u32,
        consumer_count: q.consumers.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
    }))
}

/// A routing error as the method's failure (404 no exchange, 530 no vhost, 406 bad arguments).
fn route_fail(e: RouteError) -> Fail {
    EntityError::from(e).into()
}

/// A server-generated name: RabbitMQ's prefix and 22 URL-safe characters.
fn generated_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    seed ^= COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    let mut out = String::with_capacity(prefix.len() + 22);
    out.push_str(prefix);
    for _ in 0..22 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.push(ALPHABET[(seed % 64) as usize] as char);
    }
    out
}

static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The `x-delay` header in milliseconds when positive (absent, zero or negative: route
/// at once, as the delayed-message plugin does).
fn delay_of(msg: &Message) -> Option<u64> {
    let delay = msg.props.headers.iter().find(|(k, _)| k == "x-delay")?.1.as_i64()?;
    u64::try_from(delay).ok().filter(|d| *d > 0)
}

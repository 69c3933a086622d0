//! A shovel's worker: the AMQP client (`lapin`) that consumes from the source and
//! publishes to the destination (cargo feature `shovels`, on by default).

use std::collections::VecDeque;

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{AckMode, DeleteAfter, Endpoint, UriTls, Worker};

/// Longest wait for a connection to either side.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a link ended without failing.
enum LinkEnd {
    /// Told to stop.
    Stopped,
    /// Moved what `src-delete-after` asked for.
    Done,
}

/// Why a shovel's link failed.
#[derive(Debug, thiserror::Error)]
enum ShovelError {
    #[error("{0}: {1}")]
    Amqp(&'static str, lapin::Error),
    #[error("{0}: timed out")]
    Timeout(&'static str),
    #[error("the source cancelled the consumer")]
    Cancelled,
    #[error("the destination refused a message (nack)")]
    Nacked,
    #[error("{0}: {1}")]
    Tls(&'static str, String),
    #[error("{0}: {1}")]
    Local(&'static str, super::local::LocalError),
    #[error("{0}: amqp:// names FerryMQ itself, which this shovel cannot reach")]
    NoLocal(&'static str),
}

fn amqp(side: &'static str) -> impl Fn(lapin::Error) -> ShovelError {
    move |e| ShovelError::Amqp(side, e)
}

impl Worker {
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let delay = Duration::from_secs_f64(self.def.reconnect_delay.unwrap_or(5.0));
        let mut last_error = String::new();
        let mut attempt = 0usize;
        // How many messages the shovel moves before it deletes itself, once known.
        let mut limit = match self.delete_after {
            DeleteAfter::Messages(n) => Some(n),
            _ => None,
        };
        while !*stop.borrow() {
            let (src, dest) = (&self.src[attempt % self.src.len()], &self.dest[attempt % self.dest.len()]);
            attempt += 1;
            let mut link_stop = stop.clone();
            let outcome = self.link(src, dest, &mut limit, &mut link_stop).await;
            self.status.lock().running = false;
            match outcome {
                Ok(LinkEnd::Stopped) => return,
                Ok(LinkEnd::Done) => {
                    info!(shovel = %self.name, moved = self.status.lock().moved, "shovel moved what src-delete-after asked for; deleting it");
                    if let Some(home) = self.home.upgrade() {
                        home.finished(&self.vhost, &self.name, self.run).await;
                    }
                    return;
                }
                Err(e) => {
                    let e = e.to_string();
                    if e != last_error {
                        warn!(shovel = %self.name, error = %e, "shovel down; reconnecting");
                    } else {
                        debug!(shovel = %self.name, error = %e, "shovel still down");
                    }
                    self.status.lock().reason = Some(e.clone());
                    last_error = e;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// One life: connect both sides, then move messages until one fails, `stop`, or the
    /// `limit` is reached (set from the source queue's length on the first link when
    /// `src-delete-after` is `queue-length`).
    async fn link(
        &self,
        src: &Endpoint,
        dest: &Endpoint,
        limit: &mut Option<u64>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<LinkEnd, ShovelError> {
        let src_conn = self.connect(src, "source").await?;
        let dest_conn = self.connect(dest, "destination").await?;
        let mut sch = src_conn.create_channel().await.map_err(amqp("source"))?;
        let mut dch = dest_conn.create_channel().await.map_err(amqp("destination"))?;
        let queue = match (&self.def.src_queue, &self.def.src_exchange) {
            (Some(q), _) => {
                let length;
                (sch, length) = ensure_queue(&src_conn, sch, q, "source").await?;
                if self.delete_after == DeleteAfter::QueueLength && limit.is_none() {
                    *limit = Some(u64::from(length));
                }
                q.clone()
            }
            (None, Some(x)) => {
                let opts = QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
                let q = sch.queue_declare("".into(), opts, FieldTable::default()).await.map_err(amqp("source"))?;
                let key = self.def.src_exchange_key.as_deref().unwrap_or("#");
                sch.queue_bind(
                    q.name().clone(),
                    x.as_str().into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(amqp("source"))?;
                q.name().to_string()
            }
            (None, None) => unreachable!("checked: one source"),
        };
        if let Some(q) = &self.def.dest_queue {
            (dch, _) = ensure_queue(&dest_conn, dch, q, "destination").await?;
        }
        let close = |why: &'static str| {
            let (src_conn, dest_conn) = (&src_conn, &dest_conn);
            async move {
                let _ = src_conn.close(200, why.into()).await;
                let _ = dest_conn.close(200, why.into()).await;
            }
        };
        let moved = || self.status.lock().moved;
        if limit.is_some_and(|l| moved() >= l) {
            close("shovel finished").await;
            return Ok(LinkEnd::Done);
        }
        if self.ack == AckMode::OnConfirm {
            dch.confirm_select(ConfirmSelectOptions::default()).await.map_err(amqp("destination"))?;
        }
        // No more unacknowledged at once than the limit leaves to move.
        let left = limit.map_or(u64::MAX, |l| l - moved());
        let prefetch = self.def.src_prefetch_count.unwrap_or(1000).min(u16::try_from(left).unwrap_or(u16::MAX));
        sch.basic_qos(prefetch, BasicQosOptions::default()).await.map_err(amqp("source"))?;
        let no_ack = self.ack == AckMode::NoAck;
        let mut consumer = sch
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions { no_ack, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .map_err(amqp("source"))?;
        {
            let mut s = self.status.lock();
            s.running = true;
            s.reason = None;
        }
        info!(shovel = %self.name, "shovel running");
        // A side that goes away while nothing moves is noticed at once, not at the next
        // message (the state would say running meanwhile).
        let mut src_events = Box::pin(src_conn.events_listener());
        let mut dest_events = Box::pin(dest_conn.events_listener());
        let mut confirms: VecDeque<(u64, PublisherConfirm)> = VecDeque::new();
        // Messages published and not yet counted as moved (waiting for their confirm).
        let mut sent_uncounted = 0u64;
        loop {
            if limit.is_some_and(|l| moved() >= l) {
                close("shovel finished").await;
                return Ok(LinkEnd::Done);
            }
            tokio::select! {
                biased;
                _ = stop.changed() => {
                    close("shovel stopped").await;
                    return Ok(LinkEnd::Stopped);
                }
                ev = src_events.next() => connection_event(ev, "source")?,
                ev = dest_events.next() => connection_event(ev, "destination")?,
                confirmed = front(&mut confirms) => {
                    let (tag, _) = confirms.pop_front().expect("a confirm was waited for");
                    match confirmed.map_err(amqp("destination"))? {
                        Confirmation::Nack(_) => {
                            sch.basic_nack(tag, BasicNackOptions { requeue: true, ..Default::default() }).await.map_err(amqp("source"))?;
                            return Err(ShovelError::Nacked);
                        }
                        _ => sch.basic_ack(tag, BasicAckOptions::default()).await.map_err(amqp("source"))?,
                    }
                    sent_uncounted -= 1;
                    self.status.lock().moved += 1;
                }
                delivery = consumer.next() => {
                    let d = match delivery {
                        Some(d) => d.map_err(amqp("source"))?,
                        None => return Err(ShovelError::Cancelled),
                    };
                    // Past the limit: back to the source, for whoever consumes next (a
                    // limit never comes with no-ack: checked).
                    if limit.is_some_and(|l| moved() + sent_uncounted >= l) {
                        let requeue = BasicRejectOptions { requeue: true };
                        sch.basic_reject(d.delivery_tag, requeue).await.map_err(amqp("source"))?;
                        continue;
                    }
                    let (exchange, key): (&str, &str) = match (&self.def.dest_queue, &self.def.dest_exchange) {
                        (Some(q), _) => ("", q),
                        (None, Some(x)) => (x, self.def.dest_exchange_key.as_deref().unwrap_or(d.routing_key.as_str())),
                        (None, None) => (d.exchange.as_str(), d.routing_key.as_str()),
                    };
                    let props = match self.def.add_forward_headers {
                        Some(true) => with_forward_headers(d.properties, &self.name),
                        _ => d.properties,
                    };
                    let confirm = dch
                        .basic_publish(exchange.into(), key.into(), BasicPublishOptions::default(), &d.data, props)
                        .await
                        .map_err(amqp("destination"))?;
                    match self.ack {
                        AckMode::OnConfirm => {
                            sent_uncounted += 1;
                            confirms.push_back((d.delivery_tag, confirm));
                        }
                        AckMode::OnPublish => {
                            sch.basic_ack(d.delivery_tag, BasicAckOptions::default()).await.map_err(amqp("source"))?;
                            self.status.lock().moved += 1;
                        }
                        AckMode::NoAck => self.status.lock().moved += 1,
                    }
                }
            }
        }
    }
}

/// A connection event of one side: an error (or the end of the events) ends the link.
fn connection_event(ev: Option<lapin::Event>, side: &'static str) -> Result<(), ShovelError> {
    match ev {
        Some(lapin::Event::Error(e)) => Err(ShovelError::Amqp(side, e)),
        None => Err(ShovelError::Timeout(side)),
        Some(_) => Ok(()),
    }
}

/// The front confirm's outcome; never resolves while none waits.
async fn front(confirms: &mut VecDeque<(u64, PublisherConfirm)>) -> lapin::Result<Confirmation> {
    match confirms.front_mut() {
        Some((_, c)) => c.await,
        None => std::future::pending().await,
    }
}

impl Worker {
    /// Connects to one side: another broker over TCP or TLS, FerryMQ itself in-process.
    /// The connection is named `Shovel {name}` where brokers list their clients, as
    /// RabbitMQ's shovels name theirs.
    async fn connect(&self, endpoint: &Endpoint, side: &'static str) -> Result<Connection, ShovelError> {
        let properties = ConnectionProperties::default().with_connection_name(format!("Shovel {}", self.name).into());
        match endpoint {
            Endpoint::Remote(uri) => connect_remote(uri, properties, side).await,
            Endpoint::Local { vhost, query } => {
                let local = self.local.as_ref().ok_or(ShovelError::NoLocal(side))?;
                let connect = super::local::connect(local, vhost, query, properties);
                let connected = tokio::time::timeout(CONNECT_TIMEOUT, connect).await;
                connected.map_err(|_| ShovelError::Timeout(side))?.map_err(|e| ShovelError::Local(side, e))
            }
        }
    }
}

async fn connect_remote(
    uri: &str,
    properties: ConnectionProperties,
    side: &'static str,
) -> Result<Connection, ShovelError> {
    // The TLS files are read on the blocking pool.
    let owned = uri.to_owned();
    let (uri, tls) = crate::core::blocking::spawn(move || tls_config(&owned))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
        .map_err(|e| ShovelError::Tls(side, e))?;
    let runtime = lapin::runtime::default_runtime().map_err(amqp(side))?;
    let connect = Connection::connect_with_config(&uri, properties, tls, runtime);
    tokio::time::timeout(CONNECT_TIMEOUT, connect).await.map_err(|_| ShovelError::Timeout(side))?.map_err(amqp(side))
}

/// The lapin TLS configuration of a URI's files (see [`UriTls`]).
fn tls_config(uri: &str) -> Result<(String, lapin::tcp::OwnedTLSConfig), String> {
    let UriTls { uri, ca_pem, identity } = UriTls::parse(uri)?;
    let tls = lapin::tcp::OwnedTLSConfig {
        cert_chain: ca_pem,
        identity: identity.map(|(pem, key)| lapin::tcp::OwnedIdentity::PKCS8 { pem, key }),
    };
    Ok((uri, tls))
}

/// Makes sure `queue` exists: a passive declare, and a durable declare when it is missing;
/// returns the channel to go on with (`ch`, or a new one when the failed passive declare
/// closed it) and the queue's length.
async fn ensure_queue(
    conn: &Connection,
    ch: Channel,
    queue: &str,
    side: &'static str,
) -> Result<(Channel, u32), ShovelError> {
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    if let Ok(q) = ch.queue_declare(queue.into(), passive, FieldTable::default()).await {
        return Ok((ch, q.message_count()));
    }
    let ch = conn.create_channel().await.map_err(amqp(side))?;
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let q = ch.queue_declare(queue.into(), durable, FieldTable::default()).await.map_err(amqp(side))?;
    Ok((ch, q.message_count()))
}

/// Adds the `x-shovelled` header (the shovel's name), as RabbitMQ's forward headers.
fn with_forward_headers(props: lapin::BasicProperties, name: &str) -> lapin::BasicProperties {
    use lapin::types::{AMQPValue, LongString};
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert("x-shovelled".into(), AMQPValue::LongString(LongString::from(name.as_bytes().to_vec())));
    props.with_headers(headers)
}

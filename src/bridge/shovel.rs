//! AMQP shovels, as RabbitMQ's dynamic shovels: a definition (the JSON of
//! `/api/parameters/shovel/{vhost}/{name}`, or a `[[shovel]]` table) names a source queue
//! (or an exchange and routing key) and a destination exchange or queue, each on FerryMQ
//! (`amqp://` without a host) or on another AMQP 0-9-1 broker; a worker consumes from the
//! source and publishes to the destination, acknowledging the source as `ack-mode` says
//! (`on-confirm`: only once the destination confirmed), and reconnects after
//! `reconnect-delay` when either side fails. With `src-delete-after` a shovel moves that
//! many messages (or the source queue's length when it started) and then deletes itself.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};

use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::core::broker::{Broker, Commit};

/// Longest wait for a connection to either side.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One URI or several (RabbitMQ accepts both; several are tried in turn).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Uris {
    /// One URI.
    One(String),
    /// Several, tried in turn.
    Many(Vec<String>),
}

impl Uris {
    fn list(&self) -> Vec<String> {
        match self {
            Uris::One(u) => vec![u.clone()],
            Uris::Many(v) => v.clone(),
        }
    }
}

/// A shovel's definition, in RabbitMQ's keys (`src-uri`, `src-queue`, ...).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ShovelDefinition {
    /// Where messages come from.
    pub src_uri: Uris,
    /// The source queue (declared durable when missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_queue: Option<String>,
    /// Or a source exchange: a private queue is bound to it with `src-exchange-key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_exchange: Option<String>,
    /// The routing key of that binding (default `#`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_exchange_key: Option<String>,
    /// Unacknowledged messages at once (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_prefetch_count: Option<u16>,
    /// `amqp091` (the only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_protocol: Option<String>,
    /// `never` (default), `queue-length` (the source queue's length when the shovel
    /// starts) or a number of messages: moved that many, the shovel deletes itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_delete_after: Option<Value>,
    /// Where messages go.
    pub dest_uri: Uris,
    /// The destination queue (declared durable when missing; published to through the
    /// default exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_queue: Option<String>,
    /// Or a destination exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_exchange: Option<String>,
    /// The routing key at the destination exchange (default: the message's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_exchange_key: Option<String>,
    /// `amqp091` (the only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_protocol: Option<String>,
    /// `on-confirm` (default), `on-publish` or `no-ack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_mode: Option<String>,
    /// Seconds between reconnects (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_delay: Option<f64>,
    /// Add `x-shovelled` headers naming the shovel and both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_forward_headers: Option<bool>,
    /// Keys FerryMQ does not know: refused by [`ShovelDefinition::check`], never dropped.
    #[serde(flatten, skip_serializing)]
    pub unknown: BTreeMap<String, Value>,
}

/// When a shovel deletes itself (`src-delete-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAfter {
    /// It runs until deleted.
    Never,
    /// After as many messages as the source queue held when the shovel started.
    QueueLength,
    /// After this many messages.
    Messages(u64),
}

/// How the source is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// After the destination confirmed the message (no loss).
    OnConfirm,
    /// After the message was sent to the destination.
    OnPublish,
    /// Consumed without acknowledgements.
    NoAck,
}

impl ShovelDefinition {
    /// Checks what serde cannot: one source and one destination, known values; the ack
    /// mode.
    pub fn check(&self) -> Result<AckMode, String> {
        if let Some(k) = self.unknown.keys().next() {
            return Err(format!("`{k}` is not a shovel setting FerryMQ supports"));
        }
        if self.src_queue.is_some() == self.src_exchange.is_some() {
            return Err("give one of src-queue and src-exchange".into());
        }
        if self.dest_queue.is_some() && self.dest_exchange.is_some() {
            return Err("give at most one of dest-queue and dest-exchange".into());
        }
        for (key, p) in [("src-protocol", &self.src_protocol), ("dest-protocol", &self.dest_protocol)] {
            if p.as_deref().is_some_and(|p| p != "amqp091") {
                return Err(format!("{key}: only amqp091 is supported"));
            }
        }
        if self.delete_after()? == DeleteAfter::QueueLength && self.src_queue.is_none() {
            return Err("src-delete-after: queue-length needs a src-queue".into());
        }
        for (key, uris) in [("src-uri", &self.src_uri), ("dest-uri", &self.dest_uri)] {
            let list = uris.list();
            if list.is_empty() || list.iter().any(|u| !(u.starts_with("amqp://") || u.starts_with("amqps://"))) {
                return Err(format!("{key}: amqp:// or amqps:// URIs"));
            }
            for u in &list {
                tls_config(u).map_err(|e| format!("{key}: {e}"))?;
            }
        }
        if self.reconnect_delay.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
            return Err("reconnect-delay: seconds above 0".into());
        }
        let ack = match self.ack_mode.as_deref().unwrap_or("on-confirm") {
            "on-confirm" => AckMode::OnConfirm,
            "on-publish" => AckMode::OnPublish,
            "no-ack" => AckMode::NoAck,
            other => return Err(format!("ack-mode `{other}`: on-confirm, on-publish or no-ack")),
        };
        if ack == AckMode::NoAck && self.delete_after()? != DeleteAfter::Never {
            // A no-ack consumer is sent the whole queue: past the count it would be lost.
            return Err("src-delete-after needs ack-mode on-confirm or on-publish".into());
        }
        Ok(ack)
    }

    /// `src-delete-after`.
    pub fn delete_after(&self) -> Result<DeleteAfter, String> {
        match &self.src_delete_after {
            None => Ok(DeleteAfter::Never),
            Some(Value::String(s)) if s == "never" => Ok(DeleteAfter::Never),
            Some(Value::String(s)) if s == "queue-length" => Ok(DeleteAfter::QueueLength),
            Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
                Some(n) => Ok(DeleteAfter::Messages(n)),
                None => Err(format!("src-delete-after `{v}`: never, queue-length or a number of messages")),
            },
        }
    }
}

/// `[[shovel]]`: a shovel from the configuration (RabbitMQ's static shovels), in the
/// definition's keys.
#[derive(Debug, Clone, Deserialize)]
pub struct ShovelEntry {
    /// Its name.
    pub name: String,
    /// Its virtual host (default `/`).
    #[serde(default = "slash")]
    pub vhost: String,
    /// The definition.
    #[serde(flatten)]
    pub definition: ShovelDefinition,
}

fn slash() -> String {
    "/".into()
}

/// A shovel's state, as RabbitMQ's `/api/shovels` shows it.
#[derive(Debug, Clone, Default)]
pub struct ShovelStatus {
    /// Consuming and publishing.
    pub running: bool,
    /// Why the last attempt failed.
    pub reason: Option<String>,
    /// Messages moved.
    pub moved: u64,
}

struct Running {
    /// Tells this run from a later one of the same name.
    run: u64,
    definition: ShovelDefinition,
    dynamic: bool,
    status: Arc<Mutex<ShovelStatus>>,
    stop: watch::Sender<bool>,
}

impl Running {
    fn view(&self, vhost: &str, name: &str) -> ShovelView {
        ShovelView {
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            dynamic: self.dynamic,
            definition: self.definition.clone(),
            status: self.status.lock().clone(),
        }
    }
}

/// Every shovel, and how to reach FerryMQ itself (`amqp://` without a host).
pub struct Shovels {
    running: Mutex<HashMap<(String, String), Running>>,
    /// FerryMQ's AMQP listener and the user local URIs log in as.
    local: Option<(SocketAddr, String, String)>,
    /// Where dynamic shovels' definitions are stored (a shovel that deletes itself
    /// removes its own).
    broker: Option<Arc<Broker>>,
    runs: AtomicU64,
}

impl std::fmt::Debug for Shovels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shovels").field("count", &self.running.lock().len()).finish()
    }
}

/// One shovel as listed.
#[derive(Debug, Clone)]
pub struct ShovelView {
    /// Virtual host.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// Defined through the API (`dynamic`) or the configuration (`static`).
    pub dynamic: bool,
    /// The definition.
    pub definition: ShovelDefinition,
    /// Its state.
    pub status: ShovelStatus,
}

impl Shovels {
    /// No shovels yet; `local` is FerryMQ's AMQP address and the user (name, password)
    /// that `amqp://` URIs without a host log in as.
    /// `broker` holds the stored definitions of dynamic shovels.
    pub fn new(local: Option<(SocketAddr, String, String)>, broker: Option<Arc<Broker>>) -> Shovels {
        Shovels { running: Mutex::new(HashMap::new()), local, broker, runs: AtomicU64::new(0) }
    }

    /// Starts (or restarts with a new definition) a shovel.
    pub fn start(
        self: &Arc<Self>,
        vhost: &str,
        name: &str,
        definition: ShovelDefinition,
        dynamic: bool,
    ) -> Result<(), String> {
        let ack = definition.check()?;
        let delete_after = definition.delete_after()?;
        let resolve = |uris: &Uris| -> Result<Vec<String>, String> {
            uris.list().iter().map(|u| self.resolve(u, vhost)).collect()
        };
        let (src, dest) = (resolve(&definition.src_uri)?, resolve(&definition.dest_uri)?);
        let (stop, stop_rx) = watch::channel(false);
        let status = Arc::new(Mutex::new(ShovelStatus::default()));
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let worker = Worker {
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            def: definition.clone(),
            ack,
            delete_after,
            src,
            dest,
            status: status.clone(),
            home: Arc::downgrade(self),
            run,
        };
        tokio::spawn(worker.run(stop_rx));
        let old = self
            .running
            .lock()
            .insert((vhost.to_owned(), name.to_owned()), Running { run, definition, dynamic, status, stop });
        if let Some(old) = old {
            let _ = old.stop.send(true);
        }
        Ok(())
    }

    /// Stops and forgets a shovel; whether there was one.
    pub fn remove(&self, vhost: &str, name: &str) -> bool {
        match self.running.lock().remove(&(vhost.to_owned(), name.to_owned())) {
            Some(r) => {
                let _ = r.stop.send(true);
                true
            }
            None => false,
        }
    }

    /// Every shovel, by virtual host and name.
    pub fn list(&self) -> Vec<ShovelView> {
        let mut all: Vec<ShovelView> =
            self.running.lock().iter().map(|((vhost, name), r)| r.view(vhost, name)).collect();
        all.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
        all
    }

    /// One shovel.
    pub fn get(&self, vhost: &str, name: &str) -> Option<ShovelView> {
        self.running.lock().get(&(vhost.to_owned(), name.to_owned())).map(|r| r.view(vhost, name))
    }

    /// A shovel moved what `src-delete-after` asked for: it is forgotten, and a dynamic
    /// one's stored definition removed (unless it was redefined meanwhile).
    async fn finished(&self, vhost: &str, name: &str, run: u64) {
        let key = (vhost.to_owned(), name.to_owned());
        let dynamic = {
            let mut running = self.running.lock();
            match running.get(&key) {
                Some(r) if r.run == run => running.remove(&key).is_some_and(|r| r.dynamic),
                _ => return,
            }
        };
        if let (true, Some(broker)) = (dynamic, &self.broker) {
            let write = broker.stores.access.remove_parameter("shovel", vhost, name);
            if let Err(e) = broker.commit(write, Commit::Durable).await {
                warn!(shovel = %name, vhost = %vhost, error = %e, "cannot remove the finished shovel's definition");
            }
            // Redefined meanwhile: the new definition is the one kept.
            let redefined = self.running.lock().get(&key).filter(|r| r.dynamic).map(|r| r.definition.clone());
            if let Some(def) = redefined {
                let record = crate::core::store::ParameterRecord {
                    component: "shovel".into(),
                    vhost: vhost.into(),
                    name: name.into(),
                    value: serde_json::to_string(&def).unwrap_or_default(),
                };
                if let Err(e) = broker.commit(broker.stores.access.put_parameter(&record), Commit::Durable).await {
                    warn!(shovel = %name, vhost = %vhost, error = %e, "cannot store the redefined shovel");
                }
            }
        }
    }

    /// Stops every shovel.
    pub fn stop_all(&self) {
        for (_, r) in self.running.lock().drain() {
            let _ = r.stop.send(true);
        }
    }

    /// A URI as lapin takes it: one without a host is FerryMQ itself, in its path's
    /// virtual host or else the shovel's.
    fn resolve(&self, uri: &str, vhost: &str) -> Result<String, String> {
        let (tls, rest) = match uri.strip_prefix("amqps://") {
            Some(rest) => (true, rest),
            None => (false, uri.strip_prefix("amqp://").unwrap_or(uri)),
        };
        let (authority, path) = rest.split_once('/').map(|(a, p)| (a, Some(p))).unwrap_or((rest, None));
        if !authority.is_empty() {
            return Ok(uri.to_owned());
        }
        if tls {
            return Err("amqps:// needs a host (amqp:// without one is FerryMQ itself)".into());
        }
        let Some((addr, user, pass)) = &self.local else {
            return Err("amqp:// names FerryMQ itself, whose AMQP listener is off".into());
        };
        if user.is_empty() {
            return Err("amqp:// logs in as auth.default_user, which is not set: give a user in the URI".into());
        }
        let vhost = match path {
            Some(p) if !p.is_empty() => p.to_owned(),
            _ => percent_encode(vhost),
        };
        Ok(format!("amqp://{}:{}@{addr}/{vhost}", percent_encode(user), percent_encode(pass)))
    }
}

/// Percent-encodes what a URI's user, password or path segment cannot hold.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One shovel's worker.
struct Worker {
    vhost: String,
    name: String,
    def: ShovelDefinition,
    ack: AckMode,
    delete_after: DeleteAfter,
    src: Vec<String>,
    dest: Vec<String>,
    status: Arc<Mutex<ShovelStatus>>,
    home: Weak<Shovels>,
    run: u64,
}

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
}

fn amqp(side: &'static str) -> impl Fn(lapin::Error) -> ShovelError {
    move |e| ShovelError::Amqp(side, e)
}

impl Worker {
    async fn run(self, mut stop: watch::Receiver<bool>) {
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
        src: &str,
        dest: &str,
        limit: &mut Option<u64>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<LinkEnd, ShovelError> {
        let src_conn = connect(src, "source").await?;
        let dest_conn = connect(dest, "destination").await?;
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

async fn connect(uri: &str, side: &'static str) -> Result<Connection, ShovelError> {
    // The TLS files are read on the blocking pool.
    let owned = uri.to_owned();
    let (uri, tls) = crate::core::blocking::spawn(move || tls_config(&owned))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
        .map_err(|e| ShovelError::Tls(side, e))?;
    let runtime = lapin::runtime::default_runtime().map_err(amqp(side))?;
    let connect = Connection::connect_with_config(&uri, ConnectionProperties::default(), tls, runtime);
    tokio::time::timeout(CONNECT_TIMEOUT, connect).await.map_err(|_| ShovelError::Timeout(side))?.map_err(amqp(side))
}

/// An `amqps://` URI's TLS files, RabbitMQ's query parameters `cacertfile` (PEM: CA
/// certificates trusted besides the system's), `certfile` and `keyfile` (PEM: a client
/// certificate and its key), read and taken out of the URI lapin is given.
fn tls_config(uri: &str) -> Result<(String, lapin::tcp::OwnedTLSConfig), String> {
    let mut tls = lapin::tcp::OwnedTLSConfig::default();
    let Some((base, query)) = uri.split_once('?') else { return Ok((uri.to_owned(), tls)) };
    let read = |key: &str, path: &str| std::fs::read(path).map_err(|e| format!("{key} `{path}`: {e}"));
    let (mut cert, mut key, mut kept) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "cacertfile" => {
                let pem = String::from_utf8(read(k, v)?).map_err(|_| format!("cacertfile `{v}` is not PEM text"))?;
                use rustls_pki_types::pem::PemObject;
                let certs = rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).filter(Result::is_ok);
                if certs.count() == 0 {
                    return Err(format!("cacertfile `{v}` holds no certificate"));
                }
                tls.cert_chain = Some(pem);
            }
            "certfile" => cert = Some(read(k, v)?),
            "keyfile" => key = Some(read(k, v)?),
            "verify" if v == "verify_peer" => {}
            "verify" | "fail_if_no_peer_cert" | "server_name_indication" => {
                return Err(format!("`{k}={v}` is not supported (the server's certificate is always checked)"));
            }
            _ => kept.push(pair),
        }
    }
    match (cert, key) {
        (Some(pem), Some(key)) => tls.identity = Some(lapin::tcp::OwnedIdentity::PKCS8 { pem, key }),
        (None, None) => {}
        _ => return Err("certfile and keyfile go together".into()),
    }
    if !uri.starts_with("amqps://") && (tls.cert_chain.is_some() || tls.identity.is_some()) {
        return Err("TLS files in an amqp:// URI: use amqps://".into());
    }
    let uri = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
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

//! Publishes forwarded between members: a publish whose route reached another member's
//! bindings (its own subscribers or transient queues, see [`super::interest`]) is sent to
//! it over the peer link, and the member it reaches routes it to its own targets.
//!
//! [`Forwarder`] is the core's [`MemberForwarder`]: one bounded queue and one task per
//! other member, which sends what is queued in batches (headers as JSON, bodies after them
//! as they are) and waits for the member's answer. A publish the publisher waits for (QoS
//! 1 and 2, persistent AMQP messages) is acknowledged once this member stored it and every
//! member it was forwarded to routed it and stored it for its queues. A member that cannot
//! be reached is given nothing for a second: what was for it is dropped, counted
//! (`dropped`) and logged at most once a minute, and its publisher is acknowledged — a
//! member's own subscribers live and die with it, as on one node. The publisher never
//! waits on a full queue either: what does not fit is dropped the same way.
//!
//! [`receive`] is the other side: a batch from a member, routed here
//! ([`Broker::publish_forwarded`]) and answered once stored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::JournalError;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tracing::warn;

use super::health::PeerHealth;
use super::interest::OwnInterest;
use super::link::PeerAuth;
use super::node::NodeState;
use super::rpc::{Forwarded, PeerClient, PeerRequest, PeerResponse};
use crate::core::broker::{Broker, DurableSignal, ForwardedRoute, Joint, MemberForwarder};
use crate::core::message::{now_ms, Message, SharedMessage};
use crate::core::router::MemberRoute;

/// Publishes queued per member before more are dropped, and bytes.
const QUEUED: usize = 10_000;
const QUEUED_BYTES: usize = 256 << 20;

/// Publishes per batch, and bytes.
const BATCH: usize = 512;
const BATCH_BYTES: usize = 4 << 20;

/// How long a batch may take to be answered.
const FORWARD_TTL: Duration = Duration::from_secs(5);

/// How long a member that could not be reached is given nothing.
const DOWN_FOR: Duration = Duration::from_secs(1);

/// A member not heard from for this long (it sends its interest each second) is given
/// nothing: a paused or cut-off member does not hold publishers up for [`FORWARD_TTL`].
const SILENT_FOR: Duration = Duration::from_secs(3);

/// The largest publish forwarded (header and body): a batch with it fits a frame.
const MAX_ONE: usize = super::link::MAX_FRAME - BATCH_BYTES - (1 << 20);

/// A publish queued for one member.
struct Item {
    forwarded: Forwarded,
    header: Bytes,
    body: Bytes,
    ack: Option<Arc<Joint>>,
}

impl Drop for Item {
    /// An item dropped before its publisher heard (its task ended): the publisher hears
    /// now, and hears of a failure when this member's own part was left waiting.
    fn drop(&mut self) {
        if let Some(joint) = self.ack.take() {
            if joint.take_local().is_some() {
                joint.done(Err(JournalError::Closed));
            }
            joint.done(Ok(()));
        }
    }
}

/// The publishes this member forwards to the others.
pub(super) struct Forwarder {
    me: String,
    auth: Arc<PeerAuth>,
    interest: Arc<OwnInterest>,
    health: Arc<PeerHealth>,
    queues: parking_lot::RwLock<HashMap<Arc<str>, Queue>>,
    dropped: Arc<Dropped>,
}

/// One member's queue, and until when it is given nothing (ms since the epoch; 0: it is
/// not).
struct Queue {
    tx: mpsc::Sender<Item>,
    down_until: Arc<AtomicU64>,
    /// Bytes of the publishes queued.
    bytes: Arc<AtomicUsize>,
    /// Not heard from for [`SILENT_FOR`] (kept by a watch task twice a second, so that a
    /// publish reads a flag, not the members' health behind its lock).
    silent: Arc<AtomicBool>,
    /// Its peer address.
    addr: String,
    /// Idle links for calls that are not publishes (a client's takeover).
    calls: Arc<parking_lot::Mutex<Vec<PeerClient>>>,
}

/// Idle links kept per member for calls.
const CALL_LINKS: usize = 4;

/// How long telling the others of a client's connection may take.
const TAKEOVER_TTL: Duration = Duration::from_secs(3);

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").field("dropped", &self.dropped.count.load(Ordering::Relaxed)).finish()
    }
}

/// Publishes dropped for members that could not take them, and when that was last logged.
#[derive(Debug, Default)]
struct Dropped {
    count: AtomicU64,
    logged_secs: AtomicU64,
}

impl Dropped {
    fn add(&self, n: u64, member: &str, why: &str) {
        let total = self.count.fetch_add(n, Ordering::Relaxed) + n;
        let now = crate::core::message::now_ms() / 1000;
        let last = self.logged_secs.load(Ordering::Relaxed);
        if now >= last + 60
            && self.logged_secs.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            warn!(
                member,
                dropped = total,
                "cluster: publishes for another member's subscribers dropped: {why} \
                (counted since start; logged at most once a minute)"
            );
        }
    }
}

impl Forwarder {
    /// The forwarder of member `me`.
    pub(super) fn new(me: &str, auth: Arc<PeerAuth>, interest: Arc<OwnInterest>, health: Arc<PeerHealth>) -> Forwarder {
        Forwarder { me: me.to_owned(), auth, interest, health, queues: Default::default(), dropped: Default::default() }
    }

    /// Starts the queue and task for member `name` at `addr` (nothing when there is one).
    pub(super) fn add_member(&self, name: &str, addr: &str) {
        let mut queues = self.queues.write();
        if queues.contains_key(name) {
            return;
        }
        let (tx, rx) = mpsc::channel(QUEUED);
        let down_until = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicUsize::new(0));
        let silent = Arc::new(AtomicBool::new(false));
        let queue = Queue {
            tx,
            down_until: down_until.clone(),
            bytes: bytes.clone(),
            silent: silent.clone(),
            addr: addr.to_owned(),
            calls: Default::default(),
        };
        queues.insert(Arc::from(name), queue);
        let client = PeerClient::new(&self.me, name, addr, self.auth.clone());
        let link = Link { name: name.to_owned(), down_until, bytes, dropped: self.dropped.clone() };
        tokio::spawn(send(client, link, rx));
        let (health, name) = (self.health.clone(), name.to_owned());
        tokio::spawn(async move {
            // A member never heard from is given its first SILENT_FOR, as one just heard.
            let started = std::time::Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            // Until the member's queue is gone (it was forgotten).
            while Arc::strong_count(&silent) > 1 {
                tick.tick().await;
                let quiet_for = health.since(&name).unwrap_or_else(|| started.elapsed());
                silent.store(quiet_for > SILENT_FOR, Ordering::Relaxed);
            }
        });
    }

    /// Member `name` is no longer one: its queue goes (what is in it is dropped as for a
    /// member that is down), and with it its sending task.
    pub(super) fn remove_member(&self, name: &str) {
        self.queues.write().remove(name);
    }

    /// Member `name` linked to this one again (it announced its interest): it is given
    /// publishes again at once.
    pub(super) fn member_back(&self, name: &str) {
        if let Some(q) = self.queues.read().get(name) {
            q.down_until.store(0, Ordering::Relaxed);
            q.silent.store(false, Ordering::Relaxed);
        }
    }

    /// Publishes dropped since start.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.count.load(Ordering::Relaxed)
    }
}

impl MemberForwarder for Forwarder {
    fn forward(
        &self,
        msg: &SharedMessage,
        members: &[MemberRoute],
        local: Option<DurableSignal>,
        durable: bool,
    ) -> Option<DurableSignal> {
        let header = msg.encode_header();
        if header.len() + msg.payload.len() > MAX_ONE {
            for m in members {
                self.dropped.add(1, &m.member, "a publish too large to forward");
            }
            return local;
        }
        let (joint, signal) = match durable {
            true => {
                let (joint, signal) = Joint::new(members.len(), local);
                (Some(joint), Some(signal))
            }
            false => (None, local),
        };
        let queues = self.queues.read();
        let mut queued = 0;
        for m in members {
            let forwarded = Forwarded {
                vhost: m.vhost.to_string(),
                via: m.exchanges.iter().map(|x| x.to_string()).collect(),
                publisher: m.publisher.to_string(),
                groups: m.groups.iter().map(|g| g.to_string()).collect(),
                header: header.len() as u32,
                body: msg.payload.len() as u32,
            };
            let queue = match queues.get(&m.member) {
                None => Err("no link to it"),
                Some(queue) if queue.silent.load(Ordering::Relaxed) => Err("not heard from"),
                Some(queue) if queue.bytes.load(Ordering::Relaxed) > QUEUED_BYTES => Err("its queue is full"),
                Some(queue) => Ok(queue),
            };
            let refused = match queue {
                Ok(queue) => {
                    let item =
                        Item { forwarded, header: header.clone(), body: msg.payload.clone(), ack: joint.clone() };
                    // Counted before it is queued: the send task takes it off once sent.
                    let size = item.header.len() + item.body.len();
                    queue.bytes.fetch_add(size, Ordering::Relaxed);
                    match queue.tx.try_send(item) {
                        Ok(()) => None,
                        Err(e) => {
                            queue.bytes.fetch_sub(size, Ordering::Relaxed);
                            if let Some(j) = e.into_inner().ack.take() {
                                j.done(Ok(()));
                            }
                            Some("its queue is full")
                        }
                    }
                }
                Err(why) => {
                    if let Some(j) = &joint {
                        j.done(Ok(()));
                    }
                    Some(why)
                }
            };
            match refused {
                None => queued += 1,
                Some(why) => self.dropped.add(1, &m.member, why),
            }
        }
        match (joint, queued) {
            // Nothing was queued: this member's own signal is the publish's.
            (Some(joint), 0) => joint.take_local(),
            _ => signal,
        }
    }

    fn bindings_known(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.interest.known())
    }

    fn client_connected<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            type Target = (String, String, Arc<parking_lot::Mutex<Vec<PeerClient>>>);
            let targets: Vec<Target> = self
                .queues
                .read()
                .iter()
                .filter(|(_, q)| !q.silent.load(Ordering::Relaxed))
                .map(|(name, q)| (name.to_string(), q.addr.clone(), q.calls.clone()))
                .collect();
            let calls = targets.into_iter().map(|(name, addr, pool)| async move {
                let pooled = pool.lock().pop();
                let mut client = pooled.unwrap_or_else(|| PeerClient::new(&self.me, &name, &addr, self.auth.clone()));
                let request = PeerRequest::TakeOver(client_id.to_owned());
                let answer = client.call(&request, TAKEOVER_TTL).await;
                tracing::debug!(member = %name, client_id, ?answer, "cluster: told of a client's connection");
                if answer.is_ok() {
                    let mut pool = pool.lock();
                    if pool.len() < CALL_LINKS {
                        pool.push(client);
                    }
                }
            });
            futures_util::future::join_all(calls).await;
        })
    }
}

/// One member's end of the forwarding, as its send task holds it.
struct Link {
    name: String,
    down_until: Arc<AtomicU64>,
    bytes: Arc<AtomicUsize>,
    dropped: Arc<Dropped>,
}

/// Sends what is queued for a member over `client`, in batches, until the process ends.
async fn send(mut client: PeerClient, link: Link, mut rx: mpsc::Receiver<Item>) {
    let Link { name, down_until, bytes: queued, dropped } = link;
    while let Some(first) = rx.recv().await {
        let mut bytes = first.header.len() + first.body.len();
        let mut batch = vec![first];
        while batch.len() < BATCH && bytes < BATCH_BYTES {
            match rx.try_recv() {
                Ok(item) => {
                    bytes += item.header.len() + item.body.len();
                    batch.push(item);
                }
                Err(_) => break,
            }
        }
        queued.fetch_sub(bytes, Ordering::Relaxed);
        let down = now_ms() < down_until.load(Ordering::Relaxed);
        let answer = match down {
            true => None,
            false => {
                let headers: Vec<Forwarded> = batch.iter().map(|i| i.forwarded.clone()).collect();
                let blob: Vec<Bytes> = batch.iter().flat_map(|i| [i.header.clone(), i.body.clone()]).collect();
                Some(client.call_with(&PeerRequest::Forward(headers), &blob, FORWARD_TTL).await)
            }
        };
        match answer {
            Some(Ok(PeerResponse::Done)) => {}
            // Linked, but it could not take them (its disk): dropped, the link kept.
            Some(Ok(other)) => dropped.add(batch.len() as u64, &name, &format!("it refused them: {other:?}")),
            Some(Err(_)) => {
                down_until.store(now_ms() + DOWN_FOR.as_millis() as u64, Ordering::Relaxed);
                dropped.add(batch.len() as u64, &name, "it cannot be reached");
            }
            None => dropped.add(batch.len() as u64, &name, "it cannot be reached"),
        }
        // The member's part is done; this member's own storing, when a publish's joint
        // still waits for it, is waited for off this loop (one task per batch), so that a
        // slow disk here does not hold the forwarding up.
        let mut waits = Vec::new();
        for mut item in batch {
            if let Some(joint) = item.ack.take() {
                if let Some(local) = joint.take_local() {
                    waits.push((joint.clone(), local));
                }
                joint.done(Ok(()));
            }
        }
        if !waits.is_empty() {
            tokio::spawn(async move {
                for (joint, local) in waits {
                    joint.done(local.await.unwrap_or(Err(JournalError::Closed)));
                }
            });
        }
    }
}

/// Routes a batch member `from` forwarded (`blob`: each publish's header and body, in
/// order) to this member's own targets; resolves once what they need stored is stored.
pub(super) async fn receive(
    broker: &Broker,
    node: &dyn NodeState,
    from: &str,
    batch: Vec<Forwarded>,
    blob: Bytes,
) -> Result<(), String> {
    let own = |queue| !node.is_replicated_queue(queue);
    let mut at = 0usize;
    let mut take = |n: u32| -> Result<Bytes, String> {
        let end = at + n as usize;
        let part = blob.get(at..end).ok_or_else(|| format!("a batch from {from} shorter than its headers say"))?;
        let part = blob.slice_ref(part);
        at = end;
        Ok(part)
    };
    let mut signals = Vec::new();
    for f in batch {
        let header = take(f.header)?;
        let body = take(f.body)?;
        let msg: SharedMessage =
            Arc::new(Message::decode(header, body).map_err(|e| format!("a publish from {from}: {e:?}"))?);
        let via: Vec<Box<str>> = f.via.into_iter().map(String::into_boxed_str).collect();
        let groups: Vec<Arc<str>> = f.groups.iter().map(|g| Arc::from(g.as_str())).collect();
        let route = ForwardedRoute { vhost: &f.vhost, via: &via, publisher: &f.publisher, groups: &groups };
        if let Some(signal) = broker.publish_forwarded(&route, &msg, &own).await {
            if msg.qos > 0 {
                signals.push(signal);
            }
        }
    }
    let mut failed = None;
    for signal in signals {
        if let Err(e) | Ok(Err(e)) = signal.await.map_err(|_| JournalError::Closed) {
            failed.get_or_insert(e);
        }
    }
    match failed {
        None => Ok(()),
        Some(e) => Err(format!("a forwarded publish was not stored here: {e}")),
    }
}

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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrymq_storage::JournalError;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tracing::warn;

use super::interest::OwnInterest;
use super::link::PeerAuth;
use super::node::NodeState;
use super::rpc::{Forwarded, PeerClient, PeerRequest, PeerResponse};
use crate::core::broker::{Broker, DurableSignal, ForwardedRoute, Joint, MemberForwarder};
use crate::core::message::{now_ms, Message, SharedMessage};
use crate::core::router::MemberRoute;

/// Publishes queued per member before more are dropped.
const QUEUED: usize = 10_000;

/// Publishes per batch, and bytes.
const BATCH: usize = 512;
const BATCH_BYTES: usize = 4 << 20;

/// How long a batch may take to be answered.
const FORWARD_TTL: Duration = Duration::from_secs(5);

/// How long a member that could not be reached is given nothing.
const DOWN_FOR: Duration = Duration::from_secs(1);

/// A publish queued for one member.
struct Item {
    forwarded: Forwarded,
    header: Bytes,
    body: Bytes,
    ack: Option<Arc<Joint>>,
}

/// The publishes this member forwards to the others.
pub(super) struct Forwarder {
    me: String,
    auth: Arc<PeerAuth>,
    interest: Arc<OwnInterest>,
    queues: parking_lot::RwLock<HashMap<Arc<str>, Queue>>,
    dropped: Arc<Dropped>,
}

/// One member's queue, and until when it is given nothing (ms since the epoch; 0: it is
/// not).
struct Queue {
    tx: mpsc::Sender<Item>,
    down_until: Arc<AtomicU64>,
}

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
    pub(super) fn new(me: &str, auth: Arc<PeerAuth>, interest: Arc<OwnInterest>) -> Forwarder {
        Forwarder { me: me.to_owned(), auth, interest, queues: Default::default(), dropped: Default::default() }
    }

    /// Starts the queue and task for member `name` at `addr` (nothing when there is one).
    pub(super) fn add_member(&self, name: &str, addr: &str) {
        let mut queues = self.queues.write();
        if queues.contains_key(name) {
            return;
        }
        let (tx, rx) = mpsc::channel(QUEUED);
        let down_until = Arc::new(AtomicU64::new(0));
        queues.insert(Arc::from(name), Queue { tx, down_until: down_until.clone() });
        let client = PeerClient::new(&self.me, name, addr, self.auth.clone());
        tokio::spawn(send(client, name.to_owned(), rx, down_until, self.dropped.clone()));
    }

    /// Member `name` linked to this one again (it announced its interest): it is given
    /// publishes again at once.
    pub(super) fn member_back(&self, name: &str) {
        if let Some(q) = self.queues.read().get(name) {
            q.down_until.store(0, Ordering::Relaxed);
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
            let item = Item { forwarded, header: header.clone(), body: msg.payload.clone(), ack: joint.clone() };
            let Some(queue) = queues.get(&m.member) else {
                self.dropped.add(1, &m.member, "no link to it");
                if let Some(j) = &joint {
                    j.done(Ok(()));
                }
                continue;
            };
            match queue.tx.try_send(item) {
                Ok(()) => queued += 1,
                Err(_) => {
                    self.dropped.add(1, &m.member, "its queue is full");
                    if let Some(j) = &joint {
                        j.done(Ok(()));
                    }
                }
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
}

/// Sends what is queued for member `name` over `client`, in batches, until the process ends.
async fn send(
    mut client: PeerClient,
    name: String,
    mut rx: mpsc::Receiver<Item>,
    down_until: Arc<AtomicU64>,
    dropped: Arc<Dropped>,
) {
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
        let down = now_ms() < down_until.load(Ordering::Relaxed);
        let sent = !down && {
            let headers: Vec<Forwarded> = batch.iter().map(|i| i.forwarded.clone()).collect();
            let blob: Vec<Bytes> = batch.iter().flat_map(|i| [i.header.clone(), i.body.clone()]).collect();
            matches!(client.call_with(&PeerRequest::Forward(headers), &blob, FORWARD_TTL).await, Ok(PeerResponse::Done))
        };
        if !sent {
            if !down {
                down_until.store(now_ms() + DOWN_FOR.as_millis() as u64, Ordering::Relaxed);
            }
            dropped.add(batch.len() as u64, &name, "it cannot be reached");
        }
        for item in batch {
            if let Some(joint) = item.ack {
                if let Some(local) = joint.take_local() {
                    joint.done(local.await.unwrap_or(Err(JournalError::Closed)));
                }
                joint.done(Ok(()));
            }
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
    for signal in signals {
        let _ = signal.await;
    }
    Ok(())
}

//! Where each member's own subscribers and transient queues are, as every other member
//! must know it to forward publishes there.
//!
//! A member's *interest* is the set of bindings of its routing table whose destination
//! lives on it only: connected MQTT sessions, MQTT sessions' and shared groups' queues,
//! transient AMQP queues — each as (virtual host, exchange, binding key, arguments), counted
//! so that a thousand subscribers to one filter are one entry. Durable AMQP queues are not
//! in it: the metadata group makes them, and their bindings, on every member. Bindings on
//! `x-consistent-hash` exchanges are not either (a member's binding would take a share of
//! the ring).
//!
//! [`OwnInterest`] follows this member's bindings (the core's [`BindingObserver`]) and keeps
//! a numbered log of changes; one [`announce`] task per other member sends it the whole set
//! when their link (re)opens, then the changes as they come (or an empty update each second,
//! which finds a link to a member that restarted), and records what it acknowledged.
//! [`RemoteInterest`] applies what the others announce to this member's routing table as
//! bindings to them ([`Broker::bind_member`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, warn};

use super::link::PeerAuth;
use super::metadata::{table, untable};
use super::node::NodeState;
use super::rpc::{InterestKey, InterestUpdate, PeerClient, PeerRequest, PeerResponse};
use crate::core::broker::Broker;
use crate::core::router::{Binding, BindingObserver, Destination, ExchangeKind, RouteError, SHARE_GROUP_ARG};
use crate::core::store::QueueId;
use crate::core::value::Value;

/// Changes kept for members that are behind; one further behind is sent the whole set.
const LOG_KEPT: usize = 100_000;

/// Entries per update, and bytes of their keys.
const UPDATE_ENTRIES: usize = 10_000;
const UPDATE_BYTES: usize = 4 << 20;

/// How long an announcement may take.
const ANNOUNCE_TTL: Duration = Duration::from_secs(5);

/// An idle link sends an empty update this often.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// How long a subscription's acknowledgement waits for the other members to know it.
const KNOWN_WITHIN: Duration = Duration::from_secs(3);

/// This member's interest.
struct Own {
    counts: HashMap<InterestKey, usize>,
    /// Per queue seen in a binding: whether it is this member's own, and its bindings.
    queues: HashMap<QueueId, (bool, usize)>,
    log: VecDeque<(u64, bool, InterestKey)>,
    seq: u64,
}

/// How far one other member was told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Announced {
    /// Not linked yet: the first attempt is under way.
    #[default]
    Linking,
    /// Linked, holding the whole set as of this change and those it acknowledged since.
    Up(u64),
    /// The last attempt failed; trying again.
    Down,
}

/// Other members' bindings removed here by something else than their announcement (the
/// exchange deleted, its virtual host removed): [`RemoteInterest`] binds them again once
/// the exchange is back.
#[derive(Debug, Default)]
pub(super) struct Lost(parking_lot::Mutex<Vec<(Arc<str>, InterestKey)>>);

/// This member's interest, as its bindings change.
pub(super) struct OwnInterest {
    node: Arc<dyn NodeState>,
    lost: Arc<Lost>,
    own: parking_lot::Mutex<Own>,
    seq: watch::Sender<u64>,
    /// How far each other member was told, by name.
    told: parking_lot::Mutex<HashMap<String, watch::Receiver<Announced>>>,
}

impl std::fmt::Debug for OwnInterest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnInterest").field("entries", &self.own.lock().counts.len()).finish()
    }
}

impl OwnInterest {
    /// The interest of the member `node` is; other members' bindings removed here go to
    /// `lost`.
    pub(super) fn new(node: Arc<dyn NodeState>, lost: Arc<Lost>) -> Arc<OwnInterest> {
        let own = Own { counts: HashMap::new(), queues: HashMap::new(), log: VecDeque::new(), seq: 0 };
        Arc::new(OwnInterest {
            node,
            lost,
            own: parking_lot::Mutex::new(own),
            seq: watch::channel(0).0,
            told: Default::default(),
        })
    }

    fn change(&self, vhost: &str, exchange: &str, kind: ExchangeKind, b: &Binding, added: bool) {
        if kind == ExchangeKind::ConsistentHash {
            return;
        }
        let queue = match &b.dest {
            Destination::Session(_) => None,
            Destination::Queue(id) => Some(*id),
            Destination::Member(member) if !added => {
                let key = key_of(vhost, exchange, b);
                self.lost.0.lock().push((member.clone(), key));
                return;
            }
            Destination::Exchange(_) | Destination::Member(_) => return,
        };
        let mut own = self.own.lock();
        if let Some(id) = queue {
            // Decided once per queue, when its first binding comes, so that its removal is
            // counted the same way whatever happened to the queue meanwhile.
            let local = if added {
                let node = &self.node;
                let entry = own.queues.entry(id).or_insert_with(|| (!node.is_replicated_queue(id), 0));
                entry.1 += 1;
                entry.0
            } else {
                let Some(entry) = own.queues.get_mut(&id) else { return };
                entry.1 -= 1;
                let local = entry.0;
                if entry.1 == 0 {
                    own.queues.remove(&id);
                }
                local
            };
            if !local {
                return;
            }
        }
        let key = key_of(vhost, exchange, b);
        let logged = if added {
            let n = own.counts.entry(key.clone()).or_insert(0);
            *n += 1;
            *n == 1
        } else {
            match own.counts.get_mut(&key) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => own.counts.remove(&key).is_some(),
                None => false,
            }
        };
        if logged {
            own.seq += 1;
            let seq = own.seq;
            own.log.push_back((seq, added, key));
            if own.log.len() > LOG_KEPT {
                own.log.pop_front();
            }
            // Under the lock: announcers see the numbers grow, never a lower one after.
            self.seq.send_replace(seq);
        }
    }

    /// The whole set and the change it is as of.
    fn snapshot(&self) -> (Vec<InterestKey>, u64) {
        let own = self.own.lock();
        (own.counts.keys().cloned().collect(), own.seq)
    }

    /// The changes after `seq` (at most [`UPDATE_ENTRIES`]) and the last one's number;
    /// `None` when some of them are no longer kept.
    fn since(&self, seq: u64) -> Option<(Vec<(bool, InterestKey)>, u64)> {
        let own = self.own.lock();
        if own.seq == seq {
            return Some((Vec::new(), seq));
        }
        let first = own.log.front()?.0;
        if first > seq + 1 {
            return None;
        }
        let mut bytes = 0;
        let changes: Vec<(bool, InterestKey)> = own
            .log
            .iter()
            .skip((seq + 1 - first) as usize)
            .take(UPDATE_ENTRIES)
            .take_while(|(_, _, key)| {
                let fits = bytes < UPDATE_BYTES;
                bytes += key.size();
                fits
            })
            .map(|(_, added, key)| (*added, key.clone()))
            .collect();
        let upto = seq + changes.len() as u64;
        Some((changes, upto))
    }

    /// Records the announcer of member `name`.
    pub(super) fn told(&self, name: &str, rx: watch::Receiver<Announced>) {
        self.told.lock().insert(name.to_owned(), rx);
    }

    /// Member `name` is no longer one: nothing waits for it, and its announcing task ends.
    pub(super) fn untold(&self, name: &str) {
        self.told.lock().remove(name);
    }

    /// Resolves once every member acknowledged this member's interest as it is now (a
    /// member whose last link attempt failed is not waited for; one being linked the first
    /// time is), or after [`KNOWN_WITHIN`].
    pub(super) async fn known(&self) {
        let target = self.own.lock().seq;
        let told: Vec<watch::Receiver<Announced>> = self.told.lock().values().cloned().collect();
        let all = async {
            for mut rx in told {
                let _ = rx
                    .wait_for(|a| matches!(*a, Announced::Down) || matches!(*a, Announced::Up(s) if s >= target))
                    .await;
            }
        };
        if tokio::time::timeout(KNOWN_WITHIN, all).await.is_err() {
            debug!("cluster: a member did not acknowledge a subscription within {} s", KNOWN_WITHIN.as_secs());
        }
    }
}

/// The interest entry of binding `b` of `exchange` in `vhost`. A shared group's binding is
/// announced as the group's: its members on another member are chosen against its members
/// here, once per message.
fn key_of(vhost: &str, exchange: &str, b: &Binding) -> InterestKey {
    let args = match (&b.dest, b.share_group()) {
        (Destination::Member(_), _) | (_, None) => table(&b.args),
        (_, Some(group)) => table(&[(SHARE_GROUP_ARG.to_owned(), Value::Str(group.to_owned()))]),
    };
    InterestKey { vhost: vhost.to_owned(), exchange: exchange.to_owned(), key: b.key.clone(), args }
}

impl BindingObserver for OwnInterest {
    fn bound(&self, vhost: &str, exchange: &str, kind: ExchangeKind, binding: &Binding) {
        self.change(vhost, exchange, kind, binding, true);
    }

    fn unbound(&self, vhost: &str, exchange: &str, kind: ExchangeKind, binding: &Binding) {
        self.change(vhost, exchange, kind, binding, false);
    }
}

/// Tells member `peer` (at `addr`) this member's interest, for as long as the process
/// runs: the whole set each time the link opens, then the changes.
pub(super) async fn announce(
    own: Arc<OwnInterest>,
    me: String,
    peer: String,
    addr: String,
    auth: Arc<PeerAuth>,
    told: watch::Sender<Announced>,
) {
    let mut client = PeerClient::new(&me, &peer, &addr, auth);
    let mut changed = own.seq.subscribe();
    // Epochs grow across this process's restarts too: milliseconds since the epoch at
    // start, then one more per resync.
    let mut epoch = crate::core::message::now_ms() << 10;
    // Until the member is forgotten (nobody holds what this task tells any more).
    while !told.is_closed() {
        epoch += 1;
        let (all, mut at) = own.snapshot();
        if resync(&mut client, all, epoch).await.is_err() {
            told.send_replace(Announced::Down);
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        told.send_replace(Announced::Up(at));
        while !told.is_closed() {
            if *changed.borrow_and_update() == at {
                let _ = tokio::time::timeout(KEEPALIVE, changed.changed()).await;
            }
            let Some((changes, upto)) = own.since(at) else { break };
            let update = InterestUpdate { changes, epoch, ..Default::default() };
            match client.call(&PeerRequest::Interest(update), ANNOUNCE_TTL).await {
                Ok(PeerResponse::Done) => {}
                other => {
                    debug!(peer, answer = ?other.map(|_| ()), "cluster: interest not announced; again once linked");
                    told.send_replace(Announced::Down);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
            at = upto;
            told.send_replace(Announced::Up(at));
        }
    }
}

/// Sends the whole set `all`, in parts, as resync `epoch`.
async fn resync(client: &mut PeerClient, all: Vec<InterestKey>, epoch: u64) -> Result<(), ()> {
    let mut parts: Vec<Vec<(bool, InterestKey)>> = vec![Vec::new()];
    let mut bytes = 0;
    for key in all {
        let full = parts.last().is_some_and(|p| p.len() >= UPDATE_ENTRIES) || bytes >= UPDATE_BYTES;
        if full {
            parts.push(Vec::new());
            bytes = 0;
        }
        bytes += key.size();
        parts.last_mut().expect("one part at least").push((true, key));
    }
    let last = parts.len() - 1;
    for (i, changes) in parts.into_iter().enumerate() {
        let update = InterestUpdate { resync_start: i == 0, resync_end: i == last, epoch, changes };
        match client.call(&PeerRequest::Interest(update), ANNOUNCE_TTL).await {
            Ok(PeerResponse::Done) => {}
            _ => return Err(()),
        }
    }
    Ok(())
}

/// What one other member announced.
#[derive(Default)]
struct View {
    /// Bound in this member's routing table.
    bound: HashSet<InterestKey>,
    /// Not bound yet: their exchange (or virtual host) is not here yet.
    pending: HashSet<InterestKey>,
    /// During a resync: what the resync has not named yet.
    stale: Option<HashSet<InterestKey>>,
    /// The sender's resync the view follows.
    epoch: u64,
}

/// The other members' interest, bound in this member's routing table.
pub(super) struct RemoteInterest {
    broker: Arc<Broker>,
    views: parking_lot::Mutex<HashMap<String, View>>,
    lost: Arc<Lost>,
    /// Members forgotten: what they still announce is ignored.
    forgotten: parking_lot::Mutex<HashSet<String>>,
}

impl RemoteInterest {
    /// The other members' interest, bound in `broker`'s routing table; what is removed
    /// there otherwise comes back through `lost`.
    pub(super) fn new(broker: Arc<Broker>, lost: Arc<Lost>) -> RemoteInterest {
        RemoteInterest { broker, views: Default::default(), lost, forgotten: Default::default() }
    }

    /// Member `name` is no longer one: its bindings are removed from the routing table and
    /// what it still announces is ignored, until it is a member again ([`Self::remember`]).
    /// Blocking (router changes): off the runtime's workers.
    pub(super) fn forget(&self, name: &str) {
        self.forgotten.lock().insert(name.to_owned());
        let member: Arc<str> = Arc::from(name);
        if let Some(view) = self.views.lock().remove(name) {
            for key in &view.bound {
                self.unbind(&member, key);
            }
        }
    }

    /// Member `name` is one (again).
    pub(super) fn remember(&self, name: &str) {
        self.forgotten.lock().remove(name);
    }

    /// Applies what member `from` announced. Blocking (router changes): off the runtime's
    /// workers. Refused (the sender then sends its whole set again) from a member that was
    /// forgotten, and for changes with nothing they apply to (no resync from it yet since
    /// this member started, or since it was a member again).
    pub(super) fn apply(&self, from: &str, update: InterestUpdate) -> Result<(), String> {
        let member: Arc<str> = Arc::from(from);
        let lost = std::mem::take(&mut *self.lost.0.lock());
        let mut views = self.views.lock();
        if self.forgotten.lock().contains(from) {
            return Err(format!("'{from}' is not a member"));
        }
        if !update.resync_start && !views.contains_key(from) {
            return Err("changes before the whole set: send it".into());
        }
        for (m, key) in lost {
            if let Some(view) = views.get_mut(&*m) {
                if view.bound.remove(&key) {
                    view.pending.insert(key);
                }
            }
        }
        let view = views.entry(from.to_owned()).or_default();
        if update.epoch < view.epoch {
            // Late, from a link the sender replaced since.
            return Ok(());
        }
        view.epoch = update.epoch;
        if update.resync_start {
            view.stale = Some(view.bound.iter().chain(view.pending.iter()).cloned().collect());
        }
        for (added, key) in update.changes {
            if let Some(stale) = view.stale.as_mut() {
                stale.remove(&key);
            }
            if added {
                // During a resync, bound again whatever this member holds (making it again
                // changes nothing when it is there).
                if view.stale.is_some() || !view.bound.contains(&key) {
                    self.bind(&member, view, key);
                }
            } else {
                view.pending.remove(&key);
                if view.bound.remove(&key) {
                    self.unbind(&member, &key);
                }
            }
        }
        if update.resync_end {
            for key in view.stale.take().unwrap_or_default() {
                view.pending.remove(&key);
                if view.bound.remove(&key) {
                    self.unbind(&member, &key);
                }
            }
        }
        // Bindings whose exchange was missing: again (an update comes at least each second).
        for key in std::mem::take(&mut view.pending) {
            self.bind(&member, view, key);
        }
        Ok(())
    }

    fn bind(&self, member: &Arc<str>, view: &mut View, key: InterestKey) {
        let Ok(args) = untable(&key.args) else { return };
        match self.broker.bind_member(&key.vhost, &key.exchange, member, &key.key, args) {
            Ok(_) => {
                view.bound.insert(key);
            }
            Err(RouteError::NoExchange(..) | RouteError::NoVhost(_)) => {
                view.pending.insert(key);
            }
            Err(e) => warn!(member = %member, exchange = %key.exchange, key = %key.key, error = %e,
                "cluster: a member's binding cannot be made here"),
        }
    }

    fn unbind(&self, member: &Arc<str>, key: &InterestKey) {
        let Ok(args) = untable(&key.args) else { return };
        let _ = self.broker.unbind_member(&key.vhost, &key.exchange, member, &key.key, &args);
    }
}

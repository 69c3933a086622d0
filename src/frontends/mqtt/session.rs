//! MQTT sessions: which client ids are connected (for take-over), the state of persistent
//! sessions (their consume queue, subscriptions, expiry; stored through the core's
//! [`SessionStore`](crate::core::store::SessionStore)), and pending delayed wills.
//!
//! A persistent session owns a consume queue named `mqtt-session/{client id}`; its
//! subscriptions are bindings to that queue and stay in the routing table while the client
//! is offline, so messages keep arriving in the journal. A clean session has no queue: its
//! subscriptions lead straight to its connection (the fast path).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use atomic_waker::AtomicWaker;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{oneshot, Notify};

use crate::core::delivery::Wake;
use crate::core::store::{QueueId, StoredSession, SubOptions};

/// Control messages to a connection task.
#[derive(Debug)]
pub enum Control {
    /// Another connection took the client id over (MQTT 5 reason 0x8E).
    TakenOver,
    /// The broker is shutting down (MQTT 5 reason 0x8B).
    Shutdown,
    /// An operator closed the connection (MQTT 5 reason 0x98 Administrative action).
    Kicked,
}

/// A connection task's doorbell and what others tell it ([`Control`]), and what it tells
/// them back (its cleanup finished). Whatever hands the connection work (a control
/// message, its session link, its deadline on the timer wheel) rings the one doorbell,
/// so the connection has one wait for all of them. One small allocation per connection, where a channel of each kind would
/// cost several hundred bytes.
#[derive(Debug, Default)]
pub struct ConnectionSignals {
    /// The first control message told and not yet taken (one is enough to close).
    control: Mutex<Option<Control>>,
    /// The waiting connection's waker (level-triggered: the connection looks at every
    /// source after registering it, so a ring before the wait is not needed).
    doorbell: AtomicWaker,
    finished: AtomicBool,
    finished_notify: Notify,
}

impl Wake for ConnectionSignals {
    fn wake(&self) {
        self.doorbell.wake();
    }
}

impl ConnectionSignals {
    /// Tells the connection `control`, unless it was already told something.
    pub fn tell(&self, control: Control) {
        let mut c = self.control.lock();
        if c.is_none() {
            *c = Some(control);
            drop(c);
            self.wake();
        }
    }

    /// The control message told, if any (taken).
    pub fn take_control(&self) -> Option<Control> {
        self.control.lock().take()
    }

    /// Makes the next ring wake `waker`; look at every source after this, before
    /// returning `Pending`.
    pub fn listen(&self, waker: &Waker) {
        self.doorbell.register(waker);
    }

    /// The connection finished its cleanup.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        self.finished_notify.notify_waiters();
    }

    /// Waits until the connection finished its cleanup, at most `limit`.
    pub async fn wait_finished(&self, limit: Duration) {
        let finished = async {
            loop {
                let notified = self.finished_notify.notified();
                tokio::pin!(notified);
                // Registered before the check: a finish between the two still wakes it.
                notified.as_mut().enable();
                if self.finished.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(limit, finished).await;
    }
}

/// The connection currently holding a client id.
#[derive(Debug)]
pub struct Online {
    /// Id of the holding connection: a [`Sessions::release`] naming another id leaves the slot alone.
    pub conn_id: u64,
    /// Tells it [`Control::TakenOver`]; says when its cleanup finished.
    pub signals: Arc<ConnectionSignals>,
}

/// In-memory state of a persistent session.
#[derive(Debug, Clone)]
pub struct Persistent {
    /// The session's queue (its subscriptions are bindings to it).
    pub queue: QueueId,
    /// What the session store keeps of it (subscriptions, expiry); boxed so that the
    /// sessions table and a connection's state stay small for clean sessions too.
    pub stored: Box<StoredSession>,
}

#[derive(Debug, Default)]
struct Slot {
    online: Option<Online>,
    persistent: Option<Persistent>,
    /// Cancels a delayed will of the previous connection.
    pending_will: Option<oneshot::Sender<()>>,
    expires_at_ms: Option<u64>,
}

/// Every known session.
#[derive(Debug, Default)]
pub struct Sessions {
    slots: Mutex<HashMap<Arc<str>, Slot>>,
    expiries: Mutex<BTreeSet<(u64, Arc<str>)>>,
}

/// One session as operations see it ([`Sessions::list`]).
#[derive(Debug, Clone)]
pub struct SessionView {
    /// Client id.
    pub client_id: Arc<str>,
    /// A connection holds it now.
    pub online: bool,
    /// The persistent state (queue, subscriptions, expiry), for a persistent session.
    pub persistent: Option<Persistent>,
    /// When an offline session expires, ms since the epoch.
    pub expires_at_ms: Option<u64>,
}

/// What [`Sessions::claim`] found.
#[derive(Debug)]
pub struct Claim {
    /// The previous connection holding the id, to be told it was taken over.
    pub previous: Option<Online>,
    /// The persistent state, if any.
    pub persistent: Option<Persistent>,
    /// Set by the caller once it has dealt with `previous` (its cleanup may have changed
    /// the persistent state: read it again with [`Sessions::persistent`]).
    pub previous_existed: bool,
}

impl Sessions {
    /// Every session, online or offline, by client id.
    pub fn list(&self) -> Vec<SessionView> {
        let mut all: Vec<SessionView> = self
            .slots
            .lock()
            .iter()
            .map(|(id, s)| SessionView {
                client_id: id.clone(),
                online: s.online.is_some(),
                persistent: s.persistent.clone(),
                expires_at_ms: s.expires_at_ms,
            })
            .collect();
        all.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        all
    }

    /// Tells the connection holding `client_id` that a connection on another cluster member
    /// took the id over (as [`Sessions::claim`] tells a previous connection here); its
    /// signals, to wait for its cleanup, or `None` if no connection holds the id.
    pub fn taken_over_elsewhere(&self, client_id: &str) -> Option<Arc<ConnectionSignals>> {
        let slots = self.slots.lock();
        let online = slots.get(client_id)?.online.as_ref()?;
        online.signals.tell(Control::TakenOver);
        Some(online.signals.clone())
    }

    /// Tells the connection holding `client_id` to close (an operator's kick); its
    /// signals, to wait for its cleanup, or `None` if no connection holds the id.
    pub fn kick(&self, client_id: &str) -> Option<Arc<ConnectionSignals>> {
        let slots = self.slots.lock();
        let online = slots.get(client_id)?.online.as_ref()?;
        online.signals.tell(Control::Kicked);
        Some(online.signals.clone())
    }

    /// How many sessions there are, and how many of those are offline persistent ones.
    pub fn counts(&self) -> (usize, usize) {
        let slots = self.slots.lock();
        (slots.len(), slots.values().filter(|s| s.online.is_none() && s.persistent.is_some()).count())
    }

    /// Takes an offline session's persistent state out of the table (to discard it);
    /// `None` while a connection holds it or when it has none.
    pub fn take_offline(&self, client_id: &str) -> Option<Persistent> {
        let mut slots = self.slots.lock();
        let slot = slots.get(client_id)?;
        if slot.online.is_some() || slot.persistent.is_none() {
            return None;
        }
        let slot = slots.remove(client_id)?;
        if let Some(at) = slot.expires_at_ms {
            self.expiries.lock().remove(&(at, Arc::from(client_id)));
        }
        slot.persistent
    }

    /// Registers a persistent session recovered from storage (offline).
    pub fn restore(&self, client_id: Arc<str>, persistent: Persistent, expires_at_ms: Option<u64>) {
        if let Some(at) = expires_at_ms {
            self.expiries.lock().insert((at, client_id.clone()));
        }
        self.slots.lock().insert(client_id, Slot { persistent: Some(persistent), expires_at_ms, ..Default::default() });
    }

    /// Makes `online` the holder of `client_id`; returns the previous holder and the
    /// persistent state, and cancels a pending delayed will and the expiry.
    pub fn claim(&self, client_id: &Arc<str>, online: Online) -> Claim {
        let mut slots = self.slots.lock();
        let slot = slots.entry(client_id.clone()).or_default();
        if let Some(cancel) = slot.pending_will.take() {
            let _ = cancel.send(());
        }
        if let Some(at) = slot.expires_at_ms.take() {
            self.expiries.lock().remove(&(at, client_id.clone()));
        }
        let previous = slot.online.replace(online);
        Claim { previous, persistent: slot.persistent.clone(), previous_existed: false }
    }

    /// Current persistent state of a session.
    pub fn persistent(&self, client_id: &Arc<str>) -> Option<Persistent> {
        self.slots.lock().get(client_id).and_then(|s| s.persistent.clone())
    }

    /// Replaces (or removes) the persistent state of a session.
    pub fn set_persistent(&self, client_id: &Arc<str>, persistent: Option<Persistent>) {
        if let Some(slot) = self.slots.lock().get_mut(client_id) {
            slot.persistent = persistent;
        }
    }

    /// Updates the stored form of a persistent session in memory.
    pub fn update_stored(&self, client_id: &Arc<str>, stored: &StoredSession) {
        if let Some(slot) = self.slots.lock().get_mut(client_id) {
            if let Some(p) = slot.persistent.as_mut() {
                (*p.stored).clone_from(stored);
            }
        }
    }

    /// The connection `conn_id` left. Returns false if another connection holds the id by
    /// now (take-over), in which case the caller must not touch the session.
    pub fn release(
        &self,
        client_id: &Arc<str>,
        conn_id: u64,
        expires_at_ms: Option<u64>,
        pending_will: Option<oneshot::Sender<()>>,
    ) -> bool {
        let mut slots = self.slots.lock();
        let ours = slots.get(client_id).is_some_and(|s| s.online.as_ref().map(|o| o.conn_id) == Some(conn_id));
        let Some(slot) = slots.get_mut(client_id).filter(|_| ours) else {
            // Taken over: a new connection resumed the session, so a delayed will is void.
            if let Some(cancel) = pending_will {
                let _ = cancel.send(());
            }
            return false;
        };
        slot.online = None;
        slot.pending_will = pending_will;
        if slot.persistent.is_none() {
            if slot.pending_will.is_none() {
                slots.remove(client_id);
            }
        } else if let Some(at) = expires_at_ms {
            slot.expires_at_ms = Some(at);
            self.expiries.lock().insert((at, client_id.clone()));
        }
        true
    }

    /// Sessions whose expiry passed at `now_ms` and that are still offline; they are
    /// removed from the registry and returned for cleanup.
    pub fn take_expired(&self, now_ms: u64) -> Vec<(Arc<str>, Persistent)> {
        let due: Vec<(u64, Arc<str>)> = {
            let mut exp = self.expiries.lock();
            let mut due = Vec::new();
            while let Some(first) = exp.first().cloned() {
                if first.0 > now_ms {
                    break;
                }
                exp.pop_first();
                due.push(first);
            }
            due
        };
        let mut out = Vec::new();
        let mut slots = self.slots.lock();
        for (at, id) in due {
            let expired = slots.get(&id).is_some_and(|s| s.online.is_none() && s.expires_at_ms == Some(at));
            if expired {
                if let Some(slot) = slots.remove(&id) {
                    if let Some(cancel) = slot.pending_will {
                        // Session end publishes a pending delayed will at once.
                        drop(cancel);
                    }
                    if let Some(p) = slot.persistent {
                        out.push((id, p));
                    }
                }
            }
        }
        out
    }

    /// Persistent sessions currently offline.
    pub fn offline_count(&self) -> usize {
        self.counts().1
    }

    /// Tells every connected client `control` (for shutdown).
    pub fn tell_online(&self, control: fn() -> Control) {
        for s in self.slots.lock().values() {
            if let Some(o) = &s.online {
                o.signals.tell(control());
            }
        }
    }
}

/// A connected session's subscriptions by full filter, sorted: a vector, since most
/// sessions hold one or a few (a B-tree's first node alone is 720 bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Subscriptions(Vec<(String, SubOptions)>);

impl Subscriptions {
    fn find(&self, filter: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(f, _)| f.as_str().cmp(filter))
    }

    /// The options of `filter`'s subscription.
    pub(crate) fn get(&self, filter: &str) -> Option<&SubOptions> {
        self.find(filter).ok().map(|i| &self.0[i].1)
    }

    /// True when `filter` is subscribed.
    pub(crate) fn contains_key(&self, filter: &str) -> bool {
        self.find(filter).is_ok()
    }

    /// Subscribes `filter` (replacing its options); returns the options it had.
    pub(crate) fn insert(&mut self, filter: String, options: SubOptions) -> Option<SubOptions> {
        match self.find(&filter) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, options)),
            Err(i) => {
                // Exact growth while small: one subscription costs one entry.
                if self.0.len() < 4 {
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, (filter, options));
                None
            }
        }
    }

    /// Unsubscribes `filter`; returns the options it had.
    pub(crate) fn remove(&mut self, filter: &str) -> Option<SubOptions> {
        self.find(filter).ok().map(|i| self.0.remove(i).1)
    }

    /// The filters, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(f, _)| f)
    }

    /// Filters and options, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &SubOptions)> {
        self.0.iter().map(|(f, o)| (f, o))
    }

    /// As the session store keeps them.
    pub(crate) fn to_map(&self) -> BTreeMap<String, SubOptions> {
        self.0.iter().cloned().collect()
    }
}

impl FromIterator<(String, SubOptions)> for Subscriptions {
    fn from_iter<I: IntoIterator<Item = (String, SubOptions)>>(iter: I) -> Self {
        let mut subs = Subscriptions::default();
        for (f, o) in iter {
            subs.insert(f, o);
        }
        subs
    }
}

#[cfg(test)]
mod subscriptions_tests {
    use super::*;

    fn opts(qos: u8) -> SubOptions {
        SubOptions { qos, no_local: false, retain_as_published: false, subscription_id: None, tag_filter: None }
    }

    #[test]
    fn subscriptions_stay_sorted_replace_and_remove_by_filter() {
        let mut s = Subscriptions::default();
        assert_eq!(s.insert("b/#".into(), opts(1)), None);
        assert_eq!(s.insert("a/+".into(), opts(0)), None);
        assert_eq!(s.insert("c".into(), opts(2)), None);
        assert_eq!(s.insert("a/+".into(), opts(2)), Some(opts(0)), "replaced");
        assert_eq!(s.keys().collect::<Vec<_>>(), ["a/+", "b/#", "c"]);
        assert_eq!(s.get("a/+"), Some(&opts(2)));
        assert!(s.contains_key("c") && !s.contains_key("d"));
        assert_eq!(s.remove("b/#"), Some(opts(1)));
        assert_eq!(s.remove("b/#"), None);
        let map = s.to_map();
        assert_eq!(map.len(), 2);
        assert_eq!(map.into_iter().collect::<Subscriptions>(), s, "through the store and back");
    }
}

//! The other members of a cluster, as the core sees them: where publishes matched by their
//! subscribers and transient queues go ([`MemberForwarder`]), how their bindings are made
//! in the routing table ([`Broker::bind_member`]), and how a publish forwarded from one is
//! routed to this member's own targets ([`Broker::publish_forwarded`]). A single node has
//! none of it: routes never name a member.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferrymq_storage::{JournalError, QueueId};
use futures_util::future::BoxFuture;
use tokio::sync::oneshot;

use super::{Broker, DurableSignal, RetainMode};
use crate::core::message::SharedMessage;
use crate::core::router::{Binding, BindingObserver, Destination, MemberRoute, RouteError};
use crate::core::store::StoreWrite;
use crate::core::value::Value;

/// How a publish another member forwarded here was routed there.
#[derive(Debug, Clone, Copy)]
pub struct ForwardedRoute<'a> {
    /// The virtual host.
    pub vhost: &'a str,
    /// The exchanges whose bindings to this member matched there.
    pub via: &'a [Box<str>],
    /// The publisher (an MQTT client id, for no-local; "" otherwise).
    pub publisher: &'a str,
    /// The MQTT shared groups that take it here.
    pub groups: &'a [Arc<str>],
}

/// Forwards publishes to other members (a cluster member's, set by
/// [`Broker::join_cluster`]).
pub trait MemberForwarder: Send + Sync + std::fmt::Debug {
    /// Hands `msg` over to be forwarded to each of `members`. When `durable` (the
    /// publisher waits to hear that it is safe), the signal returned resolves once `local`
    /// (this member's own storing of it, if any) did and every member took it in hand;
    /// otherwise `local` is returned as it is and the forward happens on its own.
    fn forward(
        &self,
        msg: &SharedMessage,
        members: &[MemberRoute],
        local: Option<DurableSignal>,
        durable: bool,
    ) -> Option<DurableSignal>;

    /// Resolves once every member reachable now knows this member's bindings as they are
    /// now (so that a publish through any of them reaches a subscriber made before), or
    /// after a bound wait.
    fn bindings_known(&self) -> BoxFuture<'_, ()>;

    /// Tells every member reachable now that MQTT client `client_id` connected here, so
    /// that a connection of the same id there is taken over; resolves once they closed it,
    /// or after a bound wait.
    fn client_connected<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, ()>;
}

/// One publish's acknowledgement, made of parts (this member's journal, each member it
/// was forwarded to): it resolves when the last part is done, with the first failure.
#[derive(Debug)]
pub struct Joint {
    remaining: AtomicUsize,
    outcome: parking_lot::Mutex<Outcome>,
    local: parking_lot::Mutex<Option<DurableSignal>>,
}

/// Where a [`Joint`]'s result goes, and its first failure so far.
#[derive(Debug)]
struct Outcome {
    tx: Option<oneshot::Sender<Result<(), JournalError>>>,
    failed: Option<JournalError>,
}

impl Joint {
    /// An acknowledgement of `parts` parts besides `local` (which counts as one more when
    /// there is one): the signal that resolves with it.
    pub fn new(parts: usize, local: Option<DurableSignal>) -> (Arc<Joint>, DurableSignal) {
        let (tx, rx) = oneshot::channel();
        let remaining = AtomicUsize::new(parts + usize::from(local.is_some()));
        let outcome = Outcome { tx: Some(tx), failed: None };
        let joint = Joint { remaining, outcome: parking_lot::Mutex::new(outcome), local: local.into() };
        (Arc::new(joint), rx)
    }

    /// This member's own part, for the first to wait for it (then [`Joint::done`] with its
    /// result); `None` once taken or when there is none.
    pub fn take_local(&self) -> Option<DurableSignal> {
        self.local.lock().take()
    }

    /// One part is done.
    pub fn done(&self, result: Result<(), JournalError>) {
        let mut outcome = self.outcome.lock();
        if let Err(e) = result {
            outcome.failed.get_or_insert(e);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(tx) = outcome.tx.take() {
                let _ = tx.send(outcome.failed.take().map_or(Ok(()), Err));
            }
        }
    }
}

impl Broker {
    /// This broker is a cluster member: `observer` is told of every binding (those there
    /// are first), and publishes that match other members' bindings go to `forwarder`.
    /// Set once.
    pub fn join_cluster(&self, observer: Arc<dyn BindingObserver>, forwarder: Arc<dyn MemberForwarder>) {
        if self.members.set(forwarder).is_ok() {
            self.router.observe_bindings(observer);
        }
    }

    /// Binds member `member` to `exchange` of `vhost` with `key` and `args` (a subscriber
    /// or transient queue of its own matches them); true when new.
    pub fn bind_member(
        &self,
        vhost: &str,
        exchange: &str,
        member: &Arc<str>,
        key: &str,
        args: Vec<(String, Value)>,
    ) -> Result<bool, RouteError> {
        let binding =
            Binding { dest: Destination::Member(member.clone()), key: key.to_owned(), args, mqtt: None, filter: None };
        self.router.bind(vhost, exchange, binding)
    }

    /// Removes the binding [`Broker::bind_member`] made; true when there was one.
    pub fn unbind_member(
        &self,
        vhost: &str,
        exchange: &str,
        member: &Arc<str>,
        key: &str,
        args: &[(String, Value)],
    ) -> Result<bool, RouteError> {
        self.router.unbind(vhost, exchange, &Destination::Member(member.clone()), key, args)
    }

    /// Routes a publish another member forwarded here (`msg`, as `from` says it was routed
    /// there) to this member's own targets — its sessions, the MQTT shared groups the other
    /// member chose this one for, and the queues `own` says are its own (not the queues
    /// every member holds, which the publish reached where it was made) — and stores it
    /// for those queues: the signal of that, or `None` when nothing here needed storing (or
    /// nothing matched any more).
    pub async fn publish_forwarded(
        &self,
        from: &ForwardedRoute<'_>,
        msg: &SharedMessage,
        own: &(dyn Fn(QueueId) -> bool + Sync),
    ) -> Option<DurableSignal> {
        let (vhost, exchange) = (from.vhost, msg.exchange.as_str());
        let mut routes =
            self.router.route_forwarded(vhost, exchange, from.via, msg, from.publisher, from.groups).ok()?;
        routes.queues.retain(|r| own(r.queue));
        if routes.is_empty() {
            return None;
        }
        self.publish(msg, &routes, RetainMode::None, StoreWrite::none()).await
    }

    /// Resolves once the other cluster members know this member's bindings as they are now
    /// (at once on a single node): a subscription acknowledged after it is reached by a
    /// publish through any member.
    pub async fn members_know_bindings(&self) {
        if let Some(forwarder) = self.members.get() {
            forwarder.bindings_known().await;
        }
    }

    /// MQTT client `client_id` connects here: a connection of the same id on another
    /// cluster member is taken over (nothing on a single node).
    pub async fn members_take_over(&self, client_id: &str) {
        if let Some(forwarder) = self.members.get() {
            forwarder.client_connected(client_id).await;
        }
    }

    /// `local`, joined with the forward of `msg` to the members `routes` name (on a cluster
    /// member whose route reached other members).
    pub(in crate::core) fn forward_to_members(
        &self,
        msg: &SharedMessage,
        members: &[MemberRoute],
        local: Option<DurableSignal>,
    ) -> Option<DurableSignal> {
        match self.members.get() {
            Some(forwarder) if !members.is_empty() => forwarder.forward(msg, members, local, msg.qos > 0),
            _ => local,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_joint_resolves_after_its_last_part_with_the_first_failure() {
        // Two members and this member's own storing.
        let (tx, local) = oneshot::channel();
        let (joint, signal) = Joint::new(2, Some(local));
        let own = joint.take_local().expect("this member's part, once");
        assert!(joint.take_local().is_none());
        joint.done(Ok(()));
        joint.done(Err(JournalError::Closed));
        let mut signal = signal;
        assert!(signal.try_recv().is_err(), "one part still to come");
        tx.send(Ok(())).unwrap();
        joint.done(own.await.unwrap());
        assert_eq!(signal.await.unwrap(), Err(JournalError::Closed), "the failure is the publish's");

        // Without a part of its own: resolves with the members' parts.
        let (joint, signal) = Joint::new(1, None);
        joint.done(Ok(()));
        assert_eq!(signal.await.unwrap(), Ok(()));
    }
}

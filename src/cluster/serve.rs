//! The peer listener (`cluster.listen`): each accepted connection is authenticated
//! ([`link::accept`]), then its requests are answered in order: by this member's Raft
//! node, its view of the other members' interest, or its routing of forwarded publishes. A connection that fails the handshake is closed; refusals are logged at most once
//! a minute (with how many there were), so a port scan cannot flood the log.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::LogId;
use tokio::net::TcpListener;
use tracing::{debug, warn};

use super::forward;
use super::health::PeerHealth;
use super::link::{self, PeerAuth};
use super::membership::Change;
use super::membership::Proposal;
use super::rpc::DataRpc;
use super::rpc::{ForwardedWriteError, MembershipChange, PeerRequest, PeerResponse};
use super::types::{DataRaftHandle, MetaRaftHandle, PeerNode};
use super::Routing;

/// The Raft nodes of this member's groups.
#[derive(Clone)]
pub(super) struct Rafts {
    /// The metadata group's.
    pub meta: MetaRaftHandle,
    /// The data group's, once started.
    pub data: tokio::sync::watch::Receiver<Option<DataRaftHandle>>,
}

/// Handshakes that may be in progress at once.
const MAX_HANDSHAKES: usize = 64;

/// Handshakes that may be in progress at once from one source address: one address that
/// stalls handshakes cannot take every place from the members.
const MAX_HANDSHAKES_PER_ADDRESS: usize = 16;

/// Handshakes in progress by source address.
#[derive(Debug, Default)]
struct InHandshake(parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

impl InHandshake {
    /// A place for a handshake from `ip`, unless it has [`MAX_HANDSHAKES_PER_ADDRESS`].
    fn enter(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<AddressPlace> {
        let mut counts = self.0.lock();
        let n = counts.entry(ip).or_default();
        if *n >= MAX_HANDSHAKES_PER_ADDRESS {
            return None;
        }
        *n += 1;
        Some(AddressPlace { of: self.clone(), ip })
    }
}

/// One handshake's place among its address's; given back when dropped.
struct AddressPlace {
    of: Arc<InHandshake>,
    ip: std::net::IpAddr,
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut counts = self.of.0.lock();
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// Refused handshakes since the last warning, and when that was.
#[derive(Debug, Default)]
struct Refusals {
    count: AtomicU64,
    last_logged_secs: AtomicU64,
}

impl Refusals {
    fn note(&self, peer: std::net::SocketAddr, why: &str) {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let now = crate::core::message::now_ms() / 1000;
        let last = self.last_logged_secs.load(Ordering::Relaxed);
        if now >= last + 60
            && self.last_logged_secs.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            self.count.store(0, Ordering::Relaxed);
            warn!(%peer, refused = n, "peer link refused: {why} (logged at most once a minute)");
        }
    }
}

/// Serves the peer listener until the process ends.
pub(super) async fn run(
    listener: TcpListener,
    me: String,
    id: u64,
    auth: Arc<PeerAuth>,
    rafts: Rafts,
    health: Arc<PeerHealth>,
    routing: Arc<Routing>,
) {
    let refusals = Arc::new(Refusals::default());
    // Handshakes in progress at once: past it, a new socket is closed at accept.
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let by_address = Arc::new(InHandshake::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                debug!(error = %e, "peer listener accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(place) = by_address.enter(peer.ip()) else {
            refusals.note(peer, "too many handshakes at once from one address");
            continue;
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            refusals.note(peer, "too many handshakes at once");
            continue;
        };
        let (me, auth, rafts, health, refusals, routing) =
            (me.clone(), auth.clone(), rafts.clone(), health.clone(), refusals.clone(), routing.clone());
        tokio::spawn(async move {
            let accepted = link::accept(stream, &me, &auth).await;
            drop((permit, place));
            match accepted {
                Ok((stream, name)) => serve(stream, name, peer, id, rafts, health, routing).await,
                Err(e) => refusals.note(peer, &e.to_string()),
            }
        });
    }
}

/// A change's result as the member that forwarded it is told.
fn answer(
    r: Result<LogId<u64>, RaftError<u64, ClientWriteError<u64, PeerNode>>>,
) -> Result<LogId<u64>, ForwardedWriteError> {
    match r {
        Ok(log_id) => Ok(log_id),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(ForwardedWriteError::NotLeader(f.leader_node))
        }
        Err(e) => Err(ForwardedWriteError::Failed(e.to_string())),
    }
}

/// A joining member's peer address as others reach it: one on every interface
/// (`0.0.0.0:25672`) takes the address its connection came from.
fn reachable(addr: &str, from: SocketAddr) -> String {
    match addr.parse::<SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => SocketAddr::new(from.ip(), a.port()).to_string(),
        _ => addr.to_owned(),
    }
}

/// Answers the requests of member `name` (connected from `peer`), in order, until the link
/// closes.
async fn serve(
    mut stream: link::PeerStream,
    name: String,
    peer: SocketAddr,
    id: u64,
    rafts: Rafts,
    health: Arc<PeerHealth>,
    routing: Arc<Routing>,
) {
    let Rafts { meta: raft, data: data_rx } = rafts;
    loop {
        let (request, blob): (PeerRequest, bytes::Bytes) = match link::read_message(&mut stream).await {
            Ok(r) => r,
            Err(e) => {
                debug!(peer = %name, error = %e, "peer link closed");
                return;
            }
        };
        health.answered(&name);
        let response = match request {
            PeerRequest::AppendEntries(rpc) => PeerResponse::AppendEntries(raft.append_entries(rpc).await),
            PeerRequest::Vote(rpc) => PeerResponse::Vote(raft.vote(rpc).await),
            PeerRequest::InstallSnapshot(rpc) => PeerResponse::InstallSnapshot(raft.install_snapshot(rpc).await),
            PeerRequest::ClientWrite(entry) => {
                PeerResponse::ClientWrite(answer(Change::Write(entry).make(&raft).await))
            }
            PeerRequest::ChangeMembers(change) => {
                let change = match change {
                    MembershipChange::Join { name, addr, id } => {
                        MembershipChange::Join { addr: reachable(&addr, peer), name, id }
                    }
                    forget => forget,
                };
                PeerResponse::ClientWrite(answer(Change::Members(change).make(&raft).await))
            }
            PeerRequest::Data(_) | PeerRequest::DataWrite(_) if data_rx.borrow().is_none() => {
                PeerResponse::Refused("the data group is starting".into())
            }
            PeerRequest::Data(rpc) => {
                let data = data_rx.borrow().clone().expect("checked above");
                match rpc {
                    DataRpc::AppendEntries(rpc) => PeerResponse::AppendEntries(data.append_entries(rpc).await),
                    DataRpc::Vote(rpc) => PeerResponse::Vote(data.vote(rpc).await),
                    DataRpc::InstallSnapshot(rpc) => PeerResponse::InstallSnapshot(data.install_snapshot(rpc).await),
                }
            }
            PeerRequest::DataWrite(entry) => {
                let data = data_rx.borrow().clone().expect("checked above");
                PeerResponse::ClientWrite(answer(entry.make(&data).await))
            }
            PeerRequest::Hello => PeerResponse::Hello { initialized: raft.is_initialized().await.unwrap_or(false), id },
            PeerRequest::Interest(update) => {
                if update.resync_start {
                    routing.forwarder.member_back(&name);
                }
                let (routing, from) = (routing.clone(), name.clone());
                match crate::core::blocking::spawn(move || routing.remote.apply(&from, update)).await {
                    Ok(Ok(())) => PeerResponse::Done,
                    Ok(Err(why)) => PeerResponse::Refused(why),
                    Err(e) => PeerResponse::Refused(format!("interest not applied: {e}")),
                }
            }
            PeerRequest::TakeOver(client_id) => {
                routing.node.client_taken_over(&client_id).await;
                PeerResponse::Done
            }
            PeerRequest::Forward(batch) => {
                match forward::receive(&routing.broker, &*routing.node, &name, batch, blob).await {
                    Ok(()) => PeerResponse::Done,
                    Err(e) => {
                        debug!(peer = %name, error = %e, "a forwarded batch refused");
                        PeerResponse::Refused(e)
                    }
                }
            }
        };
        if let Err(e) = link::write_message(&mut stream, &response, &[]).await {
            debug!(peer = %name, error = %e, "peer link closed");
            return;
        }
    }
}

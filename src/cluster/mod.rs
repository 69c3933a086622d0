//! The cluster (issue 26, first slice): FerryMQ members that agree on their metadata
//! through one Raft group run by openraft, over authenticated peer links.
//!
//! Owns:
//! - [`link`] — the peer link: a challenge-response on `cluster.secret`, then frames.
//! - [`rpc`] — what members say over it (openraft's RPCs, forwarded writes).
//! - [`serve`] — the peer listener (`cluster.listen`).
//! - [`network`] — openraft's network over peer links.
//! - [`log_store`] — the Raft log and vote, fsynced before openraft is answered.
//! - [`state_machine`] — committed entries applied to the journal and to memory; snapshots.
//! - [`snapshot_store`] — a group's latest snapshot as a member keeps it.
//! - [`metadata`] — the replicated form of the core's metadata commands.
//! - [`catalogue`] — everything committed, by key: what entries are judged by, and what a
//!   snapshot holds.
//! - [`data_group`] — the data group: its state machine (streams' messages appended on
//!   every member in its order) and its membership (following the metadata group's).
//! - [`data_append`] — publishes to streams made into the data group's entries.
//! - [`replicated`] — the core's [`StateMachine`] seam, replicated: metadata commands are
//!   committed by a majority before they are acknowledged; the rest stays local.
//! - [`interest`] — where each member's own subscribers and transient queues are, told to
//!   the others.
//! - [`forward`] — publishes forwarded to the members whose subscribers they match.
//! - [`membership`] — forming the group, joining it, forgetting a member.
//! - [`health`] — when each member was last heard from.
//! - [`node`] — what the cluster needs of the member it runs on.
//! - [`types`] — the groups' openraft types.
//!
//! Without `[cluster]` none of this runs. What is replicated so far, and what is not yet
//! (messages, sessions), is in `docs/cluster.md`.

mod catalogue;
mod data_append;
mod data_group;
mod forward;
mod health;
mod interest;
mod link;
mod log_store;
mod membership;
mod metadata;
mod network;
mod node;
mod replicated;
mod rpc;
mod serve;
mod snapshot_store;
mod state_machine;
mod types;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

pub use metadata::{MetaCommand, QueueNames};
pub use node::NodeState;
pub use rpc::MembershipChange;
pub use types::PeerNode;

use self::catalogue::Refusals;
use self::health::{PeerHealth, SILENT_AFTER};
use self::link::{PeerAuth, PeerTls, Secret};
use self::log_store::LogStore;
use self::membership::{Change, Proposal};
use self::network::Network;
use self::rpc::{ForwardedWriteError, PeerClient, PeerResponse};
use self::state_machine::MetaStateMachine;
use self::types::{DataRaft, DataRaftHandle, Group, MetaEntry, MetaRaftHandle};
use crate::composition::config::{ClusterSection, TlsSection};
use crate::core::broker::Broker;
use crate::core::store::{QueueCatalog, StateMachine, StoreError};

/// Why the cluster cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The Raft log store cannot be opened or read.
    #[error("cannot open the cluster's Raft log in {path}: {error}")]
    Open {
        /// Its directory.
        path: String,
        /// Why.
        error: String,
    },
    /// openraft refused to start.
    #[error("the metadata group cannot start: {0}")]
    Raft(String),
    /// `cluster.tls` is on and its certificates cannot be used.
    #[error("cluster.tls: {0}")]
    Tls(String),
}

/// Idle links kept per leader for forwarded writes.
const FORWARD_LINKS: usize = 8;

/// This member of the cluster.
pub struct Cluster {
    name: String,
    /// This data directory's Raft node id (random, kept in `cluster/raft`).
    id: u64,
    cfg: ClusterSection,
    auth: Arc<PeerAuth>,
    log: LogStore,
    /// The data group's log store.
    data_log: LogStore<DataRaft>,
    health: Arc<PeerHealth>,
    raft: watch::Sender<Option<MetaRaftHandle>>,
    /// The data group's Raft node, once started.
    data: watch::Sender<Option<DataRaftHandle>>,
    node: OnceLock<Arc<dyn NodeState>>,
    /// Idle links to the leader for forwarded writes, by leader name.
    forward: parking_lot::Mutex<HashMap<String, Vec<PeerClient>>>,
    /// Entries the state machine refused, by index.
    refusals: Arc<Refusals>,
    /// The metadata entry being applied here, or the last applied (set before its
    /// application, so that what the application made is never newer than it).
    meta_applying: Arc<std::sync::atomic::AtomicU64>,
    /// Forwarding to the other members (once started).
    routing: OnceLock<Arc<Routing>>,
}

/// Forwarding between members: this member's interest, the others', and the publishes
/// forwarded to them.
pub(super) struct Routing {
    own: Arc<interest::OwnInterest>,
    remote: interest::RemoteInterest,
    forwarder: Arc<forward::Forwarder>,
    broker: Arc<Broker>,
    node: Arc<dyn NodeState>,
    /// The members forwarded to, by name.
    members: parking_lot::Mutex<std::collections::HashSet<String>>,
}

impl Routing {
    /// Starts announcing this member's interest to member `name` at `addr`, and a queue
    /// of publishes for it (nothing when started before).
    fn add_member(&self, me: &str, name: &str, addr: &str, auth: &Arc<PeerAuth>) {
        if !self.members.lock().insert(name.to_owned()) {
            return;
        }
        self.remote.remember(name);
        self.forwarder.add_member(name, addr);
        let (told, rx) = watch::channel(interest::Announced::default());
        self.own.told(name, rx);
        tokio::spawn(interest::announce(
            self.own.clone(),
            me.to_owned(),
            name.to_owned(),
            addr.to_owned(),
            auth.clone(),
            told,
        ));
    }
}

impl Routing {
    /// Stops announcing to and forwarding to member `name`, and removes its bindings here
    /// (it was forgotten, or left). Blocking (router changes).
    fn remove_member(&self, name: &str) {
        if !self.members.lock().remove(name) {
            return;
        }
        info!(member = %name, "cluster: no longer forwarding to a member that was forgotten");
        self.own.untold(name);
        self.forwarder.remove_member(name);
        self.remote.forget(name);
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("name", &self.name).finish_non_exhaustive()
    }
}

/// One member as `ctl cluster status` and `/api/nodes` show it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    /// Its node name.
    pub name: String,
    /// This member.
    pub this: bool,
    /// Heard from within the last 5 s (this member: always).
    pub running: bool,
    /// Its role in the metadata group: `leader`, `follower`, `learner` (joining: being
    /// sent the log), or `unknown` (no leader known).
    pub role: &'static str,
    /// Milliseconds since it was last heard from (`None`: never, or this member).
    pub last_contact_ms: Option<u64>,
    /// The last metadata entry the leader knows it holds (on the leader only).
    pub matched_index: Option<u64>,
    /// How many entries of the leader's log it does not hold yet (on the leader only).
    pub lag: Option<u64>,
    /// In the in-sync set (on the leader only): a voter heard from within the last 5 s
    /// that holds the leader's log but for at most [`IN_SYNC_LAG`] entries (the leader
    /// itself always). A change is acknowledged once a majority of the voters holds it, so
    /// changes go on while a majority is in sync.
    pub in_sync: Option<bool>,
}

/// Entries a voter may lack and still count as in sync.
pub const IN_SYNC_LAG: u64 = 100;

/// The cluster as this member sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// This member's name.
    pub node: String,
    /// The metadata group's leader, if one is known.
    pub leader: Option<String>,
    /// The current Raft term.
    pub term: u64,
    /// The last metadata entry applied here.
    pub applied_index: Option<u64>,
    /// Every member.
    pub members: Vec<MemberStatus>,
    /// The in-sync set, by name (on the leader only; see [`MemberStatus::in_sync`]).
    pub in_sync: Option<Vec<String>>,
    /// Publishes for other members' subscribers dropped since start (a member that could
    /// not be reached, or whose queue was full).
    pub forward_dropped: u64,
    /// The data groups (one today).
    pub data_groups: Vec<GroupStatus>,
}

/// Where the messages a data group holds are, as RabbitMQ's `/api/queues` shows a quorum
/// queue's or a stream's: `leader`, `members`, `online`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Placement {
    /// The group's leader, if one is known.
    pub leader: Option<String>,
    /// Its voters, by name.
    pub members: Vec<String>,
    /// The voters heard from within the last 5 s (this member always).
    pub online: Vec<String>,
}

/// A data group as this member sees it.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStatus {
    /// Its name (`data-0`).
    pub name: &'static str,
    /// Its leader, if one is known.
    pub leader: Option<String>,
    /// Its current Raft term.
    pub term: u64,
    /// The last entry applied here.
    pub applied_index: Option<u64>,
    /// Its voters, by name.
    pub voters: Vec<String>,
    /// Members being sent its log before they vote, by name.
    pub learners: Vec<String>,
    /// How many entries of the leader's log each member does not hold yet (on the leader
    /// only), by name.
    pub lag: Option<std::collections::BTreeMap<String, u64>>,
}

impl GroupStatus {
    /// The group `name` as its Raft node's metrics show it.
    fn of(name: &'static str, m: &openraft::RaftMetrics<u64, types::PeerNode>) -> GroupStatus {
        let membership = m.membership_config.membership();
        let name_of = |id: &u64| membership.get_node(id).map(|n| n.name.clone());
        let voters: Vec<u64> = membership.voter_ids().collect();
        let mut voter_names: Vec<String> = voters.iter().filter_map(name_of).collect();
        voter_names.sort();
        let mut learners: Vec<String> = membership.learner_ids().filter_map(|id| name_of(&id)).collect();
        learners.sort();
        let last = m.last_log_index.unwrap_or(0);
        let lag = m.replication.as_ref().map(|r| {
            r.iter()
                .filter_map(|(id, matched)| Some((name_of(id)?, last.saturating_sub(matched.map_or(0, |l| l.index)))))
                .collect()
        });
        GroupStatus {
            name,
            leader: m.current_leader.as_ref().and_then(name_of),
            term: m.current_term,
            applied_index: m.last_applied.map(|l| l.index),
            voters: voter_names,
            learners,
            lag,
        }
    }
}

impl Cluster {
    /// Opens this member's Raft log store in `{data_dir}/cluster/raft`. Blocking: at
    /// start-up, before clients are served. A store that cannot be read stops the start.
    /// With `cluster.tls`, the peer link's TLS is made from `tls` (files that cannot be read
    /// stop the start).
    pub fn open(cfg: &ClusterSection, tls: &TlsSection, data_dir: &Path) -> Result<Arc<Cluster>, ClusterError> {
        let path = data_dir.join("cluster").join("raft");
        let open_error = |error: String| ClusterError::Open { path: path.display().to_string(), error };
        let log = LogStore::open(&path).map_err(|e| open_error(e.to_string()))?;
        let id = log.node_id().map_err(open_error)?;
        let data_log = log.of_group(data_group::DATA_GROUP).map_err(|e| open_error(e.to_string()))?;
        let tls = match cfg.tls {
            true => Some(PeerTls::new(tls).map_err(ClusterError::Tls)?),
            false => None,
        };
        Ok(Arc::new(Cluster {
            name: cfg.node_name.clone(),
            id,
            cfg: cfg.clone(),
            auth: Arc::new(PeerAuth { secret: Secret::new(&cfg.secret), tls }),
            log,
            data_log,
            health: Arc::new(PeerHealth::default()),
            raft: watch::channel(None).0,
            data: watch::channel(None).0,
            node: OnceLock::new(),
            forward: Default::default(),
            refusals: Default::default(),
            meta_applying: Default::default(),
            routing: OnceLock::new(),
        }))
    }

    /// The core's state machine for this member: metadata commands are committed by the
    /// cluster, everything else is applied by `local` (the journal's) as on one node.
    pub fn state_machine(self: &Arc<Self>, local: Arc<dyn StateMachine>) -> Arc<dyn StateMachine> {
        Arc::new(replicated::Replicated { cluster: self.clone(), local })
    }

    /// This member's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Starts the metadata group on `listener` (`cluster.listen`, bound at preflight): the
    /// Raft node, the peer listener, and (in the background) the group's formation or this
    /// member's joining it ([`Cluster::form`]).
    pub async fn start(
        self: &Arc<Self>,
        listener: TcpListener,
        catalog: Arc<dyn QueueCatalog>,
        local: Arc<dyn StateMachine>,
        node: Arc<dyn NodeState>,
    ) -> Result<(), ClusterError> {
        let _ = self.node.set(node.clone());
        let config = openraft::Config {
            cluster_name: "ferrymq".into(),
            heartbeat_interval: 200,
            election_timeout_min: 1000,
            election_timeout_max: 2000,
            // A snapshot (the committed catalogue) every `snapshot_interval_entries`; the log
            // below it is dropped but for as many entries (at most 1,000), and a member
            // further behind than that is sent the snapshot.
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.cfg.snapshot_interval_entries),
            max_in_snapshot_log_to_keep: self.cfg.snapshot_interval_entries.min(1000),
            replication_lag_threshold: self.cfg.snapshot_interval_entries.saturating_mul(2).max(5000),
            install_snapshot_timeout: 5000,
            snapshot_max_chunk_size: 1 << 20,
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(|e| ClusterError::Raft(e.to_string()))?);
        let db = self.log.db().clone();
        let refusals = self.refusals.clone();
        let routing = self.start_routing(&node);
        let meta_rx = self.raft.subscribe();
        let data_node = node.clone();
        let applying = self.meta_applying.clone();
        let (sm, data_sm) = crate::core::blocking::spawn(move || {
            Ok::<_, String>((
                MetaStateMachine::open(&db, catalog, local, node.clone(), refusals, applying)?,
                data_group::DataStateMachine::open(&db, data_node, meta_rx)?,
            ))
        })
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?
        .map_err(|error| ClusterError::Open { path: "cluster/raft".into(), error })?;
        let network = Network {
            me: self.name.clone(),
            addrs: Arc::new(self.cfg.peers.iter().map(|p| (p.name.clone(), p.addr.clone())).collect()),
            auth: self.auth.clone(),
            health: self.health.clone(),
        };
        // The data group's log is not compacted yet: no snapshot would hold its messages.
        // Its entries hold up to 4 MiB of bodies (base64 in JSON): at most 32 of them per
        // AppendEntries keeps a frame under the peer link's 320 MiB.
        let data_config = openraft::Config {
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_payload_entries: 32,
            ..(*config).clone()
        };
        let data_config = Arc::new(data_config.validate().map_err(|e| ClusterError::Raft(e.to_string()))?);
        let raft = openraft::Raft::new(self.id, config, network.clone(), self.log.clone(), sm)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        self.raft.send_replace(Some(raft.clone()));
        let rafts = serve::Rafts { meta: raft.clone(), data: self.data.subscribe() };
        tokio::spawn(serve::run(
            listener,
            self.name.clone(),
            self.id,
            self.auth.clone(),
            rafts,
            self.health.clone(),
            routing.clone(),
        ));
        routing.broker.join_data_group(data_append::Appender::start(self.clone(), routing.node.clone()));
        tokio::spawn(self.clone().follow_members(raft.clone(), routing));
        // The data group starts in the background: openraft applies again at start what the
        // journal lost, and an append waits for this member's metadata, which may have to
        // be sent by the others first (the peer listener runs already). Until it runs, its
        // publishes wait (within `cluster.command_timeout_ms`) and its RPCs are refused.
        let this = self.clone();
        tokio::spawn(async move {
            let started = openraft::Raft::new(this.id, data_config, network, this.data_log.clone(), data_sm).await;
            let data = match started {
                Ok(data) => data,
                Err(e) => {
                    tracing::error!(error = %e, "cluster: the data group cannot start; streams are not served");
                    return;
                }
            };
            this.data.send_replace(Some(data.clone()));
            tokio::spawn(data_group::follow_membership(this.id, raft.clone(), data.clone()));
            // Formed (or joined) in the background: a member never waits for the others.
            this.form(raft, data).await;
        });
        info!(node = %self.name, listen = %self.cfg.listen, peers = self.cfg.peers.len(), "cluster: member started");
        Ok(())
    }

    /// Forwarding between this member and the others (`cluster.peers` first; members that
    /// join later as they do): the core's bindings are followed and its publishes to other
    /// members' bindings forwarded from now on.
    fn start_routing(&self, node: &Arc<dyn NodeState>) -> Arc<Routing> {
        let broker = node.broker();
        let lost = Arc::new(interest::Lost::default());
        let own = interest::OwnInterest::new(node.clone(), lost.clone());
        let forwarder =
            Arc::new(forward::Forwarder::new(&self.name, self.auth.clone(), own.clone(), self.health.clone()));
        let routing = Arc::new(Routing {
            own: own.clone(),
            remote: interest::RemoteInterest::new(broker.clone(), lost),
            forwarder: forwarder.clone(),
            broker: broker.clone(),
            node: node.clone(),
            members: Default::default(),
        });
        for p in &self.cfg.peers {
            routing.add_member(&self.name, &p.name, &p.addr, &self.auth);
        }
        let _ = self.routing.set(routing.clone());
        broker.join_cluster(own, forwarder);
        routing
    }

    /// Adds forwarding to each member that joins (its address as `cluster.peers` or the
    /// membership gives it), for as long as the Raft node runs.
    async fn follow_members(self: Arc<Self>, raft: MetaRaftHandle, routing: Arc<Routing>) {
        let mut metrics = raft.metrics();
        let mut seen = None;
        loop {
            // Metrics change with every entry: the members are looked at when the
            // membership did.
            let (at, nodes): (_, Vec<PeerNode>) = {
                let m = metrics.borrow_and_update();
                let config = &m.membership_config;
                (*config.log_id(), config.membership().nodes().map(|(_, n)| n.clone()).collect())
            };
            if seen.replace(at) != Some(at) {
                for node in nodes.iter().filter(|n| n.name != self.name) {
                    let addr = self.addr_of(node);
                    if !addr.is_empty() {
                        routing.add_member(&self.name, &node.name, &addr, &self.auth);
                    }
                }
                // Members no longer in the membership (once there is one): forgotten.
                if !nodes.is_empty() {
                    let gone: Vec<String> = routing
                        .members
                        .lock()
                        .iter()
                        .filter(|m| !nodes.iter().any(|n| &n.name == *m))
                        .cloned()
                        .collect();
                    for name in gone {
                        let routing = routing.clone();
                        let _ = crate::core::blocking::spawn(move || routing.remove_member(&name)).await;
                    }
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Publishes for other members' subscribers dropped since start (a member that could
    /// not be reached, a full queue).
    pub fn forward_dropped(&self) -> u64 {
        self.routing.get().map_or(0, |r| r.forwarder.dropped())
    }

    /// Stops the Raft nodes (at shutdown, after the clients).
    pub async fn shutdown(&self) {
        let data = self.data.borrow().clone();
        if let Some(data) = data {
            if let Err(e) = data.shutdown().await {
                warn!(error = %e, "cluster: the data group's Raft node did not stop cleanly");
            }
        }
        let raft = self.raft.borrow().clone();
        if let Some(raft) = raft {
            if let Err(e) = raft.shutdown().await {
                warn!(error = %e, "cluster: the Raft node did not stop cleanly");
            }
        }
    }

    /// Where the data group's messages (streams') are: its leader, voters and the voters
    /// that are running.
    pub fn data_placement(&self) -> Placement {
        let status = self.status();
        let Some(group) = status.data_groups.first() else { return Placement::default() };
        let running = |name: &String| status.members.iter().any(|m| &m.name == name && m.running);
        Placement {
            leader: group.leader.clone(),
            online: group.voters.iter().filter(|v| running(v)).cloned().collect(),
            members: group.voters.clone(),
        }
    }

    /// Commits a probe through the data group (directly when this member leads it, else
    /// through its leader) within `cluster.command_timeout_ms`: the entry's index.
    pub async fn probe_data_group(&self) -> Result<u64, String> {
        self.propose_data(data_group::probe()).await
    }

    /// Commits `entry` through the data group within `cluster.command_timeout_ms`: the
    /// entry's index (committed: a majority holds it; not yet applied here, maybe — a
    /// publisher is answered once its publish is safe, not once this member shows it).
    async fn propose_data(&self, entry: types::DataEntry) -> Result<u64, String> {
        self.through_leader_then(&self.data, entry, self.cfg.command_timeout, false).await
    }

    /// The metadata group's entry being applied on this member, or the last applied (0
    /// before any): every stream this member can route was declared at or before it (the
    /// metrics' applied index is updated only after a whole batch was applied).
    fn meta_applied_index(&self) -> u64 {
        let applied =
            self.raft.borrow().as_ref().and_then(|r| r.metrics().borrow().last_applied).map_or(0, |l| l.index);
        applied.max(self.meta_applying.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Commits `entry` through the metadata group and waits until this member applied it:
    /// on the leader directly, else forwarded to the leader this member knows, again as the
    /// leader changes, until `cluster.command_timeout_ms` passes (then not committed: a
    /// change is never acknowledged without a majority). A change not committed in time may
    /// still be committed later, as with any consensus system whose answer is lost. A
    /// committed entry the state machine refused (see [`catalogue`]) is
    /// [`StoreError::Refused`].
    async fn propose(&self, entry: MetaEntry) -> Result<(), StoreError> {
        let index = self
            .through_leader(&self.raft, Change::Write(entry), self.cfg.command_timeout)
            .await
            .map_err(StoreError::NotCommitted)?;
        match self.refusals.take(index) {
            Some(refusal) => Err(StoreError::Refused(Box::new(refusal))),
            None => Ok(()),
        }
    }

    /// Has the leader make `change` (directly when this member leads, else over the peer
    /// link to the leader it knows, again as the leader changes) and waits until this
    /// member applied it: the index of its (last) entry; why not, once `limit` passed or
    /// the group refused it.
    async fn through_leader<C: Group, P: Proposal<C>>(
        &self,
        group: &watch::Sender<Option<openraft::Raft<C>>>,
        change: P,
        limit: Duration,
    ) -> Result<u64, String> {
        self.through_leader_then(group, change, limit, true).await
    }

    /// [`Cluster::through_leader`]; when not `wait_applied`, a change the leader made for
    /// this member is answered once committed, without waiting until this member applied it.
    async fn through_leader_then<C: Group, P: Proposal<C>>(
        &self,
        group: &watch::Sender<Option<openraft::Raft<C>>>,
        change: P,
        limit: Duration,
        wait_applied: bool,
    ) -> Result<u64, String> {
        let deadline = Instant::now() + limit;
        let raft = {
            let mut rx = group.subscribe();
            let started = tokio::time::timeout_at(deadline.into(), rx.wait_for(|r| r.is_some())).await;
            match started {
                Ok(Ok(r)) => r.clone().expect("waited for it"),
                _ => return Err("the cluster has not started".into()),
            }
        };
        let mut why = String::from("no leader elected");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("no majority of the cluster committed it within {} ms ({why})", limit.as_millis()));
            }
            let leader = match tokio::time::timeout(left, change.make(&raft)).await {
                Ok(Ok(log_id)) => return Ok(log_id.index),
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => f.leader_node,
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => continue,
            };
            if let Some(leader) = leader {
                match self.forward(&leader, &change, left).await {
                    Ok(index) if !wait_applied => return Ok(index),
                    Ok(index) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        return match raft.wait(Some(left)).applied_index_at_least(Some(index), "forwarded").await {
                            Ok(_) => Ok(index),
                            Err(e) => Err(format!("committed by the leader, not applied here yet: {e}")),
                        };
                    }
                    Err(e) => why = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(50).min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// Sends `change` to `leader` to make; the index it was committed at.
    async fn forward<C: Group>(
        &self,
        leader: &PeerNode,
        change: &impl Proposal<C>,
        ttl: Duration,
    ) -> Result<u64, String> {
        let addr = self.addr_of(leader);
        // A link is taken out of the pool for the call (no lock is held while it waits): calls
        // at once each have a link of their own, and come back to the pool after.
        let pooled = self.forward.lock().get_mut(&leader.name).and_then(|links| links.pop());
        let mut client = pooled.unwrap_or_else(|| PeerClient::new(&self.name, &leader.name, &addr, self.auth.clone()));
        let answer = client.call(&change.request(), ttl).await;
        if answer.is_ok() {
            let mut pool = self.forward.lock();
            let links = pool.entry(leader.name.clone()).or_default();
            if links.len() < FORWARD_LINKS {
                links.push(client);
            }
        }
        match answer {
            Ok(PeerResponse::ClientWrite(Ok(log_id))) => Ok(log_id.index),
            Ok(PeerResponse::ClientWrite(Err(ForwardedWriteError::NotLeader(_)))) => {
                Err(format!("'{}' is no longer the leader", leader.name))
            }
            Ok(PeerResponse::ClientWrite(Err(e))) => Err(format!("the leader '{}' refused it: {e}", leader.name)),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(format!("leader '{}' unreachable: {e}", leader.name)),
        }
    }

    /// Where member `node` is reached: the address `cluster.peers` gives for its name, else
    /// the one its membership entry records (a member that joined later).
    fn addr_of(&self, node: &PeerNode) -> String {
        self.cfg.peers.iter().find(|p| p.name == node.name).map_or_else(|| node.addr.clone(), |p| p.addr.clone())
    }

    /// The names of queues by local id (for the commands this member makes).
    fn names(&self) -> Option<&Arc<dyn NodeState>> {
        self.node.get()
    }

    /// The cluster as this member sees it.
    pub fn status(&self) -> ClusterStatus {
        let raft = self.raft.borrow().clone();
        let metrics = raft.as_ref().map(|r| r.metrics().borrow().clone());
        let membership = metrics.as_ref().map(|m| m.membership_config.membership().clone());
        // Members by name, with their Raft ids (none before the group formed).
        let mut members: Vec<(String, Option<u64>)> = match &membership {
            Some(m) if m.nodes().next().is_some() => m.nodes().map(|(id, n)| (n.name.clone(), Some(*id))).collect(),
            _ => std::iter::once(&self.name)
                .chain(self.cfg.peers.iter().map(|p| &p.name))
                .map(|n| (n.clone(), None))
                .collect(),
        };
        members.sort();
        let leader_id = metrics.as_ref().and_then(|m| m.current_leader);
        let leader = members.iter().find(|(_, id)| id.is_some() && *id == leader_id).map(|(n, _)| n.clone());
        let members: Vec<MemberStatus> = members
            .into_iter()
            .map(|(name, id)| {
                let this = name == self.name;
                let since = (!this).then(|| self.health.since(&name)).flatten();
                let matched_index = id
                    .and_then(|id| metrics.as_ref()?.replication.as_ref()?.get(&id).cloned().flatten())
                    .map(|l| l.index);
                let last_index = metrics.as_ref().and_then(|m| m.replication.as_ref().and(m.last_log_index));
                let lag = id
                    .filter(|_| last_index.is_some())
                    .and_then(|id| metrics.as_ref()?.replication.as_ref()?.get(&id).cloned())
                    .map(|matched| last_index.unwrap_or(0).saturating_sub(matched.map_or(0, |l| l.index)));
                let voter = match (&membership, id) {
                    (Some(m), Some(id)) => m.voter_ids().any(|v| v == id),
                    _ => true,
                };
                let role = match (leader.as_deref() == Some(name.as_str()), voter) {
                    (true, _) => "leader",
                    (false, false) => "learner",
                    (false, true) if this || leader.is_some() => "follower",
                    _ => "unknown",
                };
                let running = this || since.is_some_and(|s| s < SILENT_AFTER);
                let in_sync = last_index.map(|_| match role {
                    "leader" => true,
                    "follower" => running && lag.is_some_and(|l| l <= IN_SYNC_LAG),
                    _ => false,
                });
                MemberStatus {
                    running,
                    last_contact_ms: since.map(|s| s.as_millis() as u64),
                    role,
                    matched_index,
                    lag,
                    in_sync,
                    this,
                    name,
                }
            })
            .collect();
        let in_sync = members
            .iter()
            .any(|m| m.in_sync.is_some())
            .then(|| members.iter().filter(|m| m.in_sync == Some(true)).map(|m| m.name.clone()).collect());
        ClusterStatus {
            in_sync,
            node: self.name.clone(),
            leader,
            term: metrics.as_ref().map_or(0, |m| m.current_term),
            applied_index: metrics.as_ref().and_then(|m| m.last_applied).map(|l| l.index),
            members,
            forward_dropped: self.forward_dropped(),
            data_groups: self
                .data
                .borrow()
                .as_ref()
                .map(|d| GroupStatus::of(data_group::DATA_GROUP, &d.metrics().borrow()))
                .into_iter()
                .collect(),
        }
    }
}

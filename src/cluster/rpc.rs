//! What members say to each other over the peer link: openraft's RPCs, the metadata writes
//! a follower forwards to the leader, where each member's subscribers are, and the
//! publishes forwarded to them; one request and one response per frame, in
//! order on each link. [`PeerClient`] is the calling side: one link, opened on first use
//! and again after a failure.

use std::time::Duration;

use openraft::error::InstallSnapshotError;
use openraft::error::RaftError;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::LogId;
use serde::{Deserialize, Serialize};

use super::link::{self, LinkError, PeerAuth};
use super::types::{DataEntry, DataRaft, MetaEntry, MetaRaft, PeerNode};

/// A request on the peer link.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum PeerRequest {
    /// openraft's log replication and heartbeat.
    AppendEntries(AppendEntriesRequest<MetaRaft>),
    /// openraft's election.
    Vote(VoteRequest<u64>),
    /// openraft's snapshot, sent in chunks to a member too far behind for the log.
    InstallSnapshot(InstallSnapshotRequest<MetaRaft>),
    /// A metadata write a member forwards to the leader it knows.
    ClientWrite(MetaEntry),
    /// A change of membership, for the leader to make.
    ChangeMembers(MembershipChange),
    /// Whether the metadata group exists on the member asked (a starting member asks).
    Hello,
    /// The sender's interest: where its own subscribers and transient queues are.
    Interest(InterestUpdate),
    /// Publishes the sender's routes sent here; their headers and bodies follow the JSON.
    Forward(Vec<Forwarded>),
    /// MQTT client `.0` connected to the sender: a connection of that id here is taken over.
    TakeOver(String),
    /// openraft's RPCs of the data group (answered by the same variants as the metadata
    /// group's).
    Data(DataRpc),
    /// A data entry a member forwards to the data group's leader it knows.
    DataWrite(DataEntry),
}

/// openraft's RPCs of the data group.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum DataRpc {
    /// Log replication and heartbeat.
    AppendEntries(AppendEntriesRequest<DataRaft>),
    /// Election.
    Vote(VoteRequest<u64>),
    /// A snapshot's chunk.
    InstallSnapshot(InstallSnapshotRequest<DataRaft>),
}

/// The answer to a [`PeerRequest`] (the same variant).
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum PeerResponse {
    /// To [`PeerRequest::AppendEntries`].
    AppendEntries(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    /// To [`PeerRequest::Vote`].
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    /// To [`PeerRequest::InstallSnapshot`].
    InstallSnapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    /// To [`PeerRequest::ClientWrite`] and [`PeerRequest::ChangeMembers`]: where the
    /// change was committed, or why not.
    ClientWrite(Result<LogId<u64>, ForwardedWriteError>),
    /// To [`PeerRequest::Hello`].
    Hello {
        /// The member asked has the group in its log.
        initialized: bool,
        /// Its Raft node id.
        id: u64,
    },
    /// The request is not answered now (why).
    Refused(String),
    /// To [`PeerRequest::Interest`] (applied) and [`PeerRequest::Forward`] (routed here,
    /// and stored for this member's queues).
    Done,
}

/// A change of membership, as a member asks the leader for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Member `name`, reached at `addr`, joins (a learner first, then a voter) under Raft
    /// node id `id`; an older id of the same name (a member whose data directory was
    /// replaced) is removed first.
    Join {
        /// Its node name.
        name: String,
        /// Its peer address.
        addr: String,
        /// Its data directory's Raft node id.
        id: u64,
    },
    /// Member `name` is no longer one (dead, leaving, or replaced).
    Forget {
        /// Its node name.
        name: String,
    },
}

/// Why a forwarded write was not committed by the member it was sent to.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub(super) enum ForwardedWriteError {
    /// That member is not the leader (any more); the leader it knows, if any.
    #[error("not the leader")]
    NotLeader(Option<PeerNode>),
    /// The leader could not commit it.
    #[error("{0}")]
    Failed(String),
}

/// One link to one member, for calls in order.
pub(super) struct PeerClient {
    me: String,
    peer: String,
    addr: String,
    auth: std::sync::Arc<PeerAuth>,
    stream: Option<link::PeerStream>,
}

impl std::fmt::Debug for PeerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerClient").field("peer", &self.peer).field("open", &self.stream.is_some()).finish()
    }
}

impl PeerClient {
    /// A client of member `peer` at `addr`, calling as `me` (nothing connects yet; a link
    /// that reaches another member than `peer` is refused).
    pub(super) fn new(me: &str, peer: &str, addr: &str, auth: std::sync::Arc<PeerAuth>) -> PeerClient {
        PeerClient { me: me.to_owned(), peer: peer.to_owned(), addr: addr.to_owned(), auth, stream: None }
    }

    /// Sends `request` and reads its response within `ttl`, connecting first when there is
    /// no link; a failed call drops the link (the next call opens a new one).
    pub(super) async fn call(&mut self, request: &PeerRequest, ttl: Duration) -> Result<PeerResponse, LinkError> {
        self.call_with(request, &[], ttl).await
    }

    /// [`PeerClient::call`] with the bytes of `blob` after the request (message bodies).
    pub(super) async fn call_with(
        &mut self,
        request: &PeerRequest,
        blob: &[bytes::Bytes],
        ttl: Duration,
    ) -> Result<PeerResponse, LinkError> {
        let result = tokio::time::timeout(ttl, async {
            if self.stream.is_none() {
                self.stream = Some(link::connect(&self.addr, &self.me, &self.peer, &self.auth).await?);
            }
            let stream = self.stream.as_mut().expect("connected above");
            link::write_message(stream, request, blob).await?;
            link::read_message(stream).await.map(|(response, _)| response)
        })
        .await
        .unwrap_or(Err(LinkError::Timeout));
        if result.is_err() {
            self.stream = None;
        }
        result
    }
}

/// One entry of a member's interest: bindings with this source, key and arguments lead to
/// its own destinations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(super) struct InterestKey {
    /// The virtual host.
    pub vhost: String,
    /// The source exchange.
    pub exchange: String,
    /// The binding key.
    pub key: String,
    /// The binding arguments, as an AMQP field table.
    pub args: Vec<u8>,
}

impl InterestKey {
    /// About the bytes it takes in a frame.
    pub(super) fn size(&self) -> usize {
        32 + self.vhost.len() + self.exchange.len() + self.key.len() + 4 * self.args.len()
    }
}

/// What a member announces to another: changes of its interest in order (`true`: added),
/// or a part of the whole set (a resync: what the receiver holds of the sender and the
/// resync does not name is removed at its end).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct InterestUpdate {
    /// This update starts a resync.
    pub resync_start: bool,
    /// This update ends a resync.
    pub resync_end: bool,
    /// The sender's resync this update belongs to (it grows with each, across the
    /// sender's restarts too): an update of an older one, late on a link that was
    /// replaced, is ignored.
    pub epoch: u64,
    /// The changes, in order.
    pub changes: Vec<(bool, InterestKey)>,
}

/// One forwarded publish, as the batch's JSON names it; its header and body follow the
/// JSON, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Forwarded {
    /// The virtual host it was routed in.
    pub vhost: String,
    /// The exchanges whose bindings to the receiving member matched.
    pub via: Vec<String>,
    /// The publisher (MQTT client id, for no-local).
    pub publisher: String,
    /// The MQTT shared groups that take it on the receiving member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Bytes of its record header (the message but its body).
    pub header: u32,
    /// Bytes of its body.
    pub body: u32,
}

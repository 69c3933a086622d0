//! Three (or more) real `ferrymq` processes on loopback that form one cluster: each with
//! its own data directory, ephemeral client ports, and a peer port chosen free at the
//! start and kept across restarts (the others' `cluster.peers` name it). Any member can be
//! SIGKILLed, restarted on its data directory, or paused (SIGSTOP) and resumed; a cluster
//! started with [`Cluster::start_partitionable`] can also be cut apart ([`Partitions`]).

use std::time::Duration;

use serde_json::Value;

use super::http::Api;
use super::partition::Partitions;
use super::{eventually, Broker, Opts};

/// The secret every test member holds.
pub const SECRET: &str = "test-cluster-secret-0123456789";

/// A cluster of test members, `n0`, `n1`, ...
pub struct Cluster {
    members: Vec<Option<Broker>>,
    /// Each member's peer address (`cluster.listen`).
    pub peer_addrs: Vec<String>,
    /// The proxies on the peer links, when the members reach each other through them.
    partitions: Option<Partitions>,
}

impl Cluster {
    /// Starts `n` members; `extra` is added to each one's `[cluster]` section.
    pub fn start(n: usize, extra: &str) -> Cluster {
        let peer_addrs: Vec<String> = (0..n).map(|_| format!("127.0.0.1:{}", peer_port())).collect();
        let members = (0..n)
            .map(|i| Some(Broker::start_with(member_opts(i, &peer_addrs, |j| peer_addrs[j].clone(), extra))))
            .collect();
        Cluster { members, peer_addrs, partitions: None }
    }

    /// Starts `n` members that reach each other through [`Partitions`]' proxies, so that
    /// [`Cluster::partitions`] can cut them apart.
    pub fn start_partitionable(n: usize, extra: &str) -> Cluster {
        let peer_addrs: Vec<String> = (0..n).map(|_| format!("127.0.0.1:{}", peer_port())).collect();
        let partitions = Partitions::new(&peer_addrs);
        let members = (0..n)
            .map(|i| {
                let via = |j: usize| partitions.addr(i, j).to_owned();
                Some(Broker::start_with(member_opts(i, &peer_addrs, via, extra)))
            })
            .collect();
        Cluster { members, peer_addrs, partitions: Some(partitions) }
    }

    /// The proxies of a cluster started with [`Cluster::start_partitionable`].
    pub fn partitions(&self) -> &Partitions {
        self.partitions.as_ref().expect("a cluster started with start_partitionable")
    }

    /// Starts one more member, `n{len}`, whose `cluster.peers` name every member so far (it
    /// asks to join by itself); its index.
    pub fn add(&mut self) -> usize {
        let i = self.members.len();
        self.peer_addrs.push(format!("127.0.0.1:{}", peer_port()));
        assert!(self.partitions.is_none(), "members are added to a cluster without proxies");
        let addrs = self.peer_addrs.clone();
        self.members.push(Some(Broker::start_with(member_opts(i, &addrs, |j| addrs[j].clone(), ""))));
        i
    }

    /// The members running now (not killed).
    pub fn members_up(&self) -> Vec<usize> {
        (0..self.members.len()).filter(|&i| self.members[i].as_ref().and_then(|b| b.pid()).is_some()).collect()
    }

    /// Member `i` (panics when it is down).
    pub fn member(&self, i: usize) -> &Broker {
        self.members[i].as_ref().unwrap_or_else(|| panic!("member n{i} is down"))
    }

    /// The management API of member `i`.
    pub fn api(&self, i: usize) -> Api {
        Api::of(self.member(i))
    }

    /// Kills member `i` with SIGKILL (its data directory stays).
    pub fn kill(&mut self, i: usize) {
        if let Some(b) = self.members[i].as_mut() {
            b.kill();
        }
    }

    /// Empties member `i`'s data directory (a replaced disk); the member must be down.
    pub fn wipe(&self, i: usize) {
        let dir = &self.members[i].as_ref().expect("a member").dir;
        std::fs::remove_dir_all(dir).expect("remove the data directory");
    }

    /// Pauses member `i` (SIGSTOP): alive, holding its sockets, answering nothing.
    pub fn pause(&self, i: usize) {
        self.member(i).signal("STOP");
    }

    /// Resumes member `i` after [`Cluster::pause`] (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.member(i).signal("CONT");
    }

    /// Starts member `i` again on its data directory (after [`Cluster::kill`]).
    pub fn restart(&mut self, i: usize) {
        let b = self.members[i].take().expect("a member to restart");
        self.members[i] = Some(b.start_again());
    }

    /// The cluster status member `i` reports (`/api/ferrymq/cluster`).
    pub async fn status(&self, i: usize) -> Value {
        self.api(i).ok("/api/ferrymq/cluster").await
    }

    /// Waits until every member of `among` reports the same leader, itself one of
    /// `among`; its index.
    pub async fn leader(&self, among: &[usize]) -> usize {
        eventually("one leader that every running member agrees on", Duration::from_secs(30), || async {
            let mut seen = None;
            for &i in among {
                let (code, s) = self.api(i).get("/api/ferrymq/cluster").await;
                let leader = s["leader"].as_str().filter(|_| code.is_success())?.to_owned();
                if seen.get_or_insert_with(|| leader.clone()) != &leader {
                    return None;
                }
            }
            let leader: usize = seen?.strip_prefix('n')?.parse().ok()?;
            among.contains(&leader).then_some(leader)
        })
        .await
    }

    /// The logs of every member, for a failure message.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, b)| format!("===== n{i} =====\n{}", b.as_ref().map(|b| b.log()).unwrap_or_default()))
            .collect()
    }
}

/// The options of member `i` of the members at `peer_addrs`, which reaches member `j` at
/// `via(j)`.
fn member_opts(i: usize, peer_addrs: &[String], via: impl Fn(usize) -> String, extra: &str) -> Opts {
    let peers: Vec<String> =
        (0..peer_addrs.len()).filter(|j| *j != i).map(|j| format!("\"n{j}@{}\"", via(j))).collect();
    Opts::default().config(&format!(
        "[cluster]\nnode_name = \"n{i}\"\nlisten = \"{}\"\npeers = [{}]\nsecret = \"{SECRET}\"\n{extra}\n",
        peer_addrs[i],
        peers.join(", ")
    ))
}

/// A free loopback port below the kernel's ephemeral range (32768 and up), so that no
/// socket another test binds on port 0 can take it between this choice and the member's
/// bind (what `free_port` cannot rule out); spread by process id and a counter.
fn peer_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed).wrapping_add(std::process::id().wrapping_mul(7919));
        let port = 20_000 + (n % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

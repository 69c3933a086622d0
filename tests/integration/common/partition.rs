//! Network partitions between test cluster members: a fault-injecting TCP proxy on every
//! peer link. Member `i` reaches member `j` through a proxy of its own (`i → j`), so a test
//! can cut any pair of members, both ways, and heal it. A cut closes the links between the
//! pair at once and holds every new connection between them without passing a byte (as a
//! dropped route does: the dialler's handshake times out) until the cut heals.
//!
//! The proxies run on a runtime of their own, so a test that blocks its own runtime (a
//! member starting) never stalls the members' links.

use std::collections::{HashMap, HashSet};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The pairs of members cut from each other, as `(lower, higher)` index.
type Cuts = HashSet<(usize, usize)>;

/// The proxies on every peer link of a cluster of `n` members.
pub struct Partitions {
    runtime: Option<tokio::runtime::Runtime>,
    cuts: watch::Sender<Cuts>,
    /// The proxy member `i` dials to reach member `j`, by `(i, j)`.
    addrs: HashMap<(usize, usize), String>,
}

impl Partitions {
    /// Proxies for every ordered pair of the members listening at `peer_addrs`.
    pub fn new(peer_addrs: &[String]) -> Partitions {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("partition-proxy")
            .enable_all()
            .build()
            .expect("the proxies' runtime");
        let (cuts, _) = watch::channel(Cuts::new());
        let mut addrs = HashMap::new();
        for (i, _) in peer_addrs.iter().enumerate() {
            for (j, target) in peer_addrs.iter().enumerate() {
                if i == j {
                    continue;
                }
                let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a proxy");
                listener.set_nonblocking(true).expect("a non-blocking proxy listener");
                addrs.insert((i, j), listener.local_addr().expect("the proxy's address").to_string());
                let pair = (i.min(j), i.max(j));
                let cut = cuts.subscribe();
                let target = target.clone();
                runtime.spawn(async move {
                    let listener = TcpListener::from_std(listener).expect("a proxy listener");
                    proxy(listener, target, pair, cut).await;
                });
            }
        }
        Partitions { runtime: Some(runtime), cuts, addrs }
    }

    /// The address member `from` dials to reach member `to`.
    pub fn addr(&self, from: usize, to: usize) -> &str {
        &self.addrs[&(from, to)]
    }

    /// Cuts every member of each group from every member of the other groups (members in
    /// no group keep their links); cuts made before stay.
    pub fn cut(&self, groups: &[&[usize]]) {
        self.cuts.send_modify(|cuts| {
            for (g, group) in groups.iter().enumerate() {
                for other in &groups[g + 1..] {
                    for &a in group.iter() {
                        for &b in other.iter() {
                            cuts.insert((a.min(b), a.max(b)));
                        }
                    }
                }
            }
        });
    }

    /// Cuts the link between members `a` and `b` only.
    pub fn cut_link(&self, a: usize, b: usize) {
        self.cuts.send_modify(|cuts| {
            cuts.insert((a.min(b), a.max(b)));
        });
    }

    /// Heals every cut.
    pub fn heal(&self) {
        self.cuts.send_modify(|cuts| cuts.clear());
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Accepts connections for one directed link and passes them to `target` unless `pair` is cut.
async fn proxy(listener: TcpListener, target: String, pair: (usize, usize), cut: watch::Receiver<Cuts>) {
    while let Ok((inbound, _)) = listener.accept().await {
        tokio::spawn(relay(inbound, target.clone(), pair, cut.clone()));
    }
}

/// One connection: held silent while `pair` is cut, else passed through until it closes or
/// `pair` is cut.
async fn relay(mut inbound: TcpStream, target: String, pair: (usize, usize), mut cut: watch::Receiver<Cuts>) {
    if cut.borrow_and_update().contains(&pair) {
        // A dropped route: nothing passes; the connection ends when the dialler gives up
        // (its handshake times out), or when the cut heals.
        let mut sink = [0u8; 1024];
        loop {
            tokio::select! {
                read = inbound.read(&mut sink) => if matches!(read, Ok(0) | Err(_)) { return },
                changed = cut.changed() => {
                    if changed.is_err() || !cut.borrow_and_update().contains(&pair) {
                        return;
                    }
                }
            }
        }
    }
    let Ok(mut outbound) = TcpStream::connect(&target).await else { return };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = async {
            while cut.changed().await.is_ok() {
                if cut.borrow_and_update().contains(&pair) {
                    return;
                }
            }
        } => {}
    }
}

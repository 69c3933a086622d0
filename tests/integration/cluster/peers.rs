//! The peer port: only members holding `cluster.secret` get past the handshake; anyone
//! else is closed, counted and logged, and the cluster goes on.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::cluster::Cluster;
use crate::common::WAIT;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_on_the_peer_port_is_closed_and_logged() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let mut s = TcpStream::connect(&c.peer_addrs[0]).await.expect("connect");
    let mut greeting = [0u8; 48];
    tokio::time::timeout(WAIT, s.read_exact(&mut greeting)).await.expect("greeting").expect("greeting");
    assert!(greeting.starts_with(b"FERRYMQ-PEER/1"));
    // A proof made without the secret.
    let nonce = vec!["7"; 32].join(",");
    let proof = format!(r#"{{"name":"intruder","nonce":[{nonce}],"mac":[0,0,0,0]}}"#).into_bytes();
    let mut frame = (proof.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&proof);
    s.write_all(&frame).await.expect("write");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await.expect("closed").unwrap_or(0);
    assert_eq!(n, 0, "nothing is sent to a stranger: {rest:?}");
    assert!(c.member(0).wait_log("peer link refused"), "{}", c.logs());
    assert!(c.member(0).log().contains("'intruder' did not prove cluster.secret"));
    // Still one cluster.
    c.leader(&[0, 1, 2]).await;
    // Before the proof is checked, a frame past a kilobyte closes the socket unread.
    let mut s = TcpStream::connect(&c.peer_addrs[1]).await.expect("connect");
    tokio::time::timeout(WAIT, s.read_exact(&mut greeting)).await.expect("greeting").expect("greeting");
    s.write_all(&(64u32 << 20).to_be_bytes()).await.expect("write");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await.expect("closed").unwrap_or(0);
    assert_eq!(n, 0);
    assert!(c.member(1).wait_log("peer link refused"), "{}", c.logs());
}

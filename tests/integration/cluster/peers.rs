//! The peer port: only members holding `cluster.secret` get past the handshake; anyone
//! else is closed, counted and logged, and the cluster goes on; one address that stalls
//! handshakes cannot take the members' places; with `cluster.tls` the links run in TLS.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::common::cluster::Cluster;
use crate::common::{eventually, make_pki, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_on_the_peer_port_is_closed_and_logged() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let mut s = TcpStream::connect(&c.peer_addrs[0]).await.expect("connect");
    let mut greeting = [0u8; 48];
    tokio::time::timeout(WAIT, s.read_exact(&mut greeting)).await.expect("greeting").expect("greeting");
    assert!(greeting.starts_with(b"FERRYMQ-PEER/2"));
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

/// Holds `per_member` silent connections from 127.0.0.2 to every peer port (opened again as
/// the members close them) until `stop` is set.
async fn stall_handshakes(peers: Vec<String>, per_member: usize, stop: Arc<AtomicBool>) {
    let mut held: Vec<Option<TcpStream>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        held.retain(|s| s.as_ref().is_some_and(|s| s.peer_addr().is_ok()));
        for addr in &peers {
            while held.len() < per_member * peers.len() {
                let socket = TcpSocket::new_v4().expect("socket");
                socket.bind("127.0.0.2:0".parse().unwrap()).expect("bind 127.0.0.2");
                match tokio::time::timeout(WAIT, socket.connect(addr.parse().unwrap())).await {
                    Ok(Ok(s)) => held.push(Some(s)),
                    _ => break,
                }
            }
        }
        // A closed socket shows as readable with nothing to read: drop those.
        for s in held.iter_mut() {
            let mut buf = [0u8; 64];
            if let Some(stream) = s.as_mut() {
                if let Ok(0) = stream.try_read(&mut buf) {
                    *s = None;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_stalled_from_one_address_leave_the_members_their_places() {
    let mut c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    // More silent sockets from one address than the members' handshake places altogether.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = tokio::spawn(stall_handshakes(c.peer_addrs.clone(), 80, stop.clone()));
    assert!(c.member(0).wait_log("too many handshakes at once from one address"), "{}", c.logs());
    // A restarted member must open every link again, through the flood.
    c.kill(1);
    c.restart(1);
    let (code, body) = c.api(1).put("/api/queues/%2f/through-the-flood", json!({ "durable": true })).await;
    assert_eq!(code, StatusCode::CREATED, "{body}\n{}", c.logs());
    eventually("the queue on n0 and n2", WAIT, || async {
        for i in [0, 2] {
            let (code, _) = c.api(i).get("/api/queues/%2f/through-the-flood").await;
            if code != StatusCode::OK {
                return None;
            }
        }
        Some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    flood.await.expect("the flood ends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_cluster_tls_the_members_link_in_tls_and_a_plain_socket_is_refused() {
    let dir = tempfile::tempdir().expect("a directory for the certificates");
    let pki = make_pki(dir.path(), &[]);
    let extra = format!(
        "tls = true\n\n[tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n",
        pki.server_cert.display().to_string(),
        pki.server_key.display().to_string(),
        pki.ca_file.display().to_string()
    );
    let c = Cluster::start(3, &extra);
    c.leader(&[0, 1, 2]).await;
    // Metadata travels between the members as before.
    let (code, body) = c.api(1).put("/api/queues/%2f/over-tls", json!({ "durable": true })).await;
    assert_eq!(code, StatusCode::CREATED, "{body}\n{}", c.logs());
    eventually("the queue on n2", WAIT, || async {
        (c.api(2).get("/api/queues/%2f/over-tls").await.0 == StatusCode::OK).then_some(())
    })
    .await;
    // A socket that does not speak TLS gets not even the greeting, and is refused.
    let mut s = TcpStream::connect(&c.peer_addrs[0]).await.expect("connect");
    s.write_all(b"FERRYMQ-PEER/1\r\n plain text, not a TLS ClientHello").await.expect("write");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await.expect("closed");
    assert!(!rest.windows(7).any(|w| w == b"FERRYMQ"), "no greeting in clear: {rest:?}");
    assert!(c.member(0).wait_log("TLS handshake failed"), "{}", c.logs());
}

//! The peer link: one authenticated TCP connection between two members, carrying frames
//! (a 4-byte big-endian length, then a JSON value).
//!
//! **Authentication** by `cluster.secret`, a challenge-response in both directions: the
//! accepting side sends a greeting and a fresh 32-byte nonce; the connecting side answers
//! with its node name, a nonce of its own and HMAC-SHA256(secret, "client", both nonces,
//! its name, the name of the member it means to reach), every field length-prefixed; the
//! accepting side checks it (in constant time, and that it is the member meant) and proves
//! the secret back with HMAC-SHA256(secret, "server", both nonces, both names); the
//! connecting side checks that it reached the member it meant. The secret never crosses
//! the wire, a recorded exchange cannot be replayed (the nonces are fresh), a proof sent to
//! the wrong host cannot be relayed to another member, and a side that does not hold the
//! secret learns nothing it could use. Before the proof is checked at most a kilobyte is
//! read; whoever fails the check is closed without another byte; a handshake takes at most
//! [`HANDSHAKE_TIMEOUT`].

use std::time::Duration;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest frame either side reads once authenticated (a bigger length closes the link).
pub(super) const MAX_FRAME: usize = 64 << 20;

/// The largest frame read before the other side proved the secret.
const MAX_HANDSHAKE_FRAME: usize = 1024;

/// The longest node name the handshake takes.
const MAX_NAME: usize = 255;

/// How long a handshake may take, either side.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the accepting side sends first: the protocol and its version.
const GREETING: &[u8; 16] = b"FERRYMQ-PEER/1\r\n";

/// Why a peer link failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
    /// The socket failed.
    #[error("peer link I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A frame's length is over [`MAX_FRAME`].
    #[error("peer link: a frame of {0} bytes is over the limit")]
    TooLarge(usize),
    /// A frame is not the JSON value expected.
    #[error("peer link: undecodable frame: {0}")]
    Decode(String),
    /// The other side is not a FerryMQ member holding the same secret.
    #[error("peer link refused: {0}")]
    Refused(String),
    /// The handshake took longer than [`HANDSHAKE_TIMEOUT`].
    #[error("peer link: the handshake timed out")]
    Timeout,
}

/// `cluster.secret` as the key of the link's HMACs.
pub(super) struct Secret(hmac::Key);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The key of `secret`.
    pub(super) fn new(secret: &str) -> Secret {
        Secret(hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()))
    }

    /// The MAC of `role` and `fields`, each length-prefixed (no two field lists sign alike).
    fn sign(&self, role: &str, fields: &[&[u8]]) -> hmac::Tag {
        hmac::sign(&self.0, &signed(role, fields))
    }

    /// Checks `tag` in constant time.
    fn verify(&self, role: &str, fields: &[&[u8]], tag: &[u8]) -> bool {
        hmac::verify(&self.0, &signed(role, fields), tag).is_ok()
    }
}

/// What a MAC covers: the role, then each field with its length.
fn signed(role: &str, fields: &[&[u8]]) -> Vec<u8> {
    let mut msg = role.as_bytes().to_vec();
    for f in fields {
        msg.extend_from_slice(&(f.len() as u32).to_be_bytes());
        msg.extend_from_slice(f);
    }
    msg
}

/// The connecting side's answer to the challenge.
#[derive(Serialize, Deserialize)]
struct ClientProof {
    name: String,
    nonce: Vec<u8>,
    mac: Vec<u8>,
}

/// The accepting side's verdict.
#[derive(Serialize, Deserialize)]
enum ServerProof {
    Accepted { name: String, mac: Vec<u8> },
}

fn nonce() -> Result<[u8; 32], LinkError> {
    let mut n = [0u8; 32];
    SystemRandom::new().fill(&mut n).map_err(|_| LinkError::Refused("no randomness for a nonce".into()))?;
    Ok(n)
}

/// Writes `value` as one frame.
pub(super) async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, value: &T) -> Result<(), LinkError> {
    let body = serde_json::to_vec(value).map_err(|e| LinkError::Decode(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(LinkError::TooLarge(body.len()));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame as a `T`.
pub(super) async fn read_frame<R: AsyncRead + Unpin, T: DeserializeOwned>(r: &mut R) -> Result<T, LinkError> {
    read_frame_within(r, MAX_FRAME).await
}

/// Reads one frame of at most `limit` bytes as a `T`.
async fn read_frame_within<R: AsyncRead + Unpin, T: DeserializeOwned>(r: &mut R, limit: usize) -> Result<T, LinkError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > limit {
        return Err(LinkError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(|e| LinkError::Decode(e.to_string()))
}

/// Connects to member `peer` at `addr` as `me`, once both proved the secret: the proof
/// this side sends names `peer`, so that it cannot be relayed to another member, and the
/// other side must answer as `peer`.
pub(super) async fn connect(addr: &str, me: &str, peer: &str, secret: &Secret) -> Result<TcpStream, LinkError> {
    let handshake = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut greeting = [0u8; 16];
        stream.read_exact(&mut greeting).await?;
        if &greeting != GREETING {
            return Err(LinkError::Refused(format!("{addr} is not a FerryMQ peer listener")));
        }
        let mut theirs = [0u8; 32];
        stream.read_exact(&mut theirs).await?;
        let ours = nonce()?;
        let mac = secret.sign("client", &[&theirs, &ours, me.as_bytes(), peer.as_bytes()]).as_ref().to_vec();
        write_frame(&mut stream, &ClientProof { name: me.to_owned(), nonce: ours.to_vec(), mac }).await?;
        let proof: ServerProof = read_frame_within(&mut stream, MAX_HANDSHAKE_FRAME).await.map_err(|e| match e {
            LinkError::Io(_) => LinkError::Refused(format!("{addr} closed the link: not the same cluster.secret?")),
            e => e,
        })?;
        let ServerProof::Accepted { name, mac } = proof;
        if name != peer {
            return Err(LinkError::Refused(format!("{addr} is member '{name}', not '{peer}'")));
        }
        if !secret.verify("server", &[&ours, &theirs, peer.as_bytes(), me.as_bytes()], &mac) {
            return Err(LinkError::Refused(format!("{addr} does not hold this cluster.secret")));
        }
        Ok(stream)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await.map_err(|_| LinkError::Timeout)?
}

/// Authenticates a connection accepted on the peer listener as `me`: the connecting
/// member's node name once it proved the secret for this member (and was sent the proof
/// back). Reads at most [`MAX_HANDSHAKE_FRAME`] bytes before the proof is checked.
pub(super) async fn accept(stream: &mut TcpStream, me: &str, secret: &Secret) -> Result<String, LinkError> {
    let handshake = async {
        stream.set_nodelay(true)?;
        let ours = nonce()?;
        let mut hello = Vec::with_capacity(48);
        hello.extend_from_slice(GREETING);
        hello.extend_from_slice(&ours);
        stream.write_all(&hello).await?;
        let proof: ClientProof = read_frame_within(stream, MAX_HANDSHAKE_FRAME).await?;
        if proof.nonce.len() != 32 || proof.name.is_empty() || proof.name.len() > MAX_NAME || proof.name == me {
            return Err(LinkError::Refused(format!("'{}' sent a malformed proof", proof.name)));
        }
        if !secret.verify("client", &[&ours, &proof.nonce, proof.name.as_bytes(), me.as_bytes()], &proof.mac) {
            return Err(LinkError::Refused(format!("'{}' did not prove cluster.secret", proof.name)));
        }
        let mac = secret.sign("server", &[&proof.nonce, &ours, me.as_bytes(), proof.name.as_bytes()]).as_ref().to_vec();
        write_frame(stream, &ServerProof::Accepted { name: me.to_owned(), mac }).await?;
        Ok(proof.name)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await.map_err(|_| LinkError::Timeout)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn pair(
        server_secret: &str,
        client_secret: &str,
        expect: &str,
    ) -> (Result<String, String>, Result<(), String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server_secret = Secret::new(server_secret);
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            accept(&mut s, "b", &server_secret).await.map_err(|e| e.to_string())
        });
        let client =
            connect(&addr, "a", expect, &Secret::new(client_secret)).await.map(drop).map_err(|e| e.to_string());
        (server.await.unwrap(), client)
    }

    #[tokio::test]
    async fn members_with_one_secret_learn_each_others_names() {
        let (server, client) = pair("s3cret-s3cret-s3cret", "s3cret-s3cret-s3cret", "b").await;
        assert_eq!(server.unwrap(), "a");
        client.unwrap();
    }

    #[tokio::test]
    async fn a_different_secret_is_refused_on_both_sides() {
        let (server, client) = pair("s3cret-s3cret-s3cret", "guess-guess-guess-guess", "b").await;
        assert!(server.unwrap_err().contains("did not prove cluster.secret"));
        assert!(client.is_err());
    }

    #[tokio::test]
    async fn a_proof_made_for_another_member_is_refused() {
        // What a member that dialled the wrong host would send: valid, but for 'c'.
        let (server, client) = pair("s3cret-s3cret-s3cret", "s3cret-s3cret-s3cret", "c").await;
        assert!(server.unwrap_err().contains("did not prove cluster.secret"));
        assert!(client.is_err());
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_before_it_is_read() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&(MAX_FRAME as u32 + 1).to_be_bytes()).await.unwrap();
        let r: Result<String, _> = read_frame(&mut b).await;
        assert!(matches!(r, Err(LinkError::TooLarge(_))));
        a.write_all(&(MAX_HANDSHAKE_FRAME as u32 + 1).to_be_bytes()).await.unwrap();
        let r: Result<String, _> = read_frame_within(&mut b, MAX_HANDSHAKE_FRAME).await;
        assert!(matches!(r, Err(LinkError::TooLarge(_))), "before the proof, a kilobyte at most");
    }
}

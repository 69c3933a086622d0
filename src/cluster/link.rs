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
//!
//! **TLS** (`cluster.tls`, [`PeerTls`]): the link runs in TLS first, both sides presenting
//! this member's certificate (`tls.cert`) and verifying the other's against the members' CA
//! (`tls.client_ca`; the connecting side also checks that it names the host it dialled);
//! the secret's proof then runs inside it, and every frame after it is encrypted.

use std::time::Duration;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::composition::config::{TlsSection, VerifyClient};

/// What a peer link runs on: TCP, or TLS over TCP.
pub(super) trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send + Sync {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> PeerIo for T {}

/// How this member proves itself on peer links: `cluster.secret`, and TLS with
/// `cluster.tls`.
#[derive(Debug)]
pub(super) struct PeerAuth {
    /// The secret's key.
    pub secret: Secret,
    /// TLS, when `cluster.tls` is on.
    pub tls: Option<PeerTls>,
}

/// An open peer link's stream.
pub(super) type PeerStream = Box<dyn PeerIo>;

/// TLS on the peer link (`cluster.tls`): this member's certificate on both sides, the
/// other's verified against the members' CA.
#[derive(Clone)]
pub(super) struct PeerTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls(..)")
    }
}

impl PeerTls {
    /// TLS from `tls.cert`, `tls.key` and `tls.client_ca` (every one needed): why not.
    pub(super) fn new(tls: &TlsSection) -> Result<PeerTls, String> {
        if tls.cert.is_empty() || tls.key.is_empty() || tls.client_ca.is_empty() {
            return Err("cluster.tls needs tls.cert, tls.key (this member's certificate) and tls.client_ca (the CA \
                        that signs every member's)"
                .into());
        }
        let acceptor = crate::transport::tls::acceptor(&tls.cert, &tls.key, &tls.client_ca, VerifyClient::Required)
            .map_err(|e| e.to_string())?;
        let settings = ["tls.client_ca", "tls.cert", "tls.key"];
        let connector = crate::transport::tls::connector(&tls.client_ca, &tls.cert, &tls.key, false, settings)
            .map_err(|e| e.to_string())?;
        Ok(PeerTls { acceptor, connector })
    }
}

/// The name a member's certificate must carry: the host of `addr` (`host:port`).
fn server_name(addr: &str) -> Result<rustls_pki_types::ServerName<'static>, LinkError> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    rustls_pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| LinkError::Refused(format!("'{host}' is not a name TLS can check: {e}")))
}

/// The largest frame either side reads once authenticated (a bigger length closes the link):
/// room for a batch of forwarded publishes with the largest message either protocol takes.
pub(super) const MAX_FRAME: usize = 320 << 20;

/// The largest frame read before the other side proved the secret.
const MAX_HANDSHAKE_FRAME: usize = 1024;

/// The longest node name the handshake takes.
const MAX_NAME: usize = 255;

/// How long a handshake may take, either side.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the accepting side sends first: the protocol and its version.
const GREETING: &[u8; 16] = b"FERRYMQ-PEER/2\r\n";

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

/// Writes `value` and the bytes of `blob` after it as one message frame (the links' frames
/// after the handshake): its length, the length of `value`'s JSON, the JSON, the bytes.
/// Bodies travel as they are, not inside the JSON.
pub(super) async fn write_message<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    value: &T,
    blob: &[bytes::Bytes],
) -> Result<(), LinkError> {
    let json = serde_json::to_vec(value).map_err(|e| LinkError::Decode(e.to_string()))?;
    let len = 4 + json.len() + blob.iter().map(|b| b.len()).sum::<usize>();
    if len > MAX_FRAME {
        return Err(LinkError::TooLarge(len));
    }
    // Small parts are gathered into one buffer (a batch of small publishes is one write,
    // not two per publish); a large body is written as it is, after what was gathered.
    let mut pending = Vec::with_capacity(8 + json.len() + blob.iter().map(|b| b.len().min(LARGE)).sum::<usize>());
    pending.extend_from_slice(&(len as u32).to_be_bytes());
    pending.extend_from_slice(&(json.len() as u32).to_be_bytes());
    pending.extend_from_slice(&json);
    for b in blob {
        if b.len() < LARGE {
            pending.extend_from_slice(b);
        } else {
            w.write_all(&pending).await?;
            pending.clear();
            w.write_all(b).await?;
        }
    }
    w.write_all(&pending).await?;
    w.flush().await?;
    Ok(())
}

/// A part of a message frame this large is written as it is, not copied into the frame's
/// buffer.
const LARGE: usize = 64 << 10;

/// Reads one message frame ([`write_message`]): the value and the bytes after it.
pub(super) async fn read_message<R: AsyncRead + Unpin, T: DeserializeOwned>(
    r: &mut R,
) -> Result<(T, bytes::Bytes), LinkError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if !(4..=MAX_FRAME).contains(&len) {
        return Err(LinkError::TooLarge(len));
    }
    let mut frame = vec![0u8; len];
    r.read_exact(&mut frame).await?;
    let json_len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
    if json_len > len - 4 {
        return Err(LinkError::Decode(format!("a frame of {len} bytes with {json_len} of JSON")));
    }
    let mut frame = bytes::Bytes::from(frame);
    let blob = frame.split_off(4 + json_len);
    let value = serde_json::from_slice(&frame[4..]).map_err(|e| LinkError::Decode(e.to_string()))?;
    Ok((value, blob))
}

/// Reads one frame as a `T`.
#[cfg(test)]
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

/// Connects to member `peer` at `addr` as `me` (in TLS first with `cluster.tls`), once both
/// proved the secret: the proof this side sends names `peer`, so that it cannot be relayed
/// to another member, and the other side must answer as `peer`.
pub(super) async fn connect(addr: &str, me: &str, peer: &str, auth: &PeerAuth) -> Result<PeerStream, LinkError> {
    let (secret, tls) = (&auth.secret, auth.tls.as_ref());
    let handshake = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut stream: PeerStream = match tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(
                tls.connector
                    .connect(server_name(addr)?, tcp)
                    .await
                    .map_err(|e| LinkError::Refused(format!("TLS with {addr}: {e}")))?,
            ),
        };
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

/// Authenticates a connection accepted on the peer listener as `me` (in TLS first with
/// `cluster.tls`): the link and the connecting member's node name once it proved the secret for
/// this member (and was sent the proof back). Reads at most [`MAX_HANDSHAKE_FRAME`] bytes
/// before the proof is checked.
pub(super) async fn accept(tcp: TcpStream, me: &str, auth: &PeerAuth) -> Result<(PeerStream, String), LinkError> {
    let (secret, tls) = (&auth.secret, auth.tls.as_ref());
    let handshake = async {
        tcp.set_nodelay(true)?;
        let mut stream: PeerStream = match tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(
                tls.acceptor.accept(tcp).await.map_err(|e| LinkError::Refused(format!("TLS handshake failed: {e}")))?,
            ),
        };
        let ours = nonce()?;
        let mut hello = Vec::with_capacity(48);
        hello.extend_from_slice(GREETING);
        hello.extend_from_slice(&ours);
        stream.write_all(&hello).await?;
        let proof: ClientProof = read_frame_within(&mut stream, MAX_HANDSHAKE_FRAME).await?;
        if proof.nonce.len() != 32 || proof.name.is_empty() || proof.name.len() > MAX_NAME || proof.name == me {
            return Err(LinkError::Refused(format!("'{}' sent a malformed proof", proof.name)));
        }
        if !secret.verify("client", &[&ours, &proof.nonce, proof.name.as_bytes(), me.as_bytes()], &proof.mac) {
            return Err(LinkError::Refused(format!("'{}' did not prove cluster.secret", proof.name)));
        }
        let mac = secret.sign("server", &[&proof.nonce, &ours, me.as_bytes(), proof.name.as_bytes()]).as_ref().to_vec();
        write_frame(&mut stream, &ServerProof::Accepted { name: me.to_owned(), mac }).await?;
        Ok((stream, proof.name))
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
            let (s, _) = listener.accept().await.unwrap();
            accept(s, "b", &PeerAuth { secret: server_secret, tls: None })
                .await
                .map(|(_, name)| name)
                .map_err(|e| e.to_string())
        });
        let client = connect(&addr, "a", expect, &PeerAuth { secret: Secret::new(client_secret), tls: None })
            .await
            .map(drop)
            .map_err(|e| e.to_string());
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

    /// A CA and a member certificate for 127.0.0.1 it signed, as `[tls]` names them.
    fn member_tls(dir: &std::path::Path, tag: &str) -> TlsSection {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap().signed_by(&key, &issuer).unwrap();
        let path = |name: &str| dir.join(format!("{tag}-{name}")).display().to_string();
        std::fs::write(path("cert.pem"), cert.pem()).unwrap();
        std::fs::write(path("key.pem"), key.serialize_pem()).unwrap();
        std::fs::write(path("ca.pem"), ca.pem()).unwrap();
        TlsSection {
            cert: path("cert.pem"),
            key: path("key.pem"),
            client_ca: path("ca.pem"),
            verify_client: VerifyClient::None,
        }
    }

    /// A link between a member with `server` and one with `client` TLS, one secret.
    async fn tls_pair(server: PeerTls, client: PeerTls) -> (Result<String, String>, Result<(), String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let secret = "s3cret-s3cret-s3cret";
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let auth = PeerAuth { secret: Secret::new(secret), tls: Some(server) };
            accept(s, "b", &auth).await.map(|(_, name)| name).map_err(|e| e.to_string())
        });
        let auth = PeerAuth { secret: Secret::new(secret), tls: Some(client) };
        let client = connect(&addr, "a", "b", &auth).await.map(drop).map_err(|e| e.to_string());
        (server.await.unwrap(), client)
    }

    #[tokio::test]
    async fn in_tls_members_of_one_ca_link_and_a_certificate_of_another_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ours = PeerTls::new(&member_tls(dir.path(), "ours")).unwrap();
        let (server, client) = tls_pair(ours.clone(), ours.clone()).await;
        assert_eq!(server.unwrap(), "a");
        client.unwrap();
        // A member whose certificate another CA signed: the TLS handshake fails, before any
        // proof of the secret.
        let theirs = PeerTls::new(&member_tls(dir.path(), "theirs")).unwrap();
        let (server, client) = tls_pair(ours, theirs).await;
        assert!(server.unwrap_err().contains("TLS handshake failed"));
        assert!(client.is_err());
        // Without every file, cluster.tls says what it needs.
        let missing = TlsSection { client_ca: String::new(), ..member_tls(dir.path(), "x") };
        assert!(PeerTls::new(&missing).unwrap_err().contains("tls.client_ca"));
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

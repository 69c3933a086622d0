//! The HTTP listeners' sockets: plain TCP, or TLS (`http.tls_listen`) with handshakes done
//! off the accept loop, and the peer address handlers see ([`Peer`]).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const ACCEPT_BACKLOG: usize = 64;

/// The client's address, as a handler extracts it (`ConnectInfo<Peer>`), on either listener.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// A TCP listener whose connections come out TLS-handshaken. Each handshake runs in a task
/// of its own, bounded to 10 s, so a client that stalls in it holds up
/// nobody else.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener`; the accept task ends with the returned listener.
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(ACCEPT_BACKLOG);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            debug!(error = %e, "HTTPS accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = tx.closed() => return,
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => debug!(%peer, error = %e, "HTTPS handshake failed"),
                        Err(_) => debug!(%peer, "HTTPS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept task only ends once this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

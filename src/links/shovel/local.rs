//! A shovel's side on FerryMQ itself (`amqp://` without a host), connected in-process:
//! lapin runs over a `tokio::io::duplex` pipe whose far end the AMQP front-end serves as
//! any client connection ([`serve_direct`]), acting as the configured user.
//!
//! lapin connects through a [`Connection::connector`] closure that returns its runtime's
//! TCP stream type; the runtime here is tokio's, but with a reactor whose TCP stream is
//! the pipe, so lapin's timers and tasks run on tokio and no socket is ever opened.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use async_rs::traits::Reactor;
use async_rs::util::RuntimeParts;
use async_rs::{Runtime, Tokio};
use futures_util::Stream;
use lapin::tcp::AsyncTcpStream;
use lapin::uri::{AMQPUri, SASLMechanism};
use lapin::{Connection, ConnectionProperties};
use tokio::io::DuplexStream;
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt};

use super::LocalBroker;
use crate::frontends::amqp::connection::serve_direct;

/// Bytes the pipe buffers each way (as the MQTT bridge's).
const PIPE: usize = 256 * 1024;

/// tokio's reactor, but a "TCP connection" is the in-process pipe, made by the connector
/// (never by `tcp_connect`).
#[derive(Debug, Clone)]
struct PipeReactor(Tokio);

impl Reactor for PipeReactor {
    type TcpStream = Compat<DuplexStream>;
    type Sleep = <Tokio as Reactor>::Sleep;

    fn register<H: io::Read + io::Write + AsFd + AsRawFd + Send + 'static>(
        &self,
        socket: H,
    ) -> io::Result<impl futures_io::AsyncRead + futures_io::AsyncWrite + Send + Unpin + 'static> {
        self.0.register(socket)
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.0.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.0.interval(dur)
    }

    fn tcp_connect_addr(
        &self,
        _addr: SocketAddr,
    ) -> impl std::future::Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        std::future::ready(Err(io::Error::new(io::ErrorKind::Unsupported, "the in-process link opens no socket")))
    }
}

/// tokio's executor with the pipe reactor.
type PipeKit = RuntimeParts<Tokio, PipeReactor>;

/// Opens an in-process AMQP connection to FerryMQ, in `vhost` (percent-encoded) with the
/// URI query `query` (`?heartbeat=...`, or ""), acting as `local.user`.
pub(super) async fn connect(
    local: &LocalBroker,
    vhost: &str,
    query: &str,
    properties: ConnectionProperties,
) -> Result<Connection, LocalError> {
    // The host is never connected to; the user is named to the broker by the pipe, not
    // by the login (SASL EXTERNAL).
    let mut uri: AMQPUri = format!("amqp://localhost/{vhost}{query}").parse().map_err(LocalError::Uri)?;
    uri.authority.userinfo.username = local.user.clone();
    uri.authority.userinfo.password = String::new();
    uri.query.auth_mechanism = Some(SASLMechanism::External);
    let tokio = Tokio::current();
    let runtime = Runtime::new(PipeKit::new(tokio.clone(), PipeReactor(tokio)));
    let (amqp, user) = (local.amqp.clone(), local.user.clone());
    let handle = tokio::runtime::Handle::current();
    let connector =
        async move |_: AMQPUri, _: Runtime<PipeKit>| -> lapin::Result<AsyncTcpStream<Compat<DuplexStream>>> {
            let (near, far) = tokio::io::duplex(PIPE);
            handle.spawn(serve_direct(amqp.clone(), far, user.clone()));
            Ok(AsyncTcpStream::Plain(near.compat()))
        };
    Connection::connector(uri, runtime, connector, properties).await.map_err(LocalError::Amqp)
}

/// Why the in-process connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(super) enum LocalError {
    /// The URI's path or query does not read.
    #[error("{0}")]
    Uri(String),
    /// The AMQP handshake failed (a refused login or virtual host, say).
    #[error("{0}")]
    Amqp(lapin::Error),
}

//! The HTTP listeners' sockets and connections. Each accepted socket is admitted under
//! `http.max_connections` and the descriptor budget ([`crate::transport::accept`]) before anything
//! else, so unauthenticated sockets are bounded like any other; a TLS handshake
//! (`http.tls_listen`) runs in the connection's own task, bounded to 10 s; each connection
//! is served by hyper's HTTP/1 server (keep-alive) with two timeouts:
//!
//! - header read (`http.header_read_timeout_secs`): a complete request head must arrive
//!   within it from the accept or from the end of the previous response, so a socket that
//!   sends nothing, dribbles its headers, or idles between keep-alive requests is closed;
//! - idle (`http.idle_timeout_secs`): while a request body is read or a response written,
//!   a connection on which no byte moves either way for that long is closed (a handler
//!   working on a request it has read completely is not idle).
//!
//! Handlers see the client's address as [`Peer`] (`ConnectInfo<Peer>`).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::ConnectInfo;
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use crate::composition::config::HttpSection;
use crate::transport::accept::{SocketBudget, SocketClass, SocketPermit};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's address, as a handler extracts it (`ConnectInfo<Peer>`), on every listener.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// The connections' timeouts, from `[http]`.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// `http.header_read_timeout_secs`.
    pub header_read: Duration,
    /// `http.idle_timeout_secs`.
    pub idle: Duration,
}

impl Timeouts {
    /// The timeouts `[http]` sets.
    pub fn of(cfg: &HttpSection) -> Timeouts {
        Timeouts { header_read: cfg.header_read_timeout, idle: cfg.idle_timeout }
    }
}

/// What a connection's serving needs besides its socket.
#[derive(Clone)]
pub struct Served {
    /// The routes.
    pub app: Router,
    /// Where its socket is counted.
    pub sockets: Arc<SocketBudget>,
    /// Its timeouts.
    pub timeouts: Timeouts,
}

/// Accepts on `listener` (TLS with `tls`) and serves each admitted connection until
/// `stop` turns true; connections then finish the request in progress and close.
pub async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>, served: Served, mut stop: watch::Receiver<bool>) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tokio::time::sleep(served.sockets.accept_failed(SocketClass::Http, &e)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => return,
        };
        let Ok(permit) = served.sockets.admit(SocketClass::Http) else {
            debug!(%peer, "HTTP connection closed at accept");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (tls, served, stop) = (tls.clone(), served.clone(), stop.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, peer, served, stop, permit).await,
                Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => connection(tls, peer, served, stop, permit).await,
                    Ok(Err(e)) => debug!(%peer, error = %e, "HTTPS handshake failed"),
                    Err(_) => debug!(%peer, "HTTPS handshake timed out"),
                },
            }
        });
    }
}

/// Returns once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves one connection until it closes, times out, or the server stops.
async fn connection<S>(io: S, peer: SocketAddr, served: Served, mut stop: watch::Receiver<bool>, permit: SocketPermit)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = Watched { inner: io, activity: activity.clone() };
    let service = PeerService { app: served.app, peer: Peer(peer), activity: activity.clone() };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(served.timeouts.header_read);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let idle = served.timeouts.idle;
    let mut check_at = activity.last_io() + idle;
    let mut stopping = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    debug!(%peer, error = %e, "HTTP connection ended");
                }
                break;
            }
            () = stopped(&mut stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(check_at) => {
                if activity.stalled(idle) {
                    debug!(%peer, "HTTP connection idle for http.idle_timeout_secs; closed");
                    break;
                }
                check_at = (activity.last_io() + idle).max(Instant::now() + idle);
            }
        }
    }
    drop(permit);
}

/// What a connection is doing, as its idle timeout sees it.
#[derive(Debug)]
struct Activity {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last byte read or written.
    last_io_ms: AtomicU64,
    /// Requests whose handler runs.
    handling: AtomicUsize,
    /// Request bodies not read to their end.
    reading: AtomicUsize,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            epoch: Instant::now(),
            last_io_ms: AtomicU64::new(0),
            handling: AtomicUsize::new(0),
            reading: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        self.last_io_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn last_io(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed))
    }

    /// Nothing moved for `idle`, and no handler works on a request it has read.
    fn stalled(&self, idle: Duration) -> bool {
        let working = self.handling.load(Ordering::Relaxed) > 0 && self.reading.load(Ordering::Relaxed) == 0;
        !working && self.last_io() + idle <= Instant::now()
    }
}

/// A socket whose reads and writes mark the connection active.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The routes, with the client's address put into each request and the handler's work
/// and body reading counted for the idle timeout.
struct PeerService {
    app: Router,
    peer: Peer,
    activity: Arc<Activity>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for PeerService {
    type Response = Response;
    type Error = Infallible;
    type Future = Handling;

    fn call(&self, mut req: hyper::Request<Incoming>) -> Handling {
        req.extensions_mut().insert(ConnectInfo(self.peer));
        self.activity.handling.fetch_add(1, Ordering::Relaxed);
        let req = req.map(|body| {
            let unread = !http_body::Body::is_end_stream(&body);
            if unread {
                self.activity.reading.fetch_add(1, Ordering::Relaxed);
            }
            axum::body::Body::new(Tracked { inner: body, activity: unread.then(|| self.activity.clone()) })
        });
        let mut app = self.app.clone();
        Handling { inner: tower_service::Service::call(&mut app, req), activity: self.activity.clone() }
    }
}

/// A handler's future; the connection counts it as working until it ends.
struct Handling {
    inner: axum::routing::future::RouteFuture<Infallible>,
    activity: Arc<Activity>,
}

impl Future for Handling {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.activity.handling.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body; the connection counts it as being read until its end (or its drop).
struct Tracked {
    inner: Incoming,
    /// Set while the body is counted.
    activity: Option<Arc<Activity>>,
}

impl Tracked {
    fn done(&mut self) {
        if let Some(a) = self.activity.take() {
            a.reading.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || self.inner.is_end_stream() {
            self.done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.done();
    }
}

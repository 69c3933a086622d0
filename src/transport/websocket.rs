//! MQTT over WebSocket: the server handshake (the path, the browser's origin
//! ([`OriginPolicy`]), the `mqtt` / `mqttv3.1` subprotocols) and [`WsStream`], which turns the binary frames into the byte stream the
//! MQTT connection code reads and writes, so a WebSocket client is served by the same
//! sans-IO state machine as a TCP one. One MQTT packet may span frames and one frame may
//! hold several packets; pings are answered by tungstenite, a close is the end of the
//! stream, a text frame is a protocol error (MQTT over WebSocket is binary only).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::transport::origin::Origin;

/// Subprotocols accepted, in the order of preference when a client offers several: the
/// standard `mqtt` (MQTT 3.1.1 and 5.0), `mqttv3.1` (MQTT 3.1 clients), and EMQX's spellings.
const SUBPROTOCOLS: [&str; 5] = ["mqtt", "mqttv3.1", "mqtt-v5", "mqtt-v3.1.1", "mqtt-v3"];

/// Why a WebSocket upgrade was refused or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WsError {
    /// The handshake failed (not an upgrade, wrong path or subprotocol, I/O).
    #[error("WebSocket handshake: {0}")]
    Handshake(#[from] tokio_tungstenite::tungstenite::Error),
    /// The browser's `Origin` is not allowed ([`OriginPolicy`]); answered 403.
    #[error("WebSocket upgrade refused: {0}")]
    Origin(String),
}

/// Which browser pages may open an MQTT WebSocket (`mqtt.ws_check_origin_enable`,
/// `ws_check_origins`, `ws_allow_origin_absence`, as EMQX's listener options). A browser
/// always sends the page's `Origin` with an upgrade and a page cannot change it; other
/// clients send none.
#[derive(Debug, Clone, Default)]
pub(crate) struct OriginPolicy {
    /// Origins are checked at all.
    pub check: bool,
    /// Origins allowed besides the listener's own host.
    pub allowed: Vec<Origin>,
    /// An upgrade without `Origin` (not a browser) passes.
    pub allow_absence: bool,
    /// The listener is bound to loopback: a page of its own host must name it with a
    /// loopback name (another name pointing at 127.0.0.1 is DNS rebinding).
    pub loopback_listener: bool,
}

impl OriginPolicy {
    /// The policy of `[mqtt]` on a listener (`loopback`: bound to a loopback address) that
    /// does or does not admit anonymous clients (`anonymous`): checked where
    /// `ws_check_origin_enable` says, unset = where anonymous clients are admitted.
    pub(crate) fn of(cfg: &crate::composition::config::MqttSection, anonymous: bool, loopback: bool) -> OriginPolicy {
        OriginPolicy {
            check: cfg.ws_check_origin_enable.unwrap_or(anonymous),
            allowed: cfg.ws_check_origins.clone(),
            allow_absence: cfg.ws_allow_origin_absence,
            loopback_listener: loopback,
        }
    }

    /// Whether an upgrade with `origin` (its `Origin` header) sent to `host` (its `Host`
    /// header) may go on; `Err` says why not.
    pub(crate) fn verdict(&self, origin: Option<&str>, host: Option<&str>) -> Result<(), String> {
        if !self.check {
            return Ok(());
        }
        let Some(origin) = origin else {
            return match self.allow_absence {
                true => Ok(()),
                false => Err("no Origin header (mqtt.ws_allow_origin_absence = false)".into()),
            };
        };
        let Some(parsed) = Origin::parse(origin) else {
            return Err(format!("origin `{origin}` is opaque or unreadable"));
        };
        if self.allowed.contains(&parsed) {
            return Ok(());
        }
        let own_host = host.is_some_and(|h| parsed.same_host(h));
        if own_host && (!self.loopback_listener || crate::transport::origin::is_loopback_host(&parsed.host)) {
            return Ok(());
        }
        Err(format!("origin {parsed} is not this listener's host nor in mqtt.ws_check_origins"))
    }
}

/// The subprotocol to answer with, spelled exactly as offered (a browser refuses any other
/// spelling): the first one offered that FerryMQ speaks (`Ok(None)` when none was
/// offered; `Err` when only others were).
fn negotiate(offered: Option<&HeaderValue>) -> Result<Option<&str>, ()> {
    let Some(offered) = offered.and_then(|v| v.to_str().ok()) else { return Ok(None) };
    let offered: Vec<&str> = offered.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
    if offered.is_empty() {
        return Ok(None);
    }
    offered.into_iter().find(|o| SUBPROTOCOLS.iter().any(|s| s.eq_ignore_ascii_case(o))).map(Some).ok_or(())
}

fn refusal(status: StatusCode, why: &str) -> ErrorResponse {
    let mut r = ErrorResponse::new(Some(why.to_owned()));
    *r.status_mut() = status;
    r
}

/// Completes the server handshake on `stream`: the request must ask for `path` (any path
/// when empty), come from an origin `origins` allows and, if it names subprotocols, offer
/// one of MQTT's; frames are limited to `max_frame` bytes.
pub(crate) async fn accept<S>(
    stream: S,
    path: &str,
    origins: &OriginPolicy,
    max_frame: usize,
) -> Result<WsStream<S>, WsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let refused_origin = std::sync::OnceLock::new();
    // The callback's signature is tungstenite's (its error is the HTTP refusal).
    #[allow(clippy::result_large_err)]
    let check = |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        if !path.is_empty() && req.uri().path() != path {
            return Err(refusal(StatusCode::NOT_FOUND, "MQTT over WebSocket is served at another path"));
        }
        let header = |name: &str| req.headers().get(name).map(|v| v.to_str().unwrap_or("?"));
        if let Err(why) = origins.verdict(header("origin"), header("host")) {
            let _ = refused_origin.set(why);
            return Err(refusal(StatusCode::FORBIDDEN, "this origin may not open an MQTT WebSocket here"));
        }
        match negotiate(req.headers().get("sec-websocket-protocol")) {
            Ok(Some(p)) => {
                let p = HeaderValue::from_str(p).map_err(|_| refusal(StatusCode::BAD_REQUEST, "bad subprotocol"))?;
                resp.headers_mut().insert("sec-websocket-protocol", p);
                Ok(resp)
            }
            Ok(None) => Ok(resp),
            Err(()) => Err(refusal(StatusCode::BAD_REQUEST, "no MQTT subprotocol offered (mqtt, mqttv3.1)")),
        }
    };
    let config = WebSocketConfig::default().max_frame_size(Some(max_frame)).max_message_size(Some(max_frame));
    let ws = match tokio_tungstenite::accept_hdr_async_with_config(stream, check, Some(config)).await {
        Ok(ws) => ws,
        Err(e) => {
            return Err(match refused_origin.into_inner() {
                Some(why) => WsError::Origin(why),
                None => WsError::Handshake(e),
            })
        }
    };
    Ok(WsStream { inner: ws, pending: Bytes::new(), ended: false, unflushed: false })
}

/// A WebSocket connection as a byte stream: binary frames in, one binary frame per write out.
#[derive(Debug)]
pub(crate) struct WsStream<S> {
    inner: WebSocketStream<S>,
    /// What is left of the last frame read.
    pending: Bytes,
    /// The peer closed (or the stream ended): reads return end of file.
    ended: bool,
    /// A frame was accepted but its flush to the socket is still pending; the next write
    /// or read drives it (the socket's write waker is registered meanwhile).
    unflushed: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    /// Drives a pending flush; `Ready` once nothing waits to go out.
    fn poll_pending_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.unflushed {
            ready!(Pin::new(&mut self.inner).poll_flush(cx)).map_err(io_error)?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}

fn io_error(e: tokio_tungstenite::tungstenite::Error) -> io::Error {
    match e {
        tokio_tungstenite::tungstenite::Error::Io(e) => e,
        tokio_tungstenite::tungstenite::Error::Capacity(c) => {
            io::Error::new(io::ErrorKind::InvalidData, FrameTooLarge(c))
        }
        other => io::Error::other(other),
    }
}

/// A frame (or message) above the limit: the MQTT connection answers it as a packet too
/// large (MQTT 5 DISCONNECT 0x95) before it closes.
#[derive(Debug, thiserror::Error)]
#[error("WebSocket frame too large: {0}")]
pub(crate) struct FrameTooLarge(tokio_tungstenite::tungstenite::error::CapacityError);

impl FrameTooLarge {
    /// True when `e` is one.
    pub(crate) fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|inner| inner.is::<FrameTooLarge>())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // The MQTT code never flushes (a TCP socket needs none): frames go out here too.
        if let Poll::Ready(Err(e)) = self.poll_pending_flush(cx) {
            return Poll::Ready(Err(e));
        }
        // As many frames as are already here, up to the buffer's room: a client sends a
        // packet per frame, and the connection code should see a batch per read, as on TCP.
        let mut filled = false;
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                filled = true;
                if buf.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if self.ended {
                return Poll::Ready(Ok(()));
            }
            let next = match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(next) => next,
                Poll::Pending if filled => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            };
            match next {
                Some(Ok(Message::Binary(b))) => self.pending = b,
                // tungstenite queues the pong itself; it goes out with the next write or flush.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Text(_))) if filled => {
                    // Hand over what came before it; the next read reports the text frame.
                    self.ended = true;
                    return Poll::Ready(Ok(()));
                }
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a text frame: MQTT over WebSocket is carried in binary frames",
                    )))
                }
                Some(Ok(Message::Close(_))) | None => self.ended = true,
                Some(Err(_)) if filled => {
                    // Likewise: the error ends the stream after what was read.
                    self.ended = true;
                    return Poll::Ready(Ok(()));
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // The previous frame goes out first: a slow reader holds the writer back here.
        ready!(self.poll_pending_flush(cx))?;
        ready!(Pin::new(&mut self.inner).poll_ready(cx)).map_err(io_error)?;
        Pin::new(&mut self.inner).start_send(Message::Binary(Bytes::copy_from_slice(buf))).map_err(io_error)?;
        self.unflushed = true;
        // Accepted either way; a flush that cannot finish now is driven by the next call.
        if let Poll::Ready(Err(e)) = self.poll_pending_flush(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.unflushed = true;
        self.poll_pending_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx).map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked_as_the_policy_says() {
        let policy = OriginPolicy {
            check: true,
            allowed: vec![Origin::parse("https://app.example.com").unwrap()],
            allow_absence: true,
            loopback_listener: true,
        };
        let host = Some("127.0.0.1:8083");
        assert_eq!(policy.verdict(None, host), Ok(()), "not a browser");
        assert_eq!(policy.verdict(Some("http://127.0.0.1:15672"), host), Ok(()), "the dashboard's page");
        assert_eq!(policy.verdict(Some("https://app.example.com"), host), Ok(()), "listed");
        assert!(policy.verdict(Some("http://evil.example"), host).is_err());
        assert!(policy.verdict(Some("http://localhost:3000"), host).is_err(), "another name is another site");
        assert!(policy.verdict(Some("null"), host).is_err());
        let rebound = Some("evil.example:8083");
        assert!(policy.verdict(Some("http://evil.example"), rebound).is_err(), "DNS rebinding onto loopback");
        let public = OriginPolicy { loopback_listener: false, ..policy.clone() };
        assert_eq!(public.verdict(Some("https://mq.example.com"), Some("mq.example.com:8084")), Ok(()));
        let strict = OriginPolicy { allow_absence: false, ..policy.clone() };
        assert!(strict.verdict(None, host).is_err());
        let off = OriginPolicy { check: false, ..policy };
        assert_eq!(off.verdict(Some("http://evil.example"), host), Ok(()));
    }

    #[test]
    fn subprotocols_are_negotiated_as_mqtt_clients_offer_them() {
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(negotiate(None), Ok(None));
        assert_eq!(negotiate(Some(&h("mqtt"))), Ok(Some("mqtt")));
        assert_eq!(negotiate(Some(&h("mqttv3.1"))), Ok(Some("mqttv3.1")));
        assert_eq!(negotiate(Some(&h("chat, MQTT"))), Ok(Some("MQTT")), "echoed as offered");
        assert_eq!(negotiate(Some(&h("chat"))), Err(()));
    }
}

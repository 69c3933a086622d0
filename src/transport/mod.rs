//! What carries a client's bytes to a front-end: accepting sockets under the connection
//! caps, socket buffers and waits, TLS, MQTT over WebSocket, browser origins.
//!
//! - [`accept`] — what the accept loops may take: connection caps and the open-files budget.
//! - [`socket`] — buffer sizing and waits both front-ends' connection tasks share.
//! - [`tls`] — rustls acceptor from PEM files, client certificates.
//! - [`websocket`] — MQTT over WebSocket: the upgrade and a byte-stream adapter.
//! - [`origin`] — browser origins, as the API's cross-site check and the WebSocket
//!   listener's origin check compare them.

pub mod accept;
pub(crate) mod origin;
pub(crate) mod socket;
pub(crate) mod tls;
pub(crate) mod websocket;

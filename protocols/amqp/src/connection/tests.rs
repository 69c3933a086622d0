//! Connection tests, driven by a small client that encodes its frames with
//! `amq-protocol`'s generator and decodes the server's output with `amq-protocol`'s
//! parser (an implementation independent of ours).

mod channels;
mod client;
mod content;
mod handshake;
mod lifecycle;

//! `ferrymq-amqp`: AMQP 0-9-1 framing and the connection/channel state machine, sans-IO.
//!
//! Placeholder until the AMQP front-end issue: the crate exists so the workspace has the
//! shape of the design (`protocols/amqp` beside `protocols/mqtt`). It will hold frame
//! parsing (methods and content headers through `amq-protocol`, body frames parsed here
//! without copying), the handshake, tune, channel lifecycle, content assembly, delivery
//! tags and confirms — bytes in, events out, no sockets and no broker types.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

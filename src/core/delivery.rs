//! What flows from the core to a connection: direct (fast-path) messages and queue
//! deliveries, and the handle through which the router reaches a connected session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrymq_storage::QueueId;
use tokio::sync::mpsc;

use super::message::SharedMessage;

/// A message routed straight to a connected clean session (no storage involved).
#[derive(Debug, Clone)]
pub struct Direct {
    /// The message.
    pub msg: SharedMessage,
    /// Highest granted QoS of the matching subscriptions (the connection applies
    /// min(publish QoS, this)).
    pub qos: u8,
    /// Keep the RETAIN flag as published (else it is cleared).
    pub retain_as_published: bool,
    /// Subscription identifiers of the matching subscriptions.
    pub subscription_ids: Vec<u32>,
}

/// A message handed out by a consume queue; the consumer must answer with an ack (after
/// the client acknowledged it, or right after sending it for QoS 0).
#[derive(Debug, Clone)]
pub struct QueueDelivery {
    /// The queue.
    pub queue: QueueId,
    /// The entry's offset in the queue.
    pub offset: u64,
    /// The message.
    pub msg: SharedMessage,
    /// Delivery QoS (already min(publish, granted)).
    pub qos: u8,
    /// Delivered before (send with DUP / redelivered).
    pub redelivered: bool,
    /// QoS 2: the client already sent PUBREC on an earlier connection; resend PUBREL only.
    pub released: bool,
}

/// The router's handle to a connected clean session.
#[derive(Debug)]
pub struct SessionLink {
    /// Unique id of this connection's session incarnation.
    pub id: u64,
    /// Client identifier.
    pub client_id: Arc<str>,
    tx: mpsc::Sender<Direct>,
    dropped: AtomicU64,
}

impl SessionLink {
    /// A link whose direct messages go to `tx`.
    pub fn new(id: u64, client_id: Arc<str>, tx: mpsc::Sender<Direct>) -> Self {
        SessionLink { id, client_id, tx, dropped: AtomicU64::new(0) }
    }

    /// Offers a message without waiting: a full buffer (slow subscriber) drops it and counts
    /// the drop, so one slow consumer never slows the publisher.
    pub fn offer(&self, msg: Direct) -> bool {
        match self.tx.try_send(msg) {
            Ok(()) => true,
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Messages dropped because the session's buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

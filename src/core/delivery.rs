//! What flows from the core to a connection: direct (fast-path) messages and queue
//! deliveries, and the handle through which the router reaches a connected session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrymq_storage::QueueId;
use tokio::sync::{mpsc, Notify};

use super::message::SharedMessage;

/// A message routed straight to a connected clean session (no storage involved).
#[derive(Debug, Clone)]
pub struct Direct {
    /// The message, shared with every other subscriber it goes to.
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
    /// Queue the entry is from (acks go back to it).
    pub queue: QueueId,
    /// The entry's offset in the queue.
    pub offset: u64,
    /// The message the entry points to.
    pub msg: SharedMessage,
    /// Delivery QoS (already min(publish, granted)).
    pub qos: u8,
    /// Delivered before (send with DUP / redelivered).
    pub redelivered: bool,
    /// QoS 2: the client already sent PUBREC on an earlier connection; resend PUBREL only.
    pub released: bool,
    /// Id of the consumer it is for.
    pub consumer: u64,
    /// Earlier deliveries of this message (AMQP `x-delivery-count`), when the queue
    /// counts them.
    pub delivery_count: Option<u32>,
}

/// The router's handle to a connected clean session.
///
/// Its buffer is bounded. A message that finds it full waits for room (unless it is QoS 0
/// and QoS 0 may be dropped): the publisher is paced to its subscribers, which for QoS 1/2
/// holds back its acknowledgements, so no acknowledged message is dropped. If the
/// subscriber makes no room within the slow-consumer timeout, it is marked slow (its
/// connection is closed with MQTT 5 reason 0x97) and the message is dropped for it.
#[derive(Debug)]
pub struct SessionLink {
    /// Unique id of this connection's session incarnation.
    pub id: u64,
    /// MQTT Client Identifier of the session (as sent in CONNECT, or assigned by the broker).
    pub client_id: Arc<str>,
    tx: mpsc::Sender<Direct>,
    dropped: AtomicU64,
    slow: Notify,
}

impl SessionLink {
    /// A link whose direct messages go to `tx`.
    pub fn new(id: u64, client_id: Arc<str>, tx: mpsc::Sender<Direct>) -> Self {
        SessionLink { id, client_id, tx, dropped: AtomicU64::new(0), slow: Notify::new() }
    }

    /// Hands over a message; true if it was taken. When the buffer is full it waits up to
    /// `patience` for room (not at all when `wait` is false), then marks the subscriber
    /// slow.
    pub async fn deliver(&self, msg: Direct, wait: bool, patience: Duration) -> bool {
        let msg = match self.tx.try_send(msg) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(msg)) => msg,
        };
        if wait {
            match tokio::time::timeout(patience, self.tx.send(msg)).await {
                Ok(Ok(())) => return true,
                Ok(Err(_)) => return false,
                Err(_) => self.slow.notify_one(),
            }
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Resolves when a publisher gave up waiting for this subscriber.
    pub async fn slow_consumer(&self) {
        self.slow.notified().await
    }

    /// Messages dropped for this session (QoS 0 on a full buffer, or a slow consumer).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

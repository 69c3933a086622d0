//! What the MQTT and AMQP connection tasks share around their sockets: how the read
//! buffer is sized, when a drained write buffer is given back, the waits of their select
//! loops (a protocol deadline, the durability signal at the front of a queue of acks) and
//! the end of a closing socket.
//!
//! Idle connections are the common case (IoT fleets), so buffers start small, grow while
//! traffic fills them and are given back once drained.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::core::broker::DurableSignal;

/// Smallest read buffer (what an idle connection keeps).
const READ_MIN: usize = 512;
/// Drained buffers larger than this are given back.
const BUFFER_KEEP: usize = 64 * 1024;
/// Longest time spent flushing the last bytes to a closing socket, or reading what the
/// peer still sends after the close.
pub const CLOSE_FLUSH: Duration = Duration::from_secs(2);

/// A connection's read buffer: reads land in it, the protocol consumes from its front.
#[derive(Debug)]
pub struct ReadBuffer {
    buf: BytesMut,
    max_chunk: usize,
}

impl ReadBuffer {
    /// An empty buffer that grows its read chunks up to `max_chunk` bytes under load.
    pub fn new(max_chunk: usize) -> ReadBuffer {
        ReadBuffer { buf: BytesMut::with_capacity(READ_MIN), max_chunk: max_chunk.max(READ_MIN) }
    }

    /// The bytes: read into it, hand it to the protocol.
    pub fn bytes(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// True when the last read filled the buffer (there is probably more to read). Ask
    /// before the protocol consumes the bytes.
    pub fn is_full(&self) -> bool {
        self.buf.capacity() == self.buf.len()
    }

    /// After the protocol consumed what it could: a drained large buffer is given back; a
    /// read that filled the buffer (`was_full`), or too little room left, doubles the next
    /// read chunk (up to the maximum).
    pub fn resize(&mut self, was_full: bool) {
        if self.buf.is_empty() && self.buf.capacity() > BUFFER_KEEP {
            self.buf = BytesMut::with_capacity(READ_MIN);
        } else if was_full || self.buf.capacity() - self.buf.len() < READ_MIN {
            self.buf.reserve((self.buf.capacity() * 2).clamp(READ_MIN, self.max_chunk));
        }
    }

    /// Bytes allocated now.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// Gives back a drained write buffer that grew large.
pub fn trim_drained(wbuf: &mut BytesMut) {
    if wbuf.is_empty() && wbuf.capacity() > BUFFER_KEEP {
        *wbuf = BytesMut::new();
    }
}

/// Sleeps until `deadline`; never returns without one.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

/// Waits for the durability signal of the front item of `queue` (`signal` finds it);
/// true when the message was stored. Never returns while the front has no signal.
pub async fn front_stored<T>(queue: &mut VecDeque<T>, signal: fn(&mut T) -> Option<&mut DurableSignal>) -> bool {
    match queue.front_mut().and_then(signal) {
        Some(s) => matches!(s.await, Ok(Ok(()))),
        None => std::future::pending().await,
    }
}

/// Reads and drops whatever the peer still sends until it closes its side.
pub async fn discard_until_eof<R: AsyncRead + Unpin>(reader: &mut R) {
    let mut sink = [0u8; 512];
    while let Ok(n) = reader.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrymq_storage::JournalError;
    use tokio::sync::oneshot;

    #[test]
    fn the_read_buffer_grows_while_reads_fill_it_and_shrinks_when_drained() {
        let mut r = ReadBuffer::new(4096);
        assert_eq!(r.capacity(), READ_MIN);
        for _ in 0..5 {
            let before = r.capacity();
            let room = before - r.bytes().len();
            r.bytes().extend_from_slice(&vec![0; room]);
            assert!(r.is_full());
            r.resize(true);
            let room = r.capacity() - r.bytes().len();
            assert!(room >= (before * 2).min(4096), "a full read makes room for a bigger one: {room} after {before}");
        }
        // Drained and large: given back.
        let mut big = ReadBuffer::new(1 << 20);
        big.bytes().reserve(BUFFER_KEEP * 2);
        big.resize(false);
        assert_eq!(big.capacity(), READ_MIN);
        // Drained and small: kept as it is.
        let mut small = ReadBuffer::new(1 << 20);
        small.bytes().extend_from_slice(b"abc");
        small.bytes().clear();
        small.resize(false);
        assert_eq!(small.capacity(), READ_MIN, "room for a packet: neither grown nor given back");
    }

    #[test]
    fn a_drained_large_write_buffer_is_given_back() {
        let mut w = BytesMut::with_capacity(BUFFER_KEEP * 2);
        trim_drained(&mut w);
        assert_eq!(w.capacity(), 0);
        let mut w = BytesMut::with_capacity(BUFFER_KEEP * 2);
        w.extend_from_slice(b"pending");
        trim_drained(&mut w);
        assert!(w.capacity() >= BUFFER_KEEP * 2, "bytes still waiting keep their buffer");
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_until_waits_for_the_deadline_and_forever_without_one() {
        let start = tokio::time::Instant::now();
        sleep_until(Some(Instant::now() + Duration::from_secs(30))).await;
        assert!(start.elapsed() >= Duration::from_secs(30));
        let never = tokio::time::timeout(Duration::from_secs(3600), sleep_until(None)).await;
        assert!(never.is_err(), "no deadline: no wake-up");
    }

    struct Ack(Option<DurableSignal>);

    fn signal_of(a: &mut Ack) -> Option<&mut DurableSignal> {
        a.0.as_mut()
    }

    #[tokio::test(start_paused = true)]
    async fn front_stored_reports_the_front_signal() {
        let (tx, rx) = oneshot::channel();
        let mut q = VecDeque::from([Ack(Some(rx))]);
        tx.send(Ok(())).unwrap();
        assert!(front_stored(&mut q, signal_of).await, "stored");

        let (tx, rx) = oneshot::channel();
        let mut q = VecDeque::from([Ack(Some(rx))]);
        tx.send(Err(JournalError::Closed)).unwrap();
        assert!(!front_stored(&mut q, signal_of).await, "failed to store");

        let (tx, rx) = oneshot::channel::<Result<(), JournalError>>();
        let mut q = VecDeque::from([Ack(Some(rx))]);
        drop(tx);
        assert!(!front_stored(&mut q, signal_of).await, "signal dropped");

        let mut q = VecDeque::from([Ack(None)]);
        let waited = tokio::time::timeout(Duration::from_secs(60), front_stored(&mut q, signal_of)).await;
        assert!(waited.is_err(), "no signal at the front: nothing to wait for");
    }

    #[tokio::test]
    async fn discard_until_eof_returns_when_the_peer_closes() {
        let (mut a, b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut b = b;
            b.write_all(&[1; 1000]).await.unwrap();
        });
        tokio::time::timeout(Duration::from_secs(10), discard_until_eof(&mut a)).await.unwrap();
        writer.await.unwrap();
    }
}

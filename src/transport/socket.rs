//! What the MQTT and AMQP connection tasks share around their sockets: how the read
//! buffer is sized, when a drained write buffer is given back, the waits of their select
//! loops (a protocol deadline, the durability signal at the front of a queue of acks) and
//! the end of a closing socket.
//!
//! Idle connections are the common case (IoT fleets), so a quiet connection holds no
//! buffer at all: while its read buffer has no allocation, a read lands in a scratch
//! buffer of the worker thread and only the bytes read are copied out (a keep-alive ping
//! is 2 bytes); buffers grow while traffic fills them and are given back once drained by
//! a small read or write. A busy connection keeps its buffers and reads straight into them.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::core::broker::DurableSignal;

/// Smallest read chunk once a connection has traffic. A read or write smaller than this
/// that leaves its buffer drained marks a quiet connection: the buffer is given back.
const READ_MIN: usize = 512;
/// Drained buffers larger than this are given back whatever the last read or write was.
const BUFFER_KEEP: usize = 64 * 1024;
/// Size of each worker thread's scratch read buffer.
const SCRATCH: usize = 16 * 1024;
/// Longest time spent flushing the last bytes to a closing socket, or reading what the
/// peer still sends after the close.
pub(crate) const CLOSE_FLUSH: Duration = Duration::from_secs(2);

thread_local! {
    /// Where reads of connections without a read buffer land (used within one poll only).
    static SCRATCH_BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH].into_boxed_slice());
}

/// A connection's read buffer: reads land in it, the protocol consumes from its front.
#[derive(Debug)]
pub(crate) struct ReadBuffer {
    buf: BytesMut,
    max_chunk: usize,
}

impl ReadBuffer {
    /// An empty buffer (no allocation) that grows its read chunks up to `max_chunk` bytes
    /// under load.
    pub(crate) fn new(max_chunk: usize) -> ReadBuffer {
        ReadBuffer { buf: BytesMut::new(), max_chunk: max_chunk.max(READ_MIN) }
    }

    /// The bytes: hand them to the protocol.
    pub(crate) fn bytes(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Reads once from `reader`: straight into the buffer when it has room, else into the
    /// worker's scratch buffer, copying out only what was read. Cancel-safe.
    pub(crate) async fn read_from<R: AsyncRead + Unpin>(&mut self, reader: &mut R) -> io::Result<usize> {
        poll_fn(|cx| self.poll_read_from(reader, cx)).await
    }

    /// [`ReadBuffer::read_from`] as a poll.
    pub(crate) fn poll_read_from<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        if self.buf.capacity() > self.buf.len() {
            // A read future per poll: it holds no state between polls.
            return std::pin::pin!(reader.read_buf(&mut self.buf)).poll(cx);
        }
        SCRATCH_BUF.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let mut rb = ReadBuf::new(&mut scratch[..]);
            if let Err(e) = std::task::ready!(Pin::new(reader).poll_read(cx, &mut rb)) {
                return Poll::Ready(Err(e));
            }
            self.buf.extend_from_slice(rb.filled());
            Poll::Ready(Ok(rb.filled().len()))
        })
    }

    /// True when the last read filled the buffer (there is probably more to read). Ask
    /// before the protocol consumes the bytes.
    pub(crate) fn is_full(&self) -> bool {
        self.buf.capacity() == self.buf.len()
    }

    /// After the protocol consumed what it could of a read of `read` bytes: a drained
    /// buffer is given back when the read was small (a quiet connection) or the buffer
    /// large; a read that filled the buffer (`was_full`), or too little room left, doubles
    /// the next read chunk (up to the maximum).
    pub(crate) fn resize(&mut self, read: usize, was_full: bool) {
        if self.buf.is_empty() {
            if read < READ_MIN || self.buf.capacity() > BUFFER_KEEP {
                self.buf = BytesMut::new();
            }
        } else if was_full || self.buf.capacity() - self.buf.len() < READ_MIN {
            self.buf.reserve((self.buf.capacity() * 2).clamp(READ_MIN, self.max_chunk));
        }
    }

    /// Bytes allocated now.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// Gives back a write buffer drained by a write of `written` bytes, when the write was
/// small (a quiet connection) or the buffer large.
pub(crate) fn trim_drained(wbuf: &mut BytesMut, written: usize) {
    if wbuf.is_empty() && wbuf.capacity() > 0 && (written < READ_MIN || wbuf.capacity() > BUFFER_KEEP) {
        *wbuf = BytesMut::new();
    }
}

/// What a socket did in [`transfer`].
#[derive(Debug)]
pub(crate) enum Io {
    /// A write took this many bytes from the front of the write buffer (or failed).
    Wrote(io::Result<usize>),
    /// A read brought this many bytes into the read buffer (0: the peer closed its side).
    Read(io::Result<usize>),
}

/// Writes from `wbuf` (when it holds bytes) and reads into `rbuf` (when `read`),
/// whichever the socket is ready for first, the write first. One wait for both
/// directions of one socket: no split halves to allocate. Cancel-safe.
pub(crate) fn transfer<'a, S: AsyncRead + AsyncWrite + Unpin>(
    stream: &'a mut S,
    rbuf: &'a mut ReadBuffer,
    wbuf: &'a mut BytesMut,
    read: bool,
) -> impl Future<Output = Io> + 'a {
    poll_fn(move |cx| {
        if !wbuf.is_empty() {
            if let Poll::Ready(r) = Pin::new(&mut *stream).poll_write(cx, wbuf) {
                if let Ok(n) = r {
                    wbuf.advance(n);
                }
                return Poll::Ready(Io::Wrote(r));
            }
        }
        if read {
            if let Poll::Ready(r) = rbuf.poll_read_from(&mut *stream, cx) {
                return Poll::Ready(Io::Read(r));
            }
        }
        Poll::Pending
    })
}

/// Sleeps until `deadline`; never returns without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

/// Waits for the durability signal of the front item of `queue` (`signal` finds it);
/// true when the message was stored. Never returns while the front has no signal.
/// (A poll function: it holds nothing but its arguments.)
pub(crate) fn front_stored<'a, T>(
    queue: &'a mut VecDeque<T>,
    signal: fn(&mut T) -> Option<&mut DurableSignal>,
) -> impl Future<Output = bool> + 'a {
    poll_fn(move |cx| match queue.front_mut().and_then(signal) {
        Some(s) => Pin::new(s).poll(cx).map(|r| matches!(r, Ok(Ok(())))),
        None => Poll::Pending,
    })
}

/// Reads and drops whatever the peer still sends until it closes its side.
pub(crate) async fn discard_until_eof<R: AsyncRead + Unpin>(reader: &mut R) {
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
    use crate::core::JournalError;
    use tokio::sync::oneshot;

    #[test]
    fn the_read_buffer_grows_while_reads_fill_it_and_is_given_back_when_quiet() {
        let mut r = ReadBuffer::new(4096);
        assert_eq!(r.capacity(), 0, "nothing allocated before traffic");
        r.bytes().extend_from_slice(&[0; 600]);
        r.resize(600, true);
        for _ in 0..3 {
            let before = r.capacity();
            let room = before - r.bytes().len();
            r.bytes().extend_from_slice(&vec![0; room]);
            assert!(r.is_full());
            r.resize(room, true);
            let room = r.capacity() - r.bytes().len();
            assert!(room >= (before * 2).min(4096), "a full read makes room for a bigger one: {room} after {before}");
        }
        // Drained by a large read: kept (a busy connection reads straight into it).
        r.bytes().clear();
        let kept = r.capacity();
        assert!(kept <= BUFFER_KEEP);
        r.resize(4096, false);
        assert_eq!(r.capacity(), kept);
        // Drained by a small read (a ping): given back.
        r.resize(2, false);
        assert_eq!(r.capacity(), 0);
        // Drained and very large: given back whatever the read.
        let mut big = ReadBuffer::new(1 << 20);
        big.bytes().reserve(BUFFER_KEEP * 2);
        big.resize(BUFFER_KEEP, false);
        assert_eq!(big.capacity(), 0);
    }

    #[tokio::test]
    async fn a_read_without_a_buffer_copies_out_only_what_was_read() {
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        use tokio::io::AsyncWriteExt;
        b.write_all(&[0xc0, 0]).await.unwrap();
        let mut r = ReadBuffer::new(READ_MAX_FOR_TEST);
        assert_eq!(r.read_from(&mut a).await.unwrap(), 2);
        assert_eq!(&r.bytes()[..], [0xc0, 0]);
        assert!(r.capacity() < READ_MIN, "sized to the read, not to a chunk: {}", r.capacity());
        // A partial packet stays; the buffer then has room and is read into directly.
        r.resize(2, false);
        assert!(r.capacity() >= READ_MIN);
        b.write_all(&[1; 3000]).await.unwrap();
        let mut total = 2;
        while total < 3002 {
            total += r.read_from(&mut a).await.unwrap();
            r.resize(0, r.is_full());
        }
        assert_eq!(r.bytes().len(), 3002);
        assert_eq!(&r.bytes()[..2], [0xc0, 0]);
    }

    const READ_MAX_FOR_TEST: usize = 64 * 1024;

    #[test]
    fn a_drained_write_buffer_is_given_back_after_a_small_or_into_a_large_write() {
        let mut w = BytesMut::with_capacity(BUFFER_KEEP * 2);
        trim_drained(&mut w, BUFFER_KEEP * 2);
        assert_eq!(w.capacity(), 0);
        let mut w = BytesMut::with_capacity(4096);
        trim_drained(&mut w, 4096);
        assert_eq!(w.capacity(), 4096, "a busy connection keeps it");
        trim_drained(&mut w, 2);
        assert_eq!(w.capacity(), 0, "a quiet one gives it back");
        let mut w = BytesMut::with_capacity(BUFFER_KEEP * 2);
        w.extend_from_slice(b"pending");
        trim_drained(&mut w, 1);
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

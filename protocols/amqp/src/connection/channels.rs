//! The channels of a connection: which numbers are open or closing, each one's
//! confirm/tx mode and its content assembly (Basic.Publish, then a content header, then
//! body frames totalling the announced size).

use amq_protocol::protocol::basic;
use bytes::{Bytes, BytesMut};

use crate::BasicProperties;

/// Publisher-confirm or transaction mode of a channel (mutually exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Neither Confirm.Select nor Tx.Select seen: publishes carry no confirm tag.
    Plain,
    /// Confirm.Select seen: the next publish gets confirm tag `next`.
    Confirm {
        /// Next confirm tag (from 1).
        next: u64,
    },
    /// Tx.Select seen.
    Tx,
}

/// Body frames received so far; the body is concatenated once, when complete.
#[derive(Debug, Default)]
pub(super) struct Parts {
    first: Option<Bytes>,
    rest: Vec<Bytes>,
}

impl Parts {
    /// Adds a body frame's payload (empty payloads are dropped).
    pub(super) fn push(&mut self, payload: Bytes) {
        if payload.is_empty() {
            return;
        }
        if self.first.is_none() {
            self.first = Some(payload);
        } else {
            self.rest.push(payload);
        }
    }

    /// The whole body: the single payload as is, or all of them copied into one buffer.
    pub(super) fn into_body(self, size: usize) -> Bytes {
        let Some(first) = self.first else {
            return Bytes::new();
        };
        if self.rest.is_empty() {
            return first;
        }
        let mut body = BytesMut::with_capacity(size);
        body.extend_from_slice(&first);
        for part in &self.rest {
            body.extend_from_slice(part);
        }
        body.freeze()
    }
}

/// A publish waiting for its body frames.
#[derive(Debug)]
pub(super) struct Partial {
    /// The Basic.Publish method.
    pub publish: basic::Publish,
    /// Properties from the content header.
    pub properties: BasicProperties,
    /// Announced body size.
    pub size: u64,
    /// Bytes still expected.
    pub remaining: u64,
    /// Body frame payloads received so far.
    pub parts: Parts,
}

/// Content assembly state of a channel.
#[derive(Debug, Default)]
pub(super) enum Assembly {
    /// Expecting a method frame.
    #[default]
    Idle,
    /// Basic.Publish seen: expecting its content header.
    Header(basic::Publish),
    /// Header seen: expecting body frames.
    Body(Box<Partial>),
}

/// One open (or closing) channel.
#[derive(Debug)]
pub(super) struct Channel {
    /// The server sent Channel.Close and waits for Close-Ok: everything else the client
    /// sends on the channel is discarded.
    pub closing: bool,
    /// Set once by Confirm.Select or Tx.Select; never switches between the two.
    pub mode: Mode,
    /// Progress of the publish being assembled (method, content header, body frames).
    pub content: Assembly,
}

impl Channel {
    /// State of a channel just opened: plain mode, nothing being assembled.
    pub(super) fn new() -> Self {
        Channel { closing: false, mode: Mode::Plain, content: Assembly::Idle }
    }
}

/// Open and closing channels, sorted by number (connections use few channels: a sorted
/// vector beats hashing, and a client picking channel 65535 costs one entry).
#[derive(Debug, Default)]
pub(super) struct Channels {
    list: Vec<(u16, Channel)>,
}

impl Channels {
    fn index(&self, id: u16) -> Result<usize, usize> {
        self.list.binary_search_by_key(&id, |(n, _)| *n)
    }

    /// The channel, if open or closing.
    pub(super) fn get(&self, id: u16) -> Option<&Channel> {
        let i = self.index(id).ok()?;
        self.list.get(i).map(|(_, c)| c)
    }

    /// The channel, if open or closing.
    pub(super) fn get_mut(&mut self, id: u16) -> Option<&mut Channel> {
        let i = self.index(id).ok()?;
        self.list.get_mut(i).map(|(_, c)| c)
    }

    /// True if the channel is open and not closing.
    pub(super) fn is_open(&self, id: u16) -> bool {
        self.get(id).is_some_and(|c| !c.closing)
    }

    /// Adds a channel (replacing one with the same number).
    pub(super) fn insert(&mut self, id: u16, channel: Channel) {
        match self.index(id) {
            Ok(i) => {
                if let Some(slot) = self.list.get_mut(i) {
                    slot.1 = channel;
                }
            }
            Err(i) => self.list.insert(i, (id, channel)),
        }
    }

    /// Removes a channel.
    pub(super) fn remove(&mut self, id: u16) -> Option<Channel> {
        let i = self.index(id).ok()?;
        Some(self.list.remove(i).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_ops() {
        let mut t = Channels::default();
        for id in [5, 1, 3, 65535] {
            t.insert(id, Channel::new());
        }
        assert_eq!(t.list.len(), 4);
        assert!(t.is_open(3));
        assert!(!t.is_open(2));
        if let Some(c) = t.get_mut(3) {
            c.closing = true;
        }
        assert!(!t.is_open(3));
        assert!(t.get(3).is_some());
        assert!(t.remove(3).is_some());
        assert!(t.remove(3).is_none());
        assert_eq!(t.list.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1, 5, 65535]);
    }

    #[test]
    fn parts_concatenate_once() {
        let buf = Bytes::from_static(b"hello world");
        let mut p = Parts::default();
        p.push(buf.slice(0..11));
        let one = p.into_body(11);
        assert_eq!(one.as_ptr(), buf.as_ptr(), "a single part is not copied");
        let mut p = Parts::default();
        p.push(buf.slice(0..5));
        p.push(Bytes::new());
        p.push(buf.slice(5..11));
        assert_eq!(&p.into_body(11)[..], b"hello world");
        assert!(Parts::default().into_body(0).is_empty());
    }
}

//! The channels of a connection: which numbers are open or closing, and each one's
//! confirm/tx mode and content assembly state (the assembly itself is `content`'s).

use super::content::Assembly;

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
}

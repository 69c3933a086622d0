//! Outbound QoS 1/2 publishes in flight, and packet id allocation from the configured
//! range (skipping ids in flight).

use std::ops::RangeInclusive;

use super::idmap::IdMap;

/// Where an outbound publish stands: the packet awaited from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutState {
    /// QoS 1 sent, awaiting PUBACK.
    Ack,
    /// QoS 2 sent, awaiting PUBREC.
    Rec,
    /// PUBREC arrived; PUBREL waits for [`Connection::release`] (with
    /// [`Config::release_when_told`]).
    ///
    /// [`Connection::release`]: super::Connection::release
    /// [`Config::release_when_told`]: super::Config::release_when_told
    Received,
    /// PUBREL sent, awaiting PUBCOMP.
    Comp,
}

/// Packet ids in flight towards the client.
#[derive(Debug)]
pub(crate) struct Outbound {
    map: IdMap<OutState>,
    start: u16,
    end: u16,
    next: u16,
    /// Ids in flight that lie inside the allocation range.
    in_range: usize,
    /// Usable ids in the allocation range (0 excluded).
    range_size: usize,
}

impl Outbound {
    pub(crate) fn new(range: &RangeInclusive<u16>) -> Self {
        let (start, end) = (*range.start(), *range.end());
        let range_size = if start > end { 0 } else { usize::from(end - start) + 1 - usize::from(start == 0) };
        Outbound { map: IdMap::default(), start, end, next: start, in_range: 0, range_size }
    }

    fn in_alloc_range(&self, id: u16) -> bool {
        id != 0 && id >= self.start && id <= self.end
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn get(&self, id: u16) -> Option<OutState> {
        self.map.get(&id).copied()
    }

    pub(crate) fn contains(&self, id: u16) -> bool {
        self.map.contains_key(&id)
    }

    /// Inserts or updates the state of `id`.
    /// Inserts or updates the state of `id`; allocation continues after it.
    pub(crate) fn set(&mut self, id: u16, state: OutState) {
        if self.map.insert(id, state).is_none() && self.in_alloc_range(id) {
            self.in_range += 1;
            self.next = self.after(id);
        }
    }

    pub(crate) fn remove(&mut self, id: u16) -> Option<OutState> {
        let old = self.map.remove(&id);
        if old.is_some() && self.in_alloc_range(id) {
            self.in_range -= 1;
        }
        old
    }

    /// Ids of the allocation range not in flight.
    pub(crate) fn free_ids(&self) -> usize {
        self.range_size.saturating_sub(self.in_range)
    }

    fn after(&self, id: u16) -> u16 {
        if id >= self.end {
            self.start
        } else {
            id + 1
        }
    }

    /// The next free id from the range (round robin), or `None` when all are in flight.
    /// Nothing changes until [`Outbound::set`] takes it.
    pub(crate) fn allocate(&self) -> Option<u16> {
        if self.free_ids() == 0 {
            return None;
        }
        let mut id = self.next;
        for _ in 0..=self.range_size {
            if id != 0 && !self.map.contains_key(&id) {
                return Some(id);
            }
            id = self.after(id);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_round_robin_skipping_in_flight() {
        let mut o = Outbound::new(&(1..=3));
        assert_eq!(o.allocate(), Some(1));
        assert_eq!(o.allocate(), Some(1)); // not taken until set
        o.set(1, OutState::Ack);
        o.set(2, OutState::Ack); // taken by the caller
        assert_eq!(o.allocate(), Some(3));
        o.set(3, OutState::Rec);
        assert_eq!(o.free_ids(), 0);
        assert_eq!(o.allocate(), None);
        o.remove(2);
        assert_eq!(o.allocate(), Some(2));
        // Ids outside the range do not use up the range.
        o.set(100, OutState::Ack);
        assert_eq!(o.free_ids(), 1);
    }

    #[test]
    fn zero_never_allocated() {
        let mut o = Outbound::new(&(0..=1));
        assert_eq!(o.free_ids(), 1);
        assert_eq!(o.allocate(), Some(1));
        o.set(1, OutState::Ack);
        assert_eq!(o.allocate(), None);
        #[allow(clippy::reversed_empty_ranges)]
        let empty = Outbound::new(&(5..=4));
        assert_eq!(empty.allocate(), None);
    }
}

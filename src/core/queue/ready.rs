//! The ready list of a queue: entries waiting for a consumer, in offset order — or, for a
//! priority queue (`x-max-priority`), highest priority first and offset order within a
//! priority.

use std::collections::{BTreeMap, VecDeque};

use super::Entry;

/// Entries waiting for a consumer, front first.
#[derive(Debug)]
pub(super) enum Ready {
    /// Plain queue: offset order, which is arrival order.
    Fifo(VecDeque<Entry>),
    /// Keyed by (255 - priority, offset): the first key is the next to go.
    Priority(BTreeMap<(u8, u64), Entry>),
}

impl Ready {
    /// An empty list; `priority` for a priority queue.
    pub(super) fn new(priority: bool) -> Ready {
        if priority {
            Ready::Priority(BTreeMap::new())
        } else {
            Ready::Fifo(VecDeque::new())
        }
    }

    fn key(e: &Entry) -> (u8, u64) {
        (255 - e.priority, e.offset)
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Ready::Fifo(v) => v.len(),
            Ready::Priority(m) => m.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn clear(&mut self) {
        match self {
            Ready::Fifo(v) => v.clear(),
            Ready::Priority(m) => m.clear(),
        }
    }

    /// Adds an entry newer than every entry present (append, page-in).
    pub(super) fn push_back(&mut self, e: Entry) {
        match self {
            Ready::Fifo(v) => v.push_back(e),
            Ready::Priority(m) => {
                m.insert(Self::key(&e), e);
            }
        }
    }

    /// Puts back an entry just taken from the front.
    pub(super) fn push_front(&mut self, e: Entry) {
        match self {
            Ready::Fifo(v) => v.push_front(e),
            Ready::Priority(m) => {
                m.insert(Self::key(&e), e);
            }
        }
    }

    /// Puts an entry back at its own position (requeue).
    pub(super) fn insert_in_order(&mut self, e: Entry) {
        match self {
            Ready::Fifo(v) => {
                let at = v.partition_point(|x| x.offset < e.offset);
                v.insert(at, e);
            }
            Ready::Priority(m) => {
                m.insert(Self::key(&e), e);
            }
        }
    }

    pub(super) fn front(&self) -> Option<&Entry> {
        match self {
            Ready::Fifo(v) => v.front(),
            Ready::Priority(m) => m.values().next(),
        }
    }

    pub(super) fn front_mut(&mut self) -> Option<&mut Entry> {
        match self {
            Ready::Fifo(v) => v.front_mut(),
            Ready::Priority(m) => m.values_mut().next(),
        }
    }

    pub(super) fn pop_front(&mut self) -> Option<Entry> {
        match self {
            Ready::Fifo(v) => v.pop_front(),
            Ready::Priority(m) => m.pop_first().map(|(_, e)| e),
        }
    }

    /// Removes the oldest entry matching `pred`.
    pub(super) fn remove_first(&mut self, pred: impl Fn(&Entry) -> bool) -> Option<Entry> {
        match self {
            Ready::Fifo(v) => {
                let i = v.iter().position(pred)?;
                v.remove(i)
            }
            Ready::Priority(m) => {
                let key = m.iter().filter(|(_, e)| pred(e)).min_by_key(|(_, e)| e.offset).map(|(k, _)| *k)?;
                m.remove(&key)
            }
        }
    }
}

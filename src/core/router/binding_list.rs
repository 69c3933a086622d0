//! The bindings at one place of an exchange (a topic-trie node, a direct exchange's key, a
//! fanout or headers exchange's list), with an index by destination once there are many,
//! so that adding or removing one binding costs the same beside ten others or a million
//! (every device of a fleet subscribing to one broadcast topic: without it each
//! subscription scanned all the earlier ones, under the routing table's lock).

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use ferrymq_storage::QueueId;

use super::exchange::{Binding, Destination};
use crate::core::value::Value;

/// Lists up to this long are searched; longer ones are indexed.
const INDEX_FROM: usize = 32;

/// A destination as an index key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum DestKey {
    /// A session, by its link's address (sessions compare by identity).
    Session(usize),
    Queue(QueueId),
    Exchange(String),
    Member(Arc<str>),
}

impl DestKey {
    fn of(dest: &Destination) -> DestKey {
        match dest {
            Destination::Session(link) => DestKey::Session(Arc::as_ptr(link) as usize),
            Destination::Queue(id) => DestKey::Queue(*id),
            Destination::Exchange(name) => DestKey::Exchange(name.clone()),
            Destination::Member(name) => DestKey::Member(name.clone()),
        }
    }
}

/// Where in the list a destination's bindings are (nearly always one).
#[derive(Debug)]
enum Positions {
    One(u32),
    Many(Vec<u32>),
}

impl Positions {
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let (one, many) = match self {
            Positions::One(p) => (Some(*p as usize), None),
            Positions::Many(ps) => (None, Some(ps.iter().map(|p| *p as usize))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    fn add(&mut self, at: u32) {
        match self {
            Positions::One(p) => *self = Positions::Many(vec![*p, at]),
            Positions::Many(ps) => ps.push(at),
        }
    }

    /// Replaces `from` by `to`; removes it when `to` is `None`. True when none is left.
    fn replace(&mut self, from: u32, to: Option<u32>) -> bool {
        match (&mut *self, to) {
            (Positions::One(p), Some(to)) if *p == from => *p = to,
            (Positions::One(p), None) if *p == from => return true,
            (Positions::Many(ps), to) => {
                if let Some(i) = ps.iter().position(|p| *p == from) {
                    match to {
                        Some(to) => ps[i] = to,
                        None => {
                            ps.swap_remove(i);
                        }
                    }
                }
                return ps.is_empty();
            }
            _ => {}
        }
        false
    }
}

/// Bindings in the order they were made (until one is removed from a long list, which
/// moves the last one into its place), indexed by destination past [`INDEX_FROM`].
#[derive(Debug, Default)]
pub(super) struct BindingList {
    list: Vec<Binding>,
    // Boxed: one pointer in each of a million topic nodes that never need an index, where a
    // bare map would be six words.
    #[allow(clippy::box_collection)]
    index: Option<Box<HashMap<DestKey, Positions>>>,
}

impl Deref for BindingList {
    type Target = [Binding];

    fn deref(&self) -> &[Binding] {
        &self.list
    }
}

impl BindingList {
    /// Where the binding (dest, key, args) is.
    fn find(&self, dest: &Destination, key: &str, args: &[(String, Value)]) -> Option<usize> {
        match &self.index {
            None => self.list.iter().position(|b| b.same(dest, key, args)),
            Some(index) => index.get(&DestKey::of(dest))?.iter().find(|i| self.list[*i].same(dest, key, args)),
        }
    }

    /// Adds `b`, or replaces the binding of the same identity; true if it is new.
    pub(super) fn upsert(&mut self, b: Binding) -> bool {
        if let Some(i) = self.find(&b.dest, &b.key, &b.args) {
            self.list[i] = b;
            return false;
        }
        let at = self.list.len() as u32;
        if let Some(index) = self.index.as_mut() {
            match index.get_mut(&DestKey::of(&b.dest)) {
                Some(positions) => positions.add(at),
                None => {
                    index.insert(DestKey::of(&b.dest), Positions::One(at));
                }
            }
        }
        self.list.push(b);
        if self.index.is_none() && self.list.len() > INDEX_FROM {
            self.rebuild_index();
        }
        true
    }

    /// Removes the binding (dest, key, args), if there is one.
    pub(super) fn remove_one(&mut self, dest: &Destination, key: &str, args: &[(String, Value)]) -> Option<Binding> {
        let i = self.find(dest, key, args)?;
        let Some(index) = self.index.as_mut() else {
            // A short list keeps its order.
            return Some(self.list.remove(i));
        };
        let last = self.list.len() - 1;
        let gone = DestKey::of(dest);
        if index.get_mut(&gone).is_some_and(|p| p.replace(i as u32, None)) {
            index.remove(&gone);
        }
        if i != last {
            let moved = DestKey::of(&self.list[last].dest);
            if let Some(p) = index.get_mut(&moved) {
                p.replace(last as u32, Some(i as u32));
            }
        }
        Some(self.list.swap_remove(i))
    }

    /// Removes the bindings `pred` selects; returns how many.
    pub(super) fn retain_count(&mut self, pred: &dyn Fn(&Binding) -> bool) -> usize {
        let before = self.list.len();
        self.list.retain(|b| !pred(b));
        let removed = before - self.list.len();
        if removed > 0 && self.index.is_some() {
            self.rebuild_index();
        }
        removed
    }

    fn rebuild_index(&mut self) {
        if self.list.len() <= INDEX_FROM {
            self.index = None;
            return;
        }
        let mut index: HashMap<DestKey, Positions> = HashMap::with_capacity(self.list.len());
        for (i, b) in self.list.iter().enumerate() {
            match index.get_mut(&DestKey::of(&b.dest)) {
                Some(p) => p.add(i as u32),
                None => {
                    index.insert(DestKey::of(&b.dest), Positions::One(i as u32));
                }
            }
        }
        self.index = Some(Box::new(index));
    }

    /// A copy of every binding.
    pub(super) fn to_vec(&self) -> Vec<Binding> {
        self.list.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(id: u64, key: &str) -> Binding {
        Binding::queue(QueueId(id), key, vec![])
    }

    fn ids(l: &BindingList) -> Vec<u64> {
        let mut ids: Vec<u64> = l
            .iter()
            .map(|b| match b.dest {
                Destination::Queue(id) => id.0,
                _ => unreachable!(),
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_long_list_is_indexed_and_stays_right_through_adds_replaces_and_removals() {
        let mut l = BindingList::default();
        for id in 0..1000 {
            assert!(l.upsert(q(id, "k")));
        }
        assert!(l.index.is_some());
        // The same identity replaces; another key for the same queue is a second binding.
        assert!(!l.upsert(q(7, "k")));
        assert!(l.upsert(q(7, "other")));
        assert_eq!(l.len(), 1001);
        for id in (0..1000).step_by(3) {
            assert!(l.remove_one(&Destination::Queue(QueueId(id)), "k", &[]).is_some(), "{id}");
            assert!(l.remove_one(&Destination::Queue(QueueId(id)), "k", &[]).is_none(), "{id} twice");
        }
        assert!(l.remove_one(&Destination::Queue(QueueId(7)), "other", &[]).is_some());
        let expected: Vec<u64> = (0..1000).filter(|id| id % 3 != 0).collect();
        assert_eq!(ids(&l), expected);
        // Every one left is still found through the index.
        for id in &expected {
            assert!(l.find(&Destination::Queue(QueueId(*id)), "k", &[]).is_some(), "{id}");
        }
        assert_eq!(l.retain_count(&|b| matches!(b.dest, Destination::Queue(QueueId(id)) if id >= 30)), 646);
        assert!(l.index.is_none(), "short again: searched");
        assert!(l.remove_one(&Destination::Queue(QueueId(29)), "k", &[]).is_some());
        assert_eq!(ids(&l), (0..29).filter(|id| id % 3 != 0).collect::<Vec<_>>());
    }

    #[test]
    fn a_short_list_keeps_its_order_when_one_is_removed() {
        let mut l = BindingList::default();
        for id in 0..5 {
            l.upsert(q(id, "k"));
        }
        l.remove_one(&Destination::Queue(QueueId(1)), "k", &[]);
        let order: Vec<String> = l.iter().map(|b| format!("{:?}", b.dest)).collect();
        assert_eq!(order.len(), 4);
        assert!(order[0].contains("QueueId(0)") && order[1].contains("QueueId(2)") && order[3].contains("QueueId(4)"));
    }
}

//! Queue-level de-duplication (`x-message-deduplication: true`): which
//! `x-deduplication-header` values the queue holds now, so that a message whose value is
//! already in the queue is not enqueued. A value leaves with its entry (ack, drop,
//! expiry, dead-lettering, purge).

use std::collections::HashMap;

/// The header values of a queue's live entries.
#[derive(Debug, Default)]
pub(super) struct DedupIndex {
    by_value: HashMap<String, u64>,
    by_offset: HashMap<u64, String>,
}

impl DedupIndex {
    /// True when an entry with `value` is in the queue.
    pub(super) fn contains(&self, value: &str) -> bool {
        self.by_value.contains_key(value)
    }

    /// Records the entry at `offset` as holding `value`.
    pub(super) fn insert(&mut self, offset: u64, value: String) {
        self.by_offset.insert(offset, value.clone());
        self.by_value.insert(value, offset);
    }

    /// The entry at `offset` left the queue.
    pub(super) fn remove(&mut self, offset: u64) {
        if let Some(value) = self.by_offset.remove(&offset) {
            if self.by_value.get(&value) == Some(&offset) {
                self.by_value.remove(&value);
            }
        }
    }

    /// Keeps only the entries `keep` says stay (a purge keeps the unacked ones).
    pub(super) fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        self.by_offset.retain(|o, _| keep(*o));
        self.by_value.retain(|_, o| keep(*o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_leave_with_their_entries() {
        let mut d = DedupIndex::default();
        d.insert(1, "a".into());
        d.insert(2, "b".into());
        assert!(d.contains("a") && d.contains("b"));
        d.remove(1);
        assert!(!d.contains("a"));
        d.remove(7);
        assert!(d.contains("b"), "removing an unknown offset changes nothing");
        d.insert(3, "c".into());
        d.retain(|o| o == 3);
        assert!(!d.contains("b") && d.contains("c"));
    }
}

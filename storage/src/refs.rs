//! Per-segment reference counts: how many queue pointers, retained entries and timers
//! point into each segment. Owned by the writer thread; rebuilt from sled at open.

use std::collections::{BTreeMap, HashMap};

/// Live references per segment base.
#[derive(Debug, Default, Clone)]
pub(crate) struct RefCounts {
    counts: HashMap<u64, u64>,
    /// The net change per segment since the last [`RefCounts::open_batch`], a segment once
    /// (a batch touches one or two: a fan-out's thousands of pointers are one entry, not a
    /// record each); `None` before the first, so that counting at open records nothing.
    undo: Option<BTreeMap<u64, i64>>,
}

impl PartialEq for RefCounts {
    fn eq(&self, other: &RefCounts) -> bool {
        self.counts == other.counts
    }
}

impl Eq for RefCounts {}

impl RefCounts {
    /// One more reference into the segment at `base`.
    pub(crate) fn inc(&mut self, base: u64) {
        *self.counts.entry(base).or_insert(0) += 1;
        if let Some(undo) = &mut self.undo {
            *undo.entry(base).or_insert(0) += 1;
        }
    }

    /// One reference fewer into the segment at `base`.
    pub(crate) fn dec(&mut self, base: u64) {
        match self.counts.get_mut(&base) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.counts.remove(&base);
            }
            None => {
                tracing::warn!(segment = base, "reference count underflow (ignored)");
                return;
            }
        }
        if let Some(undo) = &mut self.undo {
            *undo.entry(base).or_insert(0) -= 1;
        }
    }

    /// Starts recording changes, so that [`RefCounts::undo_batch`] can take them back.
    pub(crate) fn open_batch(&mut self) {
        match &mut self.undo {
            Some(undo) => undo.clear(),
            None => self.undo = Some(BTreeMap::new()),
        }
    }

    /// Keeps the changes since [`RefCounts::open_batch`].
    pub(crate) fn commit_batch(&mut self) {
        if let Some(undo) = &mut self.undo {
            undo.clear();
        }
    }

    /// Takes back every change since [`RefCounts::open_batch`].
    pub(crate) fn undo_batch(&mut self) {
        let Some(mut undo) = self.undo.take() else { return };
        for (&base, &delta) in &undo {
            let n = self.counts.get(&base).copied().unwrap_or(0) as i64 - delta;
            if n > 0 {
                self.counts.insert(base, n as u64);
            } else {
                self.counts.remove(&base);
            }
        }
        undo.clear();
        self.undo = Some(undo);
    }

    /// The segments changed since [`RefCounts::open_batch`], each once.
    pub(crate) fn touched(&self) -> Vec<u64> {
        self.undo.iter().flat_map(|undo| undo.keys().copied()).collect()
    }

    /// References into the segment at `base`.
    pub(crate) fn get(&self, base: u64) -> u64 {
        self.counts.get(&base).copied().unwrap_or(0)
    }

    /// (segment base, count) of every referenced segment.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts.iter().map(|(b, n)| (*b, *n))
    }

    /// Counts as given (a checkpoint's).
    pub(crate) fn from_pairs(pairs: impl IntoIterator<Item = (u64, u64)>) -> RefCounts {
        RefCounts { counts: pairs.into_iter().filter(|(_, n)| *n > 0).collect(), undo: None }
    }

    /// Forgets a deleted segment.
    pub(crate) fn forget(&mut self, base: u64) {
        self.counts.remove(&base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let mut r = RefCounts::default();
        r.inc(0);
        r.inc(0);
        r.inc(100);
        r.dec(0);
        assert_eq!(r.get(0), 1);
        r.dec(0);
        r.dec(0); // underflow is ignored
        assert_eq!(r.get(0), 0);
        assert_eq!(r.get(100), 1);
        r.forget(100);
        assert_eq!(r.get(100), 0);
    }

    #[test]
    fn a_batch_is_undone_exactly() {
        let mut r = RefCounts::default();
        r.inc(0);
        r.inc(7);
        let before = r.clone();
        r.open_batch();
        r.inc(0);
        r.dec(7);
        r.dec(7); // underflow: not recorded
        r.inc(9);
        r.inc(9);
        r.dec(9);
        assert_eq!(r.touched(), vec![0, 7, 9]);
        r.undo_batch();
        assert_eq!(r, before);
        assert_eq!(r.touched(), Vec::<u64>::new());
        assert_eq!((r.get(0), r.get(7), r.get(9)), (1, 1, 0));
        r.open_batch();
        r.inc(9);
        r.commit_batch();
        r.undo_batch();
        assert_eq!(r.get(9), 1, "a committed batch stays");
    }
}

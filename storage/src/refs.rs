//! Per-segment reference counts: how many queue pointers, retained entries and timers
//! point into each segment. Owned by the writer thread; rebuilt from sled at open.

use std::collections::HashMap;

/// Live references per segment base.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RefCounts {
    counts: HashMap<u64, u64>,
}

impl RefCounts {
    /// One more reference into the segment at `base`.
    pub(crate) fn inc(&mut self, base: u64) {
        *self.counts.entry(base).or_insert(0) += 1;
    }

    /// One reference fewer into the segment at `base`.
    pub(crate) fn dec(&mut self, base: u64) {
        match self.counts.get_mut(&base) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.counts.remove(&base);
            }
            None => tracing::warn!(segment = base, "reference count underflow (ignored)"),
        }
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
        RefCounts { counts: pairs.into_iter().filter(|(_, n)| *n > 0).collect() }
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
}

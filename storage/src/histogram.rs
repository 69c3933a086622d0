//! Fixed-bucket histograms the writer fills as it works (one relaxed add per observation,
//! on the writer thread), read by monitoring through [`HistogramSnapshot`]s.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the commit-log fdatasync latency buckets, microseconds.
pub const FSYNC_MICROS: &[u64] =
    &[50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];

/// Upper bounds of the group-commit size buckets, submissions per batch.
pub const BATCH_SUBMISSIONS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Counts per bucket (the last one past every bound) and the sum of the values.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [u64],
    counts: Vec<AtomicU64>,
    sum: AtomicU64,
}

impl Histogram {
    /// Empty, with buckets up to each of `bounds` and one past them.
    pub(crate) fn new(bounds: &'static [u64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum: AtomicU64::new(0) }
    }

    /// Counts one value.
    pub(crate) fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds.to_vec(),
            counts: self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Upper bound of each bucket but the last (which takes everything above).
    pub bounds: Vec<u64>,
    /// Values per bucket (`bounds.len() + 1` of them), not cumulative.
    pub counts: Vec<u64>,
    /// Sum of every value counted.
    pub sum: u64,
}

impl HistogramSnapshot {
    /// Values counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fall_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let h = Histogram::new(&[1, 10]);
        for v in [0, 1, 2, 10, 11, 1000] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.counts, [2, 2, 2]);
        assert_eq!((s.sum, s.count()), (1024, 6));
    }
}

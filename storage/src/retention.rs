//! Retention policy: which closed, unreferenced segments to delete. Pure decision logic;
//! the writer thread gathers the facts and deletes the chosen files.

use std::time::SystemTime;

use crate::Retention;

/// What retention needs to know about a closed segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Global position of its first record: the id [`select`] returns.
    pub(crate) base: u64,
    /// Bytes in the segment.
    pub(crate) len: u64,
    /// Live references into it.
    pub(crate) refs: u64,
    /// Last modification of the file, if known.
    pub(crate) modified: Option<SystemTime>,
}

/// Bases of the segments to delete. `closed` holds only closed segments (never the
/// active one), oldest first; `total_bytes` is the size of the whole log; `disk_need`
/// how many bytes the file system should give back: the larger of what it holds beyond
/// `max_disk_used_ratio` ([`disk_excess`]) and what it lacks to `min_disk_free_bytes`
/// ([`disk_shortfall`]). A segment is chosen only if nothing refers into it and it is
/// older than `max_age`, or the log (after the deletions chosen so far) is still larger
/// than `max_bytes`, or the deletions chosen so far free less than `disk_need`.
pub(crate) fn select(
    closed: &[Candidate],
    total_bytes: u64,
    retention: &Retention,
    now: SystemTime,
    disk_need: u64,
) -> Vec<u64> {
    let mut total = total_bytes;
    let mut freed = 0;
    let mut chosen = Vec::new();
    for c in closed.iter().filter(|c| c.refs == 0) {
        let too_old = match (retention.max_age, c.modified) {
            (Some(max_age), Some(m)) => now.duration_since(m).is_ok_and(|age| age >= max_age),
            _ => false,
        };
        let too_big = retention.max_bytes.is_some_and(|max| total > max);
        if too_old || too_big || freed < disk_need {
            chosen.push(c.base);
            total = total.saturating_sub(c.len);
            freed += c.len;
        }
    }
    chosen
}

/// Bytes the file system of `dir` uses beyond `ratio` of its size (0 when it is under
/// it, or its size cannot be read).
pub(crate) fn disk_excess(dir: &std::path::Path, ratio: f64) -> u64 {
    let (Ok(total), Ok(free)) = (fs4::total_space(dir), fs4::available_space(dir)) else { return 0 };
    let used = total.saturating_sub(free);
    used.saturating_sub((total as f64 * ratio) as u64)
}

/// Bytes the file system of `dir` lacks to have `min_free` bytes free (0 when it has them,
/// or its free space cannot be read).
pub(crate) fn disk_shortfall(dir: &std::path::Path, min_free: u64) -> u64 {
    fs4::available_space(dir).map_or(0, |free| min_free.saturating_sub(free))
}

/// Whether a closed segment `base..end` may go as far as recovery is concerned: every
/// effects record in it (the last of all ends at `effects_end`) is covered by the durable
/// checkpoint, so a crash would not replay it. A segment that ends in padding after its
/// last effects record (a segment rolled over while idle) qualifies once that record is
/// covered.
pub(crate) fn checkpoint_covers(base: u64, end: u64, checkpointed: u64, effects_end: u64) -> bool {
    base >= effects_end || end.min(effects_end) <= checkpointed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn c(base: u64, refs: u64, age_s: u64, now: SystemTime) -> Candidate {
        Candidate { base, len: 100, refs, modified: Some(now - Duration::from_secs(age_s)) }
    }

    #[test]
    fn selects_unreferenced_only() {
        let now = SystemTime::now();
        let closed = [c(0, 0, 50, now), c(100, 1, 40, now), c(200, 0, 30, now), c(300, 0, 5, now)];
        let none = Retention::default();
        assert!(select(&closed, 500, &none, now, 0).is_empty());
        let age = Retention { max_age: Some(Duration::from_secs(20)), ..Default::default() };
        assert_eq!(select(&closed, 500, &age, now, 0), vec![0, 200]);
        let bytes = Retention { max_bytes: Some(250), ..Default::default() };
        // 500 -> 400 (drop 0) -> skip 100 (referenced) -> 300 (drop 200) -> 200 (drop 300).
        assert_eq!(select(&closed, 500, &bytes, now, 0), vec![0, 200, 300]);
        let bytes = Retention { max_bytes: Some(400), ..Default::default() };
        assert_eq!(select(&closed, 500, &bytes, now, 0), vec![0]);
    }

    #[test]
    fn a_fuller_disk_than_the_ratio_deletes_the_oldest_unreferenced_segments_whatever_their_age() {
        let now = SystemTime::now();
        let closed = [c(0, 0, 5, now), c(100, 1, 4, now), c(200, 0, 3, now), c(300, 0, 2, now)];
        let ratio = Retention { max_disk_used_ratio: Some(0.75), ..Default::default() };
        assert!(select(&closed, 500, &ratio, now, 0).is_empty(), "under the ratio: nothing");
        assert_eq!(select(&closed, 500, &ratio, now, 1), vec![0], "one segment frees enough");
        // 150 bytes: the first frees 100, the referenced one is skipped, the next frees 100.
        assert_eq!(select(&closed, 500, &ratio, now, 150), vec![0, 200]);
        assert_eq!(select(&closed, 500, &ratio, now, 10_000), vec![0, 200, 300], "never a referenced one");
    }

    #[test]
    fn the_excess_of_a_file_system_is_zero_under_its_ratio() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(disk_excess(dir.path(), 1.0), 0, "no file system is fuller than full");
        assert!(disk_excess(dir.path(), 0.0) > 0, "the test's file system holds something");
    }

    #[test]
    fn the_shortfall_of_a_file_system_is_what_it_lacks_to_the_free_minimum() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(disk_shortfall(dir.path(), 0), 0);
        let free = fs4::available_space(dir.path()).unwrap();
        assert!(disk_shortfall(dir.path(), u64::MAX) >= u64::MAX - free, "no file system has that much free");
    }

    #[test]
    fn a_segment_goes_once_the_checkpoint_covers_its_effects_records() {
        // Effects records up to 500; the checkpoint at 300.
        assert!(checkpoint_covers(0, 300, 300, 500), "wholly before the checkpoint");
        assert!(!checkpoint_covers(200, 400, 300, 500), "an effects record past the checkpoint may be in it");
        assert!(checkpoint_covers(500, 600, 300, 500), "after the last effects record: none in it");
        // Rolled over while idle: it ends in padding after the last effects record (500).
        assert!(!checkpoint_covers(400, 512, 300, 500));
        assert!(checkpoint_covers(400, 512, 500, 500), "its last effects record is covered");
    }
}

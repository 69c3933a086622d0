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
/// active one), oldest first; `total_bytes` is the size of the whole log. A segment is
/// chosen only if nothing refers into it and it is older than `max_age`, or the log
/// (after the deletions chosen so far) is still larger than `max_bytes`.
pub(crate) fn select(closed: &[Candidate], total_bytes: u64, retention: &Retention, now: SystemTime) -> Vec<u64> {
    let mut total = total_bytes;
    let mut chosen = Vec::new();
    for c in closed.iter().filter(|c| c.refs == 0) {
        let too_old = match (retention.max_age, c.modified) {
            (Some(max_age), Some(m)) => now.duration_since(m).is_ok_and(|age| age >= max_age),
            _ => false,
        };
        let too_big = retention.max_bytes.is_some_and(|max| total > max);
        if too_old || too_big {
            chosen.push(c.base);
            total = total.saturating_sub(c.len);
        }
    }
    chosen
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
        assert!(select(&closed, 500, &none, now).is_empty());
        let age = Retention { max_age: Some(Duration::from_secs(20)), max_bytes: None };
        assert_eq!(select(&closed, 500, &age, now), vec![0, 200]);
        let bytes = Retention { max_age: None, max_bytes: Some(250) };
        // 500 -> 400 (drop 0) -> skip 100 (referenced) -> 300 (drop 200) -> 200 (drop 300).
        assert_eq!(select(&closed, 500, &bytes, now), vec![0, 200, 300]);
        let bytes = Retention { max_age: None, max_bytes: Some(400) };
        assert_eq!(select(&closed, 500, &bytes, now), vec![0]);
    }
}

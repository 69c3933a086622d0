//! Publisher de-duplication by message id within a time window: a repeated id of the same
//! scope (a virtual host) is confirmed but not routed again. Seen ids are written with the
//! message they came with (one journal submission), so the window survives restarts.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::warn;

use super::store::{DedupStore, StoreWrite};

/// The ids seen within the window, in memory and in the [`DedupStore`].
#[derive(Debug)]
pub struct Dedup {
    window_ms: u64,
    store: Arc<dyn DedupStore>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    seen: HashMap<(String, String), u64>,
    by_expiry: BTreeSet<(u64, String, String)>,
}

impl Dedup {
    /// A table with a window in milliseconds, loaded from `store`.
    pub fn load(store: Arc<dyn DedupStore>, window_ms: u64, now_ms: u64) -> Dedup {
        let mut state = State::default();
        match store.load(now_ms) {
            Ok(ids) => {
                for (scope, id, expiry) in ids {
                    state.by_expiry.insert((expiry, scope.clone(), id.clone()));
                    state.seen.insert((scope, id), expiry);
                }
            }
            Err(e) => warn!(error = %e, "cannot read de-duplication ids"),
        }
        Dedup { window_ms, store, state: Mutex::new(state) }
    }

    /// `None` if `id` was seen in `scope` within the window (a duplicate), else the write
    /// that records it (to be committed with the message).
    pub fn check(&self, scope: &str, id: &str, now_ms: u64) -> Option<StoreWrite> {
        let mut st = self.state.lock();
        let k = (scope.to_owned(), id.to_owned());
        if st.seen.get(&k).is_some_and(|exp| *exp > now_ms) {
            return None;
        }
        let expiry = now_ms + self.window_ms;
        if let Some(old) = st.seen.insert(k, expiry) {
            st.by_expiry.remove(&(old, scope.to_owned(), id.to_owned()));
        }
        st.by_expiry.insert((expiry, scope.to_owned(), id.to_owned()));
        Some(self.store.record(scope, id, expiry))
    }

    /// Forgets ids whose window passed at `now_ms`; returns the write that forgets them in
    /// the store.
    pub fn expire(&self, now_ms: u64) -> StoreWrite {
        let mut st = self.state.lock();
        let mut write = StoreWrite::none();
        while let Some(first) = st.by_expiry.first().cloned() {
            if first.0 > now_ms {
                break;
            }
            st.by_expiry.pop_first();
            st.seen.remove(&(first.1.clone(), first.2.clone()));
            write = write.and(self.store.forget(&first.1, &first.2));
        }
        write
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::test_support::{apply, open};

    #[test]
    fn duplicates_within_the_window_only() {
        let (_dir, journal, stores) = open();
        let d = Dedup::load(stores.dedup.clone(), 1000, 0);
        let write = d.check("/", "m1", 10).expect("first time");
        assert!(d.check("/", "m1", 500).is_none(), "duplicate");
        assert!(d.check("/other", "m1", 500).is_some(), "per scope");
        assert!(d.check("/", "m1", 2000).is_some(), "window passed");
        apply(&journal, write);
        let reloaded = Dedup::load(stores.dedup.clone(), 1000, 20);
        assert!(reloaded.check("/", "m1", 30).is_none(), "survives a reload");
    }

    #[test]
    fn expired_ids_are_forgotten_in_the_store() {
        let (_dir, journal, stores) = open();
        let d = Dedup::load(stores.dedup.clone(), 100, 0);
        apply(&journal, d.check("/", "a", 0).unwrap().and(d.check("/", "b", 50).unwrap()));
        assert!(d.expire(99).is_empty(), "nothing is due before the first expiry");
        apply(&journal, d.expire(100));
        assert!(d.check("/", "a", 101).is_some(), "a is forgotten");
        assert_eq!(stores.dedup.load(0).unwrap().len(), 1, "only b is left in the store");
    }
}

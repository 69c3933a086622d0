//! Publisher de-duplication by `message_id` (exactly-once publishing): within the window,
//! a repeated id from any publisher of the virtual host is confirmed but not routed again.
//! The ids are written to the journal with the message they came with (one submission), so
//! the table survives restarts.

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use ferrymq_storage::{Journal, Op, Space};
use parking_lot::Mutex;
use tracing::warn;

/// Key prefix of de-duplication records in the `meta` keyspace.
const PREFIX: u8 = b'd';

/// The de-duplication table.
#[derive(Debug)]
pub struct Dedup {
    window_ms: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    seen: HashMap<(String, String), u64>,
    by_expiry: BTreeSet<(u64, String, String)>,
}

fn key(vhost: &str, id: &str) -> Bytes {
    let mut k = vec![PREFIX, 0];
    k.extend_from_slice(vhost.as_bytes());
    k.push(0);
    k.extend_from_slice(id.as_bytes());
    Bytes::from(k)
}

impl Dedup {
    /// A table with a window in milliseconds, loaded from the journal.
    pub fn load(journal: &Journal, window_ms: u64, now_ms: u64) -> Dedup {
        let mut state = State::default();
        if let Ok(records) = journal.scan(Space::Meta, &[PREFIX, 0]) {
            for (k, v) in records {
                let Some(rest) = k.get(2..) else { continue };
                let mut parts = rest.splitn(2, |b| *b == 0);
                let (Some(vhost), Some(id)) = (parts.next(), parts.next()) else { continue };
                let Ok(expiry) = <[u8; 8]>::try_from(&v[..]).map(u64::from_be_bytes) else { continue };
                if expiry > now_ms {
                    let (vhost, id) =
                        (String::from_utf8_lossy(vhost).into_owned(), String::from_utf8_lossy(id).into_owned());
                    state.by_expiry.insert((expiry, vhost.clone(), id.clone()));
                    state.seen.insert((vhost, id), expiry);
                }
            }
        }
        Dedup { window_ms, state: Mutex::new(state) }
    }

    /// `None` if `id` was seen within the window (a duplicate), else the journal op that
    /// records it (to be written with the message).
    pub fn check(&self, vhost: &str, id: &str, now_ms: u64) -> Option<Op> {
        let mut st = self.state.lock();
        let k = (vhost.to_owned(), id.to_owned());
        if st.seen.get(&k).is_some_and(|exp| *exp > now_ms) {
            return None;
        }
        let expiry = now_ms + self.window_ms;
        if let Some(old) = st.seen.insert(k, expiry) {
            st.by_expiry.remove(&(old, vhost.to_owned(), id.to_owned()));
        }
        st.by_expiry.insert((expiry, vhost.to_owned(), id.to_owned()));
        Some(Op::Put { space: Space::Meta, key: key(vhost, id), value: Bytes::copy_from_slice(&expiry.to_be_bytes()) })
    }

    /// Forgets ids whose window passed (also in the journal).
    pub async fn expire(&self, journal: &Journal, now_ms: u64) {
        let ops: Vec<Op> = {
            let mut st = self.state.lock();
            let mut ops = Vec::new();
            while let Some(first) = st.by_expiry.first().cloned() {
                if first.0 > now_ms {
                    break;
                }
                st.by_expiry.pop_first();
                st.seen.remove(&(first.1.clone(), first.2.clone()));
                ops.push(Op::Delete { space: Space::Meta, key: key(&first.1, &first.2) });
            }
            ops
        };
        if !ops.is_empty() {
            if let Err(e) = journal.submit_relaxed(ops, None).await {
                warn!(error = %e, "cannot expire de-duplication records");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_within_the_window_only() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(ferrymq_storage::JournalConfig::new(dir.path())).unwrap();
        let d = Dedup::load(&journal, 1000, 0);
        let op = d.check("/", "m1", 10).expect("first time");
        assert!(d.check("/", "m1", 500).is_none(), "duplicate");
        assert!(d.check("/other", "m1", 500).is_some(), "per vhost");
        assert!(d.check("/", "m1", 2000).is_some(), "window passed");
        journal.write_blocking(vec![op]).unwrap();
        let reloaded = Dedup::load(&journal, 1000, 20);
        assert!(reloaded.check("/", "m1", 30).is_none(), "survives a reload");
    }
}

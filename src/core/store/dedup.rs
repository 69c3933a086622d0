//! Publisher de-duplication ids and when each stops counting as seen.
//!
//! Layout of the local implementation: `Space::Meta` keys `d\0{scope}\0{id}` with the
//! expiry (ms since the epoch, u64 BE) as value.

use std::fmt;

use bytes::Bytes;
use ferrymq_storage::{Op, Space};

use super::{JournalStore, StoreError, StoreWrite};

/// Key prefix of de-duplication records in the `meta` keyspace.
const PREFIX: u8 = b'd';

/// De-duplication ids by scope (the scope says whose ids they are, e.g. a virtual host).
pub trait DedupStore: fmt::Debug + Send + Sync {
    /// Every stored `(scope, id, expiry ms)` that has not expired at `now_ms`.
    fn load(&self, now_ms: u64) -> Result<Vec<(String, String, u64)>, StoreError>;

    /// Records `id` of `scope` as seen until `expiry_ms`.
    fn record(&self, scope: &str, id: &str, expiry_ms: u64) -> StoreWrite;

    /// Forgets `id` of `scope`.
    fn forget(&self, scope: &str, id: &str) -> StoreWrite;
}

fn key(scope: &str, id: &str) -> Bytes {
    let mut k = vec![PREFIX, 0];
    k.extend_from_slice(scope.as_bytes());
    k.push(0);
    k.extend_from_slice(id.as_bytes());
    Bytes::from(k)
}

impl DedupStore for JournalStore {
    fn load(&self, now_ms: u64) -> Result<Vec<(String, String, u64)>, StoreError> {
        let mut ids = Vec::new();
        for (k, v) in self.journal.scan(Space::Meta, &[PREFIX, 0])? {
            let Some(rest) = k.get(2..) else { continue };
            let mut parts = rest.splitn(2, |b| *b == 0);
            let (Some(scope), Some(id)) = (parts.next(), parts.next()) else { continue };
            let Ok(expiry) = <[u8; 8]>::try_from(&v[..]).map(u64::from_be_bytes) else { continue };
            if expiry > now_ms {
                ids.push((
                    String::from_utf8_lossy(scope).into_owned(),
                    String::from_utf8_lossy(id).into_owned(),
                    expiry,
                ));
            }
        }
        Ok(ids)
    }

    fn record(&self, scope: &str, id: &str, expiry_ms: u64) -> StoreWrite {
        let value = Bytes::copy_from_slice(&expiry_ms.to_be_bytes());
        StoreWrite::of(vec![Op::Put { space: Space::Meta, key: key(scope, id), value }])
    }

    fn forget(&self, scope: &str, id: &str) -> StoreWrite {
        StoreWrite::of(vec![Op::Delete { space: Space::Meta, key: key(scope, id) }])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{apply, open};

    #[test]
    fn ids_round_trip_until_they_expire() {
        let (_dir, journal, stores) = open();
        let d = &stores.dedup;
        apply(&journal, d.record("/", "m1", 100).and(d.record("/v", "m1", 200)).and(d.record("/", "m2", 50)));
        let mut ids = d.load(60).unwrap();
        ids.sort();
        assert_eq!(ids, vec![("/".into(), "m1".into(), 100), ("/v".into(), "m1".into(), 200)]);
        apply(&journal, d.forget("/", "m1"));
        assert_eq!(d.load(0).unwrap().len(), 2, "m2 and /v's m1 are left");
    }
}

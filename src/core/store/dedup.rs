//! De-duplication values of disk-persistent `x-message-deduplication` exchanges, and
//! when each leaves its exchange's cache.
//!
//! Layout of the local implementation: `Space::Meta` keys `d\0{scope}\0{id}` with the
//! expiry (ms since the epoch, u64 BE) as value.

use std::fmt;

use bytes::Bytes;
use ferrymq_storage::{Op, Space};

use super::{JournalStore, StoreWrite};
use crate::core::restore::{RecordKey, RecordKind, RestoreError};

/// Key prefix of de-duplication records in the `meta` keyspace.
const PREFIX: u8 = b'd';

/// De-duplication values by scope (the scope says whose they are: one exchange).
pub trait DedupStore: fmt::Debug + Send + Sync {
    /// Every stored `(scope, id, expiry ms)`, expired or not; a record that cannot be read
    /// or decoded is the error.
    fn load(&self) -> Result<Vec<(String, String, u64)>, RestoreError>;

    /// Records `id` of `scope` as seen until `expiry_ms`.
    fn record(&self, scope: &str, id: &str, expiry_ms: u64) -> StoreWrite;

    /// Forgets `id` of `scope`.
    fn forget(&self, scope: &str, id: &str) -> StoreWrite;

    /// Forgets every value of `scope`.
    fn forget_scope(&self, scope: &str) -> StoreWrite;
}

fn key(scope: &str, id: &str) -> Bytes {
    let mut k = vec![PREFIX, 0];
    k.extend_from_slice(scope.as_bytes());
    k.push(0);
    k.extend_from_slice(id.as_bytes());
    Bytes::from(k)
}

impl DedupStore for JournalStore {
    fn load(&self) -> Result<Vec<(String, String, u64)>, RestoreError> {
        let kind = RecordKind::DedupValue;
        let records =
            self.journal.scan(Space::Meta, &[PREFIX, 0]).map_err(|e| RestoreError::unreadable(kind, &[PREFIX], e))?;
        let mut ids = Vec::with_capacity(records.len());
        for (k, v) in records {
            let undecodable = |reason: &str| RestoreError::undecodable(kind, RecordKey::bytes(&k), reason);
            let mut parts = k[2..].splitn(2, |b| *b == 0);
            let (Some(scope), Some(id)) = (parts.next(), parts.next()) else {
                return Err(undecodable("the key is not a scope and a value"));
            };
            let expiry = <[u8; 8]>::try_from(&v[..])
                .map(u64::from_be_bytes)
                .map_err(|_| undecodable("the expiry is not 8 bytes"))?;
            ids.push((String::from_utf8_lossy(scope).into_owned(), String::from_utf8_lossy(id).into_owned(), expiry));
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

    fn forget_scope(&self, scope: &str) -> StoreWrite {
        StoreWrite::of(vec![Op::DeletePrefix { space: Space::Meta, prefix: key(scope, "") }])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{apply, open};

    #[test]
    fn values_round_trip_and_leave_by_id_or_scope() {
        let (_dir, journal, stores) = open();
        let d = &stores.dedup;
        apply(
            &journal,
            d.record("x1:/a", "m1", 100).and(d.record("x1:/ab", "m1", 200)).and(d.record("x1:/a", "m2", 50)),
        );
        let mut ids = d.load().unwrap();
        ids.sort();
        assert_eq!(
            ids,
            vec![
                ("x1:/a".into(), "m1".into(), 100),
                ("x1:/a".into(), "m2".into(), 50),
                ("x1:/ab".into(), "m1".into(), 200)
            ]
        );
        apply(&journal, d.forget("x1:/a", "m1"));
        assert_eq!(d.load().unwrap().len(), 2);
        apply(&journal, d.forget_scope("x1:/a"));
        assert_eq!(d.load().unwrap(), vec![("x1:/ab".into(), "m1".into(), 200)], "a scope's prefix is exact");
    }
}

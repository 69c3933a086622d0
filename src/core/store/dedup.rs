//! De-duplication values of disk-persistent `x-message-deduplication` exchanges, and
//! when each leaves its exchange's cache.
//!
//! Layout of the local implementation: `Space::Meta` keys `d\0{scope}\0{id}` with the
//! expiry (ms since the epoch, u64 BE) as value.

use std::fmt;

use bytes::Bytes;
use ferrymq_storage::{Op, Space};
use futures_util::future::BoxFuture;

use super::{JournalStore, StoreWrite};
use crate::core::restore::{RecordKey, RecordKind, RestoreError};

/// Key prefix of de-duplication records in the `meta` keyspace.
const PREFIX: u8 = b'd';

/// A stored de-duplication value: its scope, the value, and its expiry (ms since the epoch).
pub type DedupRecord = (String, String, u64);

/// A change to the de-duplication values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupCommand {
    /// `id` of `scope` is recorded as seen until `expiry_ms`.
    Record {
        /// Whose value (one exchange).
        scope: String,
        /// The value.
        id: String,
        /// When it leaves the cache, ms since the epoch.
        expiry_ms: u64,
    },
    /// `id` of `scope` is forgotten.
    Forget {
        /// Whose value.
        scope: String,
        /// The value.
        id: String,
    },
    /// Every value of `scope` is forgotten.
    ForgetScope {
        /// Whose values.
        scope: String,
    },
}

/// De-duplication values by scope (the scope says whose they are: one exchange).
pub trait DedupStore: fmt::Debug + Send + Sync {
    /// Every stored `(scope, id, expiry ms)`, expired or not; a record that cannot be read
    /// or decoded is the error.
    fn load(&self) -> BoxFuture<'_, Result<Vec<DedupRecord>, RestoreError>>;

    /// Records `id` of `scope` as seen until `expiry_ms`.
    fn record(&self, scope: &str, id: &str, expiry_ms: u64) -> StoreWrite {
        StoreWrite::one(DedupCommand::Record { scope: scope.to_owned(), id: id.to_owned(), expiry_ms })
    }

    /// Forgets `id` of `scope`.
    fn forget(&self, scope: &str, id: &str) -> StoreWrite {
        StoreWrite::one(DedupCommand::Forget { scope: scope.to_owned(), id: id.to_owned() })
    }

    /// Forgets every value of `scope`.
    fn forget_scope(&self, scope: &str) -> StoreWrite {
        StoreWrite::one(DedupCommand::ForgetScope { scope: scope.to_owned() })
    }
}

/// The journal operations of a de-duplication command (the local state machine's half).
pub(super) fn ops(command: &DedupCommand) -> Vec<Op> {
    match command {
        DedupCommand::Record { scope, id, expiry_ms } => {
            let value = Bytes::copy_from_slice(&expiry_ms.to_be_bytes());
            vec![Op::Put { space: Space::Meta, key: key(scope, id), value }]
        }
        DedupCommand::Forget { scope, id } => vec![Op::Delete { space: Space::Meta, key: key(scope, id) }],
        DedupCommand::ForgetScope { scope } => {
            vec![Op::DeletePrefix { space: Space::Meta, prefix: key(scope, "") }]
        }
    }
}

fn key(scope: &str, id: &str) -> Bytes {
    let mut k = vec![PREFIX, 0];
    k.extend_from_slice(scope.as_bytes());
    k.push(0);
    k.extend_from_slice(id.as_bytes());
    Bytes::from(k)
}

impl DedupStore for JournalStore {
    fn load(&self) -> BoxFuture<'_, Result<Vec<DedupRecord>, RestoreError>> {
        let kind = RecordKind::DedupValue;
        let scan = self.scan(Space::Meta, Bytes::from_static(&[PREFIX, 0]));
        Box::pin(async move {
            let records = scan.await.map_err(|e| RestoreError::unreadable(kind, &[PREFIX], e))?;
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
                ids.push((
                    String::from_utf8_lossy(scope).into_owned(),
                    String::from_utf8_lossy(id).into_owned(),
                    expiry,
                ));
            }
            Ok(ids)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{apply, open, read};

    #[test]
    fn values_round_trip_and_leave_by_id_or_scope() {
        let (_dir, journal, stores) = open();
        let d = &stores.dedup;
        apply(
            &journal,
            d.record("x1:/a", "m1", 100).and(d.record("x1:/ab", "m1", 200)).and(d.record("x1:/a", "m2", 50)),
        );
        let mut ids = read(d.load()).unwrap();
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
        assert_eq!(read(d.load()).unwrap().len(), 2);
        apply(&journal, d.forget_scope("x1:/a"));
        assert_eq!(read(d.load()).unwrap(), vec![("x1:/ab".into(), "m1".into(), 200)], "a scope's prefix is exact");
    }
}

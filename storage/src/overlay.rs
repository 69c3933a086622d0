//! The pending changes of one group commit to one sled tree. Lookups see the changes
//! made earlier in the same batch; at the end the changes become a single
//! [`sled::Batch`], applied atomically with `apply_batch`.

use std::collections::BTreeMap;
use std::ops::Bound;

use sled::{Batch, IVec, Tree};

/// Pending inserts (`Some`) and removals (`None`) of one tree.
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    changes: BTreeMap<IVec, Option<IVec>>,
}

impl Overlay {
    /// The current value of `key`: the pending change if any, else what the tree holds.
    pub(crate) fn get(&self, tree: &Tree, key: &[u8]) -> sled::Result<Option<IVec>> {
        match self.changes.get(key) {
            Some(v) => Ok(v.clone()),
            None => tree.get(key),
        }
    }

    /// Sets `key` to `value`.
    pub(crate) fn insert(&mut self, key: impl Into<IVec>, value: impl Into<IVec>) {
        self.changes.insert(key.into(), Some(value.into()));
    }

    /// Removes `key`.
    pub(crate) fn remove(&mut self, key: impl Into<IVec>) {
        self.changes.insert(key.into(), None);
    }

    /// The pending change of `key`, if any (`Some(None)`: removed).
    pub(crate) fn change(&self, key: &[u8]) -> Option<Option<IVec>> {
        self.changes.get(key).cloned()
    }

    /// The pending changes of keys starting with `prefix`, in key order (`None`: removed).
    pub(crate) fn changes_with_prefix(&self, prefix: &[u8]) -> Vec<(IVec, Option<IVec>)> {
        self.changes
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Lays `changes` over this overlay's (later changes win).
    pub(crate) fn merge(&mut self, changes: BTreeMap<IVec, Option<IVec>>) {
        self.changes.extend(changes);
    }

    /// Takes the changes out (in key order).
    pub(crate) fn take(&mut self) -> BTreeMap<IVec, Option<IVec>> {
        std::mem::take(&mut self.changes)
    }

    /// The pending changes in key order (`None`: removed).
    pub(crate) fn changes(&self) -> impl Iterator<Item = (&IVec, &Option<IVec>)> {
        self.changes.iter()
    }

    /// Whether there is nothing to apply.
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Applies the changes to `tree` atomically and clears them.
    pub(crate) fn apply(&mut self, tree: &Tree) -> sled::Result<()> {
        if self.changes.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::default();
        for (k, v) in &self.changes {
            match v {
                Some(v) => batch.insert(k.clone(), v.clone()),
                None => batch.remove(k.clone()),
            }
        }
        // Kept if it fails: readers still see the changes, the store is opened again.
        tree.apply_batch(batch)?;
        self.changes.clear();
        Ok(())
    }

    /// Drops the changes.
    pub(crate) fn clear(&mut self) {
        self.changes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_merges_pending_and_stored() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let t = db.open_tree("t").unwrap();
        t.insert(b"a1", b"x").unwrap();
        t.insert(b"a2", b"y").unwrap();
        t.insert(b"b1", b"z").unwrap();
        let mut o = Overlay::default();
        o.insert(&b"a3"[..], &b"w"[..]);
        o.remove(&b"a2"[..]);
        assert_eq!(o.get(&t, b"a3").unwrap().as_deref(), Some(&b"w"[..]));
        assert_eq!(o.get(&t, b"a2").unwrap(), None);
        assert_eq!(o.get(&t, b"a1").unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(o.changes_with_prefix(b"a").len(), 2);
        assert_eq!(o.changes_with_prefix(b"b"), vec![]);
        o.remove(&b"a1"[..]);
        o.remove(&b"a3"[..]);
        o.insert(&b"a4"[..], &b"v"[..]);
        assert_eq!(o.change(b"a2"), Some(None));
        o.remove(&b"a4"[..]);
        o.remove(&b"b1"[..]);
        o.insert(&b"a5"[..], &b"v"[..]);
        o.apply(&t).unwrap();
        assert!(o.is_empty());
        let keys: Vec<IVec> = t.iter().keys().map(|k| k.unwrap()).collect();
        assert_eq!(keys, vec![IVec::from(&b"a5"[..])]);
    }
}

//! A map keyed by packet id with a cheap multiplicative hash (packet ids are not
//! attacker-chosen hash-flooding material: at most 65,535 distinct keys exist).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for `u16` keys.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
        self.0 = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u16(&mut self, n: u16) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Map from packet id (or topic alias) to `V`.
pub type IdMap<V> = HashMap<u16, V, BuildHasherDefault<IdHasher>>;

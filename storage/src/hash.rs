//! The stable hash of the key index.

/// FNV-1a (64-bit) over `parts` as if concatenated: the stable hash of the key index, and
/// the base of the broker's stable hashes. Part of the on-disk format: never change it.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

//! The ballast: a file of reserved (allocated, not sparse) space in the data directory, so
//! that a journal whose file system filled up can still be opened. [`Journal::open`]
//! deletes it when the file system has less free space than its size (sled and the commit
//! log need some to open and recover; consumers then drain and retention deletes what
//! nothing points into). While running, the writer gives it up as soon as the file system
//! has less free space than half its size or a commit-log write runs out of space (another
//! process took the space: sled keeps room for its own writes), and makes it again once
//! there is room for twice its size.
//!
//! [`Journal::open`]: crate::Journal::open

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};

use fs4::FileExt;

/// The ballast file of the data directory `dir`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join("ballast")
}

/// Before opening: deletes the ballast when `dir`'s file system has less than `size` bytes
/// free; true if it did.
pub(crate) fn release_if_full(dir: &Path, size: u64) -> bool {
    let file = path(dir);
    if size == 0 || !file.exists() || fs4::available_space(dir).is_ok_and(|free| free >= size) {
        return false;
    }
    match std::fs::remove_file(&file) {
        Ok(()) => {
            tracing::warn!(
                bytes = size,
                "the data file system is full: released the ballast so that the journal can open"
            );
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "the data file system is full and the ballast cannot be deleted");
            false
        }
    }
}

/// Makes the ballast (`size` bytes, allocated) when it is missing and the file system has
/// room for it plus `spare` bytes; true if it exists afterwards. A failure leaves no
/// partial file behind.
pub(crate) fn ensure(dir: &Path, size: u64, spare: u64) -> bool {
    let file = path(dir);
    if size == 0 {
        let _ = std::fs::remove_file(&file);
        return false;
    }
    match std::fs::metadata(&file) {
        Ok(m) if m.len() == size => return true,
        // Another size (the setting changed): made again.
        Ok(_) => {
            let _ = std::fs::remove_file(&file);
        }
        Err(_) => {}
    }
    if !fs4::available_space(dir).is_ok_and(|free| free >= size.saturating_add(spare)) {
        return false;
    }
    let made = (|| -> io::Result<()> {
        let f = OpenOptions::new().create(true).write(true).truncate(true).open(&file)?;
        f.allocate(size)?;
        f.sync_all()
    })();
    match made {
        Ok(()) => true,
        Err(e) => {
            let _ = std::fs::remove_file(&file);
            tracing::warn!(error = %e, bytes = size, "could not reserve the ballast");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ballast_is_made_with_room_kept_with_room_and_given_up_only_when_full() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ensure(dir.path(), 4096, 0));
        assert_eq!(std::fs::metadata(path(dir.path())).unwrap().len(), 4096);
        assert!(!release_if_full(dir.path(), 4096), "the file system has room: kept");
        assert!(!ensure(dir.path(), 8192, u64::MAX), "no room for it besides the spare: not made");
        assert!(!path(dir.path()).exists(), "and no partial file left");
        assert!(ensure(dir.path(), 4096, 0));
        assert!(release_if_full(dir.path(), u64::MAX), "less free than its size: released");
        assert!(!path(dir.path()).exists());
        assert!(!ensure(dir.path(), 0, 0), "size 0: none");
    }
}

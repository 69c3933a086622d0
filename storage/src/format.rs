//! The data directory's layout version: `data_dir/format` holds `ferrymq-journal <N>`.
//! [`Journal::open`](crate::Journal::open) reads it before touching anything else and
//! refuses a directory of a layout this build does not read, saying what to do, rather
//! than misreading it. A directory without the file but with data was written before
//! layouts were numbered, which is layout 1.
//!
//! Layouts:
//! - 1: commit-log segments in `log/`, consume queues and every index in sled (`db/`,
//!   flushed by every durable group commit), the ballast in `ballast`.
//! - 2: as 1, and every group commit also writes its sled changes to the commit log as an
//!   effects record; sled is flushed only by checkpoints, and per-queue and per-segment
//!   counters live in sled's `counters` tree. A layout-1 directory is migrated in place at
//!   open (its sled is complete; the counters are written and the directory stamped 2).
//!   Layout-1 builds refuse a layout-2 directory, as they would misread effects records.
//! - 3: as 2, but consume-queue entries live in files of their own (`cq/`, RocketMQ's
//!   ConsumeQueue) with their settled offsets in sled's `settled` tree, instead of sled's
//!   `queue` tree. A layout-1 or layout-2 directory is migrated in place at open (the
//!   entries are moved to the files, then the directory is stamped 3 and the tree
//!   emptied). Earlier builds refuse a layout-3 directory.
//! - 4: as 3, but effects records are written in their version 2 encoding (consume-queue
//!   entries and settlements as runs: about 7 bytes per message instead of 60). This build
//!   reads version 1 too, so a layout-3 directory is upgraded by stamping it at open; layout-3
//!   builds refuse a layout-4 directory, as they cannot read version 2.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::JournalError;

/// The layout this build reads and writes.
pub const LAYOUT: u32 = 4;

/// Key in sled's default tree written, last, by a migration to [`LAYOUT`] before the
/// directory is stamped: an open that finds the older stamp with this key knows that the
/// migration finished (its checkpoint says so) and only stamps.
pub(crate) const MIGRATED_KEY: &[u8] = b"ferrymq:migrated";

/// What [`check_or_stamp`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// [`LAYOUT`] (or a new directory, now stamped).
    Current,
    /// Layout 1: to be migrated by the open, which then calls [`stamp`].
    Layout1,
    /// Layout 2: to be migrated by the open, which then calls [`stamp`].
    Layout2,
}

/// What the file starts with.
const MAGIC: &str = "ferrymq-journal";

fn path(dir: &Path) -> PathBuf {
    dir.join("format")
}

/// Checks the layout of `dir` (which exists), stamping a new one.
pub(crate) fn check_or_stamp(dir: &Path) -> Result<Found, JournalError> {
    let file = path(dir);
    let text = match fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if dir.join("db").exists() || dir.join("log").exists() {
                return Ok(Found::Layout1);
            }
            stamp(dir)?;
            return Ok(Found::Current);
        }
        Err(e) => return Err(JournalError::Io(format!("reading {}: {e}", file.display()))),
    };
    let version = text.trim().strip_prefix(MAGIC).and_then(|v| v.trim().parse::<u32>().ok());
    match version {
        Some(LAYOUT) => Ok(Found::Current),
        Some(3) => {
            // Layout 4 only adds an encoding of effects records; this build reads layout 3's.
            stamp(dir)?;
            tracing::info!(dir = ?dir, "upgraded the data directory from layout 3 to {LAYOUT} (a new stamp only)");
            Ok(Found::Current)
        }
        Some(1) => Ok(Found::Layout1),
        Some(2) => Ok(Found::Layout2),
        Some(v) if v > LAYOUT => Err(JournalError::Layout(format!(
            "{} is layout {v}, written by a newer FerryMQ; this build reads layout {LAYOUT}: run the newer \
             version, or point --data-dir at another directory",
            dir.display()
        ))),
        Some(v) => Err(JournalError::Layout(format!(
            "{} is layout {v}, which this build no longer reads (it reads layout {LAYOUT})",
            dir.display()
        ))),
        None => Err(JournalError::Layout(format!(
            "{} is not a FerryMQ layout file (expected `{MAGIC} <number>`, found {:?})",
            file.display(),
            text.chars().take(64).collect::<String>()
        ))),
    }
}

/// Stamps `dir` with [`LAYOUT`] (through a temporary file and a rename, so the file is
/// whole or absent).
pub(crate) fn stamp(dir: &Path) -> Result<(), JournalError> {
    write_stamp(dir).map_err(|e| JournalError::Io(format!("writing {}: {e}", path(dir).display())))
}

fn write_stamp(dir: &Path) -> io::Result<()> {
    let tmp = dir.join("format.tmp");
    {
        let mut f = fs::File::create(&tmp)?;
        writeln!(f, "{MAGIC} {LAYOUT}")?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path(dir))?;
    crate::log::sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_stamped_once_and_other_layouts_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check_or_stamp(dir.path()).unwrap(), Found::Current);
        assert_eq!(fs::read_to_string(path(dir.path())).unwrap(), format!("ferrymq-journal {LAYOUT}\n"));
        assert_eq!(check_or_stamp(dir.path()).unwrap(), Found::Current);
        fs::write(path(dir.path()), "ferrymq-journal 1\n").unwrap();
        assert_eq!(check_or_stamp(dir.path()).unwrap(), Found::Layout1);
        fs::write(path(dir.path()), "ferrymq-journal 2\n").unwrap();
        assert_eq!(check_or_stamp(dir.path()).unwrap(), Found::Layout2);
        fs::write(path(dir.path()), "ferrymq-journal 3\n").unwrap();
        assert_eq!(check_or_stamp(dir.path()).unwrap(), Found::Current, "layout 3 needs a new stamp only");
        assert_eq!(fs::read_to_string(path(dir.path())).unwrap(), format!("ferrymq-journal {LAYOUT}\n"));
        let old = tempfile::tempdir().unwrap();
        fs::create_dir(old.path().join("db")).unwrap();
        assert_eq!(check_or_stamp(old.path()).unwrap(), Found::Layout1, "data without a format file");
        assert!(!path(old.path()).exists(), "stamped only once migrated");
        fs::write(path(dir.path()), "ferrymq-journal 99\n").unwrap();
        let e = check_or_stamp(dir.path()).unwrap_err().to_string();
        assert!(e.contains("layout 99, written by a newer FerryMQ"), "{e}");
        fs::write(path(dir.path()), "ferrymq-journal 0\n").unwrap();
        assert!(check_or_stamp(dir.path()).unwrap_err().to_string().contains("no longer reads"));
        fs::write(path(dir.path()), "something else").unwrap();
        assert!(check_or_stamp(dir.path()).unwrap_err().to_string().contains("not a FerryMQ layout file"));
    }
}

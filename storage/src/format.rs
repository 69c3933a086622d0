//! The data directory's layout version: `data_dir/format` holds `ferrymq-journal <N>`.
//! [`Journal::open`](crate::Journal::open) reads it before touching anything else and
//! refuses a directory of a layout this build does not read, saying what to do, rather
//! than misreading it.
//!
//! Layout 4 (this build's): commit-log segments in `log/` holding every group commit's
//! records and one effects record of its other changes (version 2: consume-queue changes
//! as runs), consume-queue files in `cq/`, keyed state and counters in sled (`db/`,
//! flushed by checkpoints), the ballast in `ballast` (the crate root has the details).
//!
//! Layouts 1 to 3 were development layouts, never released: consume queues in sled (1 and
//! 2; a directory with data but no `format` file is layout 1), effects records of version
//! 1 only (2 and 3). Builds up to git commit 0cd0e68 (2026-12-06) upgrade them in place to
//! layout 4; this one refuses them, saying so.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::JournalError;

/// The layout this build reads and writes.
pub const LAYOUT: u32 = 4;

/// What the file starts with.
const MAGIC: &str = "ferrymq-journal";

fn path(dir: &Path) -> PathBuf {
    dir.join("format")
}

/// The builds that still upgrade a directory of layout 1 to 3 in place.
const UPGRADING_BUILDS: &str = "git commit 0cd0e68 (2026-12-06) or earlier";

/// The refusal of a directory of development layout `v` (1 to 3), saying what to do.
fn unreleased(dir: &Path, v: u32) -> JournalError {
    JournalError::Layout(format!(
        "{} is layout {v}, a development layout this build no longer reads (it reads layout {LAYOUT}): \
         upgrade it by starting a FerryMQ built from {UPGRADING_BUILDS} on it once, then start this \
         build again; or point --data-dir at another directory",
        dir.display()
    ))
}

/// Checks the layout of `dir` (which exists), stamping a new one; writes nothing to a
/// directory it refuses.
pub(crate) fn check_or_stamp(dir: &Path) -> Result<(), JournalError> {
    let file = path(dir);
    let text = match fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if dir.join("db").exists() || dir.join("log").exists() {
                // Data from before layouts were numbered.
                return Err(unreleased(dir, 1));
            }
            return stamp(dir);
        }
        Err(e) => return Err(JournalError::Io(format!("reading {}: {e}", file.display()))),
    };
    let version = text.trim().strip_prefix(MAGIC).and_then(|v| v.trim().parse::<u32>().ok());
    match version {
        Some(LAYOUT) => Ok(()),
        Some(v) if v > LAYOUT => Err(JournalError::Layout(format!(
            "{} is layout {v}, written by a newer FerryMQ; this build reads layout {LAYOUT}: run the newer \
             version, or point --data-dir at another directory",
            dir.display()
        ))),
        Some(v @ 1..LAYOUT) => Err(unreleased(dir, v)),
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
fn stamp(dir: &Path) -> Result<(), JournalError> {
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
        check_or_stamp(dir.path()).unwrap();
        assert_eq!(fs::read_to_string(path(dir.path())).unwrap(), format!("ferrymq-journal {LAYOUT}\n"));
        check_or_stamp(dir.path()).unwrap();
        for v in 1..=3 {
            let stamp = format!("ferrymq-journal {v}\n");
            fs::write(path(dir.path()), &stamp).unwrap();
            let e = check_or_stamp(dir.path()).unwrap_err().to_string();
            assert!(e.contains(&format!("is layout {v}, a development layout this build no longer reads")), "{e}");
            assert!(e.contains("0cd0e68") && e.contains("--data-dir"), "says what to do: {e}");
            assert_eq!(fs::read_to_string(path(dir.path())).unwrap(), stamp, "not stamped");
        }
        let old = tempfile::tempdir().unwrap();
        fs::create_dir(old.path().join("db")).unwrap();
        let e = check_or_stamp(old.path()).unwrap_err().to_string();
        assert!(e.contains("is layout 1, a development layout"), "data without a format file: {e}");
        assert!(!path(old.path()).exists(), "not stamped");
        fs::write(path(dir.path()), "ferrymq-journal 99\n").unwrap();
        let e = check_or_stamp(dir.path()).unwrap_err().to_string();
        assert!(e.contains("layout 99, written by a newer FerryMQ"), "{e}");
        fs::write(path(dir.path()), "ferrymq-journal 0\n").unwrap();
        assert!(check_or_stamp(dir.path()).unwrap_err().to_string().contains("no longer reads"));
        fs::write(path(dir.path()), "something else").unwrap();
        assert!(check_or_stamp(dir.path()).unwrap_err().to_string().contains("not a FerryMQ layout file"));
    }
}

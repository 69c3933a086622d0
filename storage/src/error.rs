//! The journal's error type.

/// Why a journal operation failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum JournalError {
    /// A write or flush failed earlier; the journal refuses writes until reopened.
    #[error("journal is poisoned after an I/O failure: {0}")]
    Poisoned(String),
    /// An I/O error (message kept as text so the error stays `Clone`).
    #[error("journal I/O error: {0}")]
    Io(String),
    /// A record failed its checksum or framing check.
    #[error("corrupt record at log position {0}")]
    Corrupt(u64),
    /// A position does not refer to a live record (deleted segment, past the end).
    #[error("no record at log position {0}")]
    NotFound(u64),
    /// An entry of one of the journal's indexes (`retained`, `timer`, `queue_names`, ...)
    /// that does not decode.
    #[error("malformed entry in tree `{tree}` under key \"{}\"", .key.escape_ascii())]
    Malformed {
        /// The sled tree.
        tree: &'static str,
        /// The entry's key.
        key: Vec<u8>,
    },
    /// sled reported an error.
    #[error("sled error: {0}")]
    Db(String),
    /// The file system has less free space than the journal keeps free
    /// ([`JournalConfig::min_free_bytes`](crate::JournalConfig)): a submission that appends
    /// is refused before it is written (retry once space returns; the journal is fine).
    #[error("no space: the data file system has less than {0} bytes free")]
    NoSpace(u64),
    /// The file system ran out of space (ENOSPC, EDQUOT): the commit log's write of the
    /// batch (taken back: nothing of it is kept), or sled (every write is refused until the
    /// journal has opened it again, once space returns). Retry later; nothing is poisoned.
    #[error("the data file system is full: {0}")]
    Full(String),
    /// The data directory is of a layout this build does not read (see [`LAYOUT`](crate::LAYOUT));
    /// nothing in it was touched.
    #[error("{0}")]
    Layout(String),
    /// The writer thread has stopped (journal closed).
    #[error("journal is closed")]
    Closed,
}

//! Blocking work kept off the runtime's workers.
//!
//! sled calls, fsyncs and file reads block; connection tasks and HTTP handlers run on the
//! runtime's few worker threads, where a blocked call stalls every client those threads
//! serve. Such work runs on the journal writer (queue names, writes), on the shard threads
//! (queue and stream reads) or on tokio's blocking pool through [`spawn`] — never inline.

use tokio::task::JoinError;

/// Runs `f` on the runtime's blocking pool, where it may call the journal's blocking
/// methods; resolves to its result (an error if it panicked).
pub async fn spawn<R, F>(f: F) -> Result<R, JoinError>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    tokio::task::spawn_blocking(move || ferrymq_storage::allow_blocking(f)).await
}

//! Blocking work kept off the runtime's workers.
//!
//! sled calls, fsyncs and file reads block; connection tasks and HTTP handlers run on the
//! runtime's few worker threads, where a blocked call stalls every client those threads
//! serve. Such work runs on the journal writer (queue names, writes), on the shard threads
//! (queue and stream reads) or on tokio's blocking pool through [`spawn`] — never inline.
//!
//! [`runtime_builder`] makes the runtime the broker runs on: each of its threads is
//! marked ([`ferrymq_storage::forbid_blocking`]), so in debug builds a blocking journal
//! method called on one panics with its name, and the test suite finds every such call.
//! [`spawn`] lifts the mark for the closure it runs on the blocking pool (whose threads
//! the runtime starts, and marks, too); that is why bare `tokio::task::spawn_blocking`
//! is refused by clippy (`clippy.toml`).
//!
//! Work that must finish before its caller goes on, and is only sometimes long (the
//! router's walk of a large topic trie, a wait for the routing table's lock), runs in
//! place through `off_worker`, which hands the worker's other tasks to another thread
//! while it runs.

use tokio::task::JoinError;

/// The multi-threaded runtime builder of the broker (`main.rs`): every thread it starts
/// carries the no-blocking mark.
pub fn runtime_builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().on_thread_start(ferrymq_storage::forbid_blocking);
    builder
}

/// Runs `f` on the runtime's blocking pool, where it may call the journal's blocking
/// methods; resolves to its result (an error if it panicked).
#[allow(clippy::disallowed_methods)] // the one place that may: it lifts the mark
pub async fn spawn<R, F>(f: F) -> Result<R, JoinError>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    tokio::task::spawn_blocking(move || ferrymq_storage::allow_blocking(f)).await
}

/// Runs `f`, work that may be long, without holding a runtime worker: on a worker of a
/// multi-thread runtime the worker's other tasks move to another thread while `f` runs
/// (`block_in_place`); elsewhere (a current-thread runtime, no runtime) `f` just runs.
pub(super) fn off_worker<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrymq_storage::{Journal, JournalConfig};

    #[test]
    fn the_broker_runtime_refuses_blocking_journal_calls_on_its_workers() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let rt = runtime_builder().worker_threads(2).build().unwrap();
        let j = journal.clone();
        let inline = rt.block_on(rt.spawn(async move { j.queue_id("q").map(drop) }));
        if cfg!(debug_assertions) {
            let panic = inline.expect_err("the guard fires on a worker").into_panic();
            let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(message.contains("Journal::queue_id"), "{message}");
        }
        // Off the workers, and through the writer, it is fine.
        let j = journal.clone();
        let pooled = rt.block_on(rt.spawn(async move { spawn(move || j.queue_id("q")).await })).unwrap();
        let q = pooled.unwrap().unwrap();
        let j = journal.clone();
        let resolved = rt.block_on(rt.spawn(async move { j.resolve_queue_id("q").await })).unwrap();
        assert_eq!(resolved.unwrap(), q);
    }
}

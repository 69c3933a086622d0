//! The check that keeps blocking journal calls off async runtime workers.
//!
//! Every [`Journal`](crate::Journal) method that may block — a sled read or write, a file
//! read or scan, a wait for the writer thread — calls [`check`] first. A thread that drives
//! async tasks (a runtime worker) marks itself with [`forbid_blocking`], usually from the
//! runtime builder's `on_thread_start`; in debug builds a blocking call on such a thread
//! then panics with the method's name, so that the test suite finds every such call. Code
//! that runs on the runtime's blocking pool (`spawn_blocking`) wraps its closure in
//! [`allow_blocking`]. Threads nobody marked (the journal writer, queue-owner threads,
//! `main`, tools and tests) may block. Release builds keep the marks and skip the check.
//!
//! The mark is a plain thread-local flag: the crate needs no runtime to keep it.

use std::cell::Cell;

thread_local! {
    static FORBIDDEN: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as an async runtime worker: from now on, in debug builds, the
/// journal's blocking methods panic on it (see the module docs). For a runtime builder's
/// `on_thread_start`.
pub fn forbid_blocking() {
    FORBIDDEN.with(|f| f.set(true));
}

/// Runs `f` with blocking journal calls allowed on this thread, restoring the mark after
/// (even if `f` panics): the body of a `spawn_blocking` closure on a marked runtime.
pub fn allow_blocking<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the mark back on drop.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORBIDDEN.with(|f| f.set(self.0));
        }
    }
    let _restore = Restore(FORBIDDEN.with(|f| f.replace(false)));
    f()
}

/// True when blocking journal calls are forbidden on this thread (it is marked, and not
/// inside [`allow_blocking`]).
pub fn blocking_forbidden() -> bool {
    FORBIDDEN.with(Cell::get)
}

/// Called first by every blocking method of the journal, with its name: panics (debug
/// builds) on a thread marked by [`forbid_blocking`].
#[track_caller]
pub(crate) fn check(method: &'static str) {
    if cfg!(debug_assertions) && blocking_forbidden() {
        panic!(
            "blocking journal call Journal::{method} on an async runtime worker thread: \
             run it on the journal writer, a shard thread or spawn_blocking (ferrymq_storage::allow_blocking)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_per_thread_and_allow_restores_it() {
        assert!(!blocking_forbidden());
        std::thread::spawn(|| {
            forbid_blocking();
            assert!(blocking_forbidden());
            assert!(!allow_blocking(blocking_forbidden));
            let caught = std::panic::catch_unwind(|| allow_blocking(|| panic!("inside")));
            assert!(caught.is_err());
            assert!(blocking_forbidden(), "restored after a panic too");
        })
        .join()
        .unwrap();
        assert!(!blocking_forbidden(), "another thread's mark");
    }
}

//! When each member was last heard from over the peer link (either direction): what
//! `ctl cluster status` and `/api/nodes` call `running` and `last contact`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A member silent for longer than this is reported as not running.
pub(super) const SILENT_AFTER: Duration = Duration::from_secs(5);

/// Last contact per member name.
#[derive(Debug, Default)]
pub(super) struct PeerHealth {
    last: Mutex<HashMap<String, Instant>>,
}

impl PeerHealth {
    /// `name` answered or called just now.
    pub(super) fn answered(&self, name: &str) {
        let mut last = self.last.lock();
        match last.get_mut(name) {
            Some(at) => *at = Instant::now(),
            None => {
                last.insert(name.to_owned(), Instant::now());
            }
        }
    }

    /// How long ago `name` was last heard from; `None`: never.
    pub(super) fn since(&self, name: &str) -> Option<Duration> {
        self.last.lock().get(name).map(|at| at.elapsed())
    }
}

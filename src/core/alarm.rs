//! The memory alarm: the broker's resident memory against the high watermark, checked
//! every second. While it is raised, publishers are not read (AMQP connections that
//! publish get `connection.blocked` first) until memory drops below the watermark.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

/// The memory alarm shared by every connection: the limit and whether it is raised.
#[derive(Debug)]
pub struct MemoryAlarm {
    limit: AtomicU64,
    raised: watch::Sender<bool>,
}

impl MemoryAlarm {
    /// An alarm with a limit in bytes (0 = never raised).
    pub fn new(limit: u64) -> Arc<MemoryAlarm> {
        let (raised, _) = watch::channel(false);
        Arc::new(MemoryAlarm { limit: AtomicU64::new(limit), raised })
    }

    /// The limit from configuration: absolute bytes, else a fraction of the machine's memory.
    pub fn limit_from(bytes: u64, fraction: f64) -> u64 {
        if bytes > 0 {
            return bytes;
        }
        total_memory().map(|t| (t as f64 * fraction) as u64).unwrap_or(0)
    }

    /// Changes the limit (SIGHUP reload) and re-checks at once.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
        self.check();
    }

    /// True while memory is above the watermark.
    pub fn is_raised(&self) -> bool {
        *self.raised.borrow()
    }

    /// A receiver that sees the alarm change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.raised.subscribe()
    }

    /// Compares resident memory with the limit and raises or clears the alarm.
    pub fn check(&self) {
        let limit = self.limit.load(Ordering::Relaxed);
        let raised = limit > 0 && resident_memory().is_some_and(|rss| rss >= limit);
        if raised != self.is_raised() {
            if raised {
                warn!(limit, "memory high watermark reached: publishers are blocked");
            } else {
                info!(limit, "memory below the high watermark: publishers resume");
            }
            self.raised.send_replace(raised);
        }
    }

    /// Checks every second until the runtime stops.
    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            self.check();
        }
    }
}

/// Resident memory of this process, bytes.
fn resident_memory() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Total memory of the machine, bytes.
fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_above_the_limit_and_cleared_below() {
        let alarm = MemoryAlarm::new(1);
        alarm.check();
        assert!(alarm.is_raised(), "any process uses more than one byte");
        alarm.set_limit(u64::MAX);
        assert!(!alarm.is_raised());
        alarm.set_limit(0);
        assert!(!alarm.is_raised(), "0 = off");
        assert!(MemoryAlarm::limit_from(0, 0.4) > 0);
        assert_eq!(MemoryAlarm::limit_from(123, 0.4), 123);
    }
}

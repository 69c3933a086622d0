//! The resource alarms, as RabbitMQ's: the broker's resident memory against the high
//! watermark, and the free space of the data directory's file system against the disk
//! free limit, both checked every 100 ms. While either is raised, publishers are not read
//! (AMQP connections that publish get `connection.blocked` first, with RabbitMQ's reason
//! `low on memory` or `low on disk`); consumers and acknowledgements go on, so queues can
//! drain. An alarm clears by itself once its resource is back under its limit.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

/// How often both resources are looked at: a disk fills fast (a tmpfs or an SSD takes
/// tens to hundreds of MB per second), and the look is cheap (a `statvfs` and a read of
/// `/proc/self/statm`).
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// The alarms shared by every connection: their limits and whether one is raised.
#[derive(Debug)]
pub struct ResourceAlarm {
    memory_limit: AtomicU64,
    disk_free_limit: AtomicU64,
    /// The directory whose file system's free space is watched (none: never raised).
    data_dir: Option<PathBuf>,
    memory_raised: AtomicBool,
    disk_raised: AtomicBool,
    /// Either alarm raised.
    raised: watch::Sender<bool>,
}

/// Which resource an alarm is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Resident memory.
    Memory,
    /// Free space of the data directory's file system.
    Disk,
}

impl ResourceAlarm {
    /// Alarms with a memory limit in bytes (0 = never raised) and a disk free limit in
    /// bytes for `data_dir`'s file system (0 or no directory = never raised).
    pub fn new(memory_limit: u64, disk_free_limit: u64, data_dir: Option<PathBuf>) -> Arc<ResourceAlarm> {
        let (raised, _) = watch::channel(false);
        Arc::new(ResourceAlarm {
            memory_limit: AtomicU64::new(memory_limit),
            disk_free_limit: AtomicU64::new(disk_free_limit),
            data_dir,
            memory_raised: AtomicBool::new(false),
            disk_raised: AtomicBool::new(false),
            raised,
        })
    }

    /// The memory limit from configuration: absolute bytes, else a fraction of the
    /// machine's memory.
    pub fn memory_limit_from(bytes: u64, fraction: f64) -> u64 {
        if bytes > 0 {
            return bytes;
        }
        total_memory().map(|t| (t as f64 * fraction) as u64).unwrap_or(0)
    }

    /// The disk free limit from configuration: `relative` times the memory limit when it
    /// is above 0 (RabbitMQ's relative limit), else absolute bytes.
    pub fn disk_free_limit_from(bytes: u64, relative: f64, memory_limit: u64) -> u64 {
        if relative > 0.0 {
            return (memory_limit as f64 * relative) as u64;
        }
        bytes
    }

    /// Changes the limits (SIGHUP reload) and re-checks at once.
    pub fn set_limits(&self, memory_limit: u64, disk_free_limit: u64) {
        self.memory_limit.store(memory_limit, Ordering::Relaxed);
        self.disk_free_limit.store(disk_free_limit, Ordering::Relaxed);
        self.check();
    }

    /// True while either alarm is raised.
    pub fn is_raised(&self) -> bool {
        *self.raised.borrow()
    }

    /// The raised alarm (memory first when both are), if any.
    pub fn raised_for(&self) -> Option<Resource> {
        if self.memory_raised.load(Ordering::Acquire) {
            Some(Resource::Memory)
        } else if self.disk_raised.load(Ordering::Acquire) {
            Some(Resource::Disk)
        } else {
            None
        }
    }

    /// Every raised alarm (memory, then disk).
    pub fn raised(&self) -> Vec<Resource> {
        let mut all = Vec::new();
        if self.memory_raised.load(Ordering::Acquire) {
            all.push(Resource::Memory);
        }
        if self.disk_raised.load(Ordering::Acquire) {
            all.push(Resource::Disk);
        }
        all
    }

    /// The memory limit and the disk free limit, bytes (0 = off).
    pub fn limits(&self) -> (u64, u64) {
        (self.memory_limit.load(Ordering::Relaxed), self.disk_free_limit.load(Ordering::Relaxed))
    }

    /// Free space of the watched file system, bytes (`None` without a directory).
    pub fn disk_free(&self) -> Option<u64> {
        self.data_dir.as_ref().and_then(|d| fs4::available_space(d).ok())
    }

    /// A receiver that sees the alarm (either) change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.raised.subscribe()
    }

    /// Compares resident memory and free disk space with their limits and raises or clears
    /// each alarm.
    pub fn check(&self) {
        let limit = self.memory_limit.load(Ordering::Relaxed);
        let memory = limit > 0 && resident_memory().is_some_and(|rss| rss >= limit);
        if memory != self.memory_raised.swap(memory, Ordering::AcqRel) {
            if memory {
                warn!(limit, "memory high watermark reached: publishers are blocked");
            } else {
                info!(limit, "memory below the high watermark: publishers resume");
            }
        }
        let limit = self.disk_free_limit.load(Ordering::Relaxed);
        let free = self.data_dir.as_ref().filter(|_| limit > 0).and_then(|d| fs4::available_space(d).ok());
        let disk = free.is_some_and(|free| free < limit);
        if disk != self.disk_raised.swap(disk, Ordering::AcqRel) {
            if disk {
                warn!(limit, free, "disk free space below the limit: publishers are blocked");
            } else {
                info!(limit, free, "disk free space above the limit: publishers resume");
            }
        }
        let raised = memory || disk;
        if raised != self.is_raised() {
            self.raised.send_replace(raised);
        }
    }

    /// Checks every [`CHECK_INTERVAL`] until the runtime stops.
    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(CHECK_INTERVAL);
        loop {
            tick.tick().await;
            self.check();
        }
    }
}

/// Resident memory of this process, bytes.
pub(crate) fn resident_memory() -> Option<u64> {
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
    fn the_memory_alarm_is_raised_above_its_limit_and_cleared_below() {
        let alarm = ResourceAlarm::new(1, 0, None);
        alarm.check();
        assert!(alarm.is_raised(), "any process uses more than one byte");
        assert_eq!(alarm.raised_for(), Some(Resource::Memory));
        alarm.set_limits(u64::MAX, 0);
        assert!(!alarm.is_raised());
        alarm.set_limits(0, 0);
        assert!(!alarm.is_raised(), "0 = off");
        assert!(ResourceAlarm::memory_limit_from(0, 0.4) > 0);
        assert_eq!(ResourceAlarm::memory_limit_from(123, 0.4), 123);
    }

    #[test]
    fn the_disk_alarm_is_raised_below_the_free_limit_and_cleared_above() {
        let dir = tempfile::tempdir().unwrap();
        let alarm = ResourceAlarm::new(0, u64::MAX, Some(dir.path().to_path_buf()));
        alarm.check();
        assert!(alarm.is_raised(), "no file system has u64::MAX bytes free");
        assert_eq!(alarm.raised_for(), Some(Resource::Disk));
        alarm.set_limits(0, 1);
        assert!(!alarm.is_raised(), "a file system with a byte free");
        assert_eq!(alarm.raised_for(), None);
        alarm.set_limits(0, 0);
        assert!(!alarm.is_raised(), "0 = off");
        assert_eq!(ResourceAlarm::disk_free_limit_from(50_000_000, 0.0, 1 << 30), 50_000_000);
        assert_eq!(ResourceAlarm::disk_free_limit_from(50_000_000, 1.5, 1 << 30), 3 << 29);
    }
}

//! How a stream behaves and where a stream consumer starts: retention limits
//! (`x-max-age`, `x-max-length-bytes`) and the start position (`x-stream-offset`), in
//! RabbitMQ's vocabulary but free of any protocol's types.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::queue::QueueGauge;

/// Retention of one stream, set at declaration.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Stream (queue) name, for logs.
    pub name: String,
    /// Virtual host it was declared in (kept with `name`; the owner shard does not use it).
    pub vhost: String,
    /// Entries older than this (ms, by the broker's clock when stored) are trimmed
    /// (`x-max-age`).
    pub max_age_ms: Option<u64>,
    /// The oldest entries are trimmed while the bodies total more than this
    /// (`x-max-length-bytes`).
    pub max_bytes: Option<u64>,
    /// Live counters (entries, bytes, consumers), written by the owner shard; the
    /// queue entity's own, so that a stream is counted where a queue is.
    pub gauge: Arc<QueueGauge>,
    /// The offsets kept, written by the owner shard.
    pub extent: Arc<StreamExtent>,
}

/// A stream's live offsets as the operations views read them (written by the owner shard
/// once per turn, never per message).
#[derive(Debug, Default)]
pub struct StreamExtent {
    first: AtomicU64,
    end: AtomicU64,
    /// Every live entry's bytes are in the gauge (a stream loaded at start counts the
    /// bytes of what it held a page at a time, in the background).
    bytes_counted: AtomicBool,
}

impl StreamExtent {
    /// Stores the oldest live offset, the next one to be written, and whether the gauge's
    /// bytes cover every live entry.
    pub fn set(&self, first: u64, end: u64, bytes_counted: bool) {
        self.first.store(first, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
        self.bytes_counted.store(bytes_counted, Ordering::Relaxed);
    }

    /// Oldest live offset (the end when empty).
    pub fn first(&self) -> u64 {
        self.first.load(Ordering::Relaxed)
    }

    /// The next offset to be written.
    pub fn end(&self) -> u64 {
        self.end.load(Ordering::Relaxed)
    }

    /// The newest live offset (RabbitMQ's `committed_offset`); `None` when empty.
    pub fn last(&self) -> Option<u64> {
        let (first, end) = (self.first(), self.end());
        (end > first).then(|| end - 1)
    }

    /// The gauge's bytes cover every live entry.
    pub fn bytes_counted(&self) -> bool {
        self.bytes_counted.load(Ordering::Relaxed)
    }
}

impl StreamConfig {
    /// A stream without retention limits.
    pub fn new(name: &str, vhost: &str) -> StreamConfig {
        StreamConfig {
            name: name.to_owned(),
            vhost: vhost.to_owned(),
            max_age_ms: None,
            max_bytes: None,
            gauge: Arc::default(),
            extent: Arc::default(),
        }
    }

    /// True when some retention limit is set.
    pub fn has_retention(&self) -> bool {
        self.max_age_ms.is_some() || self.max_bytes.is_some()
    }
}

/// Where a stream consumer starts reading (`x-stream-offset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOffset {
    /// The oldest entry retention has not trimmed yet.
    First,
    /// The newest entry (the last message present when the consumer attached).
    Last,
    /// Only entries appended after the consumer attached (the default).
    Next,
    /// An absolute offset (clamped to the entries kept).
    Offset(u64),
    /// The first entry stored at or after this time (ms since the epoch, broker's clock).
    Timestamp(u64),
}

const SECOND_MS: u64 = 1000;
const DAY_MS: u64 = 24 * 3600 * SECOND_MS;

/// Parses a RabbitMQ age such as `7D`, `12h`, `30m`, `90s`, `6M` or `1Y` into ms: a positive
/// integer followed by one unit, `Y` (365 days), `M` (30 days), `D`, `h`, `m` or `s`.
/// `None` for anything else (the caller refuses it with 406).
pub(crate) fn parse_age(text: &str) -> Option<u64> {
    const UNITS: [(&str, u64); 6] = [
        ("Y", 365 * DAY_MS),
        ("M", 30 * DAY_MS),
        ("D", DAY_MS),
        ("h", 3600 * SECOND_MS),
        ("m", 60 * SECOND_MS),
        ("s", SECOND_MS),
    ];
    crate::core::duration::parse_ms(text, &UNITS).ok().filter(|ms| *ms > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_in_rabbitmq_units() {
        assert_eq!(parse_age("7D"), Some(7 * DAY_MS));
        assert_eq!(parse_age("12h"), Some(12 * 3_600_000));
        assert_eq!(parse_age("30m"), Some(30 * 60_000));
        assert_eq!(parse_age("5s"), Some(5_000));
        assert_eq!(parse_age("1M"), Some(30 * DAY_MS));
        assert_eq!(parse_age("2Y"), Some(730 * DAY_MS));
        for bad in
            ["", "7", "D", "0D", "-1D", "7d", "7 D", "7DD", "1.5h", "99999999999999999999Y", "18446744073709551615Y"]
        {
            assert_eq!(parse_age(bad), None, "{bad:?}");
        }
    }
}

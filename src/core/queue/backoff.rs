//! Delayed retries of a queue: which returns are delayed (`x-delayed-retry-type`) and for
//! how long — RabbitMQ 4.3's linear backoff (`x-delayed-retry-min` / `-max`) or FerryMQ's
//! list of steps (`x-retry-backoff`, RocketMQ-style schedules such as `10s,30s,1m`).

use crate::core::duration::{parse_ms, DurationError};
use std::time::Duration;

/// Longest single retry delay (RabbitMQ caps delays at the u32 millisecond range).
pub(crate) const MAX_DELAY_MS: u64 = u32::MAX as u64;
/// Most steps an `x-retry-backoff` list may have.
pub(super) const MAX_STEPS: usize = 64;

/// Why an unacked message goes back to its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequeueCause {
    /// The consumer rejected or nacked it with requeue (or asked with basic.recover).
    Failed,
    /// The consumer's channel or connection went away with it unacked.
    Returned,
    /// It never reached the client (its consumer was cancelled, or the channel held it
    /// back and closed): back in line at once, never delayed.
    Unsent,
}

/// Which returns are delayed (`x-delayed-retry-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOn {
    /// Both failed and returned messages.
    All,
    /// Only messages whose consumer went away.
    Returned,
    /// Only messages the consumer rejected or nacked with requeue.
    Failed,
}

/// An `x-delayed-retry-type` value that is none of the known ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown delayed retry type")]
pub struct UnknownRetryType;

impl RetryOn {
    /// Parses the argument value; `None` for `disabled`.
    pub fn parse(s: &str) -> Result<Option<RetryOn>, UnknownRetryType> {
        match s {
            "all" => Ok(Some(RetryOn::All)),
            "returned" => Ok(Some(RetryOn::Returned)),
            "failed" => Ok(Some(RetryOn::Failed)),
            "disabled" => Ok(None),
            _ => Err(UnknownRetryType),
        }
    }
}

/// How long a retry waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backoff {
    /// min(min x delivery count, max), ms.
    Linear {
        /// Delay of the first retry.
        min_ms: u64,
        /// Longest delay, ms: no retry waits more, however many deliveries came before.
        max_ms: u64,
    },
    /// The n-th retry waits the n-th step; past the end, the last step repeats.
    Steps(Vec<u64>),
}

/// The delayed-retry behaviour of a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Which returns are delayed.
    pub on: RetryOn,
    /// How long each delayed retry waits.
    pub backoff: Backoff,
}

impl RetryPolicy {
    /// True when a message requeued for `cause` waits for its retry.
    pub fn applies(&self, cause: RequeueCause) -> bool {
        matches!(
            (self.on, cause),
            (RetryOn::All, RequeueCause::Failed | RequeueCause::Returned)
                | (RetryOn::Failed, RequeueCause::Failed)
                | (RetryOn::Returned, RequeueCause::Returned)
        )
    }

    /// The wait before the next delivery of a message delivered `deliveries` times (the
    /// first retry follows the first delivery: `deliveries` = 1).
    pub fn delay_ms(&self, deliveries: u32) -> u64 {
        let n = deliveries.max(1) as u64;
        let ms = match &self.backoff {
            Backoff::Linear { min_ms, max_ms } => min_ms.saturating_mul(n).min(*max_ms),
            Backoff::Steps(steps) => {
                let i = (n as usize - 1).min(steps.len().saturating_sub(1));
                steps.get(i).copied().unwrap_or(0)
            }
        };
        ms.min(MAX_DELAY_MS)
    }
}

/// Parses an `x-retry-backoff` list such as `10s,30s,1m,2h`: steps separated by commas,
/// each a whole number with the unit `ms`, `s`, `m` or `h` (whitespace around steps is
/// ignored). Returns the steps in ms, or why the list is invalid.
pub(crate) fn parse_steps(list: &str) -> Result<Vec<u64>, String> {
    let mut steps = Vec::new();
    for raw in list.split(',') {
        let step = raw.trim();
        let too_long =
            || format!("step '{step}' is longer than {} days", Duration::from_millis(MAX_DELAY_MS).as_secs() / 86_400);
        let ms = match parse_ms(step, &[("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)]) {
            Ok(ms) if ms <= MAX_DELAY_MS => ms,
            Ok(_) | Err(DurationError::Overflow) => return Err(too_long()),
            Err(DurationError::Syntax) => {
                return Err(format!("step '{step}' needs a whole number and a unit (ms, s, m, h)"))
            }
        };
        steps.push(ms);
        if steps.len() > MAX_STEPS {
            return Err(format!("more than {MAX_STEPS} steps"));
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_backoff_grows_to_its_cap() {
        let p = RetryPolicy { on: RetryOn::All, backoff: Backoff::Linear { min_ms: 100, max_ms: 250 } };
        assert_eq!([1, 2, 3, 9].map(|n| p.delay_ms(n)), [100, 200, 250, 250]);
        assert_eq!(p.delay_ms(0), 100, "the first retry waits min x 1");
    }

    #[test]
    fn steps_repeat_the_last_one() {
        let p = RetryPolicy { on: RetryOn::All, backoff: Backoff::Steps(parse_steps("10ms, 1s,2m,1h").unwrap()) };
        assert_eq!([1, 2, 3, 4, 5, 50].map(|n| p.delay_ms(n)), [10, 1000, 120_000, 3_600_000, 3_600_000, 3_600_000]);
    }

    #[test]
    fn bad_steps_are_refused() {
        for bad in ["", "10", "s", "1d", "10 s", "-1s", "1.5s", "10s,,1m", "99999999999999h", "2000h"] {
            assert!(parse_steps(bad).is_err(), "{bad:?}");
        }
        let many = vec!["1s"; MAX_STEPS + 1].join(",");
        assert!(parse_steps(&many).is_err());
        assert_eq!(parse_steps("0ms").unwrap(), vec![0]);
    }

    #[test]
    fn types_select_causes() {
        let p = |on| RetryPolicy { on, backoff: Backoff::Steps(vec![1]) };
        assert!(p(RetryOn::All).applies(RequeueCause::Failed) && p(RetryOn::All).applies(RequeueCause::Returned));
        assert!(
            p(RetryOn::Failed).applies(RequeueCause::Failed) && !p(RetryOn::Failed).applies(RequeueCause::Returned)
        );
        assert!(
            p(RetryOn::Returned).applies(RequeueCause::Returned) && !p(RetryOn::Returned).applies(RequeueCause::Failed)
        );
        assert!(!p(RetryOn::All).applies(RequeueCause::Unsent));
        assert_eq!(RetryOn::parse("disabled"), Ok(None));
        assert!(RetryOn::parse("ALL").is_err());
    }
}

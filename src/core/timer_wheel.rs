//! A shared wheel of coarse deadlines: the timers of many connections (keep-alive,
//! the stall clock, a look at an alarm) kept in one place and fired by one ticking
//! task, instead of a runtime timer inside every connection's future.
//!
//! A deadline rings its target's [`Wake`] at or after it passes (within one tick);
//! there is no cancel: a target that no longer needs a deadline ignores the ring, and a
//! target that is gone (its last `Arc` dropped) is skipped. A caller that moves a
//! deadline later (a keep-alive restarted by a packet) keeps the earlier one armed and
//! arms the later one when the earlier rings, so a busy connection touches the wheel
//! once per deadline, not once per packet.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::delivery::Wake;

/// How many slots one turn of a shard has: a deadline further away than a turn waits
/// for the turn it falls in (each slot keeps what is not due yet).
const SLOTS: usize = 4096;
/// Shards of the wheel: arming takes one shard's lock.
const SHARDS: usize = 4;

/// Deadlines of targets `T`, in ticks of a fixed length since the wheel was made.
#[derive(Debug)]
pub struct TimerWheel<T> {
    start: Instant,
    tick: Duration,
    shards: Box<[Mutex<Shard<T>>]>,
}

#[derive(Debug)]
struct Shard<T> {
    /// Slot `tick % SLOTS` holds the entries due in that tick (of this turn or a later one).
    slots: Vec<Vec<Entry<T>>>,
}

#[derive(Debug)]
struct Entry<T> {
    tick: u64,
    target: Weak<T>,
}

impl<T: Wake> TimerWheel<T> {
    /// An empty wheel whose deadlines fire within `tick` after they pass.
    pub fn new(tick: Duration) -> TimerWheel<T> {
        assert!(!tick.is_zero(), "a timer wheel needs a tick");
        let shards =
            (0..SHARDS).map(|_| Mutex::new(Shard { slots: (0..SLOTS).map(|_| Vec::new()).collect() })).collect();
        TimerWheel { start: Instant::now(), tick, shards }
    }

    /// Rings `target` at or after `at`; `key` picks the shard (a connection id).
    pub fn arm(&self, key: u64, at: Instant, target: &Arc<T>) {
        let tick = self.tick_at_or_after(at);
        let entry = Entry { tick, target: Arc::downgrade(target) };
        self.shards[key as usize % SHARDS].lock().slots[tick as usize % SLOTS].push(entry);
    }

    /// Rings every target whose deadline passed by `now`, for the ticks after `done` up
    /// to `now`'s; returns the tick now done.
    pub fn fire(&self, done: u64, now: Instant) -> u64 {
        let current = self.tick_before(now);
        // More than a turn behind (a stalled runtime): one pass over every slot is enough.
        let first = done.saturating_add(1).max(current.saturating_sub(SLOTS as u64 - 1));
        let mut due = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            for tick in first..=current {
                let slot = &mut shard.slots[tick as usize % SLOTS];
                if slot.is_empty() {
                    continue;
                }
                slot.retain(|e| {
                    if e.tick > current {
                        return true;
                    }
                    due.push(e.target.clone());
                    false
                });
                if slot.is_empty() && slot.capacity() > 64 {
                    slot.shrink_to_fit();
                }
            }
            drop(shard);
            // Rung outside the lock: a woken target may arm again at once.
            for target in due.drain(..) {
                if let Some(t) = target.upgrade() {
                    t.wake();
                }
            }
        }
        current.max(done)
    }

    /// Fires deadlines every tick while the wheel is in use by anyone but this task.
    pub async fn run(self: Arc<Self>) {
        let weak = Arc::downgrade(&self);
        let tick = self.tick;
        drop(self);
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut done = 0;
        loop {
            interval.tick().await;
            let Some(wheel) = weak.upgrade() else { return };
            done = wheel.fire(done, Instant::now());
        }
    }

    /// How many deadlines are armed (including those of targets gone or no longer
    /// interested, until their tick).
    pub fn armed(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slots.iter().map(Vec::len).sum::<usize>()).sum()
    }

    /// The first tick that begins at or after `at` (so firing it means `at` passed);
    /// never tick 0, which counts as done before the first firing.
    fn tick_at_or_after(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.start).as_nanos();
        let tick = self.tick.as_nanos();
        (since.div_ceil(tick) as u64).max(1)
    }

    /// The last tick that began at or before `now`.
    fn tick_before(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.start).as_nanos() / self.tick.as_nanos()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn rings(c: &Counter) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[test]
    fn a_deadline_rings_once_after_it_passes_and_not_before() {
        let wheel = TimerWheel::new(Duration::from_millis(10));
        let target = Arc::new(Counter::default());
        let at = wheel.start + Duration::from_millis(35);
        wheel.arm(7, at, &target);
        let done = wheel.fire(0, wheel.start + Duration::from_millis(34));
        assert_eq!(rings(&target), 0, "rang before its deadline");
        let done = wheel.fire(done, wheel.start + Duration::from_millis(40));
        assert_eq!(rings(&target), 1);
        wheel.fire(done, wheel.start + Duration::from_millis(90));
        assert_eq!(rings(&target), 1, "rang twice");
        assert_eq!(wheel.armed(), 0);
    }

    #[test]
    fn a_deadline_further_than_a_turn_waits_for_its_turn() {
        let tick = Duration::from_millis(10);
        let wheel = TimerWheel::new(tick);
        let target = Arc::new(Counter::default());
        let at = wheel.start + tick * (SLOTS as u32 + 5);
        wheel.arm(1, at, &target);
        let mut done = 0;
        // One full turn passes its slot once without it being due.
        for step in 1..=SLOTS as u32 + 4 {
            done = wheel.fire(done, wheel.start + tick * step);
        }
        assert_eq!(rings(&target), 0, "rang a turn early");
        wheel.fire(done, at);
        assert_eq!(rings(&target), 1);
    }

    #[test]
    fn a_late_firing_rings_everything_that_passed_and_skips_targets_gone() {
        let wheel = TimerWheel::new(Duration::from_millis(10));
        let kept: Vec<_> = (0..20).map(|_| Arc::new(Counter::default())).collect();
        for (i, t) in kept.iter().enumerate() {
            wheel.arm(i as u64, wheel.start + Duration::from_millis(5 + 50 * i as u64), t);
        }
        let gone = Arc::new(Counter::default());
        wheel.arm(99, wheel.start + Duration::from_millis(5), &gone);
        drop(gone);
        // Far behind: several turns at once.
        wheel.fire(0, wheel.start + Duration::from_secs(200));
        assert!(kept.iter().all(|t| rings(t) == 1));
        assert_eq!(wheel.armed(), 0);
    }
}

//! The scheduler: routes delayed messages when their time comes. Timers live in the
//! journal's timer index (due time, log position), so they survive restarts and a million
//! pending ones cost disk, not memory; the task only remembers when to wake next.
//!
//! Firing a timer routes the stored record again without rewriting its body: the new
//! pointers (`Enqueue`) and the timer's removal go to the journal in one submission.
//! Timers whose target is tagged (not a vhost name) are retry timers ([`retry`] writes and
//! reads their targets): firing one tells the entry's queue owner that its retry is due
//! ([`ShardCmd::RetryDue`]).

use std::sync::Arc;
use std::time::Duration;

use ferrymq_storage::{Op, TimerEntry};
use tracing::{debug, warn};

use super::appended::MessageTargets;
use super::broker::{Broker, RetainMode};
use super::message::now_ms;
use super::queue::read_message;
use super::retry;
use super::router::{Routes, MQTT_VHOST};
use super::shards::ShardCmd;
use super::store::{command_ops, StoreWrite};

/// Timers fired per turn.
const BATCH: usize = 512;
/// Longest sleep between checks (covers clock jumps and missed notifications).
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// How long a due delayed message whose record cannot be read (an I/O error, a checksum
/// that does not match) waits before it is tried again. It is never dropped for it: the
/// timer moves, the record stays, and an operator who repairs the disk gets it delivered.
pub(crate) const UNREADABLE_RETRY: Duration = Duration::from_secs(5);

/// Runs until the runtime shuts down.
pub(crate) async fn run(broker: Arc<Broker>) {
    loop {
        let now = now_ms();
        // sled and the commit log are read off the runtime's workers (a slow disk must not
        // stall connections): the due timers, and the earliest one left when none is due.
        let journal = broker.journal.clone();
        let read = super::blocking::spawn(move || {
            let due = journal.timers_due(now, BATCH)?;
            let next = if due.is_empty() { journal.next_timer()? } else { None };
            Ok((due, next))
        })
        .await
        .unwrap_or_else(|e| Err(ferrymq_storage::JournalError::Io(e.to_string())));
        let next = match read {
            Ok((due, _)) if !due.is_empty() => {
                // Then at once again: more may be due, and the next timer is read there.
                fire(&broker, due).await;
                continue;
            }
            Ok((_, next)) => next,
            Err(e) => {
                warn!(error = %e, "cannot read timers");
                None
            }
        };
        let sleep = match next {
            Some(at) => Duration::from_millis(at.saturating_sub(now_ms())).min(MAX_SLEEP),
            None => MAX_SLEEP,
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = broker.timers_changed.notified() => {}
        }
    }
}

/// Counts a due delayed message whose record cannot be read; the first is logged at warn,
/// later ones at debug (`read_message` logged the storage error itself).
fn unreadable(broker: &Broker, t: &TimerEntry) {
    let retry = UNREADABLE_RETRY.as_secs();
    if broker.stats.delayed_unreadable.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
        warn!(
            pos = t.pos.0,
            "a delayed message is due but its record cannot be read; kept, tried again every {retry} s \
             (later ones at debug, counted in ferrymq_delayed_unreadable_total)"
        );
    } else {
        debug!(pos = t.pos.0, "a delayed message's record still cannot be read; tried again in {retry} s");
    }
}

async fn fire(broker: &Broker, due: Vec<TimerEntry>) {
    let (retries, due): (Vec<_>, Vec<_>) = due.into_iter().partition(|t| retry::is_tagged(&t.target));
    fire_retries(broker, retries).await;
    if due.is_empty() {
        return;
    }
    let mut ops = Vec::with_capacity(due.len() * 2);
    let mut targets = Vec::new();
    let journal = broker.journal.clone();
    let read = super::blocking::spawn(move || {
        due.into_iter()
            .map(|t| {
                let ptr = ferrymq_storage::Pointer { pos: t.pos, size: t.size, body_len: 0, tag_hash: 0, flags: 0 };
                let msg = read_message(&journal, &ptr);
                (t, msg)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    for (t, msg) in read {
        ops.push(Op::DeleteTimer { due_ms: t.due_ms, pos: t.pos });
        let Some(msg) = msg else {
            // Nothing is deleted because it could not be read: due again later.
            unreadable(broker, &t);
            let due_ms = now_ms() + UNREADABLE_RETRY.as_millis() as u64;
            ops.push(Op::AddTimer { due_ms, pos: t.pos, size: t.size, target: t.target.clone() });
            continue;
        };
        debug!(exchange = %msg.exchange, key = %msg.routing_key, "delayed message due");
        let vhost = std::str::from_utf8(&t.target).ok().filter(|v| !v.is_empty()).unwrap_or(MQTT_VHOST);
        let routes = match broker.router.route(vhost, &msg.exchange, &msg, "") {
            Ok((routes, _)) => routes,
            Err(e) => {
                warn!(error = %e, "delayed message cannot be routed; dropped");
                continue;
            }
        };
        // Connected sessions get it directly, other cluster members' subscribers through
        // them; a retained one is re-appended so that the retained index owns a record of
        // its own.
        let direct = Routes { sessions: routes.sessions.clone(), members: routes.members.clone(), ..Routes::default() };
        for command in broker.dedup_write(&routes.dedup).commands() {
            command_ops(command, &mut ops);
        }
        let retain = if msg.retain { RetainMode::Persist } else { RetainMode::None };
        drop(broker.publish(&msg, &direct, retain, StoreWrite::none()).await);
        if routes.queues.is_empty() {
            continue;
        }
        let (queues, msg_targets) = MessageTargets::for_queues(&msg, &routes.queues);
        targets.push(msg_targets);
        ops.push(Op::Enqueue { pos: t.pos, size: t.size, body_len: msg.payload.len() as u32, queues });
    }
    // Wait for durability so the next turn does not see the same timers again.
    let signal = broker.submit(ops, targets, true).await;
    if let Ok(Err(e)) = signal.await {
        warn!(error = %e, "cannot store fired timers");
    }
}

/// Fires due retry timers: tells each entry's queue owner, then removes the timers (and
/// waits until that is written, so the scheduler's next turn does not see them again).
/// Timers with an unknown tagged target are removed.
async fn fire_retries(broker: &Broker, due: Vec<TimerEntry>) {
    if due.is_empty() {
        return;
    }
    let mut ops = Vec::with_capacity(due.len());
    for t in due {
        match retry::decode_target(&t.target) {
            Some((queue, offset)) => broker.shards.send(ShardCmd::RetryDue { queue, offset, due_ms: t.due_ms }),
            None => warn!(pos = t.pos.0, "timer with an unknown target kind; dropped"),
        }
        ops.push(Op::DeleteTimer { due_ms: t.due_ms, pos: t.pos });
    }
    if let Ok(Err(e)) = broker.submit(ops, Vec::new(), false).await.await {
        warn!(error = %e, "cannot remove fired retry timers");
    }
}

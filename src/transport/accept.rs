//! What an accept loop may take: every accepted client socket is counted against its
//! listener class's cap (`mqtt.max_connections`, `amqp.max_connections`,
//! `http.max_connections`) and against one budget of file descriptors derived from the
//! process's open-files limit, of which each class of listener keeps a reserve that the
//! others may not take. A flood of idle sockets on one listener (the management port, say)
//! therefore ends at its cap or at what the others' reserves leave it, and AMQP and MQTT
//! clients still connect. A refused socket is closed at accept; the first refusal of a
//! run is logged (and the end of the run), every one is counted (`/metrics`).
//!
//! An accept that fails (out of descriptors after all: `EMFILE`) is logged once per run
//! too, and its loop waits before it tries again instead of spinning.
//!
//! The budget: the soft open-files limit, less what is open when the server starts and
//! what the journal may open later ([`FILES_RESERVE`]), at most half of the limit. Each
//! class with a listener keeps `budget / (2 × classes)` (at most its cap) for itself.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tracing::{info, warn};

/// Descriptors kept for the journal beyond those open at start: commit-log segments
/// (256 open at most), consume-queue files (1,024 at most), sled and a margin.
pub const FILES_RESERVE: usize = 256 + 1024 + 64;

/// How long an accept loop waits after a failed accept.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The kinds of listener whose sockets are counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SocketClass {
    /// MQTT over TCP and TLS (`mqtt.listen`, `mqtt.tls_listen`).
    Mqtt,
    /// MQTT over WebSocket (`mqtt.ws_listen`, `mqtt.wss_listen`).
    MqttWs,
    /// AMQP 0-9-1 over TCP and TLS (`amqp.listen`, `amqp.tls_listen`).
    Amqp,
    /// The management API, `/metrics` and the dashboard (`http.listen`,
    /// `http.tls_listen`, `prometheus.listen`).
    Http,
}

impl SocketClass {
    /// Every class.
    pub const ALL: [SocketClass; 4] = [SocketClass::Mqtt, SocketClass::MqttWs, SocketClass::Amqp, SocketClass::Http];

    /// The name in logs and in `/metrics` (`listener` label).
    pub fn name(self) -> &'static str {
        match self {
            SocketClass::Mqtt => "mqtt",
            SocketClass::MqttWs => "mqtt-ws",
            SocketClass::Amqp => "amqp",
            SocketClass::Http => "http",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The configuration key of the class's cap.
    fn cap_key(self) -> &'static str {
        match self {
            SocketClass::Mqtt | SocketClass::MqttWs => "mqtt.max_connections",
            SocketClass::Amqp => "amqp.max_connections",
            SocketClass::Http => "http.max_connections",
        }
    }
}

/// Why a socket was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The class's cap is reached.
    Cap,
    /// The descriptors left are the other classes' reserves.
    Descriptors,
}

impl Refusal {
    /// The `reason` label in `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Cap => "cap",
            Refusal::Descriptors => "descriptors",
        }
    }
}

/// The caps and the budget, as configured and as the open-files limit allows.
#[derive(Debug, Clone, Copy)]
pub struct BudgetConfig {
    /// `mqtt.max_connections`: MQTT over TCP, TLS and WebSocket together.
    pub mqtt: usize,
    /// `amqp.max_connections`.
    pub amqp: usize,
    /// `http.max_connections`.
    pub http: usize,
    /// Client sockets the open-files limit leaves (`None`: not known, caps only).
    pub descriptors: Option<usize>,
}

impl BudgetConfig {
    /// The client sockets the process's open-files limit leaves: the soft limit less
    /// the descriptors open now and [`FILES_RESERVE`], at least half of the limit
    /// (Linux: `/proc/self/limits`, `/proc/self/fd`; elsewhere unknown).
    pub fn descriptors_now() -> Option<usize> {
        let (soft, _) = rlimit::Resource::NOFILE.get().ok()?;
        let soft = usize::try_from(soft).unwrap_or(usize::MAX);
        let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
        let kept = (open + FILES_RESERVE).min(soft / 2);
        Some(soft - kept)
    }
}

#[derive(Debug, Default)]
struct Counts {
    used: [usize; 4],
}

/// The sockets each class holds, and the rule that admits one more.
#[derive(Debug)]
pub struct SocketBudget {
    counts: Mutex<Counts>,
    caps: [usize; 4],
    reserves: [usize; 4],
    budget: usize,
    refused: [[AtomicU64; 2]; 4],
    /// A run of refusals is under way (logged at its start and end).
    refusing: [AtomicBool; 4],
    accept_errors: [AtomicU64; 4],
    accept_failing: [AtomicBool; 4],
    released: Notify,
}

/// A socket counted against its class; dropping it gives the place back.
#[derive(Debug)]
pub struct SocketPermit {
    budget: Arc<SocketBudget>,
    class: SocketClass,
}

impl Drop for SocketPermit {
    fn drop(&mut self) {
        self.budget.counts.lock().used[self.class.index()] -= 1;
        self.budget.released.notify_waiters();
    }
}

/// What `/metrics` shows of one class.
#[derive(Debug, Clone, Copy)]
pub struct ClassStats {
    /// The class.
    pub class: SocketClass,
    /// Sockets held now.
    pub open: usize,
    /// Its cap.
    pub cap: usize,
    /// Its reserve (0 without a listener).
    pub reserve: usize,
    /// Refused at its cap.
    pub refused_cap: u64,
    /// Refused for the others' reserves.
    pub refused_descriptors: u64,
    /// Accepts that failed (out of descriptors, ...).
    pub accept_errors: u64,
}

impl SocketBudget {
    /// The budget for the classes that have a listener (`active`); logs it.
    pub fn new(cfg: BudgetConfig, active: &[SocketClass]) -> Arc<SocketBudget> {
        let mut caps = [0; 4];
        for class in SocketClass::ALL {
            caps[class.index()] = match class {
                SocketClass::Mqtt | SocketClass::MqttWs => cfg.mqtt,
                SocketClass::Amqp => cfg.amqp,
                SocketClass::Http => cfg.http,
            };
        }
        let budget = cfg.descriptors.unwrap_or(usize::MAX);
        let mut reserves = [0; 4];
        let share = budget / (2 * active.len().max(1));
        for class in active {
            reserves[class.index()] = share.min(caps[class.index()]);
        }
        match cfg.descriptors {
            Some(n) => info!(
                client_sockets = n,
                reserve_per_listener = share,
                mqtt = cfg.mqtt,
                amqp = cfg.amqp,
                http = cfg.http,
                "the open-files limit leaves {n} descriptors for client sockets; each kind of listener keeps a reserve \
                 the others cannot take"
            ),
            None => info!(
                mqtt = cfg.mqtt,
                amqp = cfg.amqp,
                http = cfg.http,
                "the open-files limit is not known: connection caps only"
            ),
        }
        let capped: usize = [SocketClass::Mqtt, SocketClass::Amqp, SocketClass::Http]
            .iter()
            .filter(|c| active.contains(c) || (**c == SocketClass::Mqtt && active.contains(&SocketClass::MqttWs)))
            .map(|c| caps[c.index()])
            .fold(0usize, usize::saturating_add);
        if capped > budget {
            info!(
                client_sockets = budget,
                caps = capped,
                "the listeners' caps add up to more client sockets than the open-files limit leaves; connections past \
                 it are refused at accept (raise the limit, e.g. LimitNOFILE= in systemd, to reach the caps)"
            );
        }
        Arc::new(SocketBudget {
            counts: Mutex::default(),
            caps,
            reserves,
            budget,
            refused: Default::default(),
            refusing: Default::default(),
            accept_errors: Default::default(),
            accept_failing: Default::default(),
            released: Notify::new(),
        })
    }

    /// Counts a socket just accepted on a listener of `class`, or refuses it (the caller
    /// closes it); refusals are logged once per run and counted.
    pub fn admit(self: &Arc<Self>, class: SocketClass) -> Result<SocketPermit, Refusal> {
        let verdict = self.check_and_count(class);
        let i = class.index();
        match verdict {
            Ok(()) => {
                if self.refusing[i].swap(false, Ordering::Relaxed) {
                    info!(listener = class.name(), "accepting connections again");
                }
                self.accept_failing[i].store(false, Ordering::Relaxed);
                Ok(SocketPermit { budget: self.clone(), class })
            }
            Err(why) => {
                self.refused[i][why as usize].fetch_add(1, Ordering::Relaxed);
                if !self.refusing[i].swap(true, Ordering::Relaxed) {
                    let open = self.counts.lock().used[i];
                    match why {
                        Refusal::Cap => warn!(
                            listener = class.name(),
                            open,
                            cap = self.caps[i],
                            "new connections are closed at accept: {} is reached (logged once until one is \
                             accepted again; counted in ferrymq_connections_refused)",
                            class.cap_key()
                        ),
                        Refusal::Descriptors => warn!(
                            listener = class.name(),
                            open,
                            client_sockets = self.budget,
                            "new connections are closed at accept: the descriptors left are kept for the other \
                             listeners (logged once until one is accepted again; counted in \
                             ferrymq_connections_refused)"
                        ),
                    }
                }
                Err(why)
            }
        }
    }

    fn check_and_count(&self, class: SocketClass) -> Result<(), Refusal> {
        let mut c = self.counts.lock();
        let i = class.index();
        let in_cap = match class {
            SocketClass::Mqtt | SocketClass::MqttWs => {
                c.used[SocketClass::Mqtt.index()] + c.used[SocketClass::MqttWs.index()]
            }
            _ => c.used[i],
        };
        if in_cap >= self.caps[i] {
            return Err(Refusal::Cap);
        }
        let total: usize = c.used.iter().sum();
        let kept_for_others: usize = SocketClass::ALL
            .iter()
            .filter(|other| **other != class)
            .map(|other| self.reserves[other.index()].saturating_sub(c.used[other.index()]))
            .sum();
        if total.saturating_add(1).saturating_add(kept_for_others) > self.budget {
            return Err(Refusal::Descriptors);
        }
        c.used[i] += 1;
        Ok(())
    }

    /// An accept on a listener of `class` failed: counted, logged once per run; returns
    /// how long the loop waits before it accepts again.
    pub fn accept_failed(&self, class: SocketClass, error: &std::io::Error) -> Duration {
        let i = class.index();
        self.accept_errors[i].fetch_add(1, Ordering::Relaxed);
        if !self.accept_failing[i].swap(true, Ordering::Relaxed) {
            warn!(
                listener = class.name(),
                %error,
                "accept failed; retrying every {} ms (logged once until a connection is accepted again)",
                ACCEPT_RETRY.as_millis()
            );
        }
        ACCEPT_RETRY
    }

    /// Sockets `class` holds now.
    pub fn open(&self, class: SocketClass) -> usize {
        self.counts.lock().used[class.index()]
    }

    /// Waits until none of `classes` holds a socket, telling `open` how many they still
    /// hold each time one is released.
    pub async fn drained(&self, classes: &[SocketClass], mut open: impl FnMut(usize)) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let now: usize = classes.iter().map(|c| self.open(*c)).sum();
            open(now);
            if now == 0 {
                return;
            }
            released.await;
        }
    }

    /// Every class's counts.
    pub fn stats(&self) -> Vec<ClassStats> {
        let used = self.counts.lock().used;
        SocketClass::ALL
            .iter()
            .map(|class| {
                let i = class.index();
                ClassStats {
                    class: *class,
                    open: used[i],
                    cap: self.caps[i],
                    reserve: self.reserves[i],
                    refused_cap: self.refused[i][Refusal::Cap as usize].load(Ordering::Relaxed),
                    refused_descriptors: self.refused[i][Refusal::Descriptors as usize].load(Ordering::Relaxed),
                    accept_errors: self.accept_errors[i].load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Client sockets the open-files limit leaves (`usize::MAX`: not known).
    pub fn descriptors(&self) -> usize {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(descriptors: usize, http: usize) -> Arc<SocketBudget> {
        let cfg = BudgetConfig { mqtt: 100, amqp: 100, http, descriptors: Some(descriptors) };
        SocketBudget::new(cfg, &[SocketClass::Mqtt, SocketClass::Amqp, SocketClass::Http])
    }

    #[test]
    fn a_flood_on_one_listener_leaves_the_others_their_reserves() {
        // 120 descriptors, 3 listeners: each keeps 20.
        let b = budget(120, 1000);
        let http: Vec<_> = std::iter::from_fn(|| b.admit(SocketClass::Http).ok()).take(200).collect();
        assert_eq!(http.len(), 80, "all but the others' reserves");
        assert_eq!(b.admit(SocketClass::Http).unwrap_err(), Refusal::Descriptors);
        let amqp: Vec<_> = std::iter::from_fn(|| b.admit(SocketClass::Amqp).ok()).take(200).collect();
        assert_eq!(amqp.len(), 20, "AMQP's reserve");
        let mqtt: Vec<_> = std::iter::from_fn(|| b.admit(SocketClass::Mqtt).ok()).take(200).collect();
        assert_eq!(mqtt.len(), 20, "MQTT's reserve");
        drop(http);
        assert!(b.admit(SocketClass::Amqp).is_ok(), "freed descriptors go to whoever asks");
        let s = b.stats();
        assert_eq!(s[SocketClass::Http.index()].refused_descriptors, 2, "the flood's end and the one after");
    }

    #[test]
    fn caps_hold_within_the_budget_and_mqtt_shares_one_cap_over_its_transports() {
        let b = budget(100_000, 5);
        let http: Vec<_> = std::iter::from_fn(|| b.admit(SocketClass::Http).ok()).take(10).collect();
        assert_eq!(http.len(), 5);
        assert_eq!(b.admit(SocketClass::Http).unwrap_err(), Refusal::Cap);
        let tcp: Vec<_> = std::iter::from_fn(|| b.admit(SocketClass::Mqtt).ok()).take(60).collect();
        let ws: Vec<_> = std::iter::from_fn(|| b.admit(SocketClass::MqttWs).ok()).take(60).collect();
        assert_eq!(tcp.len() + ws.len(), 100, "mqtt.max_connections over TCP and WebSocket");
        assert_eq!(b.open(SocketClass::MqttWs), 40);
    }

    #[tokio::test]
    async fn drained_waits_for_the_last_socket() {
        let b = budget(1000, 10);
        let p = b.admit(SocketClass::Amqp).unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.drained(&[SocketClass::Amqp, SocketClass::Mqtt], |_| ()).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(p);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("drained").unwrap();
    }
}

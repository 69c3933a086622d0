//! Stopping the process: SIGTERM, SIGINT and SIGHUP are received on a thread of their own
//! (with a small runtime of its own), so that a busy or stuck broker runtime cannot keep
//! the process from stopping. The first SIGTERM or SIGINT asks the broker to shut down and
//! starts the shutdown deadline (`broker.shutdown_grace_secs`, at least one second); a
//! second one, or the deadline, exits the process at once (code 1), logging what was still
//! running: the shutdown's phase, the connections still open (those logged in by name) and
//! the runtime's live tasks.
//!
//! ```text
//!  signal thread ──Stop / Reload──▶ main (Server::shutdown / Server::reload)
//!       │                                  │ phase, open connections
//!       └── 2nd signal / deadline ──▶ log [`Progress`] ──▶ exit(1)
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::signal::unix::{signal, Signal as Listener, SignalKind};
use tokio::sync::mpsc;

use crate::core::broker::Broker;

/// The shortest shutdown deadline: a grace period of 0 still leaves time to flush.
pub const MIN_SHUTDOWN: Duration = Duration::from_secs(1);

/// Connections listed by name in a forced exit's log line (the rest are counted).
const LISTED: usize = 20;

/// What a signal asks of the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM or SIGINT: shut down.
    Stop,
    /// SIGHUP: read the configuration again.
    Reload,
}

/// The signal thread, as the main task sees it.
pub struct Signals {
    rx: mpsc::UnboundedReceiver<Signal>,
    progress: Arc<OnceLock<Arc<Progress>>>,
}

impl Signals {
    /// Starts the signal thread; its handlers are installed when this returns (a SIGTERM
    /// sent from then on stops the broker, even during start-up). `grace`: the shutdown
    /// deadline after the first SIGTERM or SIGINT (at least [`MIN_SHUTDOWN`]).
    pub fn start(grace: Duration) -> std::io::Result<Signals> {
        let (tx, rx) = mpsc::unbounded_channel();
        let progress: Arc<OnceLock<Arc<Progress>>> = Arc::default();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let watched = progress.clone();
        std::thread::Builder::new().name("ferrymq-signals".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let runtime = match runtime {
                Ok(r) => r,
                Err(e) => return drop(ready_tx.send(Err(e))),
            };
            runtime.block_on(async move {
                let listeners = (|| {
                    Ok::<_, std::io::Error>([
                        signal(SignalKind::terminate())?,
                        signal(SignalKind::interrupt())?,
                        signal(SignalKind::hangup())?,
                    ])
                })();
                match listeners {
                    Ok(listeners) => {
                        let _ = ready_tx.send(Ok(()));
                        listen(listeners, tx, grace.max(MIN_SHUTDOWN), watched).await;
                    }
                    Err(e) => drop(ready_tx.send(Err(e))),
                }
            });
        })?;
        ready_rx.recv().map_err(|_| std::io::Error::other("the signal thread did not start"))??;
        Ok(Signals { rx, progress })
    }

    /// What a forced exit logs from now on (the started broker's [`Progress`]).
    pub fn watch(&self, progress: Arc<Progress>) {
        let _ = self.progress.set(progress);
    }

    /// The next signal for the broker.
    pub async fn recv(&mut self) -> Signal {
        self.rx.recv().await.unwrap_or(Signal::Stop)
    }
}

/// The signal thread's loop: forwards the first stop and every reload before it; exits the
/// process at a second stop or at the deadline.
async fn listen(
    [mut term, mut int, mut hup]: [Listener; 3],
    tx: mpsc::UnboundedSender<Signal>,
    grace: Duration,
    progress: Arc<OnceLock<Arc<Progress>>>,
) {
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = hup.recv() => {
                if deadline.is_none() {
                    let _ = tx.send(Signal::Reload);
                }
                continue;
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                forced_exit(&progress, &format!("the shutdown grace period ({} s) is over", grace.as_secs()))
            }
        };
        if deadline.is_some() {
            forced_exit(&progress, &format!("a second {name}"));
        }
        deadline = Some(tokio::time::Instant::now() + grace);
        let _ = tx.send(Signal::Stop);
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    if let Some(at) = deadline {
        tokio::time::sleep_until(at).await;
    }
}

/// Logs what is still running and exits with code 1.
fn forced_exit(progress: &OnceLock<Arc<Progress>>, why: &str) -> ! {
    let still_running = progress.get().map_or_else(|| "starting up".to_owned(), |p| p.describe());
    tracing::error!(%still_running, "{why}: exiting before the shutdown finished");
    std::process::exit(1)
}

/// How far a shutdown got, and what it waits for: what a forced exit logs.
pub struct Progress {
    phase: Mutex<&'static str>,
    /// Connections (sockets accepted, logged in or not) still open; `u64::MAX` until the
    /// shutdown counts them.
    open: AtomicU64,
    broker: Arc<Broker>,
    runtime: tokio::runtime::Handle,
}

impl Progress {
    /// The progress of the broker running on the current runtime.
    pub fn new(broker: Arc<Broker>) -> Progress {
        Progress {
            phase: Mutex::new("running"),
            open: AtomicU64::new(u64::MAX),
            broker,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The shutdown moved on to `phase` (`"waiting for connections to close"`, ...).
    pub fn phase(&self, phase: &'static str) {
        *self.phase.lock() = phase;
    }

    /// `n` connections are still open.
    pub fn open(&self, n: u64) {
        self.open.store(n, Ordering::Relaxed);
    }

    /// One line: the phase, the connections still open (those logged in by protocol, name,
    /// user and client id) and the runtime's live tasks.
    pub fn describe(&self) -> String {
        let phase = *self.phase.lock();
        let logged_in = self.broker.connections().list();
        let open = match self.open.load(Ordering::Relaxed) {
            u64::MAX => String::new(),
            n => format!("{n} connections open, "),
        };
        let mut names: Vec<String> = logged_in.iter().take(LISTED).map(|c| describe_connection(c)).collect();
        if logged_in.len() > LISTED {
            names.push(format!("and {} more", logged_in.len() - LISTED));
        }
        let metrics = self.runtime.metrics();
        format!(
            "{phase}; {open}{} logged in: [{}]; {} tasks alive on {} workers",
            logged_in.len(),
            names.join(", "),
            metrics.num_alive_tasks(),
            metrics.num_workers()
        )
    }
}

fn describe_connection(c: &crate::core::connections::ConnectionInfo) -> String {
    use crate::core::connections::ClientDetails;
    let client = match &c.client {
        ClientDetails::Mqtt { client_id, .. } => format!(" client '{client_id}'"),
        ClientDetails::Amqp { .. } => String::new(),
    };
    format!("{} {} user '{}'{client}", c.protocol.name(), c.name(), c.user)
}

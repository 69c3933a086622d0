//! The real `ferrymq` binary as a child process: started on ephemeral loopback ports with a
//! temporary data directory, ready once it printed its `FERRYMQ READY ...` line (whose
//! addresses it parses), its log kept (printed when the thread owning it panics), killed on
//! drop. Used by the integration tests (`tests/integration/common/mod.rs`) and included by
//! the benches with `#[path = "../tests/integration/common/broker.rs"] mod broker;` (each
//! allows the dead code of the part it does not use), so it depends on nothing but std and
//! `tempfile`.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// `--log` filter of a test broker unless [`Opts::log`] says otherwise.
pub const DEFAULT_LOG: &str = "ferrymq=debug,info";

/// Where the log of a restarted broker's new run begins.
const RESTARTED: &str = "--- restarted ---\n";

/// The broker's stderr as read so far, and a signal when it grows.
#[derive(Default)]
struct LogBuf {
    text: Mutex<String>,
    grew: Condvar,
}

/// A running broker process.
pub struct Broker {
    child: Option<Child>,
    /// Plain MQTT address.
    pub mqtt: SocketAddr,
    /// MQTT over TLS address, if started with one.
    pub mqtts: Option<SocketAddr>,
    /// MQTT over WebSocket address (the harness always opens one on an ephemeral port).
    pub ws: Option<SocketAddr>,
    /// MQTT over secure WebSocket address, if started with one.
    pub wss: Option<SocketAddr>,
    /// AMQP address (present once the AMQP front-end listens).
    pub amqp: Option<SocketAddr>,
    /// AMQP over TLS address, if started with one.
    pub amqps: Option<SocketAddr>,
    /// Management HTTP API address (the harness always opens one on an ephemeral port).
    pub http: Option<SocketAddr>,
    /// Management HTTPS address, if started with one (`--https-listen`).
    pub https: Option<SocketAddr>,
    /// Prometheus-only address, if started with one (`--prometheus-listen`).
    pub prometheus: Option<SocketAddr>,
    /// Data directory (kept across restarts).
    pub dir: PathBuf,
    _tmp: Option<Arc<tempfile::TempDir>>,
    log: Arc<LogBuf>,
    opts: Opts,
}

/// How to start the broker.
#[derive(Clone, Default)]
pub struct Opts {
    /// Extra command-line arguments.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Contents of a config file passed with `--config`.
    pub config: Option<String>,
    /// The `--log` filter (default [`DEFAULT_LOG`]).
    pub log: Option<String>,
    /// Soft limit on open files the process starts with (`ulimit -S -n`).
    pub open_files: Option<u64>,
    /// Soft and hard limit on open files (`ulimit -n`: the broker cannot raise it).
    pub open_files_hard: Option<u64>,
}

impl Opts {
    /// Adds a config file body.
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_owned());
        self
    }
    /// Adds arguments.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|s| s.to_string()));
        self
    }
    /// Adds an environment variable.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// Starts the process with this soft limit on open files.
    pub fn open_files(mut self, soft: u64) -> Self {
        self.open_files = Some(soft);
        self
    }
    /// Starts the process with this soft and hard limit on open files (only the broker's
    /// process has it, never the test's).
    pub fn open_files_hard(mut self, limit: u64) -> Self {
        self.open_files_hard = Some(limit);
        self
    }
    /// Sets the `--log` filter (e.g. `warn` for a benchmark).
    pub fn log(mut self, filter: &str) -> Self {
        self.log = Some(filter.to_owned());
        self
    }
}

/// Path of the broker binary cargo built for these tests (or benches);
/// `BENCH_FERRYMQ_BINARY` names another build (a benchmark comparing two builds).
pub fn binary() -> String {
    std::env::var("BENCH_FERRYMQ_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ferrymq").to_owned())
}

impl Broker {
    /// Starts a broker with defaults (fsync always) on a fresh temporary directory.
    pub fn start() -> Broker {
        Self::start_with(Opts::default())
    }

    /// Starts a broker with options on a fresh temporary directory.
    pub fn start_with(opts: Opts) -> Broker {
        let tmp = Arc::new(tempfile::tempdir().expect("tempdir"));
        let dir = tmp.path().join("data");
        Self::spawn(dir, Some(tmp), opts)
    }

    /// Starts a broker on the data directory `dir` (the caller owns it; its config file,
    /// if any, goes beside it).
    pub fn start_in(dir: PathBuf, opts: Opts) -> Broker {
        Self::spawn(dir, None, opts)
    }

    fn spawn(dir: PathBuf, tmp: Option<Arc<tempfile::TempDir>>, opts: Opts) -> Broker {
        let ulimit = match (opts.open_files_hard, opts.open_files) {
            (Some(limit), _) => Some(format!("ulimit -n {limit}")),
            (None, Some(soft)) => Some(format!("ulimit -S -n {soft}")),
            (None, None) => None,
        };
        let mut cmd = match ulimit {
            // The shell lowers its limit, then becomes the broker (same pid).
            Some(ulimit) => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(format!("{ulimit} && exec \"$0\" \"$@\"")).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        cmd.arg("--data-dir")
            .arg(&dir)
            .arg("--mqtt-listen")
            .arg("127.0.0.1:0")
            .arg("--mqtt-ws-listen")
            .arg("127.0.0.1:0")
            .arg("--amqp-listen")
            .arg("127.0.0.1:0")
            .arg("--http-listen")
            .arg("127.0.0.1:0")
            .arg("--log")
            .arg(opts.log.as_deref().unwrap_or(DEFAULT_LOG));
        if let Some(toml) = &opts.config {
            let path = dir.with_extension("toml");
            std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
            std::fs::write(&path, toml).unwrap();
            cmd.arg("--config").arg(path);
        }
        cmd.args(&opts.args);
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        let mut child = cmd.spawn().expect("spawn ferrymq");
        let log = Arc::new(LogBuf::default());
        let stderr = child.stderr.take().unwrap();
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut line = String::new();
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                log2.text.lock().unwrap().push_str(&line);
                log2.grew.notify_all();
                line.clear();
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std_mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                let _ = tx.send(line.clone());
                line.clear();
            }
        });
        let ready = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                // Not a poll: gives the stderr thread a moment to take in the last lines the
                // broker wrote before it died, so that the panic shows them.
                std::thread::sleep(Duration::from_millis(100));
                panic!("broker did not become ready; log:\n{}", log.text.lock().unwrap());
            }
        };
        let field = |name: &str| -> Option<SocketAddr> {
            ready.split_whitespace().find_map(|kv| kv.strip_prefix(&format!("{name}=")).and_then(|a| a.parse().ok()))
        };
        let mqtt = field("mqtt").unwrap_or_else(|| panic!("no mqtt address in {ready:?}"));
        let mqtts = field("mqtts");
        let ws = field("ws");
        let wss = field("wss");
        let amqp = field("amqp");
        let amqps = field("amqps");
        let http = field("http");
        let https = field("https");
        let prometheus = field("prometheus");
        Broker {
            child: Some(child),
            mqtt,
            mqtts,
            ws,
            wss,
            amqp,
            amqps,
            http,
            https,
            prometheus,
            dir,
            _tmp: tmp,
            log,
            opts,
        }
    }

    /// Stops the broker with SIGTERM and waits for a clean exit (status 0).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, "TERM");
            let status = wait_timeout(&mut child, Duration::from_secs(30));
            match status {
                Some(s) => assert!(s.success(), "broker exited with {s}; log:\n{}", self.log()),
                None => {
                    let _ = child.kill();
                    panic!("broker did not stop on SIGTERM; log:\n{}", self.log());
                }
            }
        }
    }

    /// Sends the running broker a signal (`TERM`, `INT`, `HUP`, ...).
    pub fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            signal(child, sig);
        }
    }

    /// Waits at most `limit` for the broker to exit, whatever its status; `None` if it is
    /// still running (it is killed on drop).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let status = wait_timeout(self.child.as_mut()?, limit)?;
        self.child = None;
        Some(status)
    }

    /// Kills the broker with SIGKILL (a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops cleanly and starts again on the same data directory (new ports).
    pub fn restart(mut self) -> Broker {
        self.stop();
        self.respawn()
    }

    /// Kills and starts again on the same data directory (new ports).
    pub fn crash_restart(mut self) -> Broker {
        self.kill();
        self.respawn()
    }

    /// Starts again on the same data directory and options (same ports only where the
    /// options name them) after [`Broker::stop`] or [`Broker::kill`].
    pub fn start_again(self) -> Broker {
        self.respawn()
    }

    fn respawn(mut self) -> Broker {
        let tmp = self._tmp.take();
        let dir = self.dir.clone();
        let opts = self.opts.clone();
        let old_log = self.log();
        let b = Self::spawn(dir, tmp, opts);
        b.log.text.lock().unwrap().insert_str(0, &format!("--- previous run ---\n{old_log}{RESTARTED}"));
        b
    }

    /// The broker's log so far.
    pub fn log(&self) -> String {
        self.log.text.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until the log of the broker's current run (not of one before
    /// a restart) contains `needle`; whether it did. The log is read by its own thread, so
    /// a line written before `READY` may arrive after it.
    pub fn wait_log(&self, needle: &str) -> bool {
        let seen = |t: &String| t.rsplit_once(RESTARTED).map_or(t.as_str(), |(_, run)| run).contains(needle);
        let text = self.log.text.lock().unwrap();
        let (text, _) = self.log.grew.wait_timeout_while(text, Duration::from_secs(10), |t| !seen(t)).unwrap();
        seen(&text)
    }

    /// Host and port for clients.
    pub fn host_port(&self) -> (String, u16) {
        (self.mqtt.ip().to_string(), self.mqtt.port())
    }

    /// Process id of the running broker (None once stopped or killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- ferrymq log -----\n{}\n-----------------------", self.log());
        }
        self.kill();
        // A debug build's guard caught a blocking journal call on an async runtime worker:
        // it panicked in some task, which a client may not have noticed. Every test fails on it.
        if !std::thread::panicking() && self.log().contains(BLOCKING_ON_WORKER) {
            panic!("the broker made a blocking journal call on an async runtime worker; log:\n{}", self.log());
        }
    }
}

/// What the broker's log says when its guard (debug builds, `ferrymq_storage`'s
/// `forbid_blocking`) caught a blocking journal call on an async runtime worker.
pub const BLOCKING_ON_WORKER: &str = "on an async runtime worker thread";

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status();
}

/// Waits for the child to exit, at most `limit` (std has no wait with a time-out: polls
/// `try_wait`; synchronous, as `Drop` and `stop` are).
fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Runs a command-line invocation of the binary to completion (for start-up errors).
pub fn run_binary(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(binary());
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(20));
    if status.is_none() {
        // Still running (a start that should have been refused): stopped before its stderr
        // is read to the end, which comes only when it exits.
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut out = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    (status.and_then(|s| s.code()).unwrap_or(-1), out)
}

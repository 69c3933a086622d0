//! The `ferrymq` binary: parse flags, load the configuration, run the broker until SIGINT
//! or SIGTERM, then shut down cleanly (exit 0); a second signal, or a shutdown still under
//! way at the end of `broker.shutdown_grace_secs`, exits at once (code 1, see
//! [`ferrymq::composition::shutdown`]). `ferrymq ctl ...` is the admin CLI instead.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ferrymq::composition::config::{Config, Overrides};
use ferrymq::composition::preflight::load_config;
use ferrymq::composition::server::Server;
use ferrymq::composition::shutdown::{Signal, Signals};
use tracing_subscriber::EnvFilter;

/// mimalloc rather than glibc malloc: the broker allocates and frees small buffers on every
/// thread (sled nodes, frames), and glibc's arena locks showed up as futex waits under load.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// FerryMQ: an MQTT 3.1.1/5.0 and AMQP 0-9-1 broker on one durable commit log.
#[derive(Debug, Parser)]
#[command(version = ferrymq::VERSION, about, args_override_self = true)]
struct Cli {
    /// Configuration file (TOML, same layout as conf/ferrymq.toml; any subset of keys).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (commit log + sled).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
    /// Plain MQTT listener address, e.g. 127.0.0.1:1883 ("" turns it off).
    #[arg(long, value_name = "ADDR")]
    mqtt_listen: Option<String>,
    /// MQTT-over-TLS listener address, e.g. 127.0.0.1:8883 (needs tls.cert and tls.key).
    #[arg(long, value_name = "ADDR")]
    mqtts_listen: Option<String>,
    /// MQTT-over-WebSocket listener address, e.g. 127.0.0.1:8083 ("" turns it off).
    #[arg(long, value_name = "ADDR")]
    mqtt_ws_listen: Option<String>,
    /// MQTT-over-secure-WebSocket listener address, e.g. 127.0.0.1:8084 (needs tls.cert and tls.key).
    #[arg(long, value_name = "ADDR")]
    mqtt_wss_listen: Option<String>,
    /// AMQP 0-9-1 listener address, e.g. 127.0.0.1:5672 ("" turns it off).
    #[arg(long, value_name = "ADDR")]
    amqp_listen: Option<String>,
    /// AMQP-over-TLS listener address, e.g. 127.0.0.1:5671 (needs tls.cert and tls.key).
    #[arg(long, value_name = "ADDR")]
    amqps_listen: Option<String>,
    /// Management HTTP API and /metrics listener address, e.g. 127.0.0.1:15672 ("" turns it off).
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
    /// Management HTTPS listener address, e.g. 127.0.0.1:15671 (needs tls.cert and tls.key).
    #[arg(long, value_name = "ADDR")]
    https_listen: Option<String>,
    /// A listener for Prometheus /metrics only, e.g. 127.0.0.1:15692 ("" turns it off).
    #[arg(long, value_name = "ADDR")]
    prometheus_listen: Option<String>,
    /// RabbitMQ definitions file (JSON) imported at start.
    #[arg(long, value_name = "FILE")]
    definitions: Option<String>,
    /// Log level or filter: error, warn, info, debug, trace, or e.g. "ferrymq=debug".
    #[arg(long, value_name = "LEVEL")]
    log: Option<String>,
    /// Without a command, the broker runs.
    #[command(subcommand)]
    command: Option<Command>,
}

/// Commands instead of running the broker.
#[derive(Debug, Subcommand)]
enum Command {
    /// Administer a running broker through its management HTTP API.
    Ctl(ferrymq::operations::ctl::CtlArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Ctl(args)) = &cli.command {
        match ferrymq::operations::ctl::run(args) {
            Ok(out) => {
                print!("{out}");
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("ferrymq ctl: {e}");
                std::process::exit(e.exit_code());
            }
        }
    }
    let overrides = Overrides {
        config_file: cli.config,
        data_dir: cli.data_dir,
        mqtt_listen: cli.mqtt_listen,
        mqtts_listen: cli.mqtts_listen,
        mqtt_ws_listen: cli.mqtt_ws_listen,
        mqtt_wss_listen: cli.mqtt_wss_listen,
        amqp_listen: cli.amqp_listen,
        amqps_listen: cli.amqps_listen,
        http_listen: cli.http_listen,
        https_listen: cli.https_listen,
        prometheus_listen: cli.prometheus_listen,
        definitions: cli.definitions,
        log: cli.log,
    };
    let config = match load_config(&overrides, std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferrymq: {e}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(log_filter(&config.broker.log)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    log_start(&config, &overrides);
    raise_open_files_limit();
    // Before the runtime: a SIGTERM sent as soon as READY is read must stop the broker, and
    // one the runtime is too busy to take must still stop the process.
    let signals = Signals::start(config.broker.shutdown_grace).context("cannot install the signal handlers")?;
    // Its workers are marked: a blocking journal call on one panics in debug builds.
    let runtime = ferrymq::core::blocking::runtime_builder().build().context("cannot start the runtime")?;
    runtime.block_on(run(config, overrides, signals))
}

/// The `--log` filter, with the AMQP client library the shovels use (`lapin`) silenced
/// unless the filter names it: it logs every channel or connection the other side closes
/// as an ERROR (a queue a shovel looks for before declaring it, a broker shutting down),
/// and the shovels log what matters to them themselves.
fn log_filter(filter: &str) -> String {
    if filter.contains("lapin") {
        filter.to_owned()
    } else {
        format!("{filter},lapin=off")
    }
}

/// Logs the version, the data directory and the configuration read, first thing.
fn log_start(config: &Config, overrides: &Overrides) {
    tracing::info!("ferrymq {} starting", ferrymq::VERSION);
    match &overrides.config_file {
        Some(path) => tracing::info!(file = %path.display(), "configuration read"),
        None => tracing::info!("no configuration file: built-in defaults"),
    }
    let env: Vec<String> = std::env::vars().map(|(k, _)| k).filter(|k| k.starts_with("FERRYMQ_")).collect();
    if !env.is_empty() {
        tracing::info!(variables = %env.join(" "), "configuration from the environment");
    }
    tracing::info!(dir = %config.data_dir().display(), "data directory");
}

/// Raises the soft limit on open files to the hard limit, so that the connection caps can
/// be reached (the usual soft limit, 1,024, is far below them); logs what it did. What the
/// limit leaves for client sockets is shared out at start (`ferrymq::transport::accept`), which logs
/// it once.
fn raise_open_files_limit() {
    let (soft, hard) = match rlimit::Resource::NOFILE.get() {
        Ok(limits) => limits,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-files limit");
            return;
        }
    };
    if soft < hard {
        match rlimit::Resource::NOFILE.set(hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised the open-files limit to its hard limit"),
            Err(error) => tracing::warn!(%error, soft, "cannot raise the open-files limit"),
        }
    }
}

async fn run(config: Config, overrides: Overrides, mut signals: Signals) -> anyhow::Result<()> {
    let grace_secs = config.broker.shutdown_grace.as_secs();
    let server = match Server::start(config).await {
        Ok(s) => s,
        Err(e)
            if e.downcast_ref::<ferrymq::composition::server::StartError>().is_some()
                || matches!(e.downcast_ref(), Some(ferrymq::core::JournalError::Layout(_))) =>
        {
            eprintln!("ferrymq: {e:#}");
            std::process::exit(2);
        }
        Err(e) => return Err(e),
    };
    signals.watch(server.progress());
    tracing::info!("{}", server.ready_line());
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", server.ready_line())?;
        out.flush()?;
    }
    while signals.recv().await == Signal::Reload {
        match load_config(&overrides, std::env::vars()) {
            Ok(config) => server.reload(&config),
            Err(e) => tracing::warn!(error = %e, "SIGHUP: configuration not reloaded"),
        }
    }
    tracing::info!(
        grace_secs,
        "shutting down (a second SIGTERM or SIGINT exits at once, logging what is still running)"
    );
    server.shutdown().await;
    Ok(())
}

//! Start-up checks made before anything starts: the configuration's entries as the
//! modules that run them check them ([`load_config`]), the data directory (a directory,
//! and locked for this process, so that a second FerryMQ on it is told so at once), the
//! TLS files (each problem naming its file), the users and the authorization rules of the
//! configuration, and every listener bound, all addresses in use reported together.
//!
//! Nothing is opened in the data directory and no task is started before these pass: a
//! refused start leaves no commit log to replay and logs no listener that never served.
//! Every [`StartError`] is a problem of the configuration, of the host or of the data
//! directory ([`StartError::Restore`], found once it is open) the operator can fix; the
//! binary exits with code 2 for it, as for other configuration errors.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::access::auth::User;
use crate::composition::config::{Config, ConfigError, Overrides};
use crate::transport::tls::TlsError;

/// Why the broker refuses to start (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--data-dir` names something that is not a directory.
    #[error("the data directory {} is a file, not a directory (use --data-dir to name a directory)", .0.display())]
    DataDirIsFile(PathBuf),
    /// The data directory cannot be made or opened.
    #[error("cannot use the data directory {}: {error}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        error: std::io::Error,
    },
    /// Another process holds the data directory's lock.
    #[error(
        "another FerryMQ is running on the data directory {} (it holds the directory's lock): stop it first, \
         or give this one another --data-dir",
        .0.display()
    )]
    DataDirLocked(PathBuf),
    /// A TLS file is missing, unreadable, empty, or the key is not the certificate's.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A bridge's TLS files.
    #[error("bridge `{bridge}`: {error}")]
    BridgeTls {
        /// The bridge's `connection` name.
        bridge: String,
        /// The file and its problem.
        error: crate::transport::tls::ClientTlsError,
    },
    /// Listeners that cannot be opened.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// State stored in the data directory cannot be restored: a record that cannot be read
    /// or decoded, named by kind and key. Nothing stored in the directory was changed.
    #[error(
        "cannot restore the state stored in the data directory {}: {error}. The broker did not start and \
         changed nothing stored in the directory: restore it from a backup (see \"Backing up a data \
         directory\" in docs/durability.md), or start on another --data-dir",
        path.display()
    )]
    Restore {
        /// The data directory.
        path: PathBuf,
        /// The record and what is wrong with it.
        error: crate::core::restore::RestoreError,
    },
    /// Another problem of the configuration (users, rules, ACL files, definitions).
    #[error("{0:#}")]
    Config(anyhow::Error),
}

/// A listener that cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Another process holds the address.
    #[error(
        "cannot listen on {key} {addr}: the address is in use (is another broker already listening on {addr}? \
         use {flag} to choose another address)"
    )]
    InUse {
        /// The configuration key of the listener.
        key: &'static str,
        /// The command-line flag that sets it.
        flag: &'static str,
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Another failure to bind (no such local address, a port below 1024 without the right).
    #[error("cannot listen on {key} {addr}: {error} (use {flag} to choose another address)")]
    Bind {
        /// The configuration key of the listener.
        key: &'static str,
        /// The command-line flag that sets it.
        flag: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// What the system said.
        error: std::io::Error,
    },
    /// Several listeners failed: each is listed.
    #[error("{} listeners cannot be opened:\n  {}", .0.len(), list(.0))]
    Several(Vec<ListenError>),
}

/// One line per failed listener.
fn list(errors: &[ListenError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  ")
}

/// What the checks opened, for the start to use.
pub struct Preflight {
    /// The data directory's lock, held until this is dropped (at the end of the process).
    pub data_dir_lock: File,
    /// The acceptor of the TLS listeners, when one is configured.
    pub tls: Option<TlsAcceptor>,
    /// The configured users (passwords hashed) and the names read from
    /// `auth.mosquitto_password_file`.
    pub users: (Vec<User>, Vec<String>),
    /// The bound listeners, by configuration key.
    pub listeners: Bound,
}

/// Listeners bound before anything starts.
#[derive(Debug, Default)]
pub struct Bound(Vec<(&'static str, TcpListener)>);

impl Bound {
    /// The listener of configuration key `key` (`mqtt.listen`, ...), if one is configured.
    pub fn take(&mut self, key: &str) -> Option<TcpListener> {
        let at = self.0.iter().position(|(k, _)| *k == key)?;
        Some(self.0.swap_remove(at).1)
    }
}

impl Preflight {
    /// Runs the checks in order: data directory, TLS files, users and rules, listeners.
    pub async fn check(config: &Config) -> Result<Preflight, StartError> {
        let data_dir_lock = lock_data_dir(config.data_dir())?;
        let tls = tls_acceptor(config)?;
        for b in config.bridge.mqtt.iter().filter(|b| !b.bridge_cafile.is_empty()) {
            crate::transport::tls::connector(
                &b.bridge_cafile,
                &b.bridge_certfile,
                &b.bridge_keyfile,
                b.bridge_insecure,
                crate::transport::tls::BRIDGE_SETTINGS,
            )
            .map_err(|error| StartError::BridgeTls { bridge: b.connection.clone(), error })?;
        }
        let users = crate::composition::server::configured_users(config).map_err(StartError::Config)?;
        // The rules as configured (the stored ones are checked once the journal is open).
        crate::access::authz::Policy::load(&config.auth, &config.mqtt.exchange, &Default::default())
            .map_err(StartError::Config)?;
        let listeners = bind_all(config).await?;
        Ok(Preflight { data_dir_lock, tls, users, listeners })
    }
}

/// Loads the configuration ([`Config::load`]: the settings, read and checked) and checks
/// the entries it holds for other modules as those modules will take them: users
/// ([`crate::access::auth::check_entries`]), permissions and MQTT rules
/// ([`crate::access::authz::check_entries`]), bridges and shovels ([`crate::links::check_entries`]).
/// What the broker starts with and what SIGHUP reloads; an error names the key.
pub fn load_config(
    overrides: &Overrides,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    let config = Config::load(overrides, env)?;
    crate::links::check_entries(&config.bridge, &config.shovel)?;
    crate::access::auth::check_entries(&config.auth.users)?;
    crate::access::authz::check_entries(&config.auth)?;
    Ok(config)
}

/// Makes the data directory if needed and locks it (an advisory lock on the directory
/// itself: nothing is written in it).
fn lock_data_dir(path: &Path) -> Result<File, StartError> {
    let io = |error| StartError::DataDir { path: path.to_owned(), error };
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => return Err(StartError::DataDirIsFile(path.to_owned())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(path).map_err(io)?,
        Err(e) => return Err(io(e)),
    }
    let dir = File::open(path).map_err(io)?;
    // Spelled out: from Rust 1.89 `File` has a `try_lock` of its own.
    match fs4::FileExt::try_lock(&dir) {
        Ok(()) => Ok(dir),
        Err(fs4::TryLockError::WouldBlock) => Err(StartError::DataDirLocked(path.to_owned())),
        Err(fs4::TryLockError::Error(e)) => Err(io(e)),
    }
}

/// The TLS listeners' acceptor, when one is configured: the files are read and checked
/// here, each problem naming its setting and file.
fn tls_acceptor(config: &Config) -> Result<Option<TlsAcceptor>, TlsError> {
    let any = [config.mqtt.tls_listen, config.mqtt.wss_listen, config.amqp.tls_listen, config.http.tls_listen]
        .iter()
        .any(Option::is_some);
    if !any {
        return Ok(None);
    }
    let t = &config.tls;
    crate::transport::tls::acceptor(&t.cert, &t.key, &t.client_ca, t.verify_client).map(Some)
}

/// Every configured listener, by key and flag.
fn listeners(config: &Config) -> [(&'static str, &'static str, Option<SocketAddr>); 10] {
    [
        ("mqtt.listen", "--mqtt-listen", config.mqtt.listen),
        ("mqtt.tls_listen", "--mqtts-listen", config.mqtt.tls_listen),
        ("mqtt.ws_listen", "--mqtt-ws-listen", config.mqtt.ws_listen),
        ("mqtt.wss_listen", "--mqtt-wss-listen", config.mqtt.wss_listen),
        ("amqp.listen", "--amqp-listen", config.amqp.listen),
        ("amqp.tls_listen", "--amqps-listen", config.amqp.tls_listen),
        ("http.listen", "--http-listen", config.http.listen),
        ("http.tls_listen", "--https-listen", config.http.tls_listen),
        ("prometheus.listen", "--prometheus-listen", config.prometheus.listen),
        ("cluster.listen", "FERRYMQ_CLUSTER__LISTEN", config.cluster.as_ref().map(|c| c.listen)),
    ]
}

/// Binds every configured listener; the failures are reported together.
async fn bind_all(config: &Config) -> Result<Bound, ListenError> {
    let mut bound = Bound::default();
    let mut failed = Vec::new();
    for (key, flag, addr) in listeners(config) {
        let Some(addr) = addr else { continue };
        match TcpListener::bind(addr).await {
            Ok(l) => bound.0.push((key, l)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => failed.push(ListenError::InUse { key, flag, addr }),
            Err(error) => failed.push(ListenError::Bind { key, flag, addr, error }),
        }
    }
    match failed.len() {
        0 => Ok(bound),
        1 => Err(failed.remove(0)),
        _ => Err(ListenError::Several(failed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_is_locked_once_and_a_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let lock = lock_data_dir(&dir).unwrap();
        assert!(matches!(lock_data_dir(&dir), Err(StartError::DataDirLocked(_))));
        drop(lock);
        assert!(lock_data_dir(&dir).is_ok(), "free again");
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(lock_data_dir(&file), Err(StartError::DataDirIsFile(_))));
    }

    /// Each entry config holds for another module loads as plain data and is refused by
    /// its owner's check, the message naming key and entry.
    #[test]
    fn entries_are_refused_by_the_modules_that_take_them() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("[auth]\nusers = [{ name = \"x\", password_hash = \"$7$nope\" }]\n", "`auth.users`: user `x`: "),
            (
                "[auth]\npermissions = [{ user = \"app\", configure = \"(\" }]\n",
                "`auth.permissions`: user `app` in vhost `/`: invalid regular expression",
            ),
            (
                "[auth]\ntopic_permissions = [{ user = \"app\", exchange = \"amq.topic\", write = \"(\" }]\n",
                "`auth.topic_permissions`: user `app` on `amq.topic`: invalid regular expression",
            ),
            (
                "[auth]\nrules = [{ permission = \"allow\", action = \"poke\", topics = [\"#\"] }]\n",
                "`auth.rules`: rule 1: action `poke` is not publish, subscribe, receive or all",
            ),
            (
                "[[bridge.mqtt]]\nconnection = \"c\"\naddress = \"h\"\ntopic = [\"# sideways 1\"]\n",
                "`bridge.mqtt`: bridge `c`: ",
            ),
            (
                "[[bridge.mqtt]]\nconnection = \"c\"\naddress = \"h\"\ntopic = [\"# out 1\"]\n\
                 [[bridge.mqtt]]\nconnection = \"c\"\naddress = \"h\"\ntopic = [\"# in 1\"]\n",
                "`bridge.mqtt`: two bridges are named `c`",
            ),
            (
                "[[shovel]]\nname = \"s\"\nsrc-uri = \"amqp://\"\ndest-uri = \"amqp://\"\n",
                "`shovel`: shovel `s`: give one of src-queue and src-exchange",
            ),
        ];
        for (i, (toml, refusal)) in cases.into_iter().enumerate() {
            let file = dir.path().join(format!("{i}.toml"));
            std::fs::write(&file, toml).unwrap();
            let o = Overrides { config_file: Some(file), ..Default::default() };
            Config::load(&o, []).unwrap_or_else(|e| panic!("config reads {toml:?} as data: {e}"));
            let err = load_config(&o, []).expect_err(toml).to_string();
            assert!(err.starts_with("configuration error: ") && err.contains(refusal), "{toml:?}: {err}");
        }
    }

    #[test]
    fn several_listeners_are_listed_one_a_line() {
        let addr: SocketAddr = "127.0.0.1:1883".parse().unwrap();
        let e = ListenError::Several(vec![
            ListenError::InUse { key: "mqtt.listen", flag: "--mqtt-listen", addr },
            ListenError::InUse { key: "amqp.listen", flag: "--amqp-listen", addr },
        ]);
        let text = e.to_string();
        assert!(text.starts_with("2 listeners cannot be opened:\n  cannot listen on mqtt.listen"), "{text}");
        assert!(text.contains("\n  cannot listen on amqp.listen"), "{text}");
    }
}

//! Configuration: the embedded default (`conf/ferrymq.toml`), `FERRYMQ_*` environment
//! variables, an optional file and command-line overrides, merged in that order of
//! increasing precedence and validated once.
//!
//! Plain typed data: settings are read into the types they mean (enums spelled as the
//! documentation spells them, listener addresses, durations, paths: `value`), and the
//! entries other modules take ([`access`]: users, permissions, rules; [`links`]: bridges,
//! shovels) are kept as written. Those modules check their entries
//! (`crate::composition::preflight::load_config`); config imports none of them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::transport::origin::Origin;

pub mod access;
pub mod cluster;
pub mod links;
mod value;

pub use access::{PermissionEntry, RuleEntry, TopicPermissionEntry, UserEntry};
pub use cluster::{ClusterSection, PeerEntry};
pub use links::{BridgeSection, MqttBridgeEntry, ShovelDefinition, ShovelEntry};
pub use value::{CertLoginFrom, Fsync, Qos0WhenFull, VerifyClient};

/// The default configuration, compiled in.
pub const DEFAULT_TOML: &str = include_str!("../../../conf/ferrymq.toml");

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The sources could not be read or merged, or a key is unknown or has a bad type.
    #[error("configuration error: {0}")]
    Load(config::ConfigError),
    /// A value parsed but is not acceptable.
    #[error("configuration error: `{key}`: {reason}")]
    Invalid {
        /// Dotted key, e.g. `mqtt.listen`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

impl ConfigError {
    /// The value of `key` is not acceptable, for `reason`.
    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { key: key.into(), reason: reason.into() }
    }
}

impl From<config::ConfigError> for ConfigError {
    /// A value a typed setting refused while it was read is [`ConfigError::Invalid`], key
    /// first, as the checks after reading say it; anything else is [`ConfigError::Load`].
    fn from(e: config::ConfigError) -> ConfigError {
        if let config::ConfigError::At { error, key: Some(key), .. } = &e {
            if let config::ConfigError::Message(reason) = error.as_ref() {
                if value::is_refusal(reason) {
                    return ConfigError::invalid(key.as_str(), reason.as_str());
                }
            }
        }
        ConfigError::Load(e)
    }
}

/// Command-line overrides (highest precedence).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--config FILE`.
    pub config_file: Option<PathBuf>,
    /// `--data-dir`.
    pub data_dir: Option<String>,
    /// `--mqtt-listen`.
    pub mqtt_listen: Option<String>,
    /// `--mqtts-listen`.
    pub mqtts_listen: Option<String>,
    /// `--mqtt-ws-listen`.
    pub mqtt_ws_listen: Option<String>,
    /// `--mqtt-wss-listen`.
    pub mqtt_wss_listen: Option<String>,
    /// `--amqp-listen`.
    pub amqp_listen: Option<String>,
    /// `--amqps-listen`.
    pub amqps_listen: Option<String>,
    /// `--http-listen`.
    pub http_listen: Option<String>,
    /// `--https-listen`.
    pub https_listen: Option<String>,
    /// `--prometheus-listen`.
    pub prometheus_listen: Option<String>,
    /// `--definitions`.
    pub definitions: Option<String>,
    /// `--log`.
    pub log: Option<String>,
}

/// The whole configuration, as in `conf/ferrymq.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[broker]`.
    pub broker: BrokerSection,
    /// `[mqtt]`.
    pub mqtt: MqttSection,
    /// `[tls]`.
    pub tls: TlsSection,
    /// `[amqp]`.
    pub amqp: AmqpSection,
    /// `[http]`.
    pub http: HttpSection,
    /// `[prometheus]`.
    pub prometheus: PrometheusSection,
    /// `[storage]`.
    pub storage: StorageSection,
    /// `[auth]`.
    pub auth: AuthSection,
    /// `[bridge]`: links to other brokers.
    #[serde(default)]
    pub bridge: BridgeSection,
    /// `[[shovel]]`: AMQP shovels (RabbitMQ's keys).
    #[serde(default)]
    pub shovel: Vec<ShovelEntry>,
    /// `[cluster]`: absent for a single node.
    #[serde(default)]
    pub cluster: Option<ClusterSection>,
}

/// `[broker]`: process-wide settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerSection {
    /// Directory holding the commit log and the sled database (`--data-dir`).
    pub data_dir: PathBuf,
    /// Tracing filter for the log: `info`, `debug`, or a directive like `ferrymq=debug` (`--log`).
    pub log: String,
    /// Grace period for connections at shutdown (`shutdown_grace_secs`).
    #[serde(rename = "shutdown_grace_secs", deserialize_with = "value::secs")]
    pub shutdown_grace: Duration,
    /// Memory high watermark as a fraction of the machine's memory.
    pub memory_high_watermark: f64,
    /// Memory high watermark in bytes (0 = use the fraction).
    pub memory_high_watermark_bytes: u64,
}

/// `[mqtt]`: the MQTT front-end.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSection {
    /// Plain listener address (`None`: "", off).
    #[serde(deserialize_with = "value::listen")]
    pub listen: Option<SocketAddr>,
    /// TLS listener address (`None`: "", off).
    #[serde(deserialize_with = "value::listen")]
    pub tls_listen: Option<SocketAddr>,
    /// MQTT over WebSocket listener address (`None`: "", off), as EMQX's 8083.
    #[serde(deserialize_with = "value::listen")]
    pub ws_listen: Option<SocketAddr>,
    /// MQTT over secure WebSocket (TLS with `[tls]`) listener address (`None`: "", off), as
    /// EMQX's 8084.
    #[serde(deserialize_with = "value::listen")]
    pub wss_listen: Option<SocketAddr>,
    /// The HTTP path WebSocket clients connect to (`/mqtt`, as EMQX and Mosquitto's
    /// examples; "" accepts any path).
    pub ws_path: String,
    /// Whether a WebSocket upgrade's browser `Origin` is checked (EMQX's
    /// `check_origin_enable`). Unset: on the listeners that admit anonymous clients, where
    /// any web page the user opens could otherwise connect. An origin passes when it is
    /// listed in `ws_check_origins` or names the host the client connected to (any port:
    /// the dashboard's own page), unless that listener is bound to loopback and the host
    /// is not a loopback name (DNS rebinding); others are refused with 403.
    #[serde(default)]
    pub ws_check_origin_enable: Option<bool>,
    /// Origins allowed besides the listener's own host, `scheme://host[:port]` (EMQX's
    /// `check_origins`), e.g. `["https://app.example.com"]`.
    #[serde(deserialize_with = "value::origins")]
    pub ws_check_origins: Vec<Origin>,
    /// Whether an upgrade without `Origin` (not a browser: paho, rumqttc, MQTT.js in
    /// Node) passes the origin check (EMQX's `allow_origin_absence`).
    pub ws_allow_origin_absence: bool,
    /// The client certificate's common name is the user name (Mosquitto's
    /// `use_identity_as_username`; the password is not checked).
    pub use_identity_as_username: bool,
    /// The client certificate's subject (RFC 4514) is the user name (Mosquitto's
    /// `use_subject_as_username`).
    pub use_subject_as_username: bool,
    /// Whether a CONNECT without a user name is let in (Mosquitto's `allow_anonymous`).
    /// Unset: yes on a loopback listener while MQTT passwords are not checked, no
    /// otherwise (Mosquitto 2.0's rule).
    #[serde(default)]
    pub allow_anonymous: Option<bool>,
    /// Topic exchange of virtual host `/` that MQTT publishes and subscriptions use.
    pub exchange: String,
    /// Most concurrent MQTT connections over TCP, TLS and WebSocket together; more are
    /// closed at accept (AMQP has `amqp.max_connections`).
    pub max_connections: usize,
    /// Largest inbound packet, bytes; a packet announcing more is refused before its body is read.
    pub max_packet_size: u32,
    /// Receive Maximum granted to clients: QoS 1/2 publishes one may have unacknowledged.
    pub receive_maximum: u16,
    /// Outbound in-flight limit per client.
    pub max_inflight: u16,
    /// Persistent-session queue limit, messages.
    pub max_queued_messages: u64,
    /// Persistent-session queue limit, bytes.
    pub max_queued_bytes: u64,
    /// In-memory queue of a connected clean session, messages.
    pub max_online_queue: usize,
    /// Seconds a connected subscriber may leave its socket unread while deliveries wait
    /// before it is disconnected as a slow consumer (MQTT 5 reason 0x97)
    /// (`slow_consumer_timeout_secs`).
    #[serde(rename = "slow_consumer_timeout_secs", deserialize_with = "value::secs")]
    pub slow_consumer_timeout: Duration,
    /// Accepted so that older configuration files still load, and ignored: QoS 0 beyond a
    /// clean session's buffer is always dropped for that subscriber (`wait` is warned about).
    #[serde(default, deserialize_with = "value::choice_or_unset")]
    pub qos0_when_full: Option<Qos0WhenFull>,
    /// Most levels in a topic name or filter, at most [`MAX_KEY_WORDS`] (0 is read as that
    /// ceiling: a topic of more levels could not be routed).
    ///
    /// [`MAX_KEY_WORDS`]: crate::core::router::MAX_KEY_WORDS
    pub max_topic_levels: usize,
    /// Topic Alias Maximum granted to clients.
    pub topic_alias_maximum: u16,
    /// How long a socket may stay open without a complete CONNECT (`connect_timeout_secs`).
    #[serde(rename = "connect_timeout_secs", deserialize_with = "value::secs")]
    pub connect_timeout: Duration,
    /// Keep-alive ceiling (0 = none).
    pub max_keepalive_secs: u16,
    /// Longest session expiry interval granted, seconds (also what 3.1.1 persistent sessions get).
    pub max_session_expiry_secs: u32,
    /// Accept MQTT 3.1 (`MQIsdp`, level 3) clients.
    pub allow_v3_1: bool,
    /// `$SYS` refresh period (`sys_interval_secs`; `None`: 0, off).
    #[serde(rename = "sys_interval_secs", deserialize_with = "value::secs_or_none")]
    pub sys_interval: Option<Duration>,
}

/// `[tls]`: certificate and key for TLS listeners.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// PEM certificate chain path.
    pub cert: String,
    /// PEM private key path.
    pub key: String,
    /// PEM CA certificates client certificates are verified against ("" = none).
    pub client_ca: String,
    /// Client certificates: `none` (not asked for), `optional` (verified when presented),
    /// `required` (a client without a valid one fails the handshake).
    #[serde(deserialize_with = "value::choice")]
    pub verify_client: VerifyClient,
}

/// `[amqp]`: the AMQP 0-9-1 front-end.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSection {
    /// Listener address (`None`: "", off).
    #[serde(deserialize_with = "value::listen")]
    pub listen: Option<SocketAddr>,
    /// TLS listener address (`None`: "", off).
    #[serde(deserialize_with = "value::listen")]
    pub tls_listen: Option<SocketAddr>,
    /// Most concurrent AMQP connections (plain and TLS together); more are closed at accept.
    pub max_connections: usize,
    /// frame_max proposed in Tune.
    pub frame_max: u32,
    /// channel_max proposed in Tune.
    pub channel_max: u16,
    /// Heartbeat proposed in Tune, seconds.
    pub heartbeat_secs: u16,
    /// Largest message body accepted, bytes; a larger one closes the channel with 406.
    pub max_message_size: u64,
    /// Deliveries a manual-ack consumer without a prefetch limit may hold unacknowledged
    /// (its deliveries wait in memory until its socket takes them, so this bounds what one
    /// stalled consumer can pin).
    pub max_unacked_without_prefetch: u32,
    /// Accepted so that older configuration files still load, and ignored (with a
    /// warning): de-duplication is opt-in per exchange or queue (`x-message-deduplication`).
    #[serde(default)]
    pub dedup_window_secs: u64,
    /// What a SASL EXTERNAL login takes from the client certificate as the user name:
    /// `distinguished_name` (RFC 4514, e.g. `O=client,CN=app`) or `common_name`
    /// (RabbitMQ's `ssl_cert_login_from`).
    #[serde(deserialize_with = "value::choice")]
    pub ssl_cert_login_from: CertLoginFrom,
}

/// `[auth]`: users and virtual hosts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// Check MQTT CONNECT user names and passwords against the users (AMQP always does).
    pub mqtt: bool,
    /// Virtual hosts that exist: AMQP Connection.Open names one, MQTT uses `/`.
    pub vhosts: Vec<String>,
    /// Default user ("" = none).
    pub default_user: String,
    /// Password of `default_user`.
    pub default_pass: String,
    /// Tags of `default_user` (RabbitMQ's `default_user_tags`).
    pub default_user_tags: Vec<String>,
    /// Users that may only connect from loopback.
    pub loopback_users: Vec<String>,
    /// Users besides `default_user`.
    pub users: Vec<UserEntry>,
    /// A Mosquitto password file (`mosquitto_passwd`'s format) whose users are added; when
    /// set, MQTT logins are checked as with `mqtt = true` (`None`: "").
    #[serde(deserialize_with = "value::path")]
    pub mosquitto_password_file: Option<PathBuf>,
    /// Failed logins with one user name from one address within `login_failure_window_secs`
    /// after which that user name's next attempts from there wait `login_failure_delay_ms`
    /// before they are answered; its own successful login clears the count (0 = off).
    pub max_login_failures: u32,
    /// Failed logins from one address, whatever the user names, within the window after
    /// which every attempt from it waits (unset: 4 x `max_login_failures`; 0 = off). A
    /// successful login does not clear it: the window runs out.
    #[serde(default)]
    pub max_login_failures_per_address: Option<u32>,
    /// The window failed logins are counted in (`login_failure_window_secs`).
    #[serde(rename = "login_failure_window_secs", deserialize_with = "value::secs")]
    pub login_failure_window: Duration,
    /// How long an attempt past either limit waits (`login_failure_delay_ms`).
    #[serde(rename = "login_failure_delay_ms", deserialize_with = "value::millis")]
    pub login_failure_delay: Duration,
    /// Logins from one address under way at once (waiting their delay or being checked);
    /// more are refused at once without being checked (AMQP 403, MQTT CONNACK 0x9F /
    /// not authorized, HTTP 429) (0 = no limit).
    pub max_pending_logins_per_address: u32,
    /// Check what logged-in clients do: RabbitMQ's permissions for AMQP, the MQTT rules for
    /// MQTT, refusing what nothing grants (off: everything allowed).
    pub authorization: bool,
    /// Permissions per user and virtual host (RabbitMQ's `set_permissions`).
    pub permissions: Vec<PermissionEntry>,
    /// Topic permissions per user, virtual host and exchange (RabbitMQ's
    /// `set_topic_permissions`).
    pub topic_permissions: Vec<TopicPermissionEntry>,
    /// MQTT topic rules, first match wins.
    pub rules: Vec<RuleEntry>,
    /// A Mosquitto `acl_file` whose rules follow `rules`; turns MQTT authorization on
    /// (`None`: "").
    #[serde(deserialize_with = "value::path")]
    pub mosquitto_acl_file: Option<PathBuf>,
    /// An EMQX `acl.conf` whose rules follow those; turns MQTT authorization on (`None`: "").
    #[serde(deserialize_with = "value::path")]
    pub emqx_acl_file: Option<PathBuf>,
}

impl AuthSection {
    /// `max_login_failures_per_address`, or 4 x `max_login_failures` when unset.
    pub fn login_failures_per_address(&self) -> u32 {
        self.max_login_failures_per_address.unwrap_or(self.max_login_failures.saturating_mul(4))
    }
}

impl AuthSection {
    /// True when MQTT requests are checked: `authorization`, or an ACL file is given.
    pub fn mqtt_authorization(&self) -> bool {
        self.authorization || self.mosquitto_acl_file.is_some() || self.emqx_acl_file.is_some()
    }

    /// Every user: the default one and the listed ones, loopback restrictions applied.
    pub fn all_users(&self) -> Vec<UserEntry> {
        let mut all = Vec::new();
        if !self.default_user.is_empty() {
            all.push(UserEntry {
                name: self.default_user.clone(),
                password: Some(self.default_pass.clone()),
                password_hash: None,
                hashing_algorithm: None,
                loopback_only: false,
                tags: self.default_user_tags.clone(),
            });
        }
        all.extend(self.users.iter().cloned());
        for u in &mut all {
            u.loopback_only |= self.loopback_users.contains(&u.name);
        }
        all
    }
}

/// `[http]`: the management HTTP API, `/metrics` and the dashboard.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Listener address (`None`: "", off).
    #[serde(deserialize_with = "value::listen")]
    pub listen: Option<SocketAddr>,
    /// The same over TLS with `[tls]`'s certificate (`None`: "", off), as RabbitMQ's 15671.
    #[serde(deserialize_with = "value::listen")]
    pub tls_listen: Option<SocketAddr>,
    /// Most concurrent HTTP connections over `listen`, `tls_listen` and `prometheus.listen`
    /// together; more are closed at accept.
    pub max_connections: usize,
    /// Seconds a connection has to send a complete request head, from its accept or from
    /// the end of its previous response (so also how long a keep-alive connection may
    /// idle between requests) (`header_read_timeout_secs`).
    #[serde(rename = "header_read_timeout_secs", deserialize_with = "value::secs")]
    pub header_read_timeout: Duration,
    /// How long a connection may go without a byte moving either way while a request body
    /// is read or a response written; then it is closed (`idle_timeout_secs`).
    #[serde(rename = "idle_timeout_secs", deserialize_with = "value::secs")]
    pub idle_timeout: Duration,
    /// `/metrics` needs no credentials (RabbitMQ's Prometheus plugin default).
    pub metrics_without_auth: bool,
    /// Name of this node in the API (`node`), as RabbitMQ's `rabbit@host`.
    pub node_name: String,
    /// How often the counters behind the API's rates are sampled (RabbitMQ's
    /// `collect_statistics_interval`, ms).
    #[serde(deserialize_with = "value::millis")]
    pub collect_statistics_interval: Duration,
    /// Largest request body the API reads, bytes (RabbitMQ's `management.http.max_body_size`,
    /// 20 MiB: a definitions file of 100,000 queues is about 10 MB).
    pub max_body_size: usize,
    /// Cluster name reported by `/api/overview`.
    pub cluster_name: String,
    /// A RabbitMQ definitions file imported at start (`--definitions`; "" = none), as
    /// RabbitMQ's `load_definitions`.
    #[serde(deserialize_with = "value::path")]
    pub load_definitions: Option<PathBuf>,
}

/// `[prometheus]`: a listener of its own for `/metrics` (RabbitMQ's Prometheus plugin
/// port 15692); `/metrics` is on `http.listen` either way.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusSection {
    /// Listener address (`None`: "", off).
    #[serde(deserialize_with = "value::listen")]
    pub listen: Option<SocketAddr>,
}

/// `[storage]`: the journal.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    /// When an acknowledgement is sent: `always`, `interval`, `never`.
    #[serde(deserialize_with = "value::choice")]
    pub fsync: Fsync,
    /// fsync period when `fsync = "interval"` (`interval_ms`).
    #[serde(rename = "interval_ms", deserialize_with = "value::millis")]
    pub interval: Duration,
    /// How often sled is flushed and a checkpoint recorded (a crash replays at most two
    /// intervals of the commit log) (`checkpoint_interval_ms`).
    #[serde(rename = "checkpoint_interval_ms", deserialize_with = "value::millis")]
    pub checkpoint_interval: Duration,
    /// A checkpoint is also taken once the commit log grew by this many bytes, whatever the
    /// interval (0 = by time only).
    pub checkpoint_bytes: u64,
    /// Pad each synced group commit to a 4 KiB page boundary (fewer bytes written, up to a
    /// page of log space per sync).
    pub page_aligned_syncs: bool,
    /// Segment size in bytes.
    pub segment_size: u64,
    /// Unreferenced commit-log segments older than this are deleted
    /// (`retention_max_age_secs`; `None`: 0, keep).
    #[serde(rename = "retention_max_age_secs", deserialize_with = "value::secs_or_none")]
    pub retention_max_age: Option<Duration>,
    /// Oldest unreferenced segments are deleted while the log is larger than this, bytes (0 = no limit).
    pub retention_max_bytes: u64,
    /// Oldest unreferenced segments are deleted, whatever their age, while the data file
    /// system is fuller than this fraction (0 = off); RocketMQ's `diskMaxUsedSpaceRatio`.
    pub retention_max_disk_used_ratio: f64,
    /// sled page cache, bytes.
    pub cache_bytes: u64,
    /// Space kept in reserve in `data_dir/ballast`, given up when the file system has less
    /// free space than this at start (so the broker can open its journal), or than half of
    /// it while running (0 = none).
    pub ballast_bytes: u64,
    /// Publishers are blocked while the data directory's file system has less free space
    /// than this, bytes (0 = off); RabbitMQ's `disk_free_limit.absolute`.
    pub disk_free_limit_bytes: u64,
    /// When above 0: the disk free limit is this times the memory high watermark (bytes),
    /// instead of `disk_free_limit_bytes`.
    pub disk_free_limit_relative: f64,
}

impl Config {
    /// Loads the embedded default, then `FERRYMQ_*` variables from `env`, then the file,
    /// then the overrides, and validates the result.
    pub fn load(overrides: &Overrides, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        use config::{Environment, File, FileFormat};
        let env_map: config::Map<String, String> = env.into_iter().filter(|(k, _)| k.starts_with("FERRYMQ_")).collect();
        let mut builder =
            config::Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml)).add_source(
                Environment::with_prefix("FERRYMQ")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true)
                    .source(Some(env_map)),
            );
        if let Some(path) = &overrides.config_file {
            builder = builder.add_source(File::from(path.as_path()).format(FileFormat::Toml).required(true));
        }
        let set = |b: config::ConfigBuilder<config::builder::DefaultState>, key: &str, v: &Option<String>| {
            b.set_override_option(key, v.clone())
        };
        builder = set(builder, "broker.data_dir", &overrides.data_dir)?;
        builder = set(builder, "mqtt.listen", &overrides.mqtt_listen)?;
        builder = set(builder, "mqtt.tls_listen", &overrides.mqtts_listen)?;
        builder = set(builder, "mqtt.ws_listen", &overrides.mqtt_ws_listen)?;
        builder = set(builder, "mqtt.wss_listen", &overrides.mqtt_wss_listen)?;
        builder = set(builder, "amqp.listen", &overrides.amqp_listen)?;
        builder = set(builder, "amqp.tls_listen", &overrides.amqps_listen)?;
        builder = set(builder, "http.listen", &overrides.http_listen)?;
        builder = set(builder, "http.tls_listen", &overrides.https_listen)?;
        builder = set(builder, "prometheus.listen", &overrides.prometheus_listen)?;
        builder = set(builder, "http.load_definitions", &overrides.definitions)?;
        builder = set(builder, "broker.log", &overrides.log)?;
        let mut cfg: Config = builder.build()?.try_deserialize()?;
        cfg.validate()?;
        if cfg.mqtt.max_topic_levels == 0 {
            // "Unlimited" in older files: as many as the router takes.
            cfg.mqtt.max_topic_levels = crate::core::router::MAX_KEY_WORDS;
        }
        Ok(cfg)
    }

    /// Checks values serde cannot check. The entries config holds for other modules
    /// (users, permissions and rules, bridges, shovels) are checked by those modules
    /// (`preflight::load_config`).
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: String| Err(ConfigError::invalid(key, reason));
        if let Some(cluster) = &self.cluster {
            cluster.validate()?;
        }
        for (key, addr) in [
            ("mqtt.tls_listen", self.mqtt.tls_listen),
            ("mqtt.wss_listen", self.mqtt.wss_listen),
            ("amqp.tls_listen", self.amqp.tls_listen),
            ("http.tls_listen", self.http.tls_listen),
        ] {
            if addr.is_some() && (self.tls.cert.is_empty() || self.tls.key.is_empty()) {
                return invalid("tls.cert", format!("{key} is set but tls.cert or tls.key is empty"));
            }
        }
        if self.amqp.frame_max < 4096 {
            return invalid("amqp.frame_max", "must be at least 4096".into());
        }
        if !(0.0..=1.0).contains(&self.storage.retention_max_disk_used_ratio) {
            return invalid("storage.retention_max_disk_used_ratio", "must be a fraction between 0 and 1".into());
        }
        if !(self.storage.disk_free_limit_relative >= 0.0 && self.storage.disk_free_limit_relative.is_finite()) {
            return invalid("storage.disk_free_limit_relative", "must be a number of 0 or more".into());
        }
        if !(0.0..=1.0).contains(&self.broker.memory_high_watermark) {
            return invalid("broker.memory_high_watermark", "must be a fraction between 0 and 1".into());
        }
        let x = &self.mqtt.exchange;
        if x.is_empty() || (x.starts_with("amq.") && x != "amq.topic") {
            return invalid(
                "mqtt.exchange",
                format!("`{x}` is not a topic exchange name (amq.topic or a name of your own)"),
            );
        }
        if self.tls.verify_client != VerifyClient::None && self.tls.client_ca.is_empty() {
            return invalid(
                "tls.client_ca",
                "tls.verify_client needs the CA client certificates are checked against".into(),
            );
        }
        if self.auth.vhosts.is_empty() {
            return invalid("auth.vhosts", "at least one virtual host is needed".into());
        }
        if self.storage.checkpoint_interval.is_zero() {
            return invalid("storage.checkpoint_interval_ms", "must be > 0".into());
        }
        if self.storage.fsync == Fsync::Interval && self.storage.interval.is_zero() {
            return invalid("storage.interval_ms", "must be > 0 with fsync = \"interval\"".into());
        }
        if self.storage.segment_size < 4096 {
            return invalid("storage.segment_size", "must be at least 4096 bytes".into());
        }
        if self.mqtt.max_packet_size < 64 {
            return invalid("mqtt.max_packet_size", "must be at least 64 bytes".into());
        }
        if self.mqtt.receive_maximum == 0 {
            return invalid("mqtt.receive_maximum", "must be > 0".into());
        }
        if self.mqtt.max_inflight == 0 {
            return invalid("mqtt.max_inflight", "must be > 0".into());
        }
        for (key, n) in [
            ("mqtt.max_connections", self.mqtt.max_connections),
            ("amqp.max_connections", self.amqp.max_connections),
            ("http.max_connections", self.http.max_connections),
        ] {
            if n == 0 {
                return invalid(key, "must be > 0".into());
            }
        }
        if self.http.header_read_timeout.is_zero() {
            return invalid("http.header_read_timeout_secs", "must be > 0".into());
        }
        if self.http.idle_timeout.is_zero() {
            return invalid("http.idle_timeout_secs", "must be > 0".into());
        }
        if self.mqtt.max_topic_levels > crate::core::router::MAX_KEY_WORDS {
            return invalid(
                "mqtt.max_topic_levels",
                format!(
                    "{} is more than {}, the most words a routing key has (0 means {1})",
                    self.mqtt.max_topic_levels,
                    crate::core::router::MAX_KEY_WORDS
                ),
            );
        }
        if self.mqtt.max_online_queue == 0 {
            return invalid("mqtt.max_online_queue", "must be > 0".into());
        }
        if tracing_subscriber::EnvFilter::try_new(&self.broker.log).is_err() {
            return invalid("broker.log", format!("`{}` is not a log filter", self.broker.log));
        }
        Ok(())
    }

    /// Directory holding the commit log and the sled database (`[broker] data_dir`).
    pub fn data_dir(&self) -> &Path {
        &self.broker.data_dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(o: &Overrides, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::load(o, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn addr(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn embedded_default_loads() {
        let c = load(&Overrides::default(), &[]).unwrap();
        assert_eq!(c.mqtt.listen, addr("127.0.0.1:1883"));
        assert_eq!((c.mqtt.tls_listen, c.prometheus.listen), (None, None), "\"\" is off");
        assert_eq!(c.storage.fsync, Fsync::Always);
        assert_eq!(c.tls.verify_client, VerifyClient::None);
        assert_eq!(c.amqp.ssl_cert_login_from, CertLoginFrom::DistinguishedName);
        assert_eq!(c.mqtt.qos0_when_full, None);
        assert_eq!(c.broker.shutdown_grace, Duration::from_secs(5));
        assert_eq!(c.storage.interval, Duration::from_millis(100));
        assert_eq!(c.storage.retention_max_age, Some(Duration::from_secs(259_200)));
        assert_eq!(c.mqtt.sys_interval, Some(Duration::from_secs(5)));
        assert_eq!(c.auth.login_failure_delay, Duration::from_millis(2000));
        assert_eq!(c.http.collect_statistics_interval, Duration::from_millis(5000));
        assert_eq!((c.http.load_definitions.as_ref(), c.auth.mosquitto_acl_file.as_ref()), (None, None));
        assert_eq!(c.broker.data_dir, PathBuf::from("./data"));
        assert_eq!(c.mqtt.max_packet_size, 2 * 1024 * 1024);
    }

    #[test]
    fn precedence_default_env_file_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.toml");
        std::fs::write(&file, "[mqtt]\nlisten = \"127.0.0.1:2000\"\nmax_inflight = 7\n").unwrap();
        let env = [
            ("FERRYMQ_MQTT__LISTEN", "127.0.0.1:1000"),
            ("FERRYMQ_MQTT__MAX_INFLIGHT", "5"),
            ("FERRYMQ_MQTT__RECEIVE_MAXIMUM", "9"),
        ];
        // env over default
        let c = load(&Overrides::default(), &env).unwrap();
        assert_eq!(c.mqtt.listen, addr("127.0.0.1:1000"));
        assert_eq!(c.mqtt.receive_maximum, 9);
        // file over env
        let o = Overrides { config_file: Some(file.clone()), ..Default::default() };
        let c = load(&o, &env).unwrap();
        assert_eq!(c.mqtt.listen, addr("127.0.0.1:2000"));
        assert_eq!(c.mqtt.max_inflight, 7);
        assert_eq!(c.mqtt.receive_maximum, 9);
        // flags over file
        let o = Overrides { config_file: Some(file), mqtt_listen: Some("127.0.0.1:3000".into()), ..Default::default() };
        let c = load(&o, &env).unwrap();
        assert_eq!(c.mqtt.listen, addr("127.0.0.1:3000"));
        // "" turns a listener off, from a flag as from the file.
        let o = Overrides { mqtt_listen: Some(String::new()), ..Default::default() };
        assert_eq!(load(&o, &env).unwrap().mqtt.listen, None);
    }

    #[test]
    fn topic_levels_are_bounded_by_what_the_router_takes() {
        let levels = |v: &str| load(&Overrides::default(), &[("FERRYMQ_MQTT__MAX_TOPIC_LEVELS", v)]);
        assert_eq!(levels("0").unwrap().mqtt.max_topic_levels, 256, "0 (once: unlimited) is the ceiling");
        assert_eq!(levels("256").unwrap().mqtt.max_topic_levels, 256);
        let err = levels("257").unwrap_err().to_string();
        assert!(err.contains("mqtt.max_topic_levels") && err.contains("256"), "{err}");
    }

    #[test]
    fn unknown_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.toml");
        std::fs::write(&file, "[mqtt]\nlisten_port = 5\n").unwrap();
        let o = Overrides { config_file: Some(file), ..Default::default() };
        let err = load(&o, &[]).unwrap_err().to_string();
        assert!(err.contains("listen_port"), "{err}");
    }

    /// The typed settings read the spellings the documentation gives, and refuse another
    /// with the key, the value and what is allowed.
    #[test]
    fn typed_settings_read_their_spellings_and_name_what_is_allowed() {
        let one = |k: &str, v: &str| load(&Overrides::default(), &[(k, v)]);
        let c = one("FERRYMQ_STORAGE__FSYNC", "interval").unwrap();
        assert_eq!(c.storage.fsync, Fsync::Interval);
        assert_eq!(one("FERRYMQ_STORAGE__FSYNC", "never").unwrap().storage.fsync, Fsync::Never);
        let c = one("FERRYMQ_AMQP__SSL_CERT_LOGIN_FROM", "common_name").unwrap();
        assert_eq!(c.amqp.ssl_cert_login_from, CertLoginFrom::CommonName);
        assert_eq!(one("FERRYMQ_MQTT__QOS0_WHEN_FULL", "wait").unwrap().mqtt.qos0_when_full, Some(Qos0WhenFull::Wait));
        assert_eq!(one("FERRYMQ_MQTT__QOS0_WHEN_FULL", "").unwrap().mqtt.qos0_when_full, None);
        assert_eq!(one("FERRYMQ_MQTT__SYS_INTERVAL_SECS", "0").unwrap().mqtt.sys_interval, None);
        assert_eq!(one("FERRYMQ_STORAGE__RETENTION_MAX_AGE_SECS", "0").unwrap().storage.retention_max_age, None);
        let c = one("FERRYMQ_BROKER__SHUTDOWN_GRACE_SECS", "9").unwrap();
        assert_eq!(c.broker.shutdown_grace, Duration::from_secs(9));
        let refusals = [
            (
                "FERRYMQ_STORAGE__FSYNC",
                "sometimes",
                "`storage.fsync`: `sometimes` is not one of always, interval, never",
            ),
            (
                "FERRYMQ_TLS__VERIFY_CLIENT",
                "maybe",
                "`tls.verify_client`: `maybe` is not one of none, optional, required",
            ),
            (
                "FERRYMQ_AMQP__SSL_CERT_LOGIN_FROM",
                "subject",
                "`amqp.ssl_cert_login_from`: `subject` is not one of distinguished_name, common_name",
            ),
            ("FERRYMQ_MQTT__QOS0_WHEN_FULL", "block", "`mqtt.qos0_when_full`: `block` is not one of wait, drop"),
            ("FERRYMQ_HTTP__LISTEN", "localhost", "`http.listen`: `localhost` is not an address like 127.0.0.1:1883"),
            ("FERRYMQ_STORAGE__CHECKPOINT_INTERVAL_MS", "0", "`storage.checkpoint_interval_ms`: must be > 0"),
        ];
        for (k, v, said) in refusals {
            let err = one(k, v).unwrap_err().to_string();
            assert_eq!(err, format!("configuration error: {said}"), "{k}={v}");
        }
        // "Always" is not a spelling of `always`: the documented names only.
        assert!(one("FERRYMQ_STORAGE__FSYNC", "Always").is_err());
        // A bad type and an unknown key stay config's own messages, naming the key.
        let err = one("FERRYMQ_BROKER__SHUTDOWN_GRACE_SECS", "soon").unwrap_err().to_string();
        assert!(err.contains("shutdown_grace_secs") && err.contains("invalid type"), "{err}");
    }

    #[test]
    fn bad_value_is_named() {
        let err = load(&Overrides::default(), &[("FERRYMQ_STORAGE__FSYNC", "sometimes")]).unwrap_err().to_string();
        assert!(err.contains("storage.fsync"), "{err}");
        let o = Overrides { mqtt_listen: Some("nowhere".into()), ..Default::default() };
        let err = load(&o, &[]).unwrap_err().to_string();
        assert!(err.contains("mqtt.listen"), "{err}");
        let err = load(&Overrides::default(), &[("FERRYMQ_MQTT__MAX_INFLIGHT", "many")]).unwrap_err().to_string();
        assert!(err.contains("max_inflight"), "{err}");
        let err = load(&Overrides::default(), &[("FERRYMQ_MQTT__EXCHANGE", "amq.direct")]).unwrap_err().to_string();
        assert!(err.contains("mqtt.exchange"), "{err}");
    }
}

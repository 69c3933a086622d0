//! Start-up and shutdown: open the journal, restore state, bind the listeners, accept
//! connections under the connection limit, and stop in two phases (stop accepting and tell
//! connections; then wait with a deadline and flush the journal last).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::access::auth::{LoginThrottle, User, Users};
use crate::access::authz::{Authorizer, Policy};
use crate::cluster::Cluster;
use crate::composition::config::{Config, Qos0WhenFull};
use crate::composition::member::MemberState;
use crate::composition::preflight::Preflight;
use crate::composition::shutdown::Progress;
use crate::core::alarm::ResourceAlarm;
use crate::core::broker::Broker;
use crate::core::connections::Listener;
use crate::core::data_dir::{DataDir, OpenError};
use crate::core::entities::Entities;
use crate::core::queue::{Overflow, QueueConfig};
use crate::core::restore::{RestoreError, Stored};
use crate::core::scheduler;
use crate::core::store::AccessRecords;
use crate::frontends::amqp::AmqpContext;
use crate::frontends::mqtt::session::Control;
use crate::frontends::mqtt::{self, LoginRule, MqttContext, MqttLogins};
use crate::operations::http::{HttpContext, ListenerInfo};
use crate::transport::accept::{BudgetConfig, SocketBudget, SocketClass, SocketPermit};

pub use crate::composition::preflight::{ListenError, StartError};

/// A started broker: state restored, listeners bound; [`Server::shutdown`] stops it.
pub struct Server {
    /// Bound plain MQTT address.
    pub mqtt_addr: Option<SocketAddr>,
    /// Bound MQTT-over-TLS address.
    pub mqtts_addr: Option<SocketAddr>,
    /// Bound MQTT-over-WebSocket address.
    pub ws_addr: Option<SocketAddr>,
    /// Bound MQTT-over-secure-WebSocket address.
    pub wss_addr: Option<SocketAddr>,
    /// Bound AMQP address.
    pub amqp_addr: Option<SocketAddr>,
    /// Bound AMQP-over-TLS address.
    pub amqps_addr: Option<SocketAddr>,
    /// Bound management HTTP address.
    pub http_addr: Option<SocketAddr>,
    /// Bound management HTTPS address.
    pub https_addr: Option<SocketAddr>,
    /// Bound Prometheus-only address.
    pub prometheus_addr: Option<SocketAddr>,
    broker: Arc<Broker>,
    /// The data directory's journal, closed last at shutdown.
    data: DataDir,
    mqtt: Arc<MqttContext>,
    amqp: Arc<AmqpContext>,
    alarm: Arc<ResourceAlarm>,
    /// Client sockets per kind of listener, within the open-files limit.
    sockets: Arc<SocketBudget>,
    /// The users `auth.mosquitto_password_file` gave (replaced when SIGHUP reads it again).
    file_users: parking_lot::Mutex<Vec<String>>,
    stop_accepting: watch::Sender<bool>,
    grace: Duration,
    /// The shovels (stopped first at shutdown: their connections are clients of ours).
    shovels: Arc<crate::links::shovel::Shovels>,
    /// The data directory's lock, held while the broker runs.
    _data_dir_lock: std::fs::File,
    /// How far a shutdown got (what a forced exit logs).
    progress: Arc<Progress>,
    /// This member of a cluster (`[cluster]`).
    cluster: Option<Arc<Cluster>>,
}

impl Server {
    /// Checks the configuration, the data directory and the listeners ([`Preflight`]:
    /// a [`StartError`] then), opens the data directory, restores state and starts
    /// listening. A start that fails once the journal is open closes it cleanly, so that
    /// the next start has no commit log to replay.
    pub async fn start(config: Config) -> anyhow::Result<Server> {
        let pre = Preflight::check(&config).await?;
        let dir = config.data_dir().to_path_buf();
        let restore_error = |error| StartError::Restore { path: dir.clone(), error };
        let data = match DataDir::open(&dir, &config.storage, alarm_limits(&config).1).await {
            Ok(data) => data,
            Err(OpenError::Restore(error)) => return Err(restore_error(error).into()),
            Err(OpenError::Journal(e)) => {
                return Err(anyhow::Error::new(e).context(format!("cannot open the data directory {}", dir.display())))
            }
        };
        // Everything restored is read first, before anything is applied or cleaned up: a
        // record that cannot be read or decoded stops the start with nothing written.
        let stored = match data.load().await {
            Ok(stored) => stored,
            Err(error) => {
                data.close().await;
                return Err(restore_error(error).into());
            }
        };
        match Self::start_on(config, pre, &data, stored).await {
            Ok(server) => Ok(server),
            Err(e) => {
                // Closed cleanly, so that the next start has no commit log to replay.
                data.close().await;
                Err(e)
            }
        }
    }

    /// The start once the journal is open and what it stores is read (`stored`).
    async fn start_on(config: Config, mut pre: Preflight, data: &DataDir, stored: Stored) -> anyhow::Result<Server> {
        let restore_error = |error| StartError::Restore { path: config.data_dir().to_path_buf(), error };
        // What only the front-ends decode, checked before anything is applied.
        check_stored_access(&stored.access).map_err(restore_error)?;
        // Queues nobody configured are MQTT session and group queues.
        let mut session_queues = QueueConfig::new("mqtt-session", crate::core::router::MQTT_VHOST);
        session_queues.max_len = config.mqtt.max_queued_messages;
        session_queues.max_bytes = config.mqtt.max_queued_bytes;
        session_queues.overflow = Overflow::DropQos0First;
        session_queues.max_offset_span = Some(32767);
        let shard_count = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).max(2);
        // Unbounded, and bounded by what feeds it: a dead letter is a message leaving a queue
        // (rejected, expired, past a limit) whose removal from the queue is only applied when
        // the dead-letter task republishes it, so the backlog is at most the queues' own
        // contents, which their limits and the memory alarm bound.
        let (dead_tx, dead_rx) = tokio::sync::mpsc::unbounded_channel();
        if config.mqtt.qos0_when_full == Some(Qos0WhenFull::Wait) {
            warn!("mqtt.qos0_when_full = \"wait\" is ignored: a publisher never waits for one subscriber");
        }
        // A cluster member's metadata commands go through the metadata group (its Raft log
        // opened here; a log that cannot be read stops the start).
        let cluster = match &config.cluster {
            Some(section) => {
                let (section, tls, dir) = (section.clone(), config.tls.clone(), config.data_dir().to_path_buf());
                Some(crate::core::blocking::spawn(move || Cluster::open(&section, &tls, &dir)).await??)
            }
            None => None,
        };
        let (local_state, catalog) = data.local_store();
        let state = cluster.as_ref().map(|c| c.state_machine(local_state.clone()));
        let broker =
            Arc::new(data.start_broker(shard_count, session_queues, dead_tx, &config.mqtt.exchange, state).await?);
        tokio::spawn(crate::core::dead_letter::run(broker.clone(), dead_rx));
        broker.restore_retained(stored.retained);
        let (memory_limit, disk_free_limit) = alarm_limits(&config);
        let alarm = ResourceAlarm::new(memory_limit, disk_free_limit, Some(config.data_dir().to_path_buf()));
        // Checked once before any listener opens: a client must never slip in before the
        // first periodic check (a start-up race seen in CI under load).
        alarm.check();
        tokio::spawn(alarm.clone().run());
        let (configured, from_file) = std::mem::take(&mut pre.users);
        let users = Users::new(configured, login_throttle(&config));
        let stored_access = stored.access;
        restore_access(&broker, &config, &users, &stored_access);
        let authz = authorizer(&config, &stored_access)?;
        authz.update(|p| p.user_tags = users.all().into_iter().map(|u| (u.name, u.tags)).collect());
        let logins = MqttLogins {
            users: users.clone(),
            check_passwords: config.auth.mqtt || config.auth.mosquitto_password_file.is_some(),
            allow_anonymous: config.mqtt.allow_anonymous,
        };
        let mqtt = MqttContext::restore(
            broker.clone(),
            config.mqtt.clone(),
            logins,
            authz.clone(),
            alarm.clone(),
            stored.sessions,
        )
        .map_err(restore_error)?;
        let entities = Entities::start(broker.clone(), stored.entities).map_err(restore_error)?;
        let amqp =
            AmqpContext::start(broker.clone(), &config, users.clone(), authz.clone(), alarm.clone(), entities.clone());
        // Everything stored is restored: only now is what nothing refers to deleted.
        entities.drop_orphan_queues().await;
        mqtt.drop_orphan_queues().await;
        broker.restore_dedup_caches(stored.dedup).await;

        tokio::spawn(scheduler::run(broker.clone()));
        tokio::spawn(mqtt.clone().run_expiry());
        tokio::spawn(mqtt.timers.clone().run());
        if let Some(every) = config.mqtt.sys_interval {
            tokio::spawn(mqtt::sys::run(mqtt.clone(), every));
        }

        let sockets = SocketBudget::new(
            BudgetConfig {
                mqtt: config.mqtt.max_connections,
                amqp: config.amqp.max_connections,
                http: config.http.max_connections,
                descriptors: BudgetConfig::descriptors_now(),
            },
            &active_socket_classes(&config),
        );
        let (stop_accepting, stop_rx) = watch::channel(false);
        let progress = Arc::new(Progress::new(broker.clone()));
        let mut server = Server {
            mqtt_addr: None,
            mqtts_addr: None,
            ws_addr: None,
            wss_addr: None,
            amqp_addr: None,
            amqps_addr: None,
            http_addr: None,
            https_addr: None,
            prometheus_addr: None,
            broker,
            data: data.clone(),
            mqtt,
            amqp,
            alarm,
            sockets,
            file_users: parking_lot::Mutex::new(from_file),
            stop_accepting,
            grace: config.broker.shutdown_grace,
            shovels: Arc::new(crate::links::shovel::Shovels::new(None, None)),
            _data_dir_lock: pre.data_dir_lock,
            progress,
            cluster: None,
        };
        let tls = pre.tls.clone();
        use Kind::{Amqp, Mqtt, MqttWs};
        let listeners = [
            ("mqtt.listen", Mqtt, false),
            ("mqtt.tls_listen", Mqtt, true),
            ("mqtt.ws_listen", MqttWs, false),
            ("mqtt.wss_listen", MqttWs, true),
            ("amqp.listen", Amqp, false),
            ("amqp.tls_listen", Amqp, true),
        ];
        for (key, kind, is_tls) in listeners {
            let Some(listener) = pre.listeners.take(key) else { continue };
            let bound = Some(listener.local_addr()?);
            match (kind, is_tls) {
                (Mqtt, false) => server.mqtt_addr = bound,
                (Mqtt, true) => server.mqtts_addr = bound,
                (MqttWs, false) => server.ws_addr = bound,
                (MqttWs, true) => server.wss_addr = bound,
                (Amqp, false) => server.amqp_addr = bound,
                (Amqp, true) => server.amqps_addr = bound,
            }
            if let (Mqtt | MqttWs, Some(addr)) = (kind, bound) {
                log_login_rule(&server.mqtt, addr, is_tls);
            }
            if let (MqttWs, Some(addr)) = (kind, bound) {
                let origins = ws_origin_policy(&server.mqtt, addr.ip().is_loopback());
                match origins.check {
                    true => info!(
                        listener = %addr,
                        allowed = %origins_text(&config.mqtt.ws_check_origins),
                        "MQTT WebSocket: browser origins checked (its own host and mqtt.ws_check_origins pass)"
                    ),
                    false => info!(listener = %addr, "MQTT WebSocket: browser origins not checked"),
                }
            }
            let front = match kind {
                Amqp => Front::Amqp(server.amqp.clone()),
                Mqtt => Front::Mqtt(server.mqtt.clone()),
                MqttWs => Front::MqttWs(server.mqtt.clone()),
            };
            let acceptor = if is_tls { tls.clone() } else { None };
            let class = match kind {
                Amqp => SocketClass::Amqp,
                Mqtt => SocketClass::Mqtt,
                MqttWs => SocketClass::MqttWs,
            };
            let sockets = server.sockets.clone();
            tokio::spawn(accept_loop(listener, acceptor, front, sockets, class, stop_rx.clone()));
        }
        let bridges = Arc::new(crate::links::Bridges::default());
        for b in &config.bridge.mqtt {
            let rules = crate::links::topic_rules(b).map_err(|e| anyhow::anyhow!("bridge `{}`: {e}", b.connection))?;
            // Its TLS files were checked before anything started.
            let bridge = bridges.add(b, &rules);
            // A bridge whose local side the rules let do nothing would say `running` and drop
            // everything it carries: named before it starts.
            for warning in bridge.warnings(&authz) {
                warn!(bridge = %b.connection, "{warning}");
            }
            tokio::spawn(crate::links::mqtt::run(server.mqtt.clone(), b.clone(), rules, bridge, stop_rx.clone()));
        }
        // `amqp://` without a host is FerryMQ itself, reached in-process (listener or not)
        // as the default user.
        let local =
            crate::links::shovel::LocalBroker { amqp: server.amqp.clone(), user: config.auth.default_user.clone() };
        server.shovels = Arc::new(crate::links::shovel::Shovels::new(Some(local), Some(server.broker.clone())));
        for s in &config.shovel {
            server
                .shovels
                .start(&s.vhost, &s.name, s.definition.clone(), false)
                .map_err(|e| StartError::Config(anyhow::anyhow!("shovel `{}`: {e}", s.name)))?;
        }
        for p in stored_access.parameters.iter().filter(|p| p.component == "shovel") {
            if server.shovels.get(&p.vhost, &p.name).is_some() {
                warn!(shovel = %p.name, vhost = %p.vhost, "stored shovel not started: the configuration defines one of that name");
                continue;
            }
            // Its definition decodes: checked before anything started.
            let started = serde_json::from_str(&p.value)
                .map_err(|e| e.to_string())
                .and_then(|def| server.shovels.start(&p.vhost, &p.name, def, true));
            if let Err(e) = started {
                warn!(shovel = %p.name, vhost = %p.vhost, error = %e, "stored shovel not started");
            }
        }
        let ctx = Arc::new(HttpContext {
            shovels: server.shovels.clone(),
            bridges,
            broker: server.broker.clone(),
            entities,
            mqtt: server.mqtt.clone(),
            users: users.clone(),
            cfg: config.http.clone(),
            access: crate::operations::http::access::AccessState::restore(&config, &stored_access),
            authz: authz.clone(),
            loopback_users: config.auth.loopback_users.clone(),
            alarm: server.alarm.clone(),
            sockets: server.sockets.clone(),
            listeners: Default::default(),
            rates: Default::default(),
            queue_rates: Default::default(),
            connection_rates: Default::default(),
            delayed_pending: Default::default(),
            cluster: cluster.clone(),
        });
        if let Some(cluster) = &cluster {
            ctx.entities.set_replicated();
            let listener = pre.listeners.take("cluster.listen").expect("cluster.listen is bound at preflight");
            cluster.start(listener, catalog, local_state, Arc::new(MemberState::new(ctx.clone()))).await?;
        }
        server.cluster = cluster;
        if let Some(path) = &config.http.load_definitions {
            load_definitions(&ctx, path).await.map_err(StartError::Config)?;
        }
        let mut http = crate::operations::http::Listeners::default();
        if let Some(listener) = pre.listeners.take("http.listen") {
            server.http_addr = Some(listener.local_addr()?);
            http.http = Some(listener);
        }
        if let (Some(listener), Some(tls)) = (pre.listeners.take("http.tls_listen"), tls) {
            server.https_addr = Some(listener.local_addr()?);
            http.https = Some((listener, tls));
        }
        if let Some(listener) = pre.listeners.take("prometheus.listen") {
            server.prometheus_addr = Some(listener.local_addr()?);
            http.prometheus = Some(listener);
        }
        *ctx.listeners.write() = server.listener_infos();
        crate::operations::http::start(ctx, http, stop_rx.clone());
        Ok(server)
    }

    /// The line printed once listening, for scripts and tests:
    /// `FERRYMQ READY mqtt=127.0.0.1:1883 [mqtts=...]`.
    pub fn ready_line(&self) -> String {
        let mut line = String::from("FERRYMQ READY");
        if let Some(a) = self.mqtt_addr {
            line.push_str(&format!(" mqtt={a}"));
        }
        if let Some(a) = self.mqtts_addr {
            line.push_str(&format!(" mqtts={a}"));
        }
        if let Some(a) = self.ws_addr {
            line.push_str(&format!(" ws={a}"));
        }
        if let Some(a) = self.wss_addr {
            line.push_str(&format!(" wss={a}"));
        }
        if let Some(a) = self.amqp_addr {
            line.push_str(&format!(" amqp={a}"));
        }
        if let Some(a) = self.amqps_addr {
            line.push_str(&format!(" amqps={a}"));
        }
        if let Some(a) = self.http_addr {
            line.push_str(&format!(" http={a}"));
        }
        if let Some(a) = self.https_addr {
            line.push_str(&format!(" https={a}"));
        }
        if let Some(a) = self.prometheus_addr {
            line.push_str(&format!(" prometheus={a}"));
        }
        line
    }

    /// Every bound listener, with RabbitMQ's protocol names.
    fn listener_infos(&self) -> Vec<ListenerInfo> {
        [
            ("amqp", self.amqp_addr),
            ("amqp/ssl", self.amqps_addr),
            ("mqtt", self.mqtt_addr),
            ("mqtt/ssl", self.mqtts_addr),
            ("http/web-mqtt", self.ws_addr),
            ("https/web-mqtt", self.wss_addr),
            ("http", self.http_addr),
            ("https", self.https_addr),
            ("http/prometheus", self.prometheus_addr),
        ]
        .into_iter()
        .filter_map(|(protocol, addr)| addr.map(|addr| ListenerInfo { protocol, addr }))
        .collect()
    }

    /// The broker core (for embedding and tests).
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Applies what a reloaded configuration may change at runtime (SIGHUP): the memory
    /// high watermark and the disk free limit, the MQTT rules (`[[auth.rules]]` unless
    /// the API has set its own, and the ACL files, read again) and the users of the
    /// Mosquitto password file (as Mosquitto re-reads it); a bad file keeps what is in force.
    pub fn reload(&self, config: &Config) {
        let (memory_limit, disk_free_limit) = alarm_limits(config);
        info!(memory_limit, disk_free_limit, "configuration reloaded");
        self.alarm.set_limits(memory_limit, disk_free_limit);
        let rules = crate::access::authz::rules_of(&config.auth.rules).map_err(anyhow::Error::msg);
        match rules.and_then(|r| Ok((r, crate::access::authz::file_rules(&config.auth)?))) {
            Ok((rules, file_rules)) => {
                let n = self.mqtt.authz.update(|p| {
                    if !p.api_rules {
                        p.rules = rules;
                        p.rule_entries = config.auth.rules.clone();
                    }
                    p.file_rules = file_rules;
                    p.rules.len() + p.file_rules.len()
                });
                info!(mqtt_rules = n, "MQTT rules reloaded");
            }
            Err(e) => warn!(error = %e, "MQTT rules not reloaded; the rules in force stay"),
        }
        if let Some(file) = &config.auth.mosquitto_password_file {
            match crate::access::auth::read_mosquitto_password_file(file) {
                Ok(now) => {
                    let mut names = self.file_users.lock();
                    *names = self.mqtt.logins.users.reload_file(&names, now);
                    info!(file = %file.display(), users = names.len(), "Mosquitto password file reloaded");
                }
                Err(e) => warn!(error = %e, "password file not reloaded; the users in force stay"),
            }
        }
    }

    /// How far a shutdown got: what a forced exit logs (see [`crate::composition::shutdown`]).
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Stops accepting, asks every connection to close (MQTT 5: DISCONNECT 0x8B), waits for
    /// them up to the grace period less the time kept for the final flush (a fifth of it, at
    /// most a second), then flushes and closes the journal. The signal thread exits the
    /// process should this not be done by the end of the grace period.
    pub async fn shutdown(self) {
        let began = tokio::time::Instant::now();
        self.progress.phase("stopping shovels and listeners");
        self.shovels.stop_all();
        let _ = self.stop_accepting.send(true);
        self.mqtt.sessions.tell_online(|| Control::Shutdown);
        self.amqp.shutdown();
        self.progress.phase("waiting for connections to close");
        let until = began + self.grace - (self.grace / 5).min(Duration::from_secs(1));
        let classes = [SocketClass::Mqtt, SocketClass::MqttWs, SocketClass::Amqp];
        let open: usize = classes.iter().map(|c| self.sockets.open(*c)).sum();
        self.progress.open(open as u64);
        info!(
            open,
            wait_ms = until.saturating_duration_since(began).as_millis() as u64,
            "waiting for connections to close"
        );
        let progress = &self.progress;
        let all = self.sockets.drained(&classes, |n| progress.open(n as u64));
        if tokio::time::timeout_at(until, all).await.is_err() {
            warn!(
                still_running = %self.progress.describe(),
                "connections still open at the end of the grace period; stopping without them"
            );
        }
        if let Some(cluster) = &self.cluster {
            self.progress.phase("leaving the metadata group");
            cluster.shutdown().await;
        }
        self.progress.phase("settling the queue owners");
        // Settlements the closed connections sent without waiting (PUBREC, acks) reach the
        // journal before its last flush.
        self.broker.settle_queue_owners().await;
        self.progress.phase("flushing and closing the journal");
        let stats = self.data.close().await;
        info!(
            group_commits = stats.batches,
            log_fdatasyncs = stats.fsyncs,
            checkpoints = stats.checkpoints,
            consume_queue_drains = stats.drains,
            log_bytes = stats.log_bytes,
            "stopped"
        );
    }
}

/// Logs who an MQTT listener lets in. With `mqtt.use_identity_as_username` (or
/// `use_subject_as_username`) the user is the client certificate's, so a listener without
/// TLS lets nobody in.
fn log_login_rule(mqtt: &MqttContext, addr: SocketAddr, is_tls: bool) {
    if mqtt.cfg.use_identity_as_username || mqtt.cfg.use_subject_as_username {
        let setting = if mqtt.cfg.use_subject_as_username {
            "mqtt.use_subject_as_username"
        } else {
            "mqtt.use_identity_as_username"
        };
        if is_tls {
            info!(listener = %addr, "MQTT: user names from client certificates ({setting}); clients without one refused");
        } else {
            info!(
                listener = %addr,
                "MQTT: every client refused: {setting} takes user names from client certificates, which this \
                 listener (no TLS) never has"
            );
        }
        return;
    }
    match mqtt.logins.rule(addr.ip().is_loopback()) {
        LoginRule::Open => info!(listener = %addr, "MQTT: anonymous clients allowed, user names not checked"),
        LoginRule::Checked { anonymous: true } => {
            info!(listener = %addr, "MQTT: anonymous clients allowed, user names and passwords checked")
        }
        LoginRule::Checked { anonymous: false } => info!(
            listener = %addr,
            "MQTT: anonymous clients refused (set mqtt.allow_anonymous = true to allow), \
             user names and passwords checked"
        ),
    }
}

/// Imports a RabbitMQ definitions file (`http.load_definitions`); what cannot be applied
/// stops start-up, what FerryMQ does not support is logged.
async fn load_definitions(ctx: &HttpContext, file: &Path) -> anyhow::Result<()> {
    let path = file.display();
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read the definitions file {path}"))?;
    let defs: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("the definitions file {path} is not JSON"))?;
    let report = crate::operations::http::definitions::import(ctx, &defs, None)
        .await
        .map_err(|e| anyhow::anyhow!("cannot import the definitions file {path}: {}", e.reason))?;
    for item in &report.unsupported {
        warn!(%path, %item, "definition not applied");
    }
    info!(
        %path,
        imported = %serde_json::Value::Object(report.imported.clone()),
        not_applied = report.unsupported.len(),
        "definitions imported"
    );
    Ok(())
}

/// The virtual hosts (configured, then made at runtime, less those deleted at runtime) into
/// the router, their and the users' limits into the core, and the users made or deleted
/// at runtime into `users` (their password hashes checked by [`check_stored_access`]).
fn restore_access(broker: &Broker, config: &Config, users: &Users, records: &AccessRecords) {
    let deleted = |name: &str| records.vhosts.iter().any(|v| v.deleted && v.name == name);
    for vhost in config.auth.vhosts.iter().filter(|v| !deleted(v)) {
        broker.add_vhost(vhost);
    }
    for v in records.vhosts.iter().filter(|v| !v.deleted) {
        broker.add_vhost(&v.name);
    }
    for l in &records.limits {
        broker.set_limits(l.scope, &l.owner, l.values.clone());
    }
    for u in &records.users {
        if u.deleted {
            users.remove(&u.name);
            continue;
        }
        if let Some(user) = crate::access::auth::user_from_record(u, &config.auth.loopback_users) {
            users.put(user);
        }
    }
}

/// The stored access records as only the access layer decodes them: every user's password
/// hash is one this build verifies, the permissions' and MQTT rules' expressions compile,
/// runtime and global parameters are JSON (a shovel's a shovel definition, the cluster
/// name a string). A record that does not is the error: leaving it out would let the
/// configuration's user, permissions or rules of that name come back.
fn check_stored_access(records: &AccessRecords) -> Result<(), RestoreError> {
    use crate::core::restore::{RecordKey, RecordKind};
    let bad = |kind, key: String, reason: String| RestoreError::undecodable(kind, RecordKey::text(key), reason);
    for u in records.users.iter().filter(|u| !u.deleted) {
        crate::access::auth::Secret::from_hash(&u.password_hash, Some(&u.hashing_algorithm))
            .map_err(|e| bad(RecordKind::User, u.name.clone(), format!("its password hash cannot be verified: {e}")))?;
    }
    let mut policy = Policy::default();
    for p in &records.permissions {
        let key = format!("vhost={} user={}", p.vhost, p.user);
        policy.set_permission(p).map_err(|e| bad(RecordKind::Permission, key, e))?;
    }
    for p in &records.topic_permissions {
        let key = format!("vhost={} user={} exchange={}", p.vhost, p.user, p.exchange);
        policy.set_topic_permission(p).map_err(|e| bad(RecordKind::TopicPermission, key, e))?;
    }
    if let Some(json) = &records.mqtt_rules {
        let entries: Vec<crate::access::authz::RuleEntry> =
            serde_json::from_str(json).map_err(|e| bad(RecordKind::MqttRules, "mqtt".into(), e.to_string()))?;
        crate::access::authz::rules_of(&entries).map_err(|e| bad(RecordKind::MqttRules, "mqtt".into(), e))?;
    }
    for p in &records.parameters {
        let key = format!("component={} vhost={} name={}", p.component, p.vhost, p.name);
        let decoded = match p.component.as_str() {
            "shovel" => serde_json::from_str::<crate::links::shovel::ShovelDefinition>(&p.value)
                .map(drop)
                .map_err(|e| format!("its value is not a shovel definition: {e}")),
            _ => serde_json::from_str::<serde_json::Value>(&p.value)
                .map(drop)
                .map_err(|e| format!("its value is not JSON: {e}")),
        };
        decoded.map_err(|reason| bad(RecordKind::Parameter, key, reason))?;
    }
    for (name, value) in &records.global_parameters {
        let decoded = match name.as_str() {
            crate::operations::http::cluster::CLUSTER_NAME => serde_json::from_str::<String>(value)
                .map(drop)
                .map_err(|e| format!("its value is not a JSON string: {e}")),
            _ => serde_json::from_str::<serde_json::Value>(value)
                .map(drop)
                .map_err(|e| format!("its value is not JSON: {e}")),
        };
        decoded.map_err(|reason| bad(RecordKind::GlobalParameter, name.clone(), reason))?;
    }
    Ok(())
}

/// The authorizer: where it is on, and the policy from the configuration, the stored
/// records and the ACL files (a bad file stops start-up naming file, line and problem).
fn authorizer(config: &Config, stored: &AccessRecords) -> anyhow::Result<Arc<Authorizer>> {
    let policy = Policy::load(&config.auth, &config.mqtt.exchange, stored)?;
    let (amqp, mqtt) = (config.auth.authorization, config.auth.mqtt_authorization());
    info!(
        amqp,
        mqtt,
        mqtt_rules = policy.rules.len() + policy.file_rules.len(),
        "authorization {}",
        match (amqp, mqtt) {
            (false, false) => "off: logged-in clients may do everything",
            (true, true) => "on for AMQP (permissions) and MQTT (rules)",
            _ => "on for MQTT (rules); AMQP unchecked",
        }
    );
    let checked = config.auth.mqtt || config.auth.mosquitto_password_file.is_some();
    if mqtt && !checked {
        warn!(
            "MQTT authorization is on but MQTT passwords are not checked: rules naming a user trust the \
             user name a client claims (set auth.mqtt = true or auth.mosquitto_password_file)"
        );
    }
    Ok(Authorizer::new(amqp, mqtt, policy))
}

/// Configured origins as they are written, for the log.
fn origins_text(origins: &[crate::transport::origin::Origin]) -> String {
    origins.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// What a configured listener serves.
#[derive(Clone, Copy)]
enum Kind {
    Mqtt,
    MqttWs,
    Amqp,
}

/// Which front-end a listener serves.
#[derive(Clone)]
enum Front {
    Mqtt(Arc<MqttContext>),
    /// MQTT over WebSocket: the HTTP upgrade first, then the MQTT connection.
    MqttWs(Arc<MqttContext>),
    Amqp(Arc<AmqpContext>),
}

/// The classes of listener the configuration opens (each keeps a reserve of descriptors).
fn active_socket_classes(config: &Config) -> Vec<SocketClass> {
    let mut active = Vec::new();
    let (mqtt, amqp, http) = (&config.mqtt, &config.amqp, &config.http);
    if mqtt.listen.is_some() || mqtt.tls_listen.is_some() {
        active.push(SocketClass::Mqtt);
    }
    if mqtt.ws_listen.is_some() || mqtt.wss_listen.is_some() {
        active.push(SocketClass::MqttWs);
    }
    if amqp.listen.is_some() || amqp.tls_listen.is_some() {
        active.push(SocketClass::Amqp);
    }
    if http.listen.is_some() || http.tls_listen.is_some() || config.prometheus.listen.is_some() {
        active.push(SocketClass::Http);
    }
    active
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    front: Front,
    sockets: Arc<SocketBudget>,
    class: SocketClass,
    mut stop: watch::Receiver<bool>,
) {
    let bound = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tokio::time::sleep(sockets.accept_failed(class, &e)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let Ok(permit) = sockets.admit(class) else {
            debug!(peer = %peer, "connection closed at accept");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let local = Listener {
            addr: stream.local_addr().unwrap_or(bound),
            tls: tls.is_some(),
            local_only: bound.ip().is_loopback(),
            internal: false,
        };
        // Each kind of connection is spawned as a future of its own, so that an MQTT one
        // carries neither the AMQP connection's state nor the TLS handshake's.
        match (front.clone(), tls.clone()) {
            (Front::Mqtt(ctx), None) => {
                tokio::spawn(mqtt::connection::serve(ctx, stream, peer, local, None, permit));
            }
            (Front::Amqp(ctx), None) => {
                tokio::spawn(async move {
                    crate::frontends::amqp::connection::serve(ctx, stream, peer, local, None).await;
                    drop(permit);
                });
            }
            (Front::MqttWs(ctx), None) => {
                tokio::spawn(serve_ws(ctx, stream, peer, local, None, permit));
            }
            (front, Some(acceptor)) => {
                tokio::spawn(serve_tls(front, stream, peer, local, acceptor, permit));
            }
        }
    }
}

/// The configured users (their passwords hashed), then those of
/// `auth.mosquitto_password_file` (which [`Users::new`] lets replace a configured user of
/// the same name); a bad file stops start-up.
pub(crate) fn configured_users(config: &Config) -> anyhow::Result<(Vec<User>, Vec<String>)> {
    let mut users = Vec::new();
    let mut from_file = Vec::new();
    for entry in config.auth.all_users() {
        users.push(User::from_entry(&entry).map_err(|e| anyhow::anyhow!("auth.users: user `{}`: {e}", entry.name))?);
    }
    if let Some(file) = &config.auth.mosquitto_password_file {
        let read = crate::access::auth::read_mosquitto_password_file(file)
            .map_err(|e| anyhow::anyhow!("auth.mosquitto_password_file: {e}"))?;
        info!(file = %file.display(), users = read.len(), "Mosquitto password file loaded; MQTT passwords are checked");
        from_file = read.iter().map(|u| u.name.clone()).collect();
        users.extend(read);
    }
    Ok((users, from_file))
}

/// The failed-login throttle of `[auth]`.
fn login_throttle(config: &Config) -> LoginThrottle {
    let a = &config.auth;
    LoginThrottle::new(crate::access::auth::LoginLimits {
        max_failures: a.max_login_failures,
        max_failures_per_address: a.login_failures_per_address(),
        window: a.login_failure_window,
        delay: a.login_failure_delay,
        max_pending_per_address: a.max_pending_logins_per_address,
    })
}

/// The memory high watermark and the disk free limit, bytes, from `config`.
fn alarm_limits(config: &Config) -> (u64, u64) {
    let memory = ResourceAlarm::memory_limit_from(
        config.broker.memory_high_watermark_bytes,
        config.broker.memory_high_watermark,
    );
    let s = &config.storage;
    (memory, ResourceAlarm::disk_free_limit_from(s.disk_free_limit_bytes, s.disk_free_limit_relative, memory))
}

async fn serve_tls(
    front: Front,
    stream: TcpStream,
    peer: SocketAddr,
    local: Listener,
    acceptor: TlsAcceptor,
    permit: SocketPermit,
) {
    let handshake = Duration::from_secs(10);
    // Boxed: the handshake's state is large and lives only until the session is set up.
    let accepted = tokio::time::timeout(handshake, Box::pin(acceptor.accept(stream))).await;
    // The stream moves on without being borrowed here, so that this future does not keep
    // a copy of it (and of the handshake's result) beside the connection's.
    match accepted {
        Ok(Ok(tls_stream)) => serve_over_tls(front, tls_stream, peer, local, permit).await,
        Ok(Err(e)) => debug!(peer = %peer, error = %e, "TLS handshake failed"),
        Err(_) => debug!(peer = %peer, "TLS handshake timed out"),
    }
}

/// The future that serves an accepted TLS connection on its front, boxed: the caller's
/// future then holds a pointer, not the largest front's state (an MQTT device over TLS
/// would otherwise carry an AMQP connection's 9.6 kB), and the stream is moved into the
/// connection's future once, not kept beside it.
fn serve_over_tls(
    front: Front,
    tls_stream: tokio_rustls::server::TlsStream<TcpStream>,
    peer: SocketAddr,
    local: Listener,
    permit: SocketPermit,
) -> futures_util::future::BoxFuture<'static, ()> {
    // A certificate rustls verified against tls.client_ca (none when not asked for).
    let cert = tls_stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|der| crate::transport::tls::ClientCert::from_der(der))
        .map(Arc::new);
    match front {
        Front::Mqtt(ctx) => Box::pin(mqtt::connection::serve(ctx, tls_stream, peer, local, cert, permit)),
        Front::MqttWs(ctx) => Box::pin(serve_ws(ctx, tls_stream, peer, local, cert, permit)),
        Front::Amqp(ctx) => Box::pin(async move {
            crate::frontends::amqp::connection::serve(ctx, tls_stream, peer, local, cert).await;
            drop(permit);
        }),
    }
}

/// The origin check of a WebSocket listener (`loopback`: bound to a loopback address): by
/// default where it admits anonymous clients, whom a page of any site could connect as
/// with nothing but the user's browser.
fn ws_origin_policy(ctx: &MqttContext, loopback: bool) -> crate::transport::websocket::OriginPolicy {
    let cfg = &ctx.cfg;
    let anonymous = !(cfg.use_identity_as_username || cfg.use_subject_as_username)
        && matches!(ctx.logins.rule(loopback), LoginRule::Open | LoginRule::Checked { anonymous: true });
    crate::transport::websocket::OriginPolicy::of(cfg, anonymous, loopback)
}

/// Upgrades an accepted connection to WebSocket (bounded like a TLS handshake), then serves
/// it as an MQTT connection over the frames' byte stream.
async fn serve_ws<S>(
    ctx: Arc<MqttContext>,
    stream: S,
    peer: SocketAddr,
    local: Listener,
    cert: Option<Arc<crate::transport::tls::ClientCert>>,
    permit: SocketPermit,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    // A frame may hold a whole packet and then some: the MQTT limit plus headroom.
    let max_frame = ctx.cfg.max_packet_size as usize + 64 * 1024;
    let path = ctx.cfg.ws_path.clone();
    let origins = ws_origin_policy(&ctx, local.local_only);
    let upgrade = Box::pin(crate::transport::websocket::accept(stream, &path, &origins, max_frame));
    match tokio::time::timeout(Duration::from_secs(10), upgrade).await {
        Ok(Ok(ws)) => mqtt::connection::serve(ctx, ws, peer, local, cert, permit).await,
        Ok(Err(crate::transport::websocket::WsError::Origin(why))) => {
            let refused = &ctx.broker.stats().ws_origin_refused;
            if refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                warn!(peer = %peer, reason = %why, "MQTT WebSocket upgrade refused (403; later ones at debug, \
                      counted in ferrymq_mqtt_ws_origin_refused_total)");
            } else {
                debug!(peer = %peer, reason = %why, "MQTT WebSocket upgrade refused (403)");
            }
        }
        Ok(Err(e)) => debug!(peer = %peer, error = %e, "WebSocket upgrade failed"),
        Err(_) => debug!(peer = %peer, "WebSocket upgrade timed out"),
    }
}

//! AMQP shovels, as RabbitMQ's dynamic shovels: a definition (the JSON of
//! `/api/parameters/shovel/{vhost}/{name}`, or a `[[shovel]]` table) names a source queue
//! (or an exchange and routing key) and a destination exchange or queue, each on FerryMQ
//! (`amqp://` without a host) or on another AMQP 0-9-1 broker; a worker consumes from the
//! source and publishes to the destination, acknowledging the source as `ack-mode` says
//! (`on-confirm`: only once the destination confirmed), and reconnects after
//! `reconnect-delay` when either side fails. With `src-delete-after` a shovel moves that
//! many messages (or the source queue's length when it started) and then deletes itself.
//!
//! A side on FerryMQ itself is reached in-process, as RabbitMQ's local shovels use a
//! direct connection: the worker's AMQP client runs over a pipe whose far end the AMQP
//! front-end serves as any client connection, acting as `auth.default_user` (no socket,
//! no listener, no password; the same access checks and limits).

#[cfg(feature = "shovels")]
mod local;
#[cfg(feature = "shovels")]
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::watch;
use tracing::warn;

pub(crate) use crate::composition::config::links::{ShovelDefinition, Uris};
use crate::core::broker::{Broker, Commit};
use crate::frontends::amqp::AmqpContext;

/// When a shovel deletes itself (`src-delete-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteAfter {
    /// It runs until deleted.
    Never,
    /// After as many messages as the source queue held when the shovel started.
    QueueLength,
    /// After this many messages.
    Messages(u64),
}

/// How the source is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckMode {
    /// After the destination confirmed the message (no loss).
    OnConfirm,
    /// After the message was sent to the destination.
    OnPublish,
    /// Consumed without acknowledgements.
    NoAck,
}

/// What a shovel's definition asks for, checked: how the source is acknowledged and
/// when the shovel deletes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `ack-mode`.
    pub ack: AckMode,
    /// `src-delete-after`.
    pub delete_after: DeleteAfter,
}

impl Plan {
    /// Checks what serde cannot: one source and one destination, known values, URIs whose
    /// TLS options read; the error says what is wrong.
    pub(crate) fn of(def: &ShovelDefinition) -> Result<Plan, String> {
        if let Some(k) = def.unknown.keys().next() {
            return Err(format!("`{k}` is not a shovel setting FerryMQ supports"));
        }
        if def.src_queue.is_some() == def.src_exchange.is_some() {
            return Err("give one of src-queue and src-exchange".into());
        }
        if def.dest_queue.is_some() && def.dest_exchange.is_some() {
            return Err("give at most one of dest-queue and dest-exchange".into());
        }
        for (key, p) in [("src-protocol", &def.src_protocol), ("dest-protocol", &def.dest_protocol)] {
            if p.as_deref().is_some_and(|p| p != "amqp091") {
                return Err(format!("{key}: only amqp091 is supported"));
            }
        }
        let delete_after = delete_after(def)?;
        if delete_after == DeleteAfter::QueueLength && def.src_queue.is_none() {
            return Err("src-delete-after: queue-length needs a src-queue".into());
        }
        for (key, uris) in [("src-uri", &def.src_uri), ("dest-uri", &def.dest_uri)] {
            let list = uris.list();
            if list.is_empty() || list.iter().any(|u| !(u.starts_with("amqp://") || u.starts_with("amqps://"))) {
                return Err(format!("{key}: amqp:// or amqps:// URIs"));
            }
            for u in &list {
                UriTls::parse(u).map_err(|e| format!("{key}: {e}"))?;
            }
        }
        if def.reconnect_delay.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
            return Err("reconnect-delay: seconds above 0".into());
        }
        let ack = match def.ack_mode.as_deref().unwrap_or("on-confirm") {
            "on-confirm" => AckMode::OnConfirm,
            "on-publish" => AckMode::OnPublish,
            "no-ack" => AckMode::NoAck,
            other => return Err(format!("ack-mode `{other}`: on-confirm, on-publish or no-ack")),
        };
        if ack == AckMode::NoAck && delete_after != DeleteAfter::Never {
            // A no-ack consumer is sent the whole queue: past the count it would be lost.
            return Err("src-delete-after needs ack-mode on-confirm or on-publish".into());
        }
        Ok(Plan { ack, delete_after })
    }
}

/// `src-delete-after`.
fn delete_after(def: &ShovelDefinition) -> Result<DeleteAfter, String> {
    match &def.src_delete_after {
        None => Ok(DeleteAfter::Never),
        Some(Value::String(s)) if s == "never" => Ok(DeleteAfter::Never),
        Some(Value::String(s)) if s == "queue-length" => Ok(DeleteAfter::QueueLength),
        Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
            Some(n) => Ok(DeleteAfter::Messages(n)),
            None => Err(format!("src-delete-after `{v}`: never, queue-length or a number of messages")),
        },
    }
}

/// A shovel's state, as RabbitMQ's `/api/shovels` shows it.
#[derive(Debug, Clone, Default)]
pub struct ShovelStatus {
    /// Consuming and publishing.
    pub running: bool,
    /// Why the last attempt failed.
    pub reason: Option<String>,
    /// Messages moved.
    pub moved: u64,
}

struct Running {
    /// Tells this run from a later one of the same name.
    #[cfg_attr(not(feature = "shovels"), allow(dead_code))]
    run: u64,
    definition: ShovelDefinition,
    dynamic: bool,
    status: Arc<Mutex<ShovelStatus>>,
    stop: watch::Sender<bool>,
}

impl Running {
    fn view(&self, vhost: &str, name: &str) -> ShovelView {
        ShovelView {
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            dynamic: self.dynamic,
            definition: self.definition.clone(),
            status: self.status.lock().clone(),
        }
    }
}

/// How shovels reach FerryMQ itself (`amqp://` without a host): in-process, served by
/// the AMQP front-end.
#[derive(Clone)]
pub struct LocalBroker {
    /// The AMQP front-end that serves the in-process connection.
    pub amqp: Arc<AmqpContext>,
    /// The user the local side acts as (`auth.default_user`; "" when none is set).
    pub user: String,
}

/// Where one side of a shovel connects.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    /// Another broker: the URI as given (TCP or TLS).
    Remote(String),
    /// FerryMQ itself, in-process: the virtual host (percent-encoded) and the URI's query
    /// (`?heartbeat=...`, or "").
    Local { vhost: String, query: String },
}

/// Every shovel, and how to reach FerryMQ itself (`amqp://` without a host).
pub struct Shovels {
    running: Mutex<HashMap<(String, String), Running>>,
    /// FerryMQ itself, for `amqp://` URIs without a host.
    #[cfg_attr(not(feature = "shovels"), allow(dead_code))]
    local: Option<LocalBroker>,
    /// Where dynamic shovels' definitions are stored (a shovel that deletes itself
    /// removes its own).
    #[cfg_attr(not(feature = "shovels"), allow(dead_code))]
    broker: Option<Arc<Broker>>,
    runs: AtomicU64,
}

impl std::fmt::Debug for Shovels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shovels").field("count", &self.running.lock().len()).finish()
    }
}

/// One shovel as listed.
#[derive(Debug, Clone)]
pub struct ShovelView {
    /// Virtual host.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// Defined through the API (`dynamic`) or the configuration (`static`).
    pub dynamic: bool,
    /// The definition.
    pub definition: ShovelDefinition,
    /// Its state.
    pub status: ShovelStatus,
}

impl Shovels {
    /// No shovels yet; `local` is how `amqp://` URIs without a host reach FerryMQ
    /// (`None`: they are refused); `broker` holds the stored definitions of dynamic shovels.
    pub fn new(local: Option<LocalBroker>, broker: Option<Arc<Broker>>) -> Shovels {
        Shovels { running: Mutex::new(HashMap::new()), local, broker, runs: AtomicU64::new(0) }
    }

    /// Starts (or restarts with a new definition) a shovel.
    pub fn start(
        self: &Arc<Self>,
        vhost: &str,
        name: &str,
        definition: ShovelDefinition,
        dynamic: bool,
    ) -> Result<(), String> {
        if !cfg!(feature = "shovels") {
            return Err("this FerryMQ was built without shovels (cargo feature `shovels`)".into());
        }
        let Plan { ack, delete_after } = Plan::of(&definition)?;
        let resolve = |uris: &Uris| -> Result<Vec<Endpoint>, String> {
            uris.list().iter().map(|u| self.resolve(u, vhost)).collect()
        };
        let (src, dest) = (resolve(&definition.src_uri)?, resolve(&definition.dest_uri)?);
        let (stop, stop_rx) = watch::channel(false);
        let status = Arc::new(Mutex::new(ShovelStatus::default()));
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let worker = Worker {
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            def: definition.clone(),
            ack,
            delete_after,
            src,
            dest,
            local: self.local.clone(),
            status: status.clone(),
            home: Arc::downgrade(self),
            run,
        };
        #[cfg(feature = "shovels")]
        tokio::spawn(worker.run(stop_rx));
        #[cfg(not(feature = "shovels"))]
        drop((worker, stop_rx));
        let old = self
            .running
            .lock()
            .insert((vhost.to_owned(), name.to_owned()), Running { run, definition, dynamic, status, stop });
        if let Some(old) = old {
            let _ = old.stop.send(true);
        }
        Ok(())
    }

    /// Stops and forgets a shovel; whether there was one.
    pub fn remove(&self, vhost: &str, name: &str) -> bool {
        match self.running.lock().remove(&(vhost.to_owned(), name.to_owned())) {
            Some(r) => {
                let _ = r.stop.send(true);
                true
            }
            None => false,
        }
    }

    /// Every shovel, by virtual host and name.
    pub fn list(&self) -> Vec<ShovelView> {
        let mut all: Vec<ShovelView> =
            self.running.lock().iter().map(|((vhost, name), r)| r.view(vhost, name)).collect();
        all.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
        all
    }

    /// One shovel.
    pub fn get(&self, vhost: &str, name: &str) -> Option<ShovelView> {
        self.running.lock().get(&(vhost.to_owned(), name.to_owned())).map(|r| r.view(vhost, name))
    }

    /// A shovel moved what `src-delete-after` asked for: it is forgotten, and a dynamic
    /// one's stored definition removed (unless it was redefined meanwhile).
    #[cfg_attr(not(feature = "shovels"), allow(dead_code))]
    async fn finished(&self, vhost: &str, name: &str, run: u64) {
        let key = (vhost.to_owned(), name.to_owned());
        let dynamic = {
            let mut running = self.running.lock();
            match running.get(&key) {
                Some(r) if r.run == run => running.remove(&key).is_some_and(|r| r.dynamic),
                _ => return,
            }
        };
        if let (true, Some(broker)) = (dynamic, &self.broker) {
            let write = broker.stores().access.remove_parameter("shovel", vhost, name);
            if let Err(e) = broker.commit(write, Commit::Durable).await {
                warn!(shovel = %name, vhost = %vhost, error = %e, "cannot remove the finished shovel's definition");
            }
            // Redefined meanwhile: the new definition is the one kept.
            let redefined = self.running.lock().get(&key).filter(|r| r.dynamic).map(|r| r.definition.clone());
            if let Some(def) = redefined {
                let record = crate::core::store::ParameterRecord {
                    component: "shovel".into(),
                    vhost: vhost.into(),
                    name: name.into(),
                    value: serde_json::to_string(&def).unwrap_or_default(),
                };
                if let Err(e) = broker.commit(broker.stores().access.put_parameter(&record), Commit::Durable).await {
                    warn!(shovel = %name, vhost = %vhost, error = %e, "cannot store the redefined shovel");
                }
            }
        }
    }

    /// Stops every shovel.
    pub fn stop_all(&self) {
        for (_, r) in self.running.lock().drain() {
            let _ = r.stop.send(true);
        }
    }

    /// Where a URI leads (see [`endpoint`]), for a shovel of `vhost`.
    fn resolve(&self, uri: &str, vhost: &str) -> Result<Endpoint, String> {
        endpoint(uri, vhost, self.local.as_ref().map(|l| l.user.as_str()))
    }
}

/// Where a URI leads: one without a host is FerryMQ itself, in its path's virtual host or
/// else the shovel's (`vhost`), reached as `local_user` (`None`: not reachable).
fn endpoint(uri: &str, vhost: &str, local_user: Option<&str>) -> Result<Endpoint, String> {
    let (tls, rest) = match uri.strip_prefix("amqps://") {
        Some(rest) => (true, rest),
        None => (false, uri.strip_prefix("amqp://").unwrap_or(uri)),
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    if !authority.is_empty() {
        return Ok(Endpoint::Remote(uri.to_owned()));
    }
    if tls {
        return Err("amqps:// needs a host (amqp:// without one is FerryMQ itself)".into());
    }
    let Some(user) = local_user else {
        return Err("amqp:// names FerryMQ itself, which this FerryMQ's shovels cannot reach".into());
    };
    if user.is_empty() {
        return Err("amqp:// acts as auth.default_user, which is not set: set it, or give a host and user".into());
    }
    let path = path.strip_prefix('/').unwrap_or(path);
    let (path, query) = path.split_at(path.find('?').unwrap_or(path.len()));
    let vhost = if path.is_empty() { percent_encode(vhost) } else { path.to_owned() };
    Ok(Endpoint::Local { vhost, query: query.to_owned() })
}

/// Percent-encodes what a URI's path segment cannot hold.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One shovel's worker.
#[cfg_attr(not(feature = "shovels"), allow(dead_code))]
struct Worker {
    vhost: String,
    name: String,
    def: ShovelDefinition,
    ack: AckMode,
    delete_after: DeleteAfter,
    src: Vec<Endpoint>,
    dest: Vec<Endpoint>,
    local: Option<LocalBroker>,
    status: Arc<Mutex<ShovelStatus>>,
    home: Weak<Shovels>,
    run: u64,
}

/// A URI's TLS files (RabbitMQ's `cacertfile`, `certfile`, `keyfile` query keys), read and
/// checked, and the URI without them.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "shovels"), allow(dead_code))]
pub(crate) struct UriTls {
    /// The URI, TLS keys taken out.
    pub uri: String,
    /// CA certificates trusted besides the system's (PEM).
    pub ca_pem: Option<String>,
    /// The client certificate chain and its PKCS#8 key (PEM), when one is presented.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl UriTls {
    /// Reads the files a URI names; the error names the key and file.
    pub(crate) fn parse(uri: &str) -> Result<UriTls, String> {
        let Some((base, query)) = uri.split_once('?') else {
            return Ok(UriTls { uri: uri.to_owned(), ..UriTls::default() });
        };
        let read = |key: &str, path: &str| std::fs::read(path).map_err(|e| format!("{key} `{path}`: {e}"));
        let (mut ca_pem, mut cert, mut key, mut kept) = (None, None, None, Vec::new());
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "cacertfile" => {
                    let pem =
                        String::from_utf8(read(k, v)?).map_err(|_| format!("cacertfile `{v}` is not PEM text"))?;
                    use rustls_pki_types::pem::PemObject;
                    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).filter(Result::is_ok);
                    if certs.count() == 0 {
                        return Err(format!("cacertfile `{v}` holds no certificate"));
                    }
                    ca_pem = Some(pem);
                }
                "certfile" => cert = Some(read(k, v)?),
                "keyfile" => key = Some(read(k, v)?),
                "verify" if v == "verify_peer" => {}
                "verify" | "fail_if_no_peer_cert" | "server_name_indication" => {
                    return Err(format!("`{k}={v}` is not supported (the server's certificate is always checked)"));
                }
                _ => kept.push(pair),
            }
        }
        let identity = match (cert, key) {
            (Some(pem), Some(key)) => Some((pem, key)),
            (None, None) => None,
            _ => return Err("certfile and keyfile go together".into()),
        };
        if !uri.starts_with("amqps://") && (ca_pem.is_some() || identity.is_some()) {
            return Err("TLS files in an amqp:// URI: use amqps://".into());
        }
        let uri = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        Ok(UriTls { uri, ca_pem, identity })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(vhost: &str, query: &str) -> Result<Endpoint, String> {
        Ok(Endpoint::Local { vhost: vhost.into(), query: query.into() })
    }

    #[test]
    fn a_shovel_uri_without_a_host_is_ferrymq_itself_in_its_path_or_the_shovels_vhost() {
        let guest = Some("guest");
        assert_eq!(endpoint("amqp://", "/", guest), local("%2F", ""));
        assert_eq!(endpoint("amqp:///", "shop floor", guest), local("shop%20floor", ""));
        assert_eq!(endpoint("amqp:///staging", "/", guest), local("staging", ""));
        assert_eq!(endpoint("amqp:///%2F?heartbeat=10", "x", guest), local("%2F", "?heartbeat=10"));
        assert_eq!(endpoint("amqp://?heartbeat=10", "/", guest), local("%2F", "?heartbeat=10"));
        let remote = "amqp://app:secret@central:5672/%2F";
        assert_eq!(endpoint(remote, "/", guest), Ok(Endpoint::Remote(remote.into())));
        assert_eq!(endpoint("amqps://central/%2F", "/", None), Ok(Endpoint::Remote("amqps://central/%2F".into())));
    }

    #[test]
    fn a_local_shovel_uri_needs_a_default_user_and_no_tls() {
        assert!(endpoint("amqps:///", "/", Some("guest")).unwrap_err().contains("needs a host"));
        assert!(endpoint("amqp://", "/", Some("")).unwrap_err().contains("auth.default_user"));
        assert!(endpoint("amqp://", "/", None).unwrap_err().contains("cannot reach"));
    }
}

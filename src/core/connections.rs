//! The client connections of both protocols as operations see them: who is connected, from
//! where, over which protocol, how many bytes went each way, and a way to close one (the
//! management API's `/api/connections`). A front-end registers a connection once its login
//! is accepted and unregisters it when it closes
//! ([`Broker::register_connection`](crate::core::broker::Broker::register_connection),
//! [`Broker::unregister_connection`](crate::core::broker::Broker::unregister_connection));
//! its byte counters are added per socket read or write, never per message.
//!
//! Before a front-end accepts a login it asks for an [`Admission`]
//! ([`Broker::admit`](crate::core::broker::Broker::admit)): the connection is counted against its virtual host's and its
//! user's `max-connections` ([`crate::core::limits`]) atomically with the check, and its
//! AMQP channels against the user's `max-channels`. The admission is held by the
//! connection's task and counts nothing once dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::value::Value;

/// The listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    /// The broker's address of the connection (the listener's, or the accepted socket's).
    pub addr: SocketAddr,
    /// The connection is TLS.
    pub tls: bool,
    /// The listener is bound to a loopback address: only local clients reach it.
    pub local_only: bool,
    /// A connection the broker made to itself over an in-process pipe (an MQTT bridge's or
    /// a shovel's local side; RabbitMQ's `direct` connections): the broker names its user,
    /// no password is checked.
    pub internal: bool,
}

/// The protocol a client speaks, as the management API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// AMQP 0-9-1.
    Amqp091,
    /// MQTT 3.1 (`MQIsdp`).
    Mqtt31,
    /// MQTT 3.1.1.
    Mqtt311,
    /// MQTT 5.0.
    Mqtt5,
}

impl Protocol {
    /// RabbitMQ's `protocol` field: `AMQP 0-9-1`, `MQTT 3.1.1`, ...
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Amqp091 => "AMQP 0-9-1",
            Protocol::Mqtt31 => "MQTT 3.1",
            Protocol::Mqtt311 => "MQTT 3.1.1",
            Protocol::Mqtt5 => "MQTT 5.0",
        }
    }

    /// True for the MQTT versions.
    pub fn is_mqtt(self) -> bool {
        !matches!(self, Protocol::Amqp091)
    }
}

/// What the client said about itself at login.
#[derive(Debug, Clone)]
pub enum ClientDetails {
    /// AMQP Start-Ok client properties (product, version, capabilities, connection_name).
    Amqp {
        /// The client properties table.
        properties: Vec<(String, Value)>,
        /// The SASL mechanism the client logged in with (`PLAIN`, `AMQPLAIN`, `EXTERNAL`).
        mechanism: String,
    },
    /// MQTT CONNECT.
    Mqtt {
        /// The session's client id (assigned by the broker when the client sent none).
        client_id: Arc<str>,
        /// Keep-alive granted, seconds.
        keep_alive: u16,
        /// Clean Start / Clean Session.
        clean_start: bool,
        /// Session expiry interval granted, seconds.
        expiry_secs: u32,
    },
}

/// An AMQP consumer, as `/api/consumers` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerInfo {
    /// The broker's consumer id.
    pub id: u64,
    /// Consumer tag.
    pub tag: String,
    /// Queue consumed.
    pub queue: String,
    /// Channel number.
    pub channel: u16,
    /// The client acknowledges deliveries.
    pub ack_required: bool,
    /// basic.consume exclusive.
    pub exclusive: bool,
    /// Prefetch (credit) when it attached.
    pub prefetch: u32,
    /// basic.consume arguments.
    pub arguments: Vec<(String, Value)>,
}

/// A connection's open channels and consumers (AMQP), changed as they open and close.
#[derive(Debug, Default)]
pub struct ChannelsInfo {
    /// Open channel numbers.
    pub numbers: std::collections::BTreeSet<u16>,
    /// Consumers.
    pub consumers: Vec<ConsumerInfo>,
}

/// Asks a connection's task to close it, with a reason for the client and the log.
pub(crate) type Closer = Box<dyn Fn(&str) + Send + Sync>;

/// One client connection.
pub struct ConnectionInfo {
    /// The broker's id of the connection.
    pub id: u64,
    /// The protocol and version.
    pub protocol: Protocol,
    /// The client's address.
    pub peer: SocketAddr,
    /// The listener it came in on.
    pub listener: Listener,
    /// Logged-in user ("" when anonymous MQTT).
    pub user: String,
    /// Virtual host (MQTT: `/`).
    pub vhost: String,
    /// What the client said about itself.
    pub client: ClientDetails,
    /// When the login was accepted, ms since the epoch.
    pub connected_at_ms: u64,
    /// Bytes read from the socket.
    pub recv_oct: AtomicU64,
    /// Bytes written to the socket.
    pub send_oct: AtomicU64,
    /// Open AMQP channels (MQTT: 1).
    pub channels: AtomicU64,
    /// AMQP channel numbers and consumers.
    pub details: Mutex<ChannelsInfo>,
    /// MQTT: the session's delivery state, as of the connection's last turn.
    pub mqtt: MqttClientGauge,
    closer: Closer,
}

/// An MQTT client's deliveries (EMQX's `inflight_cnt`, `mqueue_len`, `mqueue_dropped`),
/// written by its connection once per turn.
#[derive(Debug, Default)]
pub struct MqttClientGauge {
    /// QoS 1/2 deliveries sent and not yet acknowledged.
    pub inflight: AtomicU64,
    /// Deliveries waiting to be sent (the client's window is full, or not yet taken).
    pub queued: AtomicU64,
    /// Deliveries dropped for this client.
    pub dropped: AtomicU64,
}

impl std::fmt::Debug for ConnectionInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionInfo").field("id", &self.id).field("name", &self.name()).finish_non_exhaustive()
    }
}

impl ConnectionInfo {
    /// A connection's record; `closer` is called by [`ConnectionInfo::close`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        protocol: Protocol,
        peer: SocketAddr,
        listener: Listener,
        user: String,
        vhost: String,
        client: ClientDetails,
        closer: Closer,
    ) -> ConnectionInfo {
        ConnectionInfo {
            id,
            protocol,
            peer,
            listener,
            user,
            vhost,
            client,
            connected_at_ms: super::message::now_ms(),
            mqtt: MqttClientGauge::default(),
            recv_oct: AtomicU64::new(0),
            send_oct: AtomicU64::new(0),
            channels: AtomicU64::new(u64::from(protocol.is_mqtt())),
            details: Mutex::default(),
            closer,
        }
    }

    /// RabbitMQ's connection name, `peer -> broker address` (`127.0.0.1:54321 -> 127.0.0.1:5672`);
    /// a connection the broker made to itself has no addresses and is named by its id
    /// (`<direct.42>`), as RabbitMQ names its direct connections by their process.
    pub fn name(&self) -> String {
        match self.listener.internal {
            true => format!("<direct.{}>", self.id),
            false => format!("{} -> {}", self.peer, self.listener.addr),
        }
    }

    /// Asks the connection to close (AMQP: Connection.Close 320 with `reason`; MQTT 5:
    /// DISCONNECT 0x98 Administrative action; MQTT 3: the socket is closed).
    pub fn close(&self, reason: &str) {
        (self.closer)(reason)
    }

    /// A channel opened (`true`) or closed; its consumers go with it.
    pub fn channel(&self, number: u16, open: bool) {
        let mut d = self.details.lock();
        if open {
            d.numbers.insert(number);
        } else {
            d.numbers.remove(&number);
            d.consumers.retain(|c| c.channel != number);
        }
        self.channels.store(d.numbers.len() as u64, Ordering::Relaxed);
    }

    /// A consumer attached.
    pub fn consumer_added(&self, consumer: ConsumerInfo) {
        self.details.lock().consumers.push(consumer);
    }

    /// A consumer went (cancelled by the client or the broker).
    pub fn consumer_removed(&self, id: u64) {
        self.details.lock().consumers.retain(|c| c.id != id);
    }

    /// Adds bytes read from the socket.
    pub fn received(&self, n: usize) {
        if n > 0 {
            self.recv_oct.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Adds bytes written to the socket.
    pub fn sent(&self, n: usize) {
        if n > 0 {
            self.send_oct.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// Every registered connection, by id.
#[derive(Debug, Default)]
pub struct Connections {
    all: Mutex<HashMap<u64, Arc<ConnectionInfo>>>,
    opened: AtomicU64,
    closed: AtomicU64,
    admitted: Arc<Mutex<Tallies>>,
}

/// Admitted connections per virtual host and per user.
#[derive(Debug, Default)]
struct Tallies {
    vhosts: HashMap<String, u64>,
    users: HashMap<String, UserTally>,
}

/// One user's admitted connections and the channels open on them.
#[derive(Debug, Default)]
struct UserTally {
    connections: u64,
    channels: Arc<AtomicU64>,
}

/// A limit that refused a connection or a channel, with the limit's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitReached {
    /// The virtual host's `max-connections`.
    VhostConnections(u64),
    /// The user's `max-connections`.
    UserConnections(u64),
    /// The user's `max-channels`.
    UserChannels(u64),
}

/// The limits an admission is checked against (`None`: no limit).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AdmissionLimits {
    /// The virtual host's `max-connections`.
    pub vhost_connections: Option<u64>,
    /// The user's `max-connections`.
    pub user_connections: Option<u64>,
}

/// A connection counted against its virtual host's and user's limits, with the AMQP
/// channels it opened counted against the user's; dropping it uncounts all of them.
#[derive(Debug)]
pub struct Admission {
    tallies: Arc<Mutex<Tallies>>,
    vhost: String,
    /// The user and its channel count (none for an anonymous MQTT client).
    user: Option<(String, Arc<AtomicU64>)>,
    /// Channels this connection holds in the user's count.
    channels: u64,
}

impl Admission {
    /// Counts a channel against the user's `max-channels` (`limit`), unless that would pass it.
    pub fn open_channel(&mut self, limit: Option<u64>) -> Result<(), LimitReached> {
        let Some((_, count)) = &self.user else { return Ok(()) };
        let max = limit.unwrap_or(u64::MAX);
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .map_err(|_| LimitReached::UserChannels(max))?;
        self.channels += 1;
        Ok(())
    }

    /// Uncounts a channel [`Admission::open_channel`] counted.
    pub fn close_channel(&mut self) {
        if let (Some((_, count)), true) = (&self.user, self.channels > 0) {
            count.fetch_sub(1, Ordering::AcqRel);
            self.channels -= 1;
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        while self.channels > 0 {
            self.close_channel();
        }
        let mut t = self.tallies.lock();
        if let Some(n) = t.vhosts.get_mut(&self.vhost) {
            *n -= 1;
            if *n == 0 {
                t.vhosts.remove(&self.vhost);
            }
        }
        if let Some((user, _)) = &self.user {
            if let Some(u) = t.users.get_mut(user) {
                u.connections -= 1;
                if u.connections == 0 {
                    t.users.remove(user);
                }
            }
        }
    }
}

impl Connections {
    /// Counts a connection to `vhost` by `user` (`None`: anonymous) unless that passes
    /// one of `limits` (the virtual host's limit is checked first, as RabbitMQ does).
    pub(in crate::core) fn admit(
        &self,
        vhost: &str,
        user: Option<&str>,
        limits: AdmissionLimits,
    ) -> Result<Admission, LimitReached> {
        let mut t = self.admitted.lock();
        let in_vhost = t.vhosts.get(vhost).copied().unwrap_or(0);
        if let Some(max) = limits.vhost_connections.filter(|max| in_vhost >= *max) {
            return Err(LimitReached::VhostConnections(max));
        }
        let user = match user {
            Some(name) => {
                let tally = t.users.get(name);
                let by_user = tally.map_or(0, |u| u.connections);
                if let Some(max) = limits.user_connections.filter(|max| by_user >= *max) {
                    return Err(LimitReached::UserConnections(max));
                }
                let tally = t.users.entry(name.to_owned()).or_default();
                tally.connections += 1;
                Some((name.to_owned(), tally.channels.clone()))
            }
            None => None,
        };
        *t.vhosts.entry(vhost.to_owned()).or_default() += 1;
        Ok(Admission { tallies: self.admitted.clone(), vhost: vhost.to_owned(), user, channels: 0 })
    }

    /// Adds a connection (its login was accepted).
    pub(in crate::core) fn register(&self, info: Arc<ConnectionInfo>) {
        self.all.lock().insert(info.id, info);
        self.opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes a connection (it closed).
    pub(in crate::core) fn unregister(&self, id: u64) {
        if self.all.lock().remove(&id).is_some() {
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Connections registered and unregistered since start.
    pub fn churn(&self) -> (u64, u64) {
        (self.opened.load(Ordering::Relaxed), self.closed.load(Ordering::Relaxed))
    }

    /// Every connection, oldest first.
    pub fn list(&self) -> Vec<Arc<ConnectionInfo>> {
        let mut all: Vec<_> = self.all.lock().values().cloned().collect();
        all.sort_by_key(|c| c.id);
        all
    }

    /// The connection named `name` ([`ConnectionInfo::name`]).
    pub fn by_name(&self, name: &str) -> Option<Arc<ConnectionInfo>> {
        self.all.lock().values().find(|c| c.name() == name).cloned()
    }

    /// How many connections there are.
    pub fn len(&self) -> usize {
        self.all.lock().len()
    }

    /// True when no connection is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_named_as_rabbitmq_names_it_and_closes_through_its_closer() {
        let closed = Arc::new(Mutex::new(String::new()));
        let seen = closed.clone();
        let info = Arc::new(ConnectionInfo::new(
            7,
            Protocol::Amqp091,
            "127.0.0.1:40000".parse().unwrap(),
            Listener { addr: "127.0.0.1:5672".parse().unwrap(), tls: false, local_only: true, internal: false },
            "guest".into(),
            "/".into(),
            ClientDetails::Amqp { properties: vec![], mechanism: "PLAIN".into() },
            Box::new(move |why| *seen.lock() = why.to_owned()),
        ));
        let all = Connections::default();
        all.register(info.clone());
        let found = all.by_name("127.0.0.1:40000 -> 127.0.0.1:5672").expect("found by name");
        found.close("bye");
        assert_eq!(*closed.lock(), "bye");
        assert_eq!(info.channels.load(Ordering::Relaxed), 0, "AMQP starts with no channel");
        all.unregister(7);
        assert!(all.is_empty());
    }

    #[test]
    fn a_connection_the_broker_made_to_itself_is_named_by_its_id() {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let direct = |id| {
            let listener = Listener { addr, tls: false, local_only: true, internal: true };
            let details = ClientDetails::Amqp { properties: vec![], mechanism: "PLAIN".into() };
            ConnectionInfo::new(
                id,
                Protocol::Amqp091,
                addr,
                listener,
                "guest".into(),
                "/".into(),
                details,
                Box::new(|_: &str| {}),
            )
        };
        assert_eq!((direct(3).name(), direct(4).name()), ("<direct.3>".to_owned(), "<direct.4>".to_owned()));
    }

    #[test]
    fn admissions_count_per_vhost_and_user_until_dropped() {
        let all = Connections::default();
        let limits = AdmissionLimits { vhost_connections: Some(2), user_connections: Some(1) };
        let mut a = all.admit("/", Some("u"), limits).expect("first");
        assert_eq!(all.admit("/", Some("u"), limits).unwrap_err(), LimitReached::UserConnections(1));
        let anon = all.admit("/", None, limits).expect("anonymous: the vhost's limit only");
        assert_eq!(all.admit("/", Some("v"), limits).unwrap_err(), LimitReached::VhostConnections(2));
        assert!(all.admit("/other", Some("v"), limits).is_ok(), "another vhost");
        a.open_channel(Some(1)).expect("one channel");
        assert_eq!(a.open_channel(Some(1)), Err(LimitReached::UserChannels(1)));
        a.close_channel();
        a.open_channel(Some(1)).expect("given back");
        drop(a);
        drop(anon);
        let mut b = all.admit("/", Some("u"), limits).expect("the dropped one's place");
        b.open_channel(Some(1)).expect("its channels went with it");
    }
}

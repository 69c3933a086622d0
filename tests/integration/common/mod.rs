//! Test harness: the broker process (`broker.rs`: the real `ferrymq` binary on ephemeral
//! ports with a temporary data directory, its log kept and printed when a test fails,
//! stopped on drop), small helpers around `rumqttc` and raw sockets, and [`eventually`], the
//! bounded poll for state that has no event to wait for.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

pub mod amqp;
mod broker;
pub mod cluster;
pub mod http;
pub mod partition;

pub use broker::{binary, run_binary, Broker, Opts};

/// Environment variable naming a file where [`skipped`] appends one line per skipped test
/// (`.ci/run` sets it, and fails on a skip it does not expect).
pub const SKIP_LOG_ENV: &str = "CI_SKIP_LOG";

/// Says that the running test is skipped and why, where it cannot be missed: a line
/// `SKIPPED: <test binary>::<test>: <reason>` on the terminal, written past the test
/// harness's output capture (so it shows among the test results, not only on failure),
/// and in the file [`SKIP_LOG_ENV`] names. The test then returns (and counts as passed).
pub fn skipped(reason: &str) {
    use std::io::Write as _;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let line = format!("SKIPPED: {}::{test}: {reason}\n", env!("CARGO_CRATE_NAME"));
    // Straight to the process's stderr: print macros would be captured with the test's output.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        if let Err(e) = file.and_then(|mut f| f.write_all(line.as_bytes())) {
            panic!("cannot record the skip in {}: {e}", path.to_string_lossy());
        }
    }
}

/// A loopback port free now (bound and released), for a broker that must come back on
/// the same address after a restart.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Default bound for waiting on one event.
pub const WAIT: Duration = Duration::from_secs(10);

// ----- rumqttc helpers (3.1.1 in `v4`, 5.0 in `v5`) -----------------------------------------

/// The parts of a test client that read the same for both rumqttc APIs; expanded in `v4`
/// and `v5`, where `AsyncClient`, `Event`, `Packet`, ... name that version's types.
macro_rules! client_common {
    () => {
        /// A connected client whose incoming packets arrive on a channel.
        pub struct Client {
            pub client: AsyncClient,
            pub events: mpsc::UnboundedReceiver<Result<Packet, String>>,
            pub connack: ConnAck,
            task: tokio::task::JoinHandle<()>,
        }

        impl Drop for Client {
            fn drop(&mut self) {
                self.task.abort();
            }
        }

        /// Connects and waits for CONNACK.
        pub async fn connect_with(o: MqttOptions) -> Client {
            let (client, mut el) = AsyncClient::new(o, 1000);
            let connack = loop {
                match tokio::time::timeout(WAIT, el.poll()).await.expect("connect timed out") {
                    Ok(Event::Incoming(Packet::ConnAck(c))) => break c,
                    Ok(_) => continue,
                    Err(e) => panic!("connect failed: {e:?}"),
                }
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let task = tokio::spawn(async move {
                loop {
                    match el.poll().await {
                        Ok(Event::Incoming(p)) => {
                            if tx.send(Ok(p)).is_err() {
                                return;
                            }
                        }
                        Ok(Event::Outgoing(_)) => {}
                        Err(e) => {
                            let _ = tx.send(Err(format!("{e:?}")));
                            return;
                        }
                    }
                }
            });
            Client { client, events: rx, connack, task }
        }

        /// Connects expecting a refusal; returns the client's error (names the CONNACK code).
        pub async fn connect_refused(o: MqttOptions) -> String {
            let (_client, mut el) = AsyncClient::new(o, 10);
            loop {
                match tokio::time::timeout(WAIT, el.poll()).await.expect("connect timed out") {
                    Ok(Event::Incoming(Packet::ConnAck(c))) => panic!("connection accepted: {c:?}"),
                    Ok(_) => continue,
                    Err(e) => return format!("{e:?}"),
                }
            }
        }

        /// Connects a clean-session client.
        pub async fn connect(broker: &Broker, id: &str) -> Client {
            connect_with(options(broker, id)).await
        }

        impl Client {
            /// Next incoming packet (bounded wait).
            pub async fn next(&mut self) -> Packet {
                match tokio::time::timeout(WAIT, self.events.recv()).await {
                    Ok(Some(Ok(p))) => p,
                    Ok(Some(Err(e))) => panic!("connection error: {e}"),
                    Ok(None) => panic!("event loop ended"),
                    Err(_) => panic!("no packet within {WAIT:?}"),
                }
            }

            /// Next PUBLISH (skipping other packets).
            pub async fn next_publish(&mut self) -> Publish {
                loop {
                    if let Packet::Publish(p) = self.next().await {
                        return p;
                    }
                }
            }

            /// Publishes at QoS 1 or 2 and waits until the broker acknowledged it.
            pub async fn publish_acked(&mut self, topic: &str, qos: QoS, retain: bool, payload: impl Into<Vec<u8>>) {
                assert!(qos != QoS::AtMostOnce, "only QoS 1/2 are acknowledged");
                self.client.publish(topic, qos, retain, payload.into()).await.unwrap();
                loop {
                    match self.next().await {
                        Packet::PubAck(_) if qos == QoS::AtLeastOnce => return,
                        Packet::PubComp(_) if qos == QoS::ExactlyOnce => return,
                        _ => {}
                    }
                }
            }

            /// Asserts no PUBLISH arrives within `d` (a bounded negative check).
            pub async fn expect_no_publish(&mut self, d: Duration) {
                let deadline = tokio::time::Instant::now() + d;
                loop {
                    match tokio::time::timeout_at(deadline, self.events.recv()).await {
                        Err(_) => return,
                        Ok(Some(Ok(Packet::Publish(p)))) => panic!("unexpected publish: {p:?}"),
                        Ok(Some(Ok(_))) => continue,
                        Ok(Some(Err(e))) => panic!("connection error: {e}"),
                        Ok(None) => return,
                    }
                }
            }
        }
    };
}

pub mod v4 {
    use super::*;
    pub use rumqttc::{AsyncClient, ConnAck, Event, EventLoop, LastWill, MqttOptions, Packet, Publish, QoS};

    client_common!();

    /// Options for a client of `broker`.
    pub fn options(broker: &Broker, id: &str) -> MqttOptions {
        let (h, p) = broker.host_port();
        let mut o = MqttOptions::new(id, h, p);
        o.set_keep_alive(Duration::from_secs(30));
        o.set_max_packet_size(16 * 1024 * 1024, 16 * 1024 * 1024);
        o
    }

    /// Connects with clean session = false.
    pub async fn connect_persistent(broker: &Broker, id: &str) -> Client {
        let mut o = options(broker, id);
        o.set_clean_session(false);
        connect_with(o).await
    }

    impl Client {
        /// Subscribes and waits for SUBACK; returns its return codes.
        pub async fn subscribe(&mut self, filter: &str, qos: QoS) -> Vec<rumqttc::SubscribeReasonCode> {
            self.client.subscribe(filter, qos).await.unwrap();
            loop {
                if let Packet::SubAck(s) = self.next().await {
                    return s.return_codes;
                }
            }
        }

        /// Waits for the connection to end with an error (e.g. the broker closed it).
        pub async fn expect_closed(&mut self) -> String {
            loop {
                match tokio::time::timeout(WAIT, self.events.recv()).await {
                    Ok(Some(Err(e))) => return e,
                    Ok(Some(Ok(_))) => continue,
                    Ok(None) => return "ended".into(),
                    Err(_) => panic!("connection not closed within {WAIT:?}"),
                }
            }
        }
    }
}

pub mod v5 {
    use super::*;
    pub use rumqttc::v5::mqttbytes::v5::{ConnAck, Filter, Packet, Publish, PublishProperties, SubscribeProperties};
    pub use rumqttc::v5::mqttbytes::QoS;
    pub use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};

    client_common!();

    /// Options for a client of `broker`.
    pub fn options(broker: &Broker, id: &str) -> MqttOptions {
        let (h, p) = broker.host_port();
        let mut o = MqttOptions::new(id, h, p);
        o.set_keep_alive(Duration::from_secs(30));
        o
    }

    impl Client {
        /// Subscribes with a filter and waits for SUBACK; returns its reason codes.
        pub async fn subscribe_filter(
            &mut self,
            filter: Filter,
            props: Option<SubscribeProperties>,
        ) -> Vec<rumqttc::v5::mqttbytes::v5::SubscribeReasonCode> {
            match props {
                Some(p) => self.client.subscribe_many_with_properties(vec![filter], p).await.unwrap(),
                None => self.client.subscribe_many(vec![filter]).await.unwrap(),
            }
            loop {
                if let Packet::SubAck(s) = self.next().await {
                    return s.return_codes;
                }
            }
        }

        /// Subscribes to `filter` at `qos` and waits for SUBACK.
        pub async fn subscribe(
            &mut self,
            filter: &str,
            qos: QoS,
        ) -> Vec<rumqttc::v5::mqttbytes::v5::SubscribeReasonCode> {
            self.subscribe_filter(Filter::new(filter, qos), None).await
        }

        /// Waits for the broker's DISCONNECT and returns (reason code, reason string) as
        /// rumqttc reports them (it turns a server DISCONNECT into a connection error).
        pub async fn expect_server_disconnect(&mut self) -> (String, Option<String>) {
            loop {
                match tokio::time::timeout(WAIT, self.events.recv()).await.expect("no DISCONNECT in time") {
                    Some(Ok(Packet::Disconnect(d))) => {
                        return (format!("{:?}", d.reason_code), d.properties.and_then(|p| p.reason_string))
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        let code = e
                            .split("reason_code: ")
                            .nth(1)
                            .map(|r| r.split([',', ' ']).next().unwrap_or("").to_string());
                        let reason = e
                            .split("reason_string: Some(\"")
                            .nth(1)
                            .map(|r| r.split('"').next().unwrap_or("").to_string());
                        return (code.unwrap_or(e.clone()), reason);
                    }
                    None => panic!("event loop ended without DISCONNECT"),
                }
            }
        }
    }
}

// ----- raw sockets ---------------------------------------------------------------------------

/// A raw TCP connection for sending hand-made bytes.
pub struct Raw {
    pub stream: TcpStream,
}

impl Raw {
    /// Connects to the broker's MQTT port.
    pub async fn connect(broker: &Broker) -> Raw {
        Raw { stream: TcpStream::connect(broker.mqtt).await.unwrap() }
    }

    /// Writes bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads until at least `n` bytes arrived or the peer closed; returns what arrived.
    pub async fn read_at_least(&mut self, n: usize) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while buf.len() < n {
            match tokio::time::timeout(WAIT, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(k)) => buf.extend_from_slice(&chunk[..k]),
                Err(_) => panic!("nothing more within {WAIT:?} (have {} bytes, ending {:02x?})", buf.len(), tail(&buf)),
            }
        }
        buf
    }

    /// Reads everything until the broker closes the connection (bounded); returns the bytes.
    pub async fn read_until_closed(&mut self) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match tokio::time::timeout(WAIT, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return buf,
                Ok(Ok(k)) => buf.extend_from_slice(&chunk[..k]),
                Err(_) => panic!(
                    "connection not closed within {WAIT:?} (got {} bytes, ending {:02x?})",
                    buf.len(),
                    tail(&buf)
                ),
            }
        }
    }
}

/// The last bytes of a buffer, for failure messages.
pub fn tail(buf: &[u8]) -> &[u8] {
    &buf[buf.len().saturating_sub(48)..]
}

/// An MQTT 3.1.1 CONNECT with clean session and keep-alive 60.
pub fn connect_v4_bytes(client_id: &str) -> Vec<u8> {
    connect_bytes(4, client_id, 0x02, 60, &[])
}

/// An MQTT 5 CONNECT with clean start and no properties.
pub fn connect_v5_bytes(client_id: &str) -> Vec<u8> {
    connect_bytes(5, client_id, 0x02, 60, &[0])
}

/// A CONNECT packet: protocol level, client id, connect flags, keep-alive, raw properties
/// (MQTT 5 only; include the property-length byte).
pub fn connect_bytes(level: u8, client_id: &str, flags: u8, keep_alive: u16, props: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', level, flags]);
    body.extend_from_slice(&keep_alive.to_be_bytes());
    body.extend_from_slice(props);
    body.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
    body.extend_from_slice(client_id.as_bytes());
    packet(0x10, &body)
}

/// A packet with the given first byte and body (remaining length encoded).
pub fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let mut b = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            b |= 0x80;
        }
        out.push(b);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// How often [`eventually`] polls.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `f` every [`POLL`] until it returns `Some`, for at most `limit`; panics naming `what`
/// after that. For state that has no event to await (a queue deleted after its connection
/// went away, a message that becomes available, a connection seen closed).
pub async fn eventually<T, Fut>(what: &str, limit: Duration, f: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    eventually_every(what, limit, POLL, f).await
}

/// [`eventually`] with a chosen polling interval (e.g. longer than a queue's `x-expires`,
/// since a passive declare renews a queue's lease).
pub async fn eventually_every<T, Fut>(what: &str, limit: Duration, every: Duration, mut f: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(every).await;
    }
}

/// A throw-away CA and a server certificate for `localhost`/`127.0.0.1` in `dir`: returns
/// (certificate file, key file, CA certificate PEM).
pub fn make_certs(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let pki = make_pki(dir, &[]);
    (pki.server_cert, pki.server_key, pki.ca_pem)
}

/// Files of a throw-away PKI made by [`make_pki`].
pub struct Pki {
    /// Server certificate (localhost, 127.0.0.1) and key.
    pub server_cert: std::path::PathBuf,
    pub server_key: std::path::PathBuf,
    /// The CA's certificate, as a file (for `tls.client_ca`) and as PEM text.
    pub ca_file: std::path::PathBuf,
    pub ca_pem: String,
    /// Per client: (certificate PEM, key PEM), in the order asked for.
    pub clients: Vec<(String, String)>,
}

/// A CA, a server certificate and one client certificate (clientAuth) per `(CN, O)` in
/// `clients`, written into `dir`.
pub fn make_pki(dir: &std::path::Path, clients: &[(&str, &str)]) -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (c, k, ca) = (dir.join("server.pem"), dir.join("server.key"), dir.join("ca.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    std::fs::write(&ca, ca_cert.pem()).unwrap();
    let clients = clients
        .iter()
        .map(|(cn, o)| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, *cn);
            dn.push(DnType::OrganizationName, *o);
            params.distinguished_name = dn;
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, &issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        })
        .collect();
    Pki { server_cert: c, server_key: k, ca_file: ca, ca_pem: ca_cert.pem(), clients }
}

//! Client certificates (mutual TLS) as Mosquitto and RabbitMQ users expect them:
//! `tls.verify_client = required` refuses a handshake without a certificate from
//! `tls.client_ca`, `optional` lets it through; MQTT takes the user name from the
//! certificate (`use_identity_as_username`), and AMQP offers SASL EXTERNAL with the
//! certificate's subject as the user (RabbitMQ's rabbitmq_auth_mechanism_ssl). Real
//! broker, rumqttc and raw AMQP frames over rustls.

use crate::common;

use std::sync::Arc;

use crate::common::amqp::{bounded, longstr, method_frame, shortstr, RawAmqp, PROTOCOL_HEADER};
use crate::common::{make_pki, v4, Broker, Opts, Pki};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn client_config(pki: &Pki, client: Option<usize>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(i) => {
            let (cert, key) = &pki.clients[i];
            let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap()).unwrap()
        }
    };
    Arc::new(config)
}

fn tls_broker(pki: &Pki, verify: &str, extra: &str) -> Broker {
    let config = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nverify_client = \"{verify}\"\n{extra}",
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca_file.display()
    );
    Broker::start_with(Opts::default().config(&config).args(&[
        "--mqtts-listen",
        "127.0.0.1:0",
        "--amqps-listen",
        "127.0.0.1:0",
    ]))
}

fn mqtts_options(broker: &Broker, pki: &Pki, id: &str, client: Option<usize>) -> v4::MqttOptions {
    let mut o = v4::MqttOptions::new(id, "localhost", broker.mqtts.unwrap().port());
    o.set_keep_alive(std::time::Duration::from_secs(30));
    o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(client_config(pki, client))));
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_takes_the_user_name_from_the_client_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = make_pki(tmp.path(), &[("device-1", "fleet")]);
    let broker = tls_broker(
        &pki,
        "required",
        "[mqtt]\nuse_identity_as_username = true\n[auth]\nmqtt = true\nauthorization = true\n\
         rules = [{ permission = \"allow\", action = \"all\", topics = [\"devices/%u/#\"] }]\n",
    );
    // No credentials in CONNECT: the certificate's CN is the user the rules see.
    let mut dev = v4::connect_with(mqtts_options(&broker, &pki, "d1", Some(0))).await;
    let granted = dev.subscribe("devices/device-1/#", v4::QoS::AtLeastOnce).await;
    assert_eq!(granted, vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::AtLeastOnce)]);
    let refused = dev.subscribe("devices/device-2/#", v4::QoS::AtLeastOnce).await;
    assert_eq!(refused, vec![rumqttc::SubscribeReasonCode::Failure]);
    // Shown as that user in the management API.
    let api = common::http::Api::of(&broker);
    let conns = api.ok("/api/connections").await;
    assert!(conns.as_array().unwrap().iter().any(|c| c["user"] == "device-1"), "{conns}");
    // Required: a client without a certificate does not get through the handshake.
    let e = v4::connect_refused(mqtts_options(&broker, &pki, "anon", None)).await;
    assert!(e.contains("Tls") || e.contains("Io") || e.contains("tls"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_client_certificates_let_password_clients_in_too() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = make_pki(tmp.path(), &[("device-1", "fleet")]);
    let broker = tls_broker(&pki, "optional", "[auth]\nmqtt = true\nusers = [{ name = \"app\", password = \"pw\" }]\n");
    let mut with_password = mqtts_options(&broker, &pki, "p", None);
    with_password.set_credentials("app", "pw");
    drop(v4::connect_with(with_password).await);
    let mut with_cert = mqtts_options(&broker, &pki, "c", Some(0));
    with_cert.set_credentials("app", "pw");
    drop(v4::connect_with(with_cert).await);
}

/// Connection.Start's mechanisms (its third field, after the version and the server
/// properties table).
fn mechanisms(start: &common::amqp::Frame) -> String {
    let p = &start.payload[4..];
    let table = u32::from_be_bytes([p[2], p[3], p[4], p[5]]) as usize;
    let at = 6 + table;
    let n = u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]) as usize;
    String::from_utf8_lossy(&p[at + 4..at + 4 + n]).into_owned()
}

/// Starts an AMQP connection and answers Start with `mechanism` (empty response);
/// returns Start and the frame that follows (Tune or Close).
async fn start_with<S>(raw: &mut RawAmqp<S>, mechanism: &str) -> (String, common::amqp::Frame)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    raw.send(PROTOCOL_HEADER).await;
    let start = raw.expect_method(10, 10).await;
    let mut args = 0u32.to_be_bytes().to_vec();
    args.extend(shortstr(mechanism));
    args.extend(longstr(b""));
    args.extend(shortstr("en_US"));
    raw.send(&method_frame(0, 10, 11, &args)).await;
    (mechanisms(&start), raw.read_frame().await.expect("an answer to start-ok"))
}

async fn amqps(
    broker: &Broker,
    pki: &Pki,
    client: usize,
) -> RawAmqp<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let connector = tokio_rustls::TlsConnector::from(client_config(pki, Some(client)));
    let tcp = tokio::net::TcpStream::connect(broker.amqps.unwrap()).await.unwrap();
    let tls = bounded("TLS handshake", connector.connect(ServerName::try_from("localhost").unwrap(), tcp)).await;
    RawAmqp::new(tls.expect("TLS handshake"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_sasl_external_logs_in_as_the_certificate_subject() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = make_pki(tmp.path(), &[("app-1", "fleet"), ("stranger", "elsewhere")]);
    let broker =
        tls_broker(&pki, "required", "[auth]\nusers = [{ name = \"O=fleet,CN=app-1\", password = \"unused\" }]\n");
    let mut raw = amqps(&broker, &pki, 0).await;
    let (offered, next) = start_with(&mut raw, "EXTERNAL").await;
    assert_eq!(offered, "PLAIN AMQPLAIN EXTERNAL");
    assert_eq!(next.method(), Some((10, 30)), "tune after an EXTERNAL start-ok: {next:?}");
    let p = &next.payload[4..];
    let mut args = p[0..2].to_vec();
    args.extend_from_slice(&p[2..6]);
    args.extend_from_slice(&0u16.to_be_bytes());
    raw.send(&method_frame(0, 10, 31, &args)).await;
    let mut open = shortstr("/");
    open.extend(shortstr(""));
    open.push(0);
    raw.send(&method_frame(0, 10, 40, &open)).await;
    raw.expect_method(10, 41).await;
    let api = common::http::Api::of(&broker);
    let conns = api.ok("/api/connections").await;
    assert!(
        conns.as_array().unwrap().iter().any(|c| c["user"] == "O=fleet,CN=app-1" && c["auth_mechanism"] == "EXTERNAL"),
        "{conns}"
    );

    // A certificate naming no user is refused as RabbitMQ refuses a login.
    let mut raw = amqps(&broker, &pki, 1).await;
    let (_, next) = start_with(&mut raw, "EXTERNAL").await;
    let (code, text) = next.close_reason().expect("connection.close");
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("EXTERNAL"), "{text}");

    // Plain TCP: no certificate, so EXTERNAL is neither offered nor accepted.
    let mut plain = RawAmqp::connect(broker.amqp.unwrap()).await;
    let (offered, next) = start_with(&mut plain, "EXTERNAL").await;
    assert_eq!(offered, "PLAIN AMQPLAIN");
    assert_eq!(next.close_reason().map(|r| r.0), Some(403));
}

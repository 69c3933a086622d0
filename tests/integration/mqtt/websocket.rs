//! MQTT over WebSocket as browser and paho/rumqttc clients use it: `ws://HOST:PORT/mqtt`
//! with subprotocol `mqtt`, served by the same connection code as TCP (clients of both
//! transports see each other's messages, logins and rules apply), one MQTT packet split
//! over frames and several in one frame, ping/pong, the wrong path or a text frame
//! refused. Real broker, rumqttc's websocket transport and raw tungstenite frames.

use crate::common;

use std::time::Duration;

use crate::common::{v4, v5, Broker, Opts, WAIT};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

fn ws_url(broker: &Broker) -> String {
    format!("ws://127.0.0.1:{}/mqtt", broker.ws.expect("ws= in the READY line").port())
}

fn ws_v4(broker: &Broker, id: &str) -> v4::MqttOptions {
    let mut o = v4::MqttOptions::new(id, ws_url(broker), broker.ws.unwrap().port());
    o.set_transport(rumqttc::Transport::Ws);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_max_packet_size(16 * 1024 * 1024, 16 * 1024 * 1024);
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_and_tcp_clients_see_each_other() {
    let broker = Broker::start();
    let mut ws = v4::connect_with(ws_v4(&broker, "ws-sub")).await;
    ws.subscribe("plant/#", v4::QoS::AtLeastOnce).await;
    let mut tcp = v4::connect(&broker, "tcp-pub").await;
    tcp.publish_acked("plant/a", v4::QoS::AtLeastOnce, false, vec![7u8; 100_000]).await;
    let p = ws.next_publish().await;
    assert_eq!((p.topic.as_str(), p.payload.len()), ("plant/a", 100_000), "a packet larger than a frame buffer");
    // And back: a WebSocket publisher, a TCP subscriber, MQTT 5 on both.
    let mut sub5 = v5::connect(&broker, "tcp-sub5").await;
    sub5.subscribe("back/#", v5::QoS::ExactlyOnce).await;
    let mut o = v5::MqttOptions::new("ws-pub5", ws_url(&broker), broker.ws.unwrap().port());
    o.set_transport(rumqttc::Transport::Ws);
    let mut pub5 = v5::connect_with(o).await;
    pub5.publish_acked("back/x", v5::QoS::ExactlyOnce, false, "over ws").await;
    assert_eq!(&sub5.next_publish().await.payload[..], b"over ws");
    // The API lists them as MQTT connections like any other, on the WebSocket port.
    let conns = common::http::Api::of(&broker).ok("/api/connections").await;
    let ws_port = broker.ws.unwrap().port();
    let on_ws = conns.as_array().unwrap().iter().filter(|c| c["port"] == ws_port).count();
    assert_eq!(on_ws, 2, "{conns}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_and_rules_apply_over_websocket_as_over_tcp() {
    let broker = Broker::start_with(Opts::default().config(
        "[auth]\nmqtt = true\nauthorization = true\nusers = [{ name = \"dev\", password = \"pw\" }]\n\
         rules = [{ permission = \"allow\", action = \"all\", topics = [\"devices/%u/#\"] }]\n",
    ));
    let mut o = ws_v4(&broker, "dev-ws");
    o.set_credentials("dev", "wrong");
    let e = v4::connect_refused(o).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    let mut o = ws_v4(&broker, "dev-ws");
    o.set_credentials("dev", "pw");
    let mut dev = v4::connect_with(o).await;
    assert_eq!(
        dev.subscribe("devices/other/#", v4::QoS::AtMostOnce).await,
        vec![rumqttc::SubscribeReasonCode::Failure]
    );
    assert_eq!(
        dev.subscribe("devices/dev/#", v4::QoS::AtMostOnce).await,
        vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::AtMostOnce)]
    );
}

/// A raw WebSocket client: the handshake response, then binary frames.
async fn raw(
    broker: &Broker,
    path: &str,
    protocol: Option<&str>,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    let addr = broker.ws.unwrap();
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    if let Some(p) = protocol {
        req.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_str(p).unwrap());
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::timeout(WAIT, tokio_tungstenite::client_async(req, tcp)).await.expect("handshake timed out")
}

async fn next_binary(ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>) -> Vec<u8> {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("no frame in time") {
            Some(Ok(Message::Binary(b))) => return b.to_vec(),
            Some(Ok(Message::Pong(_))) | Some(Ok(Message::Ping(_))) => continue,
            other => panic!("expected a binary frame, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packets_span_frames_and_frames_hold_packets() {
    let broker = Broker::start();
    let (mut ws, resp) = raw(&broker, "/mqtt", Some("mqttv3.1, mqtt")).await.unwrap();
    assert_eq!(resp.headers().get("sec-websocket-protocol").unwrap(), "mqttv3.1", "the first one offered");
    // CONNECT (3.1.1) split across two frames.
    let connect = common::connect_v4_bytes("raw-ws");
    let (a, b) = connect.split_at(5);
    ws.send(Message::Binary(a.to_vec().into())).await.unwrap();
    ws.send(Message::Binary(b.to_vec().into())).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, [0x20, 2, 0, 0], "CONNACK accepted");
    // SUBSCRIBE and PINGREQ in one frame: both answered (PINGRESP may come first: the
    // subscription is applied asynchronously, over TCP too).
    let mut both = common::packet(0x82, &[0, 1, 0, 3, b'a', b'/', b'b', 0]);
    both.extend([0xC0, 0]);
    ws.send(Message::Binary(both.into())).await.unwrap();
    let mut got = next_binary(&mut ws).await;
    if got.len() < 7 {
        got.extend(next_binary(&mut ws).await);
    }
    let (suback, pingresp) = ([0x90, 3, 0, 1, 0], [0xD0, 0]);
    assert!(got == [&suback[..], &pingresp[..]].concat() || got == [&pingresp[..], &suback[..]].concat(), "{got:?}");
    // A WebSocket ping is answered with a pong carrying its payload.
    ws.send(Message::Ping(b"hi".to_vec().into())).await.unwrap();
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("no pong in time") {
            Some(Ok(Message::Pong(p))) => {
                assert_eq!(&p[..], b"hi");
                break;
            }
            Some(Ok(_)) => continue,
            other => panic!("expected a pong, got {other:?}"),
        }
    }
    // A text frame is not MQTT: the connection ends.
    ws.send(Message::Text("CONNECT".into())).await.unwrap();
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection stayed open after a text frame");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_path_or_subprotocol_is_refused_at_the_upgrade() {
    let broker = Broker::start();
    let e = raw(&broker, "/other", Some("mqtt")).await.expect_err("not the MQTT path");
    assert!(e.to_string().contains("404"), "{e}");
    let e = raw(&broker, "/mqtt", Some("chat")).await.expect_err("not an MQTT subprotocol");
    assert!(e.to_string().contains("400"), "{e}");
    // No subprotocol at all (some embedded clients): accepted.
    let (mut ws, _) = raw(&broker, "/mqtt", None).await.unwrap();
    ws.send(Message::Binary(common::connect_v4_bytes("no-proto").into())).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, [0x20, 2, 0, 0]);
    // An abandoned upgrade does not hold the listener: others still connect.
    let _idle = tokio::net::TcpStream::connect(broker.ws.unwrap()).await.unwrap();
    drop(v4::connect_with(ws_v4(&broker, "after-idle")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_websocket_with_a_client_certificate() {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let tmp = tempfile::tempdir().unwrap();
    let pki = common::make_pki(tmp.path(), &[("browser-1", "fleet")]);
    let config = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nverify_client = \"required\"\n\
         [mqtt]\nuse_identity_as_username = true\n[auth]\nmqtt = true\nauthorization = true\n\
         rules = [{{ permission = \"allow\", action = \"all\", topics = [\"%u/#\"] }}]\n",
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca_file.display()
    );
    let broker = Broker::start_with(Opts::default().config(&config).args(&["--mqtt-wss-listen", "127.0.0.1:0"]));
    let wss = broker.wss.expect("wss= in the READY line");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap()).unwrap();
    let (cert, key) = &pki.clients[0];
    let tls =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap();
    let mut o = v4::MqttOptions::new("b1", format!("wss://localhost:{}/mqtt", wss.port()), wss.port());
    o.set_transport(rumqttc::Transport::wss_with_config(rumqttc::TlsConfiguration::Rustls(std::sync::Arc::new(tls))));
    let mut c = v4::connect_with(o).await;
    // The certificate's CN is the user the rules name.
    assert_eq!(
        c.subscribe("browser-1/#", v4::QoS::AtLeastOnce).await,
        vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::AtLeastOnce)]
    );
    assert_eq!(c.subscribe("other/#", v4::QoS::AtLeastOnce).await, vec![rumqttc::SubscribeReasonCode::Failure]);
    // use_identity_as_username holds on every listener: a TCP client without a certificate
    // is refused; the wss client's own publish comes back to it.
    let e = v4::connect_refused(v4::options(&broker, "tcp")).await;
    assert!(e.contains("NotAuthorized"), "{e}");
    c.client.publish("browser-1/cmd", v4::QoS::AtLeastOnce, false, "over wss").await.unwrap();
    assert_eq!(&c.next_publish().await.payload[..], b"over wss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_too_large_is_answered_as_a_packet_too_large() {
    // max_packet_size 1 KiB: frames are allowed that plus 64 KiB; one above is refused the
    // way an MQTT 5 client understands, DISCONNECT 0x95.
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_PACKET_SIZE", "1024"));
    let (mut ws, _) = raw(&broker, "/mqtt", Some("mqtt")).await.unwrap();
    ws.send(Message::Binary(common::connect_v5_bytes("big-frame").into())).await.unwrap();
    assert_eq!(next_binary(&mut ws).await[0], 0x20, "CONNACK");
    ws.send(Message::Binary(vec![0x30; 70 * 1024].into())).await.unwrap();
    let disconnect = next_binary(&mut ws).await;
    assert_eq!((disconnect[0], disconnect[2]), (0xE0, 0x95), "{disconnect:?}");
}

/// A raw upgrade to `/mqtt` (subprotocol `mqtt`) with extra `headers` (`Origin`, `Host`).
async fn upgrade_with(
    broker: &Broker,
    headers: &[(&str, &str)],
) -> Result<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>, tokio_tungstenite::tungstenite::Error> {
    let addr = broker.ws.unwrap();
    let mut req = format!("ws://{addr}/mqtt").into_client_request().unwrap();
    req.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static("mqtt"));
    for (k, v) in headers {
        let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap();
        req.headers_mut().insert(name, HeaderValue::from_str(v).unwrap());
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let upgraded = tokio::time::timeout(WAIT, tokio_tungstenite::client_async(req, tcp)).await;
    upgraded.expect("handshake timed out").map(|(ws, _)| ws)
}

/// The HTTP status of a refused upgrade.
fn refused_status(e: &tokio_tungstenite::tungstenite::Error) -> u16 {
    match e {
        tokio_tungstenite::tungstenite::Error::Http(resp) => resp.status().as_u16(),
        other => panic!("not an HTTP refusal: {other}"),
    }
}

/// Upgrades with `headers`, then CONNECTs without a user name: the CONNACK's code.
async fn anonymous_connack(broker: &Broker, headers: &[(&str, &str)], id: &str) -> u8 {
    let mut ws = upgrade_with(broker, headers).await.unwrap_or_else(|e| panic!("{headers:?}: {e}"));
    ws.send(Message::Binary(common::connect_v4_bytes(id).into())).await.unwrap();
    next_binary(&mut ws).await[3]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_sites_cannot_use_the_anonymous_websocket_listener() {
    // The default: a loopback WebSocket listener that admits anonymous clients.
    let broker = Broker::start();
    for origin in ["http://evil.example", "http://localhost:3000", "null"] {
        let e = upgrade_with(&broker, &[("origin", origin)]).await.expect_err(origin);
        assert_eq!(refused_status(&e), 403, "{origin}");
    }
    assert!(broker.wait_log("MQTT WebSocket: browser origins checked"), "logged at start: {}", broker.log());
    // DNS rebinding: a name of the attacker's that resolves to 127.0.0.1.
    let ws_port = broker.ws.unwrap().port();
    let rebound = format!("evil.example:{ws_port}");
    let e = upgrade_with(&broker, &[("origin", "http://evil.example"), ("host", &rebound)]).await.expect_err("rebound");
    assert_eq!(refused_status(&e), 403);
    // The dashboard's own page (the HTTP listener: same host, another port) and clients
    // that are not browsers (no Origin) connect as before.
    let dashboard = format!("http://{}", broker.http.unwrap());
    assert_eq!(anonymous_connack(&broker, &[("origin", &dashboard)], "dashboard").await, 0);
    assert_eq!(anonymous_connack(&broker, &[], "paho").await, 0);
    let page_on_same_host = format!("http://127.0.0.1:{}", ws_port + 1);
    assert_eq!(anonymous_connack(&broker, &[("origin", &page_on_same_host)], "same-host").await, 0);
    let metrics = reqwest::get(format!("{dashboard}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "ferrymq_mqtt_ws_origin_refused_total 4"), "{metrics}");
    assert!(broker.log().contains("MQTT WebSocket upgrade refused"), "logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_check_origins_and_its_switches_work_as_emqxs() {
    // Listed origins pass besides the listener's host.
    let listed =
        Broker::start_with(Opts::default().config("[mqtt]\nws_check_origins = [\"https://app.example.com\"]\n"));
    assert_eq!(anonymous_connack(&listed, &[("origin", "https://app.example.com")], "app").await, 0);
    assert_eq!(anonymous_connack(&listed, &[("origin", "https://APP.example.com:443")], "app2").await, 0);
    let e = upgrade_with(&listed, &[("origin", "https://other.example.com")]).await.expect_err("not listed");
    assert_eq!(refused_status(&e), 403);

    // Where logins are checked, origins are not checked unless asked: a page must know a
    // password either way.
    let checked = Broker::start_with(Opts::default().config("[auth]\nmqtt = true\n"));
    assert!(checked.wait_log("MQTT WebSocket: browser origins not checked"), "{}", checked.log());
    assert_eq!(anonymous_connack(&checked, &[("origin", "http://evil.example")], "e").await, 5, "not authorized");
    let strict = Broker::start_with(
        Opts::default()
            .config("[mqtt]\nws_check_origin_enable = true\nws_allow_origin_absence = false\n[auth]\nmqtt = true\n"),
    );
    let e = upgrade_with(&strict, &[("origin", "http://evil.example")]).await.expect_err("checked when asked");
    assert_eq!(refused_status(&e), 403);
    let e = upgrade_with(&strict, &[]).await.expect_err("no Origin refused when asked");
    assert_eq!(refused_status(&e), 403);

    // And turned off on an anonymous listener: any page may connect, as before.
    let off = Broker::start_with(Opts::default().config("[mqtt]\nws_check_origin_enable = false\n"));
    assert_eq!(anonymous_connack(&off, &[("origin", "http://evil.example")], "any").await, 0);

    // A configured origin that is not one stops start-up, naming the key.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ferrymq.toml");
    std::fs::write(&conf, "[mqtt]\nws_check_origins = [\"app.example.com\"]\n").unwrap();
    let data = dir.path().join("data");
    let (code, err) =
        common::run_binary(&["--config", conf.to_str().unwrap(), "--data-dir", data.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("mqtt.ws_check_origins") && err.contains("app.example.com"), "{err}");
}

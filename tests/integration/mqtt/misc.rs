//! Delayed publish, `$SYS` topics, MQTT over TLS, configuration and shutdown, as users
//! observe them.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{run_binary, v4, v5, Broker, Opts};

#[tokio::test]
async fn delayed_publish_arrives_after_the_delay() {
    let broker = Broker::start();
    let mut s = v4::connect(&broker, "s").await;
    s.subscribe("later/#", v4::QoS::AtLeastOnce).await;
    let p = v4::connect(&broker, "p").await;
    let sent = Instant::now();
    p.client.publish("$delayed/1/later/x", v4::QoS::AtLeastOnce, false, "hi").await.unwrap();
    let m = s.next_publish().await;
    let waited = sent.elapsed();
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("later/x", &b"hi"[..]));
    assert!(waited >= Duration::from_millis(900), "delivered after the delay, took {waited:?}");
}

#[tokio::test]
async fn delayed_publish_survives_a_restart() {
    let broker = Broker::start();
    let mut p = v4::connect(&broker, "p").await;
    p.client.publish("$delayed/2/after/restart", v4::QoS::AtLeastOnce, false, "kept").await.unwrap();
    loop {
        if let v4::Packet::PubAck(_) = p.next().await {
            break;
        }
    }
    drop(p);
    let broker = broker.restart();
    let mut s = v4::connect(&broker, "s").await;
    s.subscribe("after/#", v4::QoS::AtLeastOnce).await;
    let m = s.next_publish().await;
    assert_eq!(&m.payload[..], b"kept");
}

#[tokio::test]
async fn malformed_delayed_topic_is_refused() {
    let broker = Broker::start();
    let mut p = v5::connect(&broker, "p").await;
    p.client.publish("$delayed/soon/x", v5::QoS::AtLeastOnce, false, "x").await.unwrap();
    loop {
        if let v5::Packet::PubAck(a) = p.next().await {
            assert_eq!(a.reason, rumqttc::v5::mqttbytes::v5::PubAckReason::TopicNameInvalid);
            break;
        }
    }
}

#[tokio::test]
async fn sys_topics_are_published() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__SYS_INTERVAL_SECS", "1"));
    let mut s = v4::connect(&broker, "sys-watcher").await;
    s.subscribe("$SYS/broker/#", v4::QoS::AtMostOnce).await;
    let wanted = [
        "$SYS/broker/version",
        "$SYS/broker/uptime",
        "$SYS/broker/clients/connected",
        "$SYS/broker/messages/received",
        "$SYS/broker/messages/sent",
        "$SYS/broker/subscriptions/count",
        "$SYS/broker/bytes/received",
        "$SYS/broker/load/messages/received/1min",
        "$SYS/broker/load/bytes/sent/15min",
        "$SYS/broker/load/connections/5min",
        "$SYS/broker/heap/current",
        "$SYS/broker/heap/maximum",
    ];
    let mut seen = std::collections::HashMap::new();
    // The retained values at subscribe time may predate this client; refreshes follow.
    let counted_me = |seen: &std::collections::HashMap<String, String>| {
        let at_least_one = |k: &str| seen.get(k).and_then(|v| v.parse::<u64>().ok()).is_some_and(|n| n >= 1);
        at_least_one("$SYS/broker/clients/connected") && at_least_one("$SYS/broker/subscriptions/count")
    };
    while !wanted.iter().all(|w| seen.contains_key(*w)) || !counted_me(&seen) {
        let m = s.next_publish().await;
        seen.insert(m.topic.clone(), String::from_utf8_lossy(&m.payload).to_string());
    }
    assert!(seen["$SYS/broker/version"].starts_with("ferrymq version"));
    assert!(seen["$SYS/broker/uptime"].ends_with(" seconds"));
    let connected: u64 = seen["$SYS/broker/clients/connected"].parse().unwrap();
    assert!(connected >= 1);
    let subs: u64 = seen["$SYS/broker/subscriptions/count"].parse().unwrap();
    assert!(subs >= 1);
    assert!(seen["$SYS/broker/heap/current"].parse::<u64>().unwrap() > 1 << 20, "resident bytes");
    assert!(seen["$SYS/broker/load/messages/received/1min"].parse::<f64>().is_ok());
    assert!(seen["$SYS/broker/bytes/received"].parse::<u64>().unwrap() > 0);
}

#[tokio::test]
async fn mqtt_over_tls() {
    use rustls_pki_types::pem::PemObject;
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, ca_pem) = common::make_certs(tmp.path());
    let broker = Broker::start_with(
        Opts::default()
            .args(&["--mqtts-listen", "127.0.0.1:0"])
            .env("FERRYMQ_TLS__CERT", cert.to_str().unwrap())
            .env("FERRYMQ_TLS__KEY", key.to_str().unwrap()),
    );
    let tls_addr = broker.mqtts.expect("mqtts address in READY line");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls_pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut o = rumqttc::MqttOptions::new("tls-client", "localhost", tls_addr.port());
    o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::new(config))));
    let mut tls = v4::connect_with(o).await;
    tls.subscribe("secure/#", v4::QoS::AtLeastOnce).await;
    let plain = v4::connect(&broker, "plain").await;
    plain.client.publish("secure/x", v4::QoS::AtLeastOnce, false, "over tls").await.unwrap();
    assert_eq!(&tls.next_publish().await.payload[..], b"over tls");
}

#[test]
fn unknown_config_keys_and_bad_values_stop_startup() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("bad.toml");
    std::fs::write(&file, "[mqtt]\nlisten = \"127.0.0.1:0\"\nmax_packet_sise = 5\n").unwrap();
    let (code, err) =
        run_binary(&["--config", file.to_str().unwrap(), "--data-dir", tmp.path().to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("max_packet_sise"), "names the key: {err}");
    let (code, err) = run_binary(
        &["--data-dir", tmp.path().to_str().unwrap(), "--mqtt-listen", "127.0.0.1:0"],
        &[("FERRYMQ_STORAGE__FSYNC", "often")],
    );
    assert_eq!(code, 2);
    let said = "ferrymq: configuration error: `storage.fsync`: `often` is not one of always, interval, never";
    assert!(err.contains(said), "names the key, the value and what is allowed (docs/configuration.md): {err}");
    let (code, err) = run_binary(&["--mqtt-listen", "not-an-address"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("mqtt.listen"), "names the key: {err}");
}

#[test]
fn a_listen_address_in_use_names_the_flag_and_exits_with_code_2() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for (flag, other) in [("--mqtt-listen", "--amqp-listen"), ("--amqp-listen", "--mqtt-listen")] {
        let args = [
            "--data-dir",
            tmp.path().to_str().unwrap(),
            flag,
            &addr,
            other,
            "127.0.0.1:0",
            "--mqtt-ws-listen",
            "127.0.0.1:0",
        ];
        let (code, err) = run_binary(&args, &[]);
        assert_eq!(code, 2, "a configuration error: {err}");
        let hint = format!("is another broker already listening on {addr}? use {flag}");
        assert!(err.contains(&hint), "{flag}: {err}");
    }
}

/// A data directory records its layout (`format`); one of a layout this build does not
/// read (a newer FerryMQ's) is refused before anything in it is touched, naming what to
/// do, with code 2 like other configuration errors.
#[test]
fn a_data_directory_of_another_layout_is_refused_untouched_with_code_2() {
    let broker = Broker::start();
    let stamped = std::fs::read_to_string(broker.dir.join("format")).unwrap();
    assert_eq!(stamped, format!("ferrymq-journal {}\n", ferrymq_storage::LAYOUT));
    drop(broker);

    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("format"), "ferrymq-journal 99\n").unwrap();
    let args = ["--data-dir", tmp.path().to_str().unwrap(), "--mqtt-listen", "127.0.0.1:0"];
    let (code, err) = run_binary(&args, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("layout 99, written by a newer FerryMQ"), "{err}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("format")], "nothing else was made");
}

/// The soft and hard limits on open files of a process, from `/proc/{pid}/limits`.
fn open_files_limits(pid: &str) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let n: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (n[0], n[1])
}

#[tokio::test]
async fn the_open_files_limit_is_raised_so_connections_past_the_soft_limit_are_served() {
    let (_, hard) = open_files_limits("self");
    if hard < 1024 {
        common::skipped(&format!("the hard limit on open files here is {hard}, under the 1024 the test needs"));
        return;
    }
    let broker = Broker::start_with(Opts::default().open_files(128));
    let (soft_now, hard_now) = open_files_limits(&broker.pid().unwrap().to_string());
    assert_eq!(soft_now, hard_now, "raised to the hard limit");
    assert!(broker.wait_log("raised the open-files limit"), "and logged: {}", broker.log());
    // More connections than the soft limit the broker was started with.
    let mut conns = Vec::new();
    for i in 0..300 {
        let mut raw = common::Raw::connect(&broker).await;
        raw.send(&common::connect_v4_bytes(&format!("c{i}"))).await;
        conns.push(raw);
    }
    for (i, raw) in conns.iter_mut().enumerate() {
        assert_eq!(raw.read_at_least(4).await, [0x20, 2, 0, 0], "connection {i} accepted");
    }
}

#[tokio::test]
async fn flags_override_file_which_overrides_environment() {
    // File sets 4096, environment 8192: the file wins. The flag --mqtt-listen (127.0.0.1:0,
    // set by the harness) wins over the file's listen address.
    let broker = Broker::start_with(
        Opts::default()
            .config("[mqtt]\nlisten = \"127.0.0.1:1\"\nmax_packet_size = 4096\n")
            .env("FERRYMQ_MQTT__MAX_PACKET_SIZE", "8192"),
    );
    assert_ne!(broker.mqtt.port(), 1);
    let c = v5::connect(&broker, "cfg").await;
    assert_eq!(c.connack.properties.clone().unwrap().max_packet_size, Some(4096));
    let broker2 = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_PACKET_SIZE", "8192"));
    let c = v5::connect(&broker2, "cfg").await;
    assert_eq!(c.connack.properties.clone().unwrap().max_packet_size, Some(8192));
}

#[tokio::test]
async fn sigterm_disconnects_clients_and_exits_cleanly() {
    let mut broker = Broker::start();
    let mut c = v5::connect(&broker, "bye").await;
    #[allow(clippy::disallowed_methods)] // the test's own runtime: no journal here
    let stopper = tokio::task::spawn_blocking(move || {
        broker.stop(); // asserts exit status 0
        broker
    });
    let (code, _) = c.expect_server_disconnect().await;
    assert_eq!(code, "ServerShuttingDown");
    let _ = stopper.await.unwrap();
}

#[tokio::test]
async fn a_stalled_subscriber_is_disconnected_and_publishers_go_on() {
    let broker = Broker::start_with(
        Opts::default()
            .env("FERRYMQ_MQTT__MAX_ONLINE_QUEUE", "10")
            .env("FERRYMQ_MQTT__SLOW_CONSUMER_TIMEOUT_SECS", "1"),
    );
    // A subscriber that never reads and never acks.
    let mut stalled = common::Raw::connect(&broker).await;
    stalled.send(&common::connect_v5_bytes("stalled")).await;
    let ack = stalled.read_at_least(3).await;
    assert_eq!(ack[0], 0x20);
    stalled.send(&common::packet(0x82, &[0, 1, 0, 0, 6, b's', b'l', b'o', b'w', b'/', b'#', 1])).await;
    let mut healthy = v4::connect(&broker, "healthy").await;
    healthy.subscribe("slow/#", v4::QoS::AtLeastOnce).await;
    let mut p = v4::connect(&broker, "fast-publisher").await;
    // Publish until the stalled subscriber's window and buffer are full and beyond: every
    // publish is acknowledged and the healthy subscriber gets every message.
    for i in 0..2000u32 {
        p.publish_acked("slow/x", v4::QoS::AtLeastOnce, false, i.to_be_bytes().to_vec()).await;
        let m = healthy.next_publish().await;
        assert_eq!(u32::from_be_bytes(m.payload[..4].try_into().unwrap()), i);
    }
    let got = stalled.read_until_closed().await;
    assert!(got.windows(3).any(|w| w[0] == 0xE0 && w[2] == 0x97), "DISCONNECT 0x97 for the slow consumer");
}

/// With `auth.mqtt = true`, CONNECT's user name and password are checked against the same
/// user store as AMQP logins: a known user gets in (3.1.1 and 5), a wrong password is
/// refused with "bad user name or password" and a CONNECT without a user name with "not
/// authorized", as Mosquitto does without anonymous access.
#[tokio::test]
async fn mqtt_credentials_are_checked_against_the_user_store_when_enabled() {
    let broker = Broker::start_with(
        Opts::default().config("[auth]\nmqtt = true\nusers = [{ name = \"device\", password = \"s3cret\" }]\n"),
    );
    let mut o = v4::options(&broker, "ok4");
    o.set_credentials("device", "s3cret");
    let mut ok = v4::connect_with(o).await;
    ok.subscribe("auth/#", v4::QoS::AtLeastOnce).await;
    let mut o = v5::options(&broker, "ok5");
    o.set_credentials("guest", "guest");
    let p = v5::connect_with(o).await;
    p.client.publish("auth/x", v5::QoS::AtLeastOnce, false, "in").await.unwrap();
    assert_eq!(&ok.next_publish().await.payload[..], b"in");

    let mut o = v4::options(&broker, "bad4");
    o.set_credentials("device", "wrong");
    let e = v4::connect_refused(o).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    let mut o = v5::options(&broker, "bad5");
    o.set_credentials("nobody", "x");
    let e = v5::connect_refused(o).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    let e = v4::connect_refused(v4::options(&broker, "anon4")).await;
    assert!(e.contains("NotAuthorized"), "{e}");
    let e = v5::connect_refused(v5::options(&broker, "anon5")).await;
    assert!(e.contains("NotAuthorized"), "{e}");
}

/// Under the memory alarm a client that publishes is no longer read: its next QoS 1
/// publish gets no PUBACK and reaches nobody, while a subscriber that never published
/// still gets what was accepted. Raising the watermark (config + SIGHUP) resumes it.
#[tokio::test]
async fn publishers_are_not_read_while_the_memory_alarm_is_raised() {
    let broker = Broker::start_with(
        Opts::default().env("FERRYMQ_BROKER__MEMORY_HIGH_WATERMARK_BYTES", "1").config("# reloaded below\n"),
    );
    let mut s = v4::connect(&broker, "sub").await;
    s.subscribe("alarm/#", v4::QoS::AtLeastOnce).await;
    let mut p = v4::connect(&broker, "pub").await;
    // The first publish is read (the connection is not known as a publisher yet).
    p.publish_acked("alarm/1", v4::QoS::AtLeastOnce, false, "first").await;
    assert_eq!(&s.next_publish().await.payload[..], b"first");
    p.client.publish("alarm/2", v4::QoS::AtLeastOnce, false, "held").await.unwrap();
    s.expect_no_publish(Duration::from_millis(700)).await;
    common::amqp::rewrite_config_and_reload(&broker, "[broker]\nmemory_high_watermark_bytes = 1099511627776\n");
    assert_eq!(&s.next_publish().await.payload[..], b"held");
    loop {
        if let v4::Packet::PubAck(_) = p.next().await {
            break;
        }
    }
}

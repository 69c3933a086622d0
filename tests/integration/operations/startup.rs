//! Starting the broker as a new operator does: what the log says at start (version with
//! its commit, data directory, configuration, who each listener lets in, nothing alarming
//! on a default start), and start-ups refused before anything starts, each with a message
//! that names what to fix and exit code 2 (TLS files, a data directory that is a file or
//! held by another FerryMQ, every address in use); a start that fails leaves nothing for
//! the next one to replay. Disconnects are logged at info with their reason.

use crate::common;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use crate::common::{run_binary, v4, Broker, Opts, Raw};

/// Every listener on an ephemeral loopback port except those `args` set.
fn args<'a>(data: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--data-dir", data];
    for flag in ["--mqtt-listen", "--mqtt-ws-listen", "--amqp-listen", "--http-listen"] {
        if !extra.contains(&flag) {
            a.extend([flag, "127.0.0.1:0"]);
        }
    }
    a.extend(extra);
    a
}

/// The lines of a log that say something went wrong, or that a listener serves.
fn alarming(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("listener=")).collect()
}

#[test]
fn a_mismatched_or_missing_tls_file_is_named_before_anything_starts_with_code_2() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let one = common::make_pki(&a, &[]);
    let other = common::make_pki(&b, &[]);
    let data = tmp.path().join("data");
    let data = data.to_str().unwrap();
    let missing = tmp.path().join("no-such.pem");
    let cases = [
        // The key of another certificate.
        (one.server_cert.clone(), other.server_key.clone(), "the private key is not the certificate's"),
        // No certificate file at all.
        (missing.clone(), one.server_key.clone(), "tls.cert"),
    ];
    for (cert, key, problem) in cases {
        let conf = tmp.path().join("tls.toml");
        std::fs::write(&conf, format!("[tls]\ncert = \"{}\"\nkey = \"{}\"\n", cert.display(), key.display())).unwrap();
        let mut a = args(data, &["--mqtts-listen", "127.0.0.1:0"]);
        a.extend(["--config", conf.to_str().unwrap()]);
        let (code, err) = run_binary(&a, &[]);
        assert_eq!(code, 2, "a configuration error: {err}");
        assert!(err.contains(problem), "says what is wrong ({problem}): {err}");
        assert!(err.contains(&cert.display().to_string()), "names the certificate file: {err}");
        assert!(!err.contains("KeyMismatch"), "{err}");
        assert!(alarming(&err).is_empty(), "no listener line, no warning, before the refusal: {err}");
        assert!(!Path::new(data).join("log").exists(), "the data directory was not opened: {err}");
    }
}

#[tokio::test]
async fn a_second_ferrymq_on_the_same_data_directory_is_told_another_one_holds_it() {
    let broker = Broker::start();
    let data = broker.dir.to_str().unwrap();
    let (code, err) = run_binary(&args(data, &[]), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("another FerryMQ is running on the data directory"), "{err}");
    assert!(err.contains(data), "names the directory: {err}");
    assert!(!err.contains("WouldBlock"), "{err}");
    // The first one is untouched.
    drop(v4::connect(&broker, "still-served").await);
}

#[test]
fn a_data_directory_that_is_a_file_gets_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("data");
    std::fs::write(&file, "not a directory").unwrap();
    let (code, err) = run_binary(&args(file.to_str().unwrap(), &[]), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("the data directory {} is a file, not a directory", file.display())), "{err}");
}

#[test]
fn every_address_in_use_is_reported_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let taken: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let [mqtt, amqp] = [0, 1].map(|i| taken[i].local_addr().unwrap().to_string());
    let a = args(data.to_str().unwrap(), &["--mqtt-listen", &mqtt, "--amqp-listen", &amqp]);
    let (code, err) = run_binary(&a, &[]);
    assert_eq!(code, 2, "{err}");
    for (addr, flag) in [(&mqtt, "--mqtt-listen"), (&amqp, "--amqp-listen")] {
        let hint = format!("is another broker already listening on {addr}? use {flag}");
        assert!(err.contains(&hint), "{flag} named: {err}");
    }
}

/// The commit log of a start that failed is closed cleanly: the next start has nothing
/// to replay. Both ways a start fails: before anything is opened (an address in use), and
/// once the data directory is open (a definitions file that cannot be imported).
#[test]
fn a_failed_start_leaves_nothing_for_the_next_start_to_replay() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let defs_dir = tempfile::tempdir().unwrap();
    let defs = defs_dir.path().join("defs.json");
    let queue = r#"{"name":"q","vhost":"/","durable":true,"auto_delete":false,"arguments":{"x-max-length":"abc"}}"#;
    std::fs::write(&defs, format!(r#"{{"queues":[{queue}]}}"#)).unwrap();
    let cases: [(&[&str], &str); 2] = [
        (&["--amqp-listen", &addr], "the address is in use"),
        (&["--definitions", defs.to_str().unwrap()], "cannot import the definitions file"),
    ];
    for (extra, why) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let (code, err) = run_binary(&args(data.to_str().unwrap(), extra), &[]);
        assert_eq!(code, 2, "{why}: {err}");
        assert!(err.contains(why), "{err}");
        let broker = Broker::start_in(data.clone(), Opts::default());
        assert!(!broker.log().contains("replayed the commit log"), "{why}: {}", broker.log());
    }
}

#[test]
fn the_start_is_logged_with_version_commit_data_directory_and_configuration() {
    let out = Command::new(common::binary()).arg("--version").output().unwrap();
    let version = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    // `ferrymq 0.1.0 (abc1234)`: the commit the binary was built from.
    let commit = version.rsplit_once(" (").and_then(|(_, c)| c.strip_suffix(')')).unwrap_or_default();
    assert!(version.starts_with(&format!("ferrymq {} (", env!("CARGO_PKG_VERSION"))), "{version}");
    assert!(commit == "unknown" || commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit()), "{version}");
    let broker = Broker::start_with(Opts::default().config("[mqtt]\nmax_packet_size = 65536\n").log("info"));
    let log = broker.log();
    assert!(log.contains(&format!("{version} starting")), "{log}");
    assert!(log.contains(&broker.dir.with_extension("toml").display().to_string()), "the configuration file: {log}");
    assert!(log.contains(&format!("data directory dir={}", broker.dir.display())), "{log}");
}

/// A default start says nothing alarming: no open-files warning; caps that add up to more
/// sockets than the open-files limit leaves are said once, at info.
#[test]
fn a_default_start_logs_no_warning() {
    let broker = Broker::start_with(Opts::default().log("info"));
    let log = broker.log();
    let bad: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).collect();
    assert!(bad.is_empty(), "{bad:?}");
    drop(broker);
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_CONNECTIONS", "100000000"));
    assert!(
        broker.wait_log("the listeners' caps add up to more client sockets than the open-files limit leaves"),
        "{}",
        broker.log()
    );
}

/// With `mqtt.use_identity_as_username` the user is the client certificate's: the start
/// line of a plain listener says it lets nobody in, not that it admits anonymous clients.
#[tokio::test]
async fn with_use_identity_as_username_the_plain_listener_is_not_said_to_admit_anonymous_clients() {
    let broker = Broker::start_with(Opts::default().config("[mqtt]\nuse_identity_as_username = true\n"));
    let mqtt = broker.mqtt.to_string();
    assert!(broker.wait_log("client certificates"), "{}", broker.log());
    let log = broker.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&format!("listener={mqtt}"))).collect();
    assert!(lines.iter().all(|l| !l.contains("anonymous clients allowed")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("every client refused")), "{lines:?}");
    // As it says: a client without a certificate is refused.
    let e = v4::connect_refused(v4::options(&broker, "anon")).await;
    assert!(e.contains("NotAuthorized"), "{e}");
}

/// The broker's log line for `client_id`'s disconnect, once it is there.
fn disconnect_line(broker: &Broker, needle: &str) -> String {
    assert!(broker.wait_log(needle), "{}", broker.log());
    broker.log().lines().find(|l| l.contains(needle)).unwrap_or_default().to_owned()
}

/// Every disconnect is logged at info with its reason, as Mosquitto logs them (MQTT) and
/// RabbitMQ (AMQP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnects_are_logged_at_info_with_their_reason() {
    let broker = Broker::start_with(Opts::default().log("info"));
    // MQTT: DISCONNECT, a socket closed without one, a malformed packet.
    let c = v4::connect(&broker, "leaver").await;
    c.client.disconnect().await.unwrap();
    let line = disconnect_line(&broker, "client_id=\"leaver\" reason=client sent DISCONNECT");
    assert!(line.contains(" INFO ") && line.contains("client disconnected"), "{line}");
    let mut raw = Raw::connect(&broker).await;
    raw.send(&common::connect_v4_bytes("dropper")).await;
    let _ = raw.read_at_least(4).await;
    drop(raw);
    let line = disconnect_line(&broker, "client_id=\"dropper\" reason=connection closed by the client");
    assert!(line.contains(" INFO "), "{line}");
    let mut raw = Raw::connect(&broker).await;
    raw.send(&common::connect_v4_bytes("garbler")).await;
    let _ = raw.read_at_least(4).await;
    raw.send(&[0x80, 0x02, 0x00, 0x01]).await; // SUBSCRIBE with reserved flags 0000
    let _ = raw.read_until_closed().await;
    let line = disconnect_line(&broker, "client_id=\"garbler\" reason=protocol error");
    assert!(line.contains(" WARN "), "a misbehaving client at warn: {line}");

    // AMQP: connection.close, and a socket closed without it.
    let conn = common::amqp::connect_uri(&format!("amqp://guest:guest@{}/%2F", broker.amqp.unwrap())).await.unwrap();
    conn.close(200, "bye".into()).await.unwrap();
    let line = disconnect_line(&broker, "reason=client closed the connection");
    assert!(line.contains(" INFO ") && line.contains("user=\"guest\""), "{line}");
    let mut raw = common::amqp::RawAmqp::connect(broker.amqp.unwrap()).await;
    raw.handshake(131072, 0).await;
    drop(raw);
    let line = disconnect_line(&broker, "reason=client closed the TCP connection");
    assert!(line.contains(" INFO "), "{line}");
}

//! MQTT bridges (`[[bridge.mqtt]]`), as an operator who replaces a Mosquitto bridge sees
//! them: topics carried out and in with Mosquitto's topic lines, nothing sent back where it
//! came from, no acknowledged message lost while the remote broker is away or restarts,
//! nor when FerryMQ itself is killed mid-stream. The remote is another FerryMQ and a real
//! Mosquitto (Debian's `mosquitto`, which `.ci/run` installs).

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{eventually, free_port, v4, v5, Broker, Opts, WAIT};
use serde_json::json;

/// A broker whose MQTT listener is on `port` (so that it restarts on it).
fn remote_on(port: u16) -> Broker {
    Broker::start_with(Opts::default().args(&["--mqtt-listen", &format!("127.0.0.1:{port}")]))
}

/// An edge broker with one bridge to `address`.
fn edge(address: &str, protocol: &str, topics: &[&str]) -> Broker {
    Broker::start_with(Opts::default().config(&bridge_toml(address, protocol, topics)))
}

fn bridge_toml(address: &str, protocol: &str, topics: &[&str]) -> String {
    let topics: Vec<String> = topics.iter().map(|t| format!("{t:?}")).collect();
    format!(
        "[[bridge.mqtt]]\nconnection = \"cloud\"\naddress = \"{address}\"\nbridge_protocol_version = \"{protocol}\"\n\
         restart_timeout = [0.2, 1.0]\nkeepalive_interval = 5\ntopic = [{}]\n",
        topics.join(", ")
    )
}

/// Waits until the edge says its bridge is connected.
fn bridged(edge: &Broker) {
    assert!(edge.wait_log("bridge connected"), "the bridge did not connect: {}", edge.log());
}

/// Payloads of the next `n` publishes.
async fn payloads_v4(c: &mut v4::Client, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < n {
        got.push(String::from_utf8_lossy(&c.next_publish().await.payload).into_owned());
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_carries_topics_out_and_in_as_its_topic_lines_say() {
    let cloud = Broker::start();
    let (h, p) = cloud.host_port();
    let edge = edge(
        &format!("{h}:{p}"),
        "mqttv50",
        &["sensors/# out 1", "cmd/+ in 1 edge/ site-1/", "sync/# both 1", "\"\" out 0 status/edge uplinks/site-1"],
    );
    bridged(&edge);
    let mut at_cloud = v4::connect(&cloud, "cloud-app").await;
    for f in ["sensors/#", "sync/#", "uplinks/#", "cmd/#"] {
        at_cloud.subscribe(f, v4::QoS::AtLeastOnce).await;
    }
    let mut at_edge = v5::connect(&edge, "edge-app").await;
    for f in ["edge/#", "sync/#", "site-1/#"] {
        at_edge.subscribe(f, v5::QoS::AtLeastOnce).await;
    }
    let mut device = v5::connect(&edge, "device").await;
    let mut operator = v4::connect(&cloud, "operator").await;

    // Out: the subscription at the remote was made by the bridge; QoS 1 arrives as QoS 1.
    device.publish_acked("sensors/1/temp", v5::QoS::AtLeastOnce, false, "21.5").await;
    let m = at_cloud.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..], m.qos), ("sensors/1/temp", &b"21.5"[..], v4::QoS::AtLeastOnce));
    // An empty pattern carries one topic, renamed by the prefixes.
    device.publish_acked("status/edge", v5::QoS::AtLeastOnce, false, "up").await;
    let m = at_cloud.next_publish().await;
    assert_eq!((m.topic.as_str(), m.qos), ("uplinks/site-1", v4::QoS::AtMostOnce), "QoS at most the line's 0");

    // In, with prefixes: site-1/cmd/reboot at the remote is edge/cmd/reboot here.
    operator.publish_acked("site-1/cmd/reboot", v4::QoS::AtLeastOnce, false, "now").await;
    let m = at_edge.next_publish().await;
    assert_eq!((m.topic.as_ref(), &m.payload[..]), (&b"edge/cmd/reboot"[..], &b"now"[..]));
    // An in line carries nothing out: edge/cmd/x published here stays here.
    device.publish_acked("edge/cmd/local", v5::QoS::AtLeastOnce, false, "local").await;
    assert_eq!(&at_edge.next_publish().await.payload[..], b"local");

    // Both ways, and nothing comes back: one copy on each side.
    device.publish_acked("sync/a", v5::QoS::AtLeastOnce, false, "from-edge").await;
    assert_eq!(&at_edge.next_publish().await.payload[..], b"from-edge");
    assert_eq!(&at_cloud.next_publish().await.payload[..], b"from-edge");
    operator.publish_acked("sync/b", v4::QoS::AtLeastOnce, false, "from-cloud").await;
    assert_eq!(&at_cloud.next_publish().await.payload[..], b"from-cloud");
    assert_eq!(&at_edge.next_publish().await.payload[..], b"from-cloud");
    at_edge.expect_no_publish(Duration::from_millis(500)).await;
    at_cloud.expect_no_publish(Duration::from_millis(300)).await;

    // The bridge shows in the management API.
    let api = common::http::Api::of(&edge);
    let b = api.ok("/api/ferrymq/bridges").await;
    assert_eq!((b[0]["name"].as_str(), b[0]["state"].as_str()), (Some("cloud"), Some("running")), "{b}");
    assert!(b[0]["sent"].as_u64() >= Some(3) && b[0]["received"].as_u64() >= Some(2), "{b}");
    // And in Prometheus' /metrics.
    let metrics = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ferrymq_bridge_up{bridge=\"cloud\"} 1"), "{metrics}");
    assert!(metrics.contains("ferrymq_bridge_messages_total{bridge=\"cloud\",direction=\"out\"}"), "{metrics}");
    let out = std::process::Command::new(common::binary())
        .args(["ctl", "--url", &format!("http://{}", edge.http.unwrap()), "list", "bridges"])
        .output()
        .expect("run ferrymq ctl");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.lines().nth(1).is_some_and(|l| l.contains("running")), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_wait_in_the_journal_while_the_remote_is_away_even_across_a_crash_of_ferrymq() {
    let port = free_port();
    let mut cloud = remote_on(port);
    // A persistent subscriber at the remote, then the remote goes away.
    let mut sink = v4::connect_persistent(&cloud, "sink").await;
    sink.subscribe("data/#", v4::QoS::AtLeastOnce).await;
    drop(sink);
    let edge = edge(&format!("127.0.0.1:{port}"), "mqttv311", &["data/# out 1"]);
    bridged(&edge);
    cloud.stop();

    let mut device = v4::connect(&edge, "device").await;
    for i in 0..100 {
        device.publish_acked(&format!("data/{i}"), v4::QoS::AtLeastOnce, false, format!("m{i}")).await;
    }
    drop(device);
    // FerryMQ is killed with the 100 messages acked to the device and not yet sent on.
    let edge = edge.crash_restart();
    let cloud = cloud.start_again();
    bridged(&edge);
    let mut sink = v4::connect_persistent(&cloud, "sink").await;
    let got: BTreeSet<String> = payloads_v4(&mut sink, 100).await.into_iter().collect();
    let want: BTreeSet<String> = (0..100).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want, "every acknowledged message arrives");
}

// ----- against a real Mosquitto ---------------------------------------------------------

/// A Mosquitto broker on a fixed loopback port, with persistence in its own directory.
struct Mosquitto {
    bin: &'static str,
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: String,
    _tmp: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts Mosquitto, or `None` (the test is skipped, and says so) where it is not
    /// installed; `.ci/run` installs it, so CI always runs these tests.
    async fn start() -> Option<Mosquitto> {
        Self::start_with("").await
    }

    /// [`Mosquitto::start`] with more lines of mosquitto.conf (a bridge).
    async fn start_with(extra: &str) -> Option<Mosquitto> {
        let Some(bin) = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"].into_iter().find(|p| Path::new(p).exists())
        else {
            common::skipped("mosquitto is not installed (apt-get install mosquitto)");
            return None;
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut m = Mosquitto { bin, child: None, port: free_port(), dir, extra: extra.to_owned(), _tmp: tmp };
        m.spawn().await;
        Some(m)
    }

    async fn spawn(&mut self) {
        let conf = self.dir.join("mosquitto.conf");
        let root = running_as_root();
        std::fs::write(
            &conf,
            format!(
                "listener {} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n\
                 log_dest stderr\nlog_type all\n{}{}\n",
                self.port,
                self.dir.display(),
                if root { "user root\n" } else { "" },
                self.extra
            ),
        )
        .unwrap();
        let child = Command::new(self.bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("mosquitto.log")).unwrap())
            .spawn()
            .expect("spawn mosquitto");
        self.child = Some(child);
        let port = self.port;
        eventually("mosquitto listening", WAIT, || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop)
        })
        .await;
    }

    /// Stops it with SIGTERM (it saves its persistence file) and waits.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
    }

    /// Kills it with SIGKILL (its connections end without DISCONNECT).
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn options_v4(&self, id: &str) -> v4::MqttOptions {
        let mut o = v4::MqttOptions::new(id, "127.0.0.1", self.port);
        o.set_keep_alive(Duration::from_secs(30));
        o.set_clean_session(false);
        o
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }
}

/// Mosquitto run as root drops to user `mosquitto` unless told `user root`.
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- mosquitto log -----\n{}", self.log());
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_to_mosquitto_loses_nothing_when_mosquitto_restarts_mid_stream() {
    let Some(mut mosquitto) = Mosquitto::start().await else { return };
    let mut sink = v4::connect_with(mosquitto.options_v4("sink")).await;
    sink.subscribe("fleet/#", v4::QoS::AtLeastOnce).await;
    let edge = edge(&mosquitto.address(), "mqttv311", &["fleet/# out 1", "cmd/# in 1"]);
    bridged(&edge);

    let mut device = v4::connect(&edge, "device").await;
    for i in 0..20 {
        device.publish_acked(&format!("fleet/{i}"), v4::QoS::AtLeastOnce, false, format!("m{i}")).await;
    }
    let got: BTreeSet<String> = payloads_v4(&mut sink, 20).await.into_iter().collect();
    assert_eq!(got.len(), 20);
    // The sink goes offline (Mosquitto queues for its session); the device publishes 200
    // more, and Mosquitto is stopped while they stream through the bridge.
    drop(sink);
    let publisher = tokio::spawn(async move {
        for i in 20..220 {
            device.publish_acked(&format!("fleet/{i}"), v4::QoS::AtLeastOnce, false, format!("m{i}")).await;
        }
    });
    let api = common::http::Api::of(&edge);
    eventually("the bridge carried some of the stream", WAIT, || async {
        (api.ok("/api/ferrymq/bridges").await[0]["sent"].as_u64() >= Some(60)).then_some(())
    })
    .await;
    mosquitto.stop();
    tokio::time::timeout(WAIT * 3, publisher).await.expect("publishes acked by FerryMQ").unwrap();
    mosquitto.spawn().await;
    let mut sink = v4::connect_with(mosquitto.options_v4("sink")).await;
    let mut got = BTreeSet::new();
    let mut first_seen = Vec::new();
    let want: BTreeSet<String> = (20..220).map(|i| format!("m{i}")).collect();
    while got != want {
        let p = sink.next_publish().await;
        let m = String::from_utf8_lossy(&p.payload).into_owned();
        if got.insert(m.clone()) {
            first_seen.push(m[1..].parse::<u32>().unwrap());
        }
    }
    // Order is kept: a message re-sent after the outage comes again, never ahead of its turn.
    assert!(first_seen.windows(2).all(|w| w[0] < w[1]), "out of order: {first_seen:?}");

    // And Mosquitto's publishes come in.
    let mut app = v4::connect(&edge, "app").await;
    app.subscribe("cmd/#", v4::QoS::AtLeastOnce).await;
    // The bridge is connected again (the messages above came through it), and its
    // subscription at Mosquitto outlived the restart (a persistent session).
    let mut operator = v4::connect_with(mosquitto.options_v4("operator")).await;
    operator.publish_acked("cmd/1", v4::QoS::AtLeastOnce, false, "reboot").await;
    let got = app.next_publish().await;
    assert_eq!((got.topic.as_str(), &got.payload[..]), ("cmd/1", &b"reboot"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt5_bridge_to_mosquitto_sends_nothing_back_both_ways() {
    let Some(mosquitto) = Mosquitto::start().await else { return };
    let edge = edge(&mosquitto.address(), "mqttv50", &["room/# both 2"]);
    bridged(&edge);
    let mut there = v4::connect_with(mosquitto.options_v4("there")).await;
    there.subscribe("room/#", v4::QoS::ExactlyOnce).await;
    let mut here = v5::connect(&edge, "here").await;
    here.subscribe("room/#", v5::QoS::ExactlyOnce).await;

    let mut here_pub = v5::connect(&edge, "here-pub").await;
    let mut there_pub = v4::connect_with(mosquitto.options_v4("there-pub")).await;
    here_pub.publish_acked("room/1", v5::QoS::ExactlyOnce, false, "hello from here").await;
    let m = there.next_publish().await;
    assert_eq!((&m.payload[..], m.qos), (&b"hello from here"[..], v4::QoS::ExactlyOnce), "QoS 2 end to end");
    assert_eq!(&here.next_publish().await.payload[..], b"hello from here");
    there_pub.publish_acked("room/2", v4::QoS::ExactlyOnce, false, "hello from there").await;
    assert_eq!(&there.next_publish().await.payload[..], b"hello from there");
    assert_eq!(&here.next_publish().await.payload[..], b"hello from there");
    // No echo either way: Mosquitto does not send the bridge its own publishes (no-local),
    // nor FerryMQ the local side its own.
    here.expect_no_publish(Duration::from_millis(500)).await;
    there.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_1_1_bridge_is_not_sent_its_own_publishes_back() {
    // The bridge bit (try_private, on by default) asks the remote FerryMQ for no-local.
    let cloud = Broker::start();
    let (h, p) = cloud.host_port();
    let edge = edge(&format!("{h}:{p}"), "mqttv311", &["chat/# both 1"]);
    bridged(&edge);
    let mut here = v4::connect(&edge, "here").await;
    here.subscribe("chat/#", v4::QoS::AtLeastOnce).await;
    let mut there = v4::connect(&cloud, "there").await;
    there.subscribe("chat/#", v4::QoS::AtLeastOnce).await;
    let mut speaker = v4::connect(&edge, "speaker").await;
    speaker.publish_acked("chat/1", v4::QoS::AtLeastOnce, false, "once").await;
    assert_eq!(&there.next_publish().await.payload[..], b"once");
    assert_eq!(&here.next_publish().await.payload[..], b"once");
    here.expect_no_publish(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mosquitto_bridge_connects_into_ferrymq_unchanged() {
    // An edge Mosquitto with a bridge block as written for a Mosquitto hub: its defaults
    // (MQTT 3.1.1 with try_private) included.
    let hub = Broker::start();
    let (h, p) = hub.host_port();
    let conf = format!(
        "connection hub\naddress {h}:{p}\ntopic telemetry/# out 1\ntopic ota/# in 1\ntopic talk/# both 1\n\
         restart_timeout 1 2\n"
    );
    let Some(edge) = Mosquitto::start_with(&conf).await else { return };
    let mut at_hub = v5::connect(&hub, "hub-app").await;
    at_hub.subscribe("telemetry/#", v5::QoS::AtLeastOnce).await;
    at_hub.subscribe("talk/#", v5::QoS::AtLeastOnce).await;
    let mut at_edge = v4::connect_with(edge.options_v4("edge-app")).await;
    at_edge.subscribe("ota/#", v4::QoS::AtLeastOnce).await;
    at_edge.subscribe("talk/#", v4::QoS::AtLeastOnce).await;
    // The bridge subscribes at FerryMQ once it is up: wait for its session.
    let api = common::http::Api::of(&hub);
    eventually("Mosquitto's bridge subscribed at FerryMQ", WAIT, || async {
        let subs = api.ok("/api/ferrymq/mqtt/subscriptions").await;
        (subs.as_array().map(|a| a.len()).unwrap_or(0) >= 4).then_some(())
    })
    .await;

    let mut sensor = v4::connect_with(edge.options_v4("sensor")).await;
    sensor.publish_acked("telemetry/t1", v4::QoS::AtLeastOnce, false, "7").await;
    let m = at_hub.next_publish().await;
    assert_eq!((&m.topic[..], &m.payload[..]), (&b"telemetry/t1"[..], &b"7"[..]));
    let mut ops = v5::connect(&hub, "ops").await;
    ops.publish_acked("ota/fw", v5::QoS::AtLeastOnce, false, "v2").await;
    let m = at_edge.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("ota/fw", &b"v2"[..]));
    // Both ways and no echo: FerryMQ sends the bridge none of its own publishes back.
    sensor.publish_acked("talk/1", v4::QoS::AtLeastOnce, false, "hi").await;
    assert_eq!(&at_edge.next_publish().await.payload[..], b"hi");
    assert_eq!(&at_hub.next_publish().await.payload[..], b"hi");
    at_edge.expect_no_publish(Duration::from_millis(500)).await;
}

/// A Mosquitto bridge connected into FerryMQ publishes its state on
/// `$SYS/broker/connection/{its client id}/state` (its `notifications`, on by default):
/// `1` retained once up, `0` through its will when it goes away. FerryMQ keeps it retained
/// as Mosquitto does, at every protocol version the bridge may speak, and lists the remote
/// bridge in `/api/ferrymq/bridges`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mosquitto_bridge_connected_into_ferrymq_reports_its_state_there() {
    for version in ["mqttv31", "mqttv311", "mqttv50"] {
        let hub = Broker::start();
        let (h, p) = hub.host_port();
        let mut watch = v4::connect(&hub, "watch").await;
        watch.subscribe("$SYS/broker/connection/+/state", v4::QoS::AtLeastOnce).await;
        let conf = format!(
            "connection hub\naddress {h}:{p}\nremote_clientid edge-7\nbridge_protocol_version {version}\n\
             topic telemetry/# out 1\nrestart_timeout 1 2\n"
        );
        let Some(mut edge) = Mosquitto::start_with(&conf).await else { return };
        let m = watch.next_publish().await;
        assert_eq!((m.topic.as_str(), &m.payload[..]), ("$SYS/broker/connection/edge-7/state", &b"1"[..]), "{version}");
        // Retained: a client that subscribes later gets it.
        let mut late = v5::connect(&hub, "late").await;
        late.subscribe("$SYS/broker/connection/edge-7/state", v5::QoS::AtLeastOnce).await;
        let m = late.next_publish().await;
        assert_eq!((&m.payload[..], m.retain), (&b"1"[..], true), "{version}: retained");
        drop(late);
        // The bridges view lists the remote bridge beside FerryMQ's own.
        let api = common::http::Api::of(&hub);
        let rows = api.ok("/api/ferrymq/bridges").await;
        let row = rows.as_array().and_then(|a| a.iter().find(|b| b["name"] == "edge-7")).cloned();
        let row = row.unwrap_or_else(|| panic!("{version}: edge-7 not in {rows}"));
        assert_eq!((row["state"].as_str(), row["remote"].as_bool()), (Some("running"), Some(true)), "{version}: {row}");
        assert!(row["address"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:")), "{version}: {row}");
        // Mosquitto dies: its will says `0`, and so does the view.
        edge.kill();
        let m = watch.next_publish().await;
        assert_eq!((m.topic.as_str(), &m.payload[..]), ("$SYS/broker/connection/edge-7/state", &b"0"[..]), "{version}");
        let rows = api.ok("/api/ferrymq/bridges").await;
        let row = rows.as_array().and_then(|a| a.iter().find(|b| b["name"] == "edge-7")).cloned();
        assert_eq!(row.as_ref().and_then(|r| r["state"].as_str()), Some("down"), "{version}: {rows}");
        // Kept across a restart of FerryMQ, as Mosquitto keeps retained messages.
        drop(watch);
        let hub = hub.restart();
        let mut late = v4::connect(&hub, "after-restart").await;
        late.subscribe("$SYS/broker/connection/edge-7/state", v4::QoS::AtLeastOnce).await;
        let m = late.next_publish().await;
        assert_eq!((&m.payload[..], m.retain), (&b"0"[..], true), "{version}: retained across a restart");
        let rows = common::http::Api::of(&hub).ok("/api/ferrymq/bridges").await;
        let row = rows.as_array().and_then(|a| a.iter().find(|b| b["name"] == "edge-7")).cloned();
        assert_eq!(row.as_ref().and_then(|r| r["state"].as_str()), Some("down"), "{version}: {rows}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_over_tls_presents_its_client_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = common::make_pki(tmp.path(), &[("edge-7", "fleet")]);
    let (cert, key) = (tmp.path().join("edge.pem"), tmp.path().join("edge.key"));
    std::fs::write(&cert, &pki.clients[0].0).unwrap();
    std::fs::write(&key, &pki.clients[0].1).unwrap();
    // The remote asks every TLS client for a certificate.
    let cloud = Broker::start_with(
        Opts::default()
            .config(&format!(
                "[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nverify_client = \"required\"\n",
                pki.server_cert.display(),
                pki.server_key.display(),
                pki.ca_file.display()
            ))
            .args(&["--mqtts-listen", "127.0.0.1:0"]),
    );
    let tls = format!(
        "bridge_cafile = \"{}\"\nbridge_certfile = \"{}\"\nbridge_keyfile = \"{}\"\n",
        pki.ca_file.display(),
        cert.display(),
        key.display()
    );
    let address = format!("localhost:{}", cloud.mqtts.unwrap().port());
    let edge = Broker::start_with(Opts::default().config(&(bridge_toml(&address, "mqttv50", &["up/# out 1"]) + &tls)));
    bridged(&edge);
    let mut at_cloud = v4::connect(&cloud, "cloud-app").await;
    at_cloud.subscribe("up/#", v4::QoS::AtLeastOnce).await;
    let mut device = v4::connect(&edge, "device").await;
    device.publish_acked("up/1", v4::QoS::AtLeastOnce, false, "sealed").await;
    assert_eq!(&at_cloud.next_publish().await.payload[..], b"sealed");

    // Without the certificate the remote refuses the handshake; the bridge says why.
    let no_cert = format!("bridge_cafile = \"{}\"\n", pki.ca_file.display());
    let lone =
        Broker::start_with(Opts::default().config(&(bridge_toml(&address, "mqttv50", &["up/# out 1"]) + &no_cert)));
    assert!(lone.wait_log("bridge down; reconnecting with backoff"), "{}", lone.log());

    // A remote reached at an address its certificate does not name (127.0.0.2; it names
    // localhost and 127.0.0.1) is refused, unless `bridge_insecure` is set; the chain is
    // checked either way.
    let other = Broker::start_with(
        Opts::default()
            .config(&format!(
                "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
                pki.server_cert.display(),
                pki.server_key.display()
            ))
            .args(&["--mqtts-listen", "127.0.0.2:0"]),
    );
    let address = format!("127.0.0.2:{}", other.mqtts.unwrap().port());
    let bridge = bridge_toml(&address, "mqttv311", &["up/# out 1"]) + &no_cert;
    let strict = Broker::start_with(Opts::default().config(&bridge));
    assert!(strict.wait_log("bridge down; reconnecting with backoff"), "{}", strict.log());
    assert!(strict.log().contains("not valid for name \"127.0.0.2\""), "refused for the name: {}", strict.log());
    let insecure = Broker::start_with(Opts::default().config(&(bridge + "bridge_insecure = true\n")));
    bridged(&insecure);
}

#[test]
fn a_bad_topic_line_is_refused_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let (conf, data) = (tmp.path().join("f.toml"), tmp.path().join("data"));
    for (line, why) in [("sensors/# sideways 1", "out, in or both"), ("a/# out 3", "QoS is 0, 1 or 2")] {
        std::fs::write(&conf, bridge_toml("127.0.0.1:1", "mqttv311", &[line])).unwrap();
        let (code, err) =
            common::run_binary(&["--config", conf.to_str().unwrap(), "--data-dir", data.to_str().unwrap()], &[]);
        assert_ne!(code, 0, "{err}");
        assert!(err.contains("bridge `cloud`") && err.contains(why), "{err}");
    }
}

// ----- QoS 2 exactly once across a crash of FerryMQ -------------------------------------

/// A QoS 2 PUBLISH as the scripted remote sends it.
fn qos2_message(pkid: u16, topic: &str, payload: &'static str, dup: bool) -> ferrymq_mqtt::Publish {
    ferrymq_mqtt::Publish {
        dup,
        qos: ferrymq_mqtt::QoS::ExactlyOnce,
        retain: false,
        topic: topic.into(),
        pkid,
        payload: bytes::Bytes::from_static(payload.as_bytes()),
        properties: ferrymq_mqtt::PublishProperties::default(),
    }
}

/// The remote broker played by the test, one connection at a time, in FerryMQ's own
/// codec: it decides when acks go back, so the crash can fall between two of them.
struct ScriptedRemote {
    stream: tokio::net::TcpStream,
    buf: bytes::BytesMut,
}

impl ScriptedRemote {
    const LEVEL: ferrymq_mqtt::ProtocolLevel = ferrymq_mqtt::ProtocolLevel::V3_1_1;

    /// Accepts the bridge: CONNECT (a persistent session), CONNACK with the session
    /// present, SUBSCRIBE, SUBACK.
    async fn accept(listener: &tokio::net::TcpListener) -> ScriptedRemote {
        use ferrymq_mqtt::{ConnAckProperties, Packet, ReasonCode};
        let (stream, _) = tokio::time::timeout(WAIT, listener.accept()).await.expect("the bridge connects").unwrap();
        let mut r = ScriptedRemote { stream, buf: bytes::BytesMut::new() };
        let Packet::Connect(c) = r.read(None).await else { panic!("CONNECT first") };
        assert!(!c.clean_start, "the bridge keeps its session at the remote");
        let connack = Packet::ConnAck {
            session_present: true,
            reason: ReasonCode::SUCCESS,
            properties: Box::<ConnAckProperties>::default(),
        };
        r.send(connack).await;
        let Packet::Subscribe(s) = r.next().await else { panic!("SUBSCRIBE") };
        r.send(Packet::SubAck { pkid: s.pkid, reasons: vec![ReasonCode(2)], reason_string: None }).await;
        // The bridge's state, as Mosquitto's bridges publish it (`notifications`).
        let state = r.next_publish().await;
        assert_eq!(
            (state.topic.as_str(), &state.payload[..], state.retain),
            ("$SYS/broker/connection/ferrymq.cloud/state", &b"1"[..], true)
        );
        r.send(Packet::PubAck { pkid: state.pkid, reason: ReasonCode::SUCCESS, reason_string: None }).await;
        r
    }

    async fn read(&mut self, level: Option<ferrymq_mqtt::ProtocolLevel>) -> ferrymq_mqtt::Packet {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some(p) = ferrymq_mqtt::codec::decode(&mut self.buf, level, 1 << 20).unwrap() {
                return p;
            }
            let n = tokio::time::timeout(WAIT, self.stream.read_buf(&mut self.buf)).await.expect("a packet").unwrap();
            assert!(n > 0, "the bridge closed the connection");
        }
    }

    /// The next packet other than PINGREQ (answered).
    async fn next(&mut self) -> ferrymq_mqtt::Packet {
        loop {
            match self.read(Some(Self::LEVEL)).await {
                ferrymq_mqtt::Packet::PingReq => self.send(ferrymq_mqtt::Packet::PingResp).await,
                p => return p,
            }
        }
    }

    async fn send(&mut self, p: ferrymq_mqtt::Packet) {
        use tokio::io::AsyncWriteExt;
        let mut b = bytes::BytesMut::new();
        ferrymq_mqtt::codec::encode(&p, Self::LEVEL, &mut b).unwrap();
        self.stream.write_all(&b).await.unwrap();
    }

    /// Sends a QoS 2 PUBLISH and plays the exchange to its end, as a remote that did (or,
    /// `dup`, did not) see the PUBREC of an earlier try.
    async fn publish_qos2(&mut self, pkid: u16, topic: &str, payload: &'static str, dup: bool) {
        use ferrymq_mqtt::{Packet, ReasonCode};
        self.send(Packet::Publish(qos2_message(pkid, topic, payload, dup))).await;
        assert!(matches!(self.next().await, Packet::PubRec { pkid: id, .. } if id == pkid));
        self.send(Packet::PubRel { pkid, reason: ReasonCode::SUCCESS }).await;
        assert!(matches!(self.next().await, Packet::PubComp { pkid: id, .. } if id == pkid));
    }

    /// The next PUBLISH the bridge sends.
    async fn next_publish(&mut self) -> ferrymq_mqtt::Publish {
        match self.next().await {
            ferrymq_mqtt::Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos2_crosses_a_bridge_exactly_once_when_ferrymq_is_killed_between_the_acks() {
    use ferrymq_mqtt::{Packet, QoS, ReasonCode};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let edge = edge(&address, "mqttv311", &["cmd/# in 2", "up/# out 2"]);
    let mut app = v4::connect_persistent(&edge, "app").await;
    app.subscribe("cmd/#", v4::QoS::ExactlyOnce).await;
    drop(app);

    // In: the remote's PUBLISH is stored at FerryMQ (PUBREC) when FerryMQ is killed.
    let mut remote = ScriptedRemote::accept(&listener).await;
    remote.send(Packet::Publish(qos2_message(7, "cmd/a", "first", false))).await;
    assert!(matches!(remote.next().await, Packet::PubRec { pkid: 7, .. }));
    let edge = edge.crash_restart();
    // The remote did not see that PUBREC: it sends the PUBLISH again, then the rest.
    let mut remote = ScriptedRemote::accept(&listener).await;
    remote.publish_qos2(7, "cmd/a", "first", true).await;
    // Id 7 is free again at FerryMQ: a new message under it is a new message.
    remote.publish_qos2(7, "cmd/a", "second", false).await;
    remote.publish_qos2(8, "cmd/a", "end", false).await;
    let mut app = v4::connect_persistent(&edge, "app").await;
    assert_eq!(payloads_v4(&mut app, 3).await, ["first", "second", "end"], "one copy of each");

    // Out: FerryMQ's PUBLISH reaches the remote, which has not answered when FerryMQ is
    // killed; after the restart the same message comes again under the same packet id,
    // so a remote that kept its session recognises it.
    let mut device = v4::connect(&edge, "device").await;
    device.publish_acked("up/x", v4::QoS::ExactlyOnce, false, "u1").await;
    let sent = remote.next_publish().await;
    assert_eq!((&sent.payload[..], sent.qos, sent.dup), (&b"u1"[..], QoS::ExactlyOnce, false));
    drop(device);
    let edge = edge.crash_restart();
    let mut remote = ScriptedRemote::accept(&listener).await;
    let again = remote.next_publish().await;
    // (The DUP flag is set when the delivery was recorded before the kill; the receiver
    // goes by the id.)
    assert_eq!((&again.payload[..], again.pkid), (&b"u1"[..], sent.pkid), "re-sent under the same id");
    remote.send(Packet::PubRec { pkid: sent.pkid, reason: ReasonCode::SUCCESS, reason_string: None }).await;
    assert!(matches!(remote.next().await, Packet::PubRel { pkid, .. } if pkid == sent.pkid));
    remote.send(Packet::PubComp { pkid: sent.pkid, reason: ReasonCode::SUCCESS }).await;
    // The exchange is over at FerryMQ too: the next message goes, and u1 is not sent again.
    let mut device = v4::connect(&edge, "device").await;
    device.publish_acked("up/x", v4::QoS::ExactlyOnce, false, "u2").await;
    let u2 = remote.next_publish().await;
    assert_eq!(&u2.payload[..], b"u2");
    // This time the remote's PUBREC went through and FerryMQ's PUBREL arrived when
    // FerryMQ is killed. After the restart FerryMQ's session sends the PUBREL again; it
    // waits until the bridge is up (after its SUBSCRIBE and state message, whose ids it
    // would otherwise meet) and reaches the remote under the same id.
    remote.send(Packet::PubRec { pkid: u2.pkid, reason: ReasonCode::SUCCESS, reason_string: None }).await;
    assert!(matches!(remote.next().await, Packet::PubRel { pkid, .. } if pkid == u2.pkid));
    drop(device);
    let edge = edge.crash_restart();
    let mut remote = ScriptedRemote::accept(&listener).await;
    // FerryMQ sent that PUBREL only once the PUBREC's effect on its session was durable,
    // so the resumed session sends the PUBREL again, never the PUBLISH (which a remote
    // that had completed the id would take as a new message).
    match remote.next().await {
        Packet::PubRel { pkid, .. } if pkid == u2.pkid => {}
        other => panic!("expected PUBREL {} again, got {other:?}", u2.pkid),
    }
    remote.send(Packet::PubComp { pkid: u2.pkid, reason: ReasonCode::SUCCESS }).await;
    let mut device = v4::connect(&edge, "device").await;
    device.publish_acked("up/x", v4::QoS::ExactlyOnce, false, "u3").await;
    assert_eq!(&remote.next_publish().await.payload[..], b"u3", "the bridge stayed up");
}

/// The next state the bridge published on `$SYS/broker/connection/+/state`.
async fn next_state(watch: &mut v4::Client) -> String {
    let m = watch.next_publish().await;
    assert_eq!(m.topic, "$SYS/broker/connection/ferrymq.cloud/state");
    String::from_utf8_lossy(&m.payload).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_fails_over_to_the_next_address_returns_to_the_main_one_and_reports_its_state() {
    let port = free_port();
    let mut main = remote_on(port);
    let spare = Broker::start();
    let (h, p) = spare.host_port();
    // Mosquitto's spelling: the addresses in one string, separated by spaces.
    let edge = edge(&format!("127.0.0.1:{port} {h}:{p}"), "mqttv311", &["up/# out 1"]);
    let mut watch = v4::connect(&edge, "watch").await;
    watch.subscribe("$SYS/broker/connection/+/state", v4::QoS::AtLeastOnce).await;
    assert_eq!(next_state(&mut watch).await, "1", "connected to the main address");
    // The remote sees the state too, retained.
    let mut at_main = v4::connect(&main, "main-watch").await;
    at_main.subscribe("$SYS/broker/connection/+/state", v4::QoS::AtLeastOnce).await;
    let m = at_main.next_publish().await;
    assert_eq!((&m.payload[..], m.retain), (&b"1"[..], true));
    drop(at_main);

    // The main broker goes away: the bridge goes down, then up at the spare address.
    main.stop();
    assert_eq!(next_state(&mut watch).await, "0");
    assert_eq!(next_state(&mut watch).await, "1", "connected to the spare address");
    let mut at_spare = v4::connect(&spare, "spare-app").await;
    at_spare.subscribe("up/#", v4::QoS::AtLeastOnce).await;
    at_spare.subscribe("$SYS/broker/connection/+/state", v4::QoS::AtLeastOnce).await;
    assert_eq!(&at_spare.next_publish().await.payload[..], b"1");
    let mut device = v4::connect(&edge, "device").await;
    device.publish_acked("up/1", v4::QoS::AtLeastOnce, false, "via-spare").await;
    assert_eq!(&at_spare.next_publish().await.payload[..], b"via-spare");

    // The main broker is back: the bridge leaves the spare (which is told `0`) for it.
    let main = main.start_again();
    assert_eq!(&at_spare.next_publish().await.payload[..], b"0", "the spare is told the bridge left");
    assert_eq!(next_state(&mut watch).await, "0");
    assert_eq!(next_state(&mut watch).await, "1", "back on the main address");
    assert!(edge.wait_log("the main address is back"), "{}", edge.log());
    let mut at_main = v4::connect(&main, "main-app").await;
    at_main.subscribe("up/#", v4::QoS::AtLeastOnce).await;
    device.publish_acked("up/2", v4::QoS::AtLeastOnce, false, "via-main").await;
    assert_eq!(&at_main.next_publish().await.payload[..], b"via-main");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_nor_reordered_when_either_broker_is_killed_mid_stream() {
    let port = free_port();
    let cloud = remote_on(port);
    let mut sink = v4::connect_persistent(&cloud, "sink").await;
    sink.subscribe("fleet/#", v4::QoS::AtLeastOnce).await;
    drop(sink);
    let edge = edge(&format!("127.0.0.1:{port}"), "mqttv311", &["fleet/# out 1"]);
    bridged(&edge);
    let publish = |edge: &Broker, range: std::ops::Range<u32>| {
        let options = v4::options(edge, "device");
        tokio::spawn(async move {
            let mut device = v4::connect_with(options).await;
            for i in range {
                device.publish_acked(&format!("fleet/{i}"), v4::QoS::AtLeastOnce, false, format!("m{i}")).await;
            }
        })
    };
    // The remote is SIGKILLed while the first half streams through the bridge.
    let first = publish(&edge, 0..150);
    let api = common::http::Api::of(&edge);
    eventually("the bridge carried some of the stream", WAIT, || async {
        (api.ok("/api/ferrymq/bridges").await[0]["sent"].as_u64() >= Some(50)).then_some(())
    })
    .await;
    let mut cloud = cloud;
    cloud.kill();
    let cloud = cloud.start_again();
    tokio::time::timeout(WAIT * 3, first).await.expect("publishes acked by FerryMQ").unwrap();
    // Then FerryMQ is SIGKILLed with the second half acked to the device and on its way.
    let second = publish(&edge, 150..300);
    tokio::time::timeout(WAIT * 3, second).await.expect("publishes acked by FerryMQ").unwrap();
    let edge = edge.crash_restart();
    bridged(&edge);

    let mut sink = v4::connect_persistent(&cloud, "sink").await;
    let (mut got, mut first_seen) = (BTreeSet::new(), Vec::new());
    while got.len() < 300 {
        let m = String::from_utf8_lossy(&sink.next_publish().await.payload).into_owned();
        if got.insert(m.clone()) {
            first_seen.push(m[1..].parse::<u32>().unwrap());
        }
    }
    // Every acknowledged message arrived (at least once); a copy sent again after a crash
    // never comes ahead of its turn.
    assert_eq!(first_seen, (0..300).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_that_fails_over_takes_the_next_brokers_qos2_ids_as_new_messages() {
    use ferrymq_mqtt::Packet;
    let main = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let spare = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addresses = format!("{} {}", main.local_addr().unwrap(), spare.local_addr().unwrap());
    let edge = edge(&addresses, "mqttv311", &["cmd/# in 2"]);
    let mut app = v4::connect_persistent(&edge, "app").await;
    app.subscribe("cmd/#", v4::QoS::ExactlyOnce).await;
    drop(app);
    // The main broker's QoS 2 message 7 is stored at FerryMQ (PUBREC), then that broker
    // goes away before its PUBREL.
    let mut at_main = ScriptedRemote::accept(&main).await;
    at_main.send(Packet::Publish(qos2_message(7, "cmd/a", "from-main", false))).await;
    assert!(matches!(at_main.next().await, Packet::PubRec { pkid: 7, .. }));
    drop((at_main, main));
    // The spare's own message 7 is another message, not a re-send of the main's.
    let mut at_spare = ScriptedRemote::accept(&spare).await;
    at_spare.publish_qos2(7, "cmd/a", "from-spare", false).await;
    let mut app = v4::connect_persistent(&edge, "app").await;
    assert_eq!(payloads_v4(&mut app, 2).await, ["from-main", "from-spare"]);
}

// ----- the Mosquitto migration walk-through, and a bridge the rules let do nothing ------

/// A fenced block of the "Migrating from a running Mosquitto" walk-through in
/// docs/mqtt.md (`fence` is its opening, such as "```toml"), without the list's indentation.
fn walk_through_block(fence: &str) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/mqtt.md")).unwrap();
    let at = doc.find("**Migrating from a running Mosquitto").expect("the walk-through in docs/mqtt.md");
    let rest = &doc[at..];
    let start = rest.find(&format!("{fence}\n")).unwrap_or_else(|| panic!("a {fence} block in the walk-through"));
    let body = &rest[start + fence.len() + 1..];
    let body = &body[..body.find("```").expect("the block's end")];
    body.lines().map(|l| l.strip_prefix("   ").unwrap_or(l)).collect::<Vec<_>>().join("\n")
}

/// A `mosquitto_passwd` file with these users, or `None` (skipped, saying so) without the tool.
fn password_file(dir: &Path, users: &[(&str, &str)]) -> Option<PathBuf> {
    let Some(tool) =
        ["/usr/bin/mosquitto_passwd", "/usr/sbin/mosquitto_passwd"].into_iter().find(|p| Path::new(p).exists())
    else {
        common::skipped("mosquitto_passwd is not installed (apt-get install mosquitto)");
        return None;
    };
    let file = dir.join("passwd");
    for (i, (user, pass)) in users.iter().enumerate() {
        let mut cmd = Command::new(tool);
        if i == 0 {
            cmd.arg("-c");
        }
        let status = cmd.arg("-b").arg(&file).arg(user).arg(pass).stdout(Stdio::null()).status().unwrap();
        assert!(status.success(), "mosquitto_passwd {user}");
    }
    Some(file)
}

/// Issue 30: following the Mosquitto migration walk-through (then in the README, now in
/// docs/mqtt.md) lost every bridged message both ways, silently (under the `acl_file` the
/// bridge's local side was anonymous and could do nothing). The walk-through's
/// configuration and ACL lines, as docs/mqtt.md has them, with Mosquitto and FerryMQ
/// reading the same password and ACL files: devices on either broker see each other's
/// messages, and the bridge reports nothing refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_mosquitto_migration_walk_through_carries_messages_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let users = [("bridge", "bridge-pw"), ("alice", "alice-pw"), ("bob", "bob-pw")];
    let Some(passwd) = password_file(tmp.path(), &users) else { return };
    // The devices' own lines, then the walk-through's.
    let acl = tmp.path().join("acl");
    let devices = "user alice\ntopic readwrite fleet/#\ntopic readwrite cmd/#\n\
                   user bob\ntopic readwrite fleet/#\ntopic readwrite cmd/#\n";
    std::fs::write(&acl, format!("{devices}{}\n", walk_through_block("```text"))).unwrap();
    let files = format!("password_file {}\nacl_file {}\n", passwd.display(), acl.display());
    let Some(mosquitto) = Mosquitto::start_with(&files).await else { return };

    let bridge = walk_through_block("```toml");
    for placeholder in ["address = \"mosquitto-host:1883\"", "remote_password = \"...\""] {
        assert!(bridge.contains(placeholder), "the walk-through's block has {placeholder}:\n{bridge}");
    }
    let bridge = bridge
        .replace("mosquitto-host:1883", &mosquitto.address())
        .replace("remote_password = \"...\"", "remote_password = \"bridge-pw\"");
    let config = format!(
        "[auth]\nmosquitto_password_file = \"{}\"\nmosquitto_acl_file = \"{}\"\n\n{bridge}\n",
        passwd.display(),
        acl.display()
    );
    let ferrymq = Broker::start_with(Opts::default().config(&config));
    bridged(&ferrymq);

    let mut on_ferrymq = v4::options(&ferrymq, "alice-device");
    on_ferrymq.set_credentials("alice", "alice-pw");
    let mut alice = v4::connect_with(on_ferrymq).await;
    alice.subscribe("cmd/#", v4::QoS::AtLeastOnce).await;
    let mut on_mosquitto = mosquitto.options_v4("bob-device");
    on_mosquitto.set_credentials("bob", "bob-pw");
    let mut bob = v4::connect_with(on_mosquitto).await;
    bob.subscribe("fleet/#", v4::QoS::AtLeastOnce).await;

    alice.publish_acked("fleet/truck-1", v4::QoS::AtLeastOnce, false, "from FerryMQ").await;
    let m = bob.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("fleet/truck-1", &b"from FerryMQ"[..]), "out to Mosquitto");
    bob.publish_acked("cmd/truck-1", v4::QoS::AtLeastOnce, false, "from Mosquitto").await;
    let m = alice.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("cmd/truck-1", &b"from Mosquitto"[..]), "in to FerryMQ");
    alice.expect_no_publish(Duration::from_millis(300)).await;

    let b = common::http::Api::of(&ferrymq).ok("/api/ferrymq/bridges").await;
    assert_eq!(b[0]["state"], "running", "{b}");
    assert_eq!(
        (&b[0]["warnings"], &b[0]["refused_in"], &b[0]["refused_out"]),
        (&json!([]), &json!(0), &json!(0)),
        "{b}"
    );
    assert!(!ferrymq.log().contains("may publish none"), "{}", ferrymq.log());
}

/// Issue 30: a bridge whose local side the rules let do nothing said `running` and dropped
/// everything. It is named at start and in `/api/ferrymq/bridges` (`warnings`), what it
/// drops is counted per direction there and in `/metrics` and logged once, and a rule that
/// grants the local side its topics clears the warning and lets messages through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_whose_local_side_may_do_nothing_is_named_and_counts_what_it_drops() {
    let cloud = Broker::start();
    let (h, p) = cloud.host_port();
    let tmp = tempfile::tempdir().unwrap();
    let acl = tmp.path().join("acl");
    // The ACL grants the device, not the bridge (no local_username: anonymous).
    std::fs::write(&acl, "user device\ntopic readwrite data/#\n").unwrap();
    let config = format!(
        "[auth]\nmosquitto_acl_file = \"{}\"\n\n{}",
        acl.display(),
        bridge_toml(&format!("{h}:{p}"), "mqttv311", &["data/# both 1"])
    );
    let edge = Broker::start_with(Opts::default().config(&config));
    bridged(&edge);
    let log = edge.log();
    let warned = |what: &str| log.lines().any(|l| l.contains("WARN") && l.contains(what) && l.contains("anonymous"));
    assert!(warned("may publish none of these topics"), "named at start:\n{log}");
    assert!(warned("may receive none of these topics"), "named at start:\n{log}");
    let api = common::http::Api::of(&edge);
    let b = api.ok("/api/ferrymq/bridges").await;
    assert_eq!(b[0]["state"], "running", "{b}");
    assert_eq!(b[0]["warnings"].as_array().map(Vec::len), Some(2), "{b}");

    let mut at_cloud = v4::connect(&cloud, "cloud-app").await;
    at_cloud.subscribe("data/#", v4::QoS::AtLeastOnce).await;
    let device_options = |id: &str| {
        let mut o = v4::options(&edge, id);
        o.set_credentials("device", "");
        o
    };
    let mut device = v4::connect_with(device_options("device-1")).await;
    let mut at_edge = v4::connect_with(device_options("device-2")).await;
    at_edge.subscribe("data/in/#", v4::QoS::AtLeastOnce).await;
    for i in 0..3 {
        device.publish_acked(&format!("data/out/{i}"), v4::QoS::AtLeastOnce, false, "lost").await;
    }
    let mut cloud_app = v4::connect(&cloud, "cloud-pub").await;
    for i in 0..2 {
        cloud_app.publish_acked(&format!("data/in/{i}"), v4::QoS::AtLeastOnce, false, "lost too").await;
    }
    let b = eventually("the refusals counted", WAIT, || async {
        let b = api.ok("/api/ferrymq/bridges").await;
        (b[0]["refused_out"] == 3 && b[0]["refused_in"] == 2).then_some(b)
    })
    .await;
    assert_eq!((&b[0]["sent"], &b[0]["received"]), (&json!(0), &json!(2)), "taken from the remote, then refused: {b}");
    at_edge.expect_no_publish(Duration::from_millis(300)).await;
    // The cloud's subscriber sees only its own side's messages.
    for _ in 0..2 {
        assert_eq!(&at_cloud.next_publish().await.payload[..], b"lost too");
    }
    at_cloud.expect_no_publish(Duration::from_millis(300)).await;
    let metrics = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ferrymq_bridge_refused_total{bridge=\"cloud\",direction=\"in\"} 2"), "{metrics}");
    assert!(metrics.contains("ferrymq_bridge_refused_total{bridge=\"cloud\",direction=\"out\"} 3"), "{metrics}");
    let log = edge.log();
    assert_eq!(log.matches("may not publish this topic").count(), 1, "logged once:\n{log}");
    assert_eq!(log.matches("may not receive this topic").count(), 1, "logged once:\n{log}");

    // Granting the anonymous local side its topics clears the warnings, and messages cross.
    let grant = json!([{"permission": "allow", "action": "all", "topics": ["data/#"], "anonymous": true}]);
    let (status, body) = api.put("/api/mqtt/rules", grant).await;
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(api.ok("/api/ferrymq/bridges").await[0]["warnings"], json!([]));
    device.publish_acked("data/out/ok", v4::QoS::AtLeastOnce, false, "carried").await;
    let m = at_cloud.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("data/out/ok", &b"carried"[..]));
    cloud_app.publish_acked("data/in/ok", v4::QoS::AtLeastOnce, false, "carried in").await;
    let m = at_edge.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("data/in/ok", &b"carried in"[..]));
}

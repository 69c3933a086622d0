//! Logins as users moving over from RabbitMQ and Mosquitto expect them: passwords kept only
//! hashed (configured in clear, or as RabbitMQ's and mosquitto_passwd's hashes), a
//! Mosquitto password file used as it is, anonymous MQTT clients only on loopback
//! listeners unless allowed, and an address that keeps failing held back while others
//! are not. Real broker, real clients (rumqttc, lapin) and raw sockets.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::amqp::{amqp_error, connect_uri};
use crate::common::http::Api;
use crate::common::{packet, v4, v5, Broker, Opts, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn amqp_uri(broker: &Broker, user: &str, pass: &str) -> String {
    format!("amqp://{user}:{pass}@{}/%2f", broker.amqp.unwrap())
}

/// MQTT 3.1.1 options to the broker's MQTT port on 127.0.0.1 (its listener may be 0.0.0.0).
fn v4_options(broker: &Broker, id: &str, credentials: Option<(&str, &str)>) -> v4::MqttOptions {
    let mut o = v4::MqttOptions::new(id, "127.0.0.1", broker.mqtt.port());
    o.set_keep_alive(Duration::from_secs(30));
    if let Some((u, p)) = credentials {
        o.set_credentials(u, p);
    }
    o
}

fn v5_options(broker: &Broker, id: &str, credentials: Option<(&str, &str)>) -> v5::MqttOptions {
    let mut o = v5::MqttOptions::new(id, "127.0.0.1", broker.mqtt.port());
    o.set_keep_alive(Duration::from_secs(30));
    if let Some((u, p)) = credentials {
        o.set_credentials(u, p);
    }
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_passwords_and_rabbitmq_and_mosquitto_hashes_log_in_over_both_protocols() {
    let md5 = ferrymq::access::auth::hash_password(ferrymq::access::auth::HashingAlgorithm::Md5, "old-pw");
    let sha512 = ferrymq::access::auth::hash_password(ferrymq::access::auth::HashingAlgorithm::Sha512, "new-pw");
    // From tests/fixtures/mosquitto_passwd (mosquitto_passwd 2.0.11), password d3vice-secret.
    let mosquitto = std::fs::read_to_string(fixture("mosquitto_passwd")).unwrap();
    let dev_hash = mosquitto.lines().next().unwrap().split_once(':').unwrap().1.to_owned();
    let config = format!(
        "[auth]\nmqtt = true\nusers = [\n\
         {{ name = \"app\", password = \"clear-pw\", tags = [\"administrator\"] }},\n\
         {{ name = \"old\", password_hash = \"{md5}\", hashing_algorithm = \"rabbit_password_hashing_md5\" }},\n\
         {{ name = \"new\", password_hash = \"{sha512}\", hashing_algorithm = \"rabbit_password_hashing_sha512\" }},\n\
         {{ name = \"dev\", password_hash = \"{dev_hash}\" }},\n]\n"
    );
    let broker = Broker::start_with(Opts::default().config(&config));
    for (user, pass) in [("app", "clear-pw"), ("old", "old-pw"), ("new", "new-pw"), ("dev", "d3vice-secret")] {
        let conn = connect_uri(&amqp_uri(&broker, user, pass)).await.unwrap_or_else(|e| panic!("{user}: {e}"));
        drop(conn);
        let c = v4::connect_with(v4_options(&broker, &format!("{user}-4"), Some((user, pass)))).await;
        drop(c);
        let c = v5::connect_with(v5_options(&broker, &format!("{user}-5"), Some((user, pass)))).await;
        drop(c);
        let wrong = connect_uri(&amqp_uri(&broker, user, "wrong")).await.expect_err("a wrong password is refused");
        assert_eq!(amqp_error(&wrong).map(|e| e.0), Some(403), "{wrong}");
        let e = v4::connect_refused(v4_options(&broker, "w4", Some((user, "wrong")))).await;
        assert!(e.contains("BadUserNamePassword"), "{e}");
    }
    // The clear password is kept only as a salted hash: the API shows RabbitMQ's sha256 hash.
    let api = Api::of(&broker).as_user("app", "clear-pw");
    let app = api.ok("/api/users/app").await;
    assert_eq!(app["hashing_algorithm"], "rabbit_password_hashing_sha256");
    let hash = app["password_hash"].as_str().unwrap();
    assert!(hash.len() > 40 && !hash.contains("clear-pw"), "{app}");
    let dev = api.ok("/api/users/dev").await;
    assert_eq!(
        (dev["hashing_algorithm"].as_str(), dev["password_hash"].as_str()),
        (Some("mosquitto_passwd"), Some(&*dev_hash))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mosquitto_password_file_turns_on_mqtt_passwords() {
    let file = fixture("mosquitto_passwd");
    let broker = Broker::start_with(Opts::default().config(&format!("[auth]\nmosquitto_password_file = \"{file}\"\n")));
    assert!(broker.wait_log("Mosquitto password file loaded"), "{}", broker.log());
    let mut sub = v4::connect_with(v4_options(&broker, "backend", Some(("backend", "back end pw")))).await;
    sub.subscribe("fleet/#", v4::QoS::AtLeastOnce).await;
    let mut device = v5::connect_with(v5_options(&broker, "device-1", Some(("device-1", "d3vice-secret")))).await;
    device.publish_acked("fleet/1/temp", v5::QoS::AtLeastOnce, false, "21.5").await;
    assert_eq!(&sub.next_publish().await.payload[..], b"21.5");

    let e = v4::connect_refused(v4_options(&broker, "x4", Some(("device-1", "guess")))).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    let e = v5::connect_refused(v5_options(&broker, "x5", Some(("device-1", "guess")))).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    let e = v4::connect_refused(v4_options(&broker, "anon", None)).await;
    assert!(e.contains("NotAuthorized"), "no user name: refused as Mosquitto with a password file: {e}");

    // allow_anonymous = true lets clients without a user name in; named ones stay checked.
    let both = Broker::start_with(
        Opts::default()
            .config(&format!("[mqtt]\nallow_anonymous = true\n[auth]\nmosquitto_password_file = \"{file}\"\n")),
    );
    drop(v4::connect_with(v4_options(&both, "anon", None)).await);
    let e = v4::connect_refused(v4_options(&both, "x4", Some(("device-1", "guess")))).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_password_file_again() {
    let lines: Vec<String> =
        std::fs::read_to_string(fixture("mosquitto_passwd")).unwrap().lines().map(str::to_owned).collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    std::fs::write(&file, format!("{}\n", lines[0])).unwrap(); // device-1 only
    let config = format!("[auth]\nmosquitto_password_file = \"{}\"\n", file.display());
    let broker = Broker::start_with(Opts::default().config(&config));
    drop(v4::connect_with(v4_options(&broker, "d", Some(("device-1", "d3vice-secret")))).await);
    let e = v4::connect_refused(v4_options(&broker, "b", Some(("backend", "back end pw")))).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    // As `mosquitto_passwd` rewrites it: device-1 removed, backend added.
    std::fs::write(&file, format!("{}\n", lines[1])).unwrap();
    let pid = broker.pid().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    common::eventually("the reloaded password file", common::WAIT, || {
        let log = broker.log();
        async move { log.contains("Mosquitto password file reloaded").then_some(()) }
    })
    .await;
    drop(v4::connect_with(v4_options(&broker, "b", Some(("backend", "back end pw")))).await);
    let e = v4::connect_refused(v4_options(&broker, "d", Some(("device-1", "d3vice-secret")))).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    // A bad file keeps the users in force.
    std::fs::write(&file, "backend:clear-text\n").unwrap();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    common::eventually("the refused reload", common::WAIT, || {
        let log = broker.log();
        async move { log.contains("password file not reloaded").then_some(()) }
    })
    .await;
    drop(v4::connect_with(v4_options(&broker, "b2", Some(("backend", "back end pw")))).await);
}

#[test]
fn a_bad_password_file_stops_start_up_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    std::fs::write(&file, "# devices\nplain:secret\n").unwrap();
    let conf = dir.path().join("ferrymq.toml");
    std::fs::write(&conf, format!("[auth]\nmosquitto_password_file = \"{}\"\n", file.display())).unwrap();
    let data = dir.path().join("data");
    let (code, err) = common::run_binary(
        &[
            "--config",
            conf.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--mqtt-listen",
            "127.0.0.1:0",
            "--mqtt-ws-listen",
            "127.0.0.1:0",
            "--amqp-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains(&format!("{}:2:", file.display())), "{err}");
    assert!(err.contains("mosquitto_passwd -U"), "{err}");

    // A configured hash that is not one is refused before anything starts, naming the user.
    std::fs::write(&conf, "[auth]\nusers = [{ name = \"x\", password_hash = \"$7$nope\" }]\n").unwrap();
    let (code, err) =
        common::run_binary(&["--config", conf.to_str().unwrap(), "--data-dir", data.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("auth.users") && err.contains("user `x`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_mqtt_clients_are_refused_on_a_listener_that_is_not_loopback() {
    // Bound to every address (still reached over loopback here): Mosquitto 2.0's rule.
    let broker = Broker::start_with(Opts::default().args(&["--mqtt-listen", "0.0.0.0:0"]));
    assert!(broker.wait_log("anonymous clients refused"), "the decision is logged: {}", broker.log());
    let e = v4::connect_refused(v4_options(&broker, "anon4", None)).await;
    assert!(e.contains("NotAuthorized"), "{e}");
    let e = v5::connect_refused(v5_options(&broker, "anon5", None)).await;
    assert!(e.contains("NotAuthorized"), "{e}");
    // A user name is checked, so naming any user is no way in.
    let e = v4::connect_refused(v4_options(&broker, "named", Some(("nobody", "x")))).await;
    assert!(e.contains("BadUserNamePassword"), "{e}");
    drop(v4::connect_with(v4_options(&broker, "guest", Some(("guest", "guest")))).await);

    let open = Broker::start_with(
        Opts::default().args(&["--mqtt-listen", "0.0.0.0:0"]).config("[mqtt]\nallow_anonymous = true\n"),
    );
    drop(v4::connect_with(v4_options(&open, "anon4", None)).await);
    // The default loopback listener keeps today's behaviour: anyone, names not checked.
    let local = Broker::start();
    assert!(local.wait_log("anonymous clients allowed, user names not checked"), "{}", local.log());
    drop(v4::connect_with(v4_options(&local, "anon4", None)).await);
    drop(v4::connect_with(v4_options(&local, "any", Some(("any", "thing")))).await);
}

/// A raw MQTT 3.1.1 CONNECT with a user name and password, from `source` (a loopback
/// address of the test's choosing); returns the CONNACK's return code.
async fn connect_from(source: &str, broker: SocketAddr, user: &str, pass: &str) -> u8 {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut stream: TcpStream =
        tokio::time::timeout(WAIT, socket.connect(SocketAddr::new("127.0.0.1".parse().unwrap(), broker.port())))
            .await
            .unwrap()
            .unwrap();
    let mut body = Vec::new();
    body.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0xC2, 0, 60]);
    for field in ["raw", user, pass] {
        body.extend_from_slice(&(field.len() as u16).to_be_bytes());
        body.extend_from_slice(field.as_bytes());
    }
    stream.write_all(&packet(0x10, &body)).await.unwrap();
    let mut connack = [0u8; 4];
    tokio::time::timeout(WAIT, stream.read_exact(&mut connack)).await.expect("CONNACK in time").unwrap();
    assert_eq!(connack[0], 0x20, "{connack:02x?}");
    connack[3]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_keeps_failing_waits_and_others_do_not() {
    let broker = Broker::start_with(Opts::default().config(
        "[auth]\nmqtt = true\nmax_login_failures = 3\nlogin_failure_window_secs = 60\nlogin_failure_delay_ms = 1500\n",
    ));
    let addr = broker.mqtt;
    for _ in 0..3 {
        assert_eq!(connect_from("127.0.0.1", addr, "guest", "wrong").await, 4, "bad user name or password");
    }
    // The fourth attempt from 127.0.0.1 waits; one from 127.0.0.2 meanwhile is answered first.
    let started = Instant::now();
    let held = tokio::spawn(async move {
        let code = connect_from("127.0.0.1", addr, "guest", "guest").await;
        (code, Instant::now())
    });
    let other = connect_from("127.0.0.2", addr, "guest", "wrong").await;
    let other_at = Instant::now();
    let (code, held_at) = held.await.unwrap();
    assert_eq!(other, 4);
    assert!(other_at < held_at, "the other address was not held back");
    assert_eq!(code, 0, "the right password still gets in, after the wait");
    assert!(held_at - started >= Duration::from_millis(1400), "waited {:?}", held_at - started);
    // The login cleared the count: the next attempt is answered without a wait, before
    // one from an address that is held back now.
    for _ in 0..3 {
        connect_from("127.0.0.3", addr, "guest", "wrong").await;
    }
    let held = tokio::spawn(async move { (connect_from("127.0.0.3", addr, "guest", "guest").await, Instant::now()) });
    assert_eq!(connect_from("127.0.0.1", addr, "guest", "guest").await, 0);
    let cleared_at = Instant::now();
    let (code, held_at) = held.await.unwrap();
    assert_eq!(code, 0);
    assert!(cleared_at < held_at, "127.0.0.1 is no longer held back");
}

/// The return codes of `n` raw MQTT 3.1.1 logins as `user` / `pass` from `source`, sent at once.
async fn parallel_connects(source: &'static str, broker: SocketAddr, n: usize, user: &str, pass: &str) -> Vec<u8> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (user, pass) = (user.to_owned(), pass.to_owned());
            tokio::spawn(async move { connect_from(source, broker, &user, &pass).await })
        })
        .collect();
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_guesses_from_a_held_back_address_are_refused_at_once_past_a_few() {
    // Only the keys of before: max_pending_logins_per_address keeps its default (10).
    let broker = Broker::start_with(Opts::default().config(
        "[auth]\nmqtt = true\nmax_login_failures = 3\nlogin_failure_window_secs = 60\nlogin_failure_delay_ms = 5000\n",
    ));
    let api = Api::of(&broker).as_user("guest", "wrong");
    for _ in 0..3 {
        assert_eq!(api.get("/api/whoami").await.0, reqwest::StatusCode::UNAUTHORIZED);
    }
    // 200 guesses at once over HTTP: a few wait their turn and are checked, the rest are
    // refused at once, unchecked (429), instead of all 200 being checked after one delay.
    let guesses: Vec<_> = (0..200)
        .map(|_| {
            let req = api.http.get(format!("{}/api/whoami", api.base)).basic_auth("guest", Some("wrong"));
            tokio::spawn(async move {
                let resp = tokio::time::timeout(WAIT, req.send()).await.expect("answered in time").unwrap();
                (resp.status(), resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned()))
            })
        })
        .collect();
    let (mut checked, mut refused) = (0, 0);
    for g in guesses {
        match g.await.unwrap() {
            (reqwest::StatusCode::UNAUTHORIZED, _) => checked += 1,
            (reqwest::StatusCode::TOO_MANY_REQUESTS, retry) => {
                assert_eq!(retry.as_deref(), Some("5"), "Retry-After: the login delay");
                refused += 1;
            }
            (other, _) => panic!("a guess answered {other}"),
        }
    }
    assert!(refused >= 100, "most of the parallel guesses refused at once: {refused} refused, {checked} checked");

    // The same address over MQTT (the limit is per address, whatever the protocol): a
    // refused login is CONNACK 5 (not authorized), a checked one 4 (bad user name or password).
    let codes = parallel_connects("127.0.0.1", broker.mqtt, 50, "guest", "wrong").await;
    assert!(codes.iter().all(|c| *c == 4 || *c == 5), "{codes:?}");
    let busy = codes.iter().filter(|c| **c == 5).count();
    assert!(busy >= 25, "most refused at once: {codes:?}");
    // MQTT 5 names the reason: connection rate exceeded (0x9F).
    let held: Vec<_> = (0..12)
        .map(|i| {
            let o = v5_options(&broker, &format!("g{i}"), Some(("guest", "wrong")));
            tokio::spawn(async move { v5::connect_refused(o).await })
        })
        .collect();
    let mut texts = Vec::new();
    for h in held {
        texts.push(h.await.unwrap());
    }
    assert!(texts.iter().any(|e| e.contains("ConnectionRateExceeded")), "{texts:?}");

    // AMQP: 403 ACCESS_REFUSED, saying why.
    let uri = amqp_uri(&broker, "guest", "wrong");
    let attempts: Vec<_> = (0..20).map(|_| tokio::spawn(connect_uri_owned(uri.clone()))).collect();
    let mut too_many = 0;
    for a in attempts {
        let e = a.await.unwrap().expect_err("a wrong password never logs in");
        let (code, text) = amqp_error(&e).unwrap_or_else(|| panic!("{e}"));
        assert_eq!(code, 403, "{text}");
        too_many += text.contains("too many logins") as usize;
    }
    assert!(too_many >= 5, "{too_many} of 20 refused as too many at once");
    let metrics = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
    let refused_total = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ferrymq_logins_refused_pending_total "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(refused_total.is_some_and(|n| n >= (refused + busy + too_many) as u64), "{metrics}");
    assert!(broker.log().contains("too many logins under way from one address"), "logged once");
}

async fn connect_uri_owned(uri: String) -> lapin::Result<lapin::Connection> {
    connect_uri(&uri).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attackers_own_login_does_not_reset_the_victims_delay() {
    let broker = Broker::start_with(Opts::default().config(
        "[auth]\nmqtt = true\nmax_login_failures = 3\nlogin_failure_window_secs = 60\nlogin_failure_delay_ms = 1500\n\
         users = [{ name = \"victim\", password = \"v\" }, { name = \"attacker\", password = \"a\" }]\n",
    ));
    let addr = broker.mqtt;
    for _ in 0..3 {
        assert_eq!(connect_from("127.0.0.1", addr, "victim", "guess").await, 4);
    }
    // The attacker logs in with its own account from the same address...
    assert_eq!(connect_from("127.0.0.1", addr, "attacker", "a").await, 0);
    // ...and the victim's next guess still waits, while another user name from the same
    // address (below the address's own budget) is answered meanwhile.
    let started = Instant::now();
    let guess = tokio::spawn(async move { (connect_from("127.0.0.1", addr, "victim", "guess").await, Instant::now()) });
    assert_eq!(connect_from("127.0.0.1", addr, "someone", "else").await, 4);
    let other_at = Instant::now();
    let (code, guessed_at) = guess.await.unwrap();
    assert_eq!(code, 4);
    assert!(guessed_at - started >= Duration::from_millis(1400), "the guess waited only {:?}", guessed_at - started);
    assert!(other_at < guessed_at, "another user name from the address is not held back");

    // Spraying one password over many user names from one address: past 4 x
    // max_login_failures failures (12) every user name from it waits, even a fresh one.
    for i in 0..12 {
        assert_eq!(connect_from("127.0.0.4", addr, &format!("user-{i}"), "spray").await, 4);
    }
    let started = Instant::now();
    assert_eq!(connect_from("127.0.0.4", addr, "attacker", "a").await, 0, "the right password, after the wait");
    assert!(started.elapsed() >= Duration::from_millis(1400), "waited only {:?}", started.elapsed());
}

//! The management listener is no way in for exhaustion: idle and header-dribbling sockets
//! are closed after `http.header_read_timeout_secs`, a stalled request body after
//! `http.idle_timeout_secs`, HTTP sockets past `http.max_connections` are closed at accept,
//! and however many the management port is sent, AMQP and MQTT clients keep the file
//! descriptors they need (each kind of listener keeps a reserve; refusals are logged once
//! and counted in `/metrics`). Keep-alive use (the dashboard, `rabbitmqadmin`) still works.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::amqp::{connect_uri, open_channel};
use crate::common::{v4, Broker, Opts, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the broker closes the socket; panics if it is still open after [`WAIT`].
async fn closed_by_broker(s: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(WAIT, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => continue,
            Err(_) => panic!("{what}: still open after {WAIT:?}"),
        }
    }
}

/// One HTTP/1.1 response read off `s`: its status line and body (by Content-Length).
async fn response(s: &mut TcpStream) -> (String, String) {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .unwrap_or(0);
            if data.len() >= end + 4 + len {
                let body = String::from_utf8_lossy(&data[end + 4..end + 4 + len]).to_string();
                return (head.lines().next().unwrap_or_default().to_owned(), body);
            }
        }
        let n = tokio::time::timeout(WAIT, s.read(&mut buf)).await.expect("a response in time").expect("read");
        assert!(n > 0, "closed before a whole response: {:?}", String::from_utf8_lossy(&data));
        data.extend_from_slice(&buf[..n]);
    }
}

fn get(path: &str) -> String {
    // guest:guest
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\r\n")
}

/// `/metrics` once the HTTP listener takes connections again.
async fn metrics(http: SocketAddr) -> String {
    common::eventually("the HTTP listener answering again", WAIT, || async move {
        let mut s = TcpStream::connect(http).await.ok()?;
        s.write_all(get("/metrics").as_bytes()).await.ok()?;
        let mut data = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match tokio::time::timeout(WAIT, s.read(&mut buf)).await.ok()?.ok()? {
                0 => return None,
                n => data.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&data);
            if text.starts_with("HTTP/1.1 200") && text.contains("# EOF") {
                return Some(text.to_string());
            }
        }
    })
    .await
}

/// The value of the series `name` in metrics text (0 when absent).
fn series(metrics: &str, name: &str) -> u64 {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http_sockets_cannot_take_the_descriptors_amqp_and_mqtt_clients_need() {
    // 256 descriptors for the whole broker (only its process: a wrapper shell lowers it).
    let broker = Broker::start_with(
        Opts::default()
            .open_files_hard(256)
            .config("[http]\nheader_read_timeout_secs = 600\nmax_connections = 100000\n"),
    );
    let http = broker.http.unwrap();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(http).await.expect("connect"));
    }
    assert!(broker.wait_log("new connections are closed at accept"), "{}", broker.log());
    let amqp = format!("amqp://guest:guest@{}/%2f", broker.amqp.unwrap());
    let mut kept = Vec::new();
    for i in 0..5 {
        let conn = connect_uri(&amqp).await.unwrap_or_else(|e| panic!("AMQP connection {i}: {e}"));
        open_channel(&conn).await;
        kept.push(conn);
    }
    let mut mqtt = Vec::new();
    for i in 0..5 {
        mqtt.push(v4::connect(&broker, &format!("still-served-{i}")).await);
    }
    drop(idle);
    let text = metrics(http).await;
    let refused = series(&text, "ferrymq_connections_refused_total{listener=\"http\",reason=\"descriptors\"}");
    assert!(refused > 0, "counted: {text}");
    assert!(series(&text, "ferrymq_listener_sockets{listener=\"amqp\"}") >= 5, "{text}");
    let log = broker.log();
    assert_eq!(log.matches("new connections are closed at accept").count(), 1, "logged once: {log}");
    assert!(log.contains("accepting connections again"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_that_send_nothing_dribble_headers_or_stall_a_body_are_closed() {
    let broker =
        Broker::start_with(Opts::default().config("[http]\nheader_read_timeout_secs = 1\nidle_timeout_secs = 1\n"));
    let http = broker.http.unwrap();
    let mut silent = TcpStream::connect(http).await.unwrap();
    let mut dribbler = TcpStream::connect(http).await.unwrap();
    dribbler.write_all(b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n").await.unwrap();
    let (mut reader, mut writer) = dribbler.into_split();
    // A header line every 200 ms for longer than the test waits: never a complete head.
    let dribbling = tokio::spawn(async move {
        for i in 0..150 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if writer.write_all(format!("X-Slow-{i}: y\r\n").as_bytes()).await.is_err() {
                return;
            }
        }
    });
    closed_by_broker(&mut silent, "a socket that sends nothing").await;
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(WAIT, reader.read(&mut buf)).await {
        Ok(Ok(_)) | Ok(Err(_)) => {}
        Err(_) => panic!("a socket that dribbles its headers: still open after {WAIT:?}"),
    }
    dribbling.abort();

    // Keep-alive: two requests on one connection are both answered...
    let mut keep = TcpStream::connect(http).await.unwrap();
    for _ in 0..2 {
        keep.write_all(get("/api/overview").as_bytes()).await.unwrap();
        let (status, body) = response(&mut keep).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
    }
    // ...and the connection is closed once it idles past the timeout.
    closed_by_broker(&mut keep, "an idle keep-alive connection").await;

    // A handler that works longer than the idle timeout on a request it has read is not
    // idle: a definitions import of 12,000 queues (seconds of work in a debug build).
    let queues: Vec<serde_json::Value> = (0..12_000)
        .map(|i| serde_json::json!({"name": format!("imported-{i}"), "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}))
        .collect();
    let body = serde_json::json!({ "queues": queues }).to_string();
    let mut import = TcpStream::connect(http).await.unwrap();
    let head = format!(
        "POST /api/definitions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    import.write_all(head.as_bytes()).await.unwrap();
    import.write_all(body.as_bytes()).await.unwrap();
    let (status, answer) = response(&mut import).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status} {answer}");

    // A body that stops coming (an authenticated client: its handler reads the body).
    let mut stall = TcpStream::connect(http).await.unwrap();
    let head = "POST /api/definitions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\
                Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"vhosts\"";
    stall.write_all(head.as_bytes()).await.unwrap();
    closed_by_broker(&mut stall, "a request whose body stalls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sockets_past_the_cap_are_closed_at_accept_logged_once_and_counted() {
    let broker =
        Broker::start_with(Opts::default().config("[http]\nmax_connections = 3\nheader_read_timeout_secs = 600\n"));
    let http = broker.http.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(http).await.unwrap());
    }
    // The broker has taken the three in (an answered request on the last proves it).
    held[2].write_all(get("/api/overview").as_bytes()).await.unwrap();
    assert!(response(&mut held[2]).await.0.starts_with("HTTP/1.1 200"));
    for i in 0..4 {
        let mut extra = TcpStream::connect(http).await.unwrap();
        closed_by_broker(&mut extra, &format!("socket {} past the cap", i + 4)).await;
    }
    // AMQP and MQTT are not counted against the HTTP cap.
    connect_uri(&format!("amqp://guest:guest@{}/%2f", broker.amqp.unwrap())).await.expect("AMQP");
    v4::connect(&broker, "not-http").await;
    // Read over a socket the broker holds (a new one could be refused once more while the
    // broker has not yet seen the dropped ones close).
    held[2].write_all(get("/metrics").as_bytes()).await.unwrap();
    let (status, text) = response(&mut held[2]).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(series(&text, "ferrymq_connections_refused_total{listener=\"http\",reason=\"cap\"}"), 4, "{text}");
    assert_eq!(series(&text, "ferrymq_listener_socket_cap{listener=\"http\"}"), 3, "{text}");
    let log = broker.log();
    assert_eq!(log.matches("http.max_connections is reached").count(), 1, "logged once: {log}");
}

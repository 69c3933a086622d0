//! FerryMQ-only, configuration driven: memory flow control (connection.blocked / unblocked
//! on a config reload), configured users, AMQP over TLS. Skipped against RabbitMQ, except
//! the flow-control test, which can be pointed at a reference node whose alarm the caller
//! raises and clears with commands (see `flow_control_blocks_publishers_until_the_watermark_is_raised`).

use crate::common;

use std::sync::Arc;

use crate::common::amqp::*;
use crate::common::Opts;

const BLOCK_CMD_ENV: &str = "FERRYMQ_TEST_RABBITMQ_BLOCK";
const UNBLOCK_CMD_ENV: &str = "FERRYMQ_TEST_RABBITMQ_UNBLOCK";

fn sh(cmd: &str) {
    let st = std::process::Command::new("sh").arg("-c").arg(cmd).status().expect("sh");
    assert!(st.success(), "{cmd}: {st}");
}

/// With a memory high watermark of 1 byte the publishing connection gets connection.blocked
/// and its publish is not confirmed; raising the watermark in the config file and sending
/// SIGHUP unblocks it and the confirm arrives.
///
/// Against RabbitMQ it runs only when `FERRYMQ_TEST_RABBITMQ_BLOCK` / `_UNBLOCK` hold shell
/// commands that raise / clear the node's memory alarm (e.g. `rabbitmqctl
/// set_vm_memory_high_watermark absolute 1` / `... 0.4`); run it alone then, as the alarm
/// blocks every publisher on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_blocks_publishers_until_the_watermark_is_raised() {
    let rabbit_cmds = (std::env::var(BLOCK_CMD_ENV).ok(), std::env::var(UNBLOCK_CMD_ENV).ok());
    let rabbit = against_rabbitmq();
    if rabbit && (rabbit_cmds.0.is_none() || rabbit_cmds.1.is_none()) {
        skip_on_rabbitmq("memory watermark set by FerryMQ configuration and SIGHUP");
        return;
    }
    let t = if rabbit {
        sh(rabbit_cmds.0.as_deref().unwrap());
        Target::start()
    } else {
        Target::start_with(
            Opts::default().env("FERRYMQ_BROKER__MEMORY_HIGH_WATERMARK_BYTES", "1").config("# reloaded below\n"),
        )
    };
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    let mut ev = events(&conn);
    let (reason, publisher) = publish_into_a_block(&conn, &mut ev, &ch, &q, b"held").await;
    eprintln!("connection.blocked: {reason:?}");
    if rabbit {
        sh(rabbit_cmds.1.as_deref().unwrap());
    } else {
        rewrite_config_and_reload(
            t.broker.as_ref().unwrap(),
            "[broker]\nmemory_high_watermark_bytes = 1099511627776\n",
        );
    }
    match next_event(&mut ev).await {
        Event::ConnectionUnblocked => {}
        other => panic!("expected connection.unblocked, got {other:?}"),
    }
    let confirmation = bounded("confirm after unblock", publisher).await.unwrap().expect("publish");
    assert_eq!(confirmation, Confirmation::Ack(None));
    assert_eq!(drain(&ch, &q).await, ["held"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_users_can_log_in_and_wrong_passwords_are_refused() {
    if skip_on_rabbitmq("users come from FerryMQ's [auth] configuration") {
        return;
    }
    let t = Target::start_with(Opts::default().config(
        r#"
[auth]
users = [{ name = "app", password = "secret", loopback_only = false }]
"#,
    ));
    let conn = connect_uri(&t.uri_for("app", "secret", "/")).await.expect("app/secret logs in");
    assert_eq!(conn.status().username(), "app");
    let ch = open_channel(&conn).await;
    let q = declare_queue(&ch, &unique("app-q"), FieldTable::default()).await;
    publish(&ch, "", &q, b"as app", BasicProperties::default().with_user_id("app".into())).await;
    let m = eventually("the message published as app", WAIT, || get(&ch, &q, true)).await;
    assert_eq!(m.delivery.properties.user_id().as_ref().map(|s| s.as_str()), Some("app"));
    let text = expect_code(connect_uri(&t.uri_for("app", "wrong", "/")).await, 403);
    assert!(text.starts_with("ACCESS_REFUSED"), "{text:?}");
    let text = expect_code(connect_uri(&t.uri_for("nobody", "secret", "/")).await, 403);
    assert!(text.starts_with("ACCESS_REFUSED"), "{text:?}");
    // guest (loopback-only by default) still logs in over loopback. Refusal from another
    // address cannot be tested here: tests only use loopback addresses.
    connect_uri(&t.uri).await.expect("guest over loopback");
}

/// AMQP over TLS. lapin is built without a TLS provider (its rustls feature defaults to
/// aws-lc), so the client is tokio-rustls (ring) carrying the raw-frame client: a full
/// handshake to connection.open-ok, a channel and a publish that a plain client then reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_listener_speaks_amqp_over_tls() {
    use rustls_pki_types::pem::PemObject;
    if skip_on_rabbitmq("AMQPS listener configured with FerryMQ flags") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, ca_pem) = common::make_certs(tmp.path());
    let t = Target::start_with(
        Opts::default()
            .args(&["--amqps-listen", "127.0.0.1:0"])
            .env("FERRYMQ_TLS__CERT", cert.to_str().unwrap())
            .env("FERRYMQ_TLS__KEY", key.to_str().unwrap()),
    );
    let broker = t.broker.as_ref().unwrap();
    let tls_addr =
        broker.amqps.unwrap_or_else(|| panic!("no amqps= address in the READY line; log:\n{}", broker.log()));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls_pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(tls_addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = bounded("TLS handshake", connector.connect(name, tcp)).await.expect("TLS handshake");
    let mut raw = RawAmqp::new(tls);
    raw.handshake(0, 0).await;
    raw.open_channel(1).await;
    let (_plain, ch) = t.channel().await;
    let q = declare_queue(&ch, &unique("over-tls"), FieldTable::default()).await;
    raw.send(&publish_frames(1, "", &q, b"sent over TLS", 4096)).await;
    raw.send(&method_frame(0, 10, 50, &[0, 200, 2, b'o', b'k', 0, 0, 0, 0])).await;
    raw.expect_method(10, 51).await;
    let m = get(&ch, &q, true).await.expect("the message published over TLS");
    assert_eq!(m.delivery.data, b"sent over TLS");
    // A plaintext AMQP header on the TLS port gets no AMQP answer.
    let mut plain_on_tls = RawAmqp::connect(tls_addr).await;
    plain_on_tls.send(PROTOCOL_HEADER).await;
    let answer = plain_on_tls.read_raw(8).await;
    assert_ne!(answer, PROTOCOL_HEADER);
}

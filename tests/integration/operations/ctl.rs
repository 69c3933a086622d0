//! `ferrymq ctl`, the admin CLI, against the real broker's management API: tables for
//! people, `--json` for scripts, and exit codes (0 done, 1 refused, 2 usage, 3 unreachable,
//! 4 unhealthy).

use crate::common;

use std::process::Command;

use crate::common::amqp::*;
use crate::common::{binary, Broker, Opts};

/// Runs `ferrymq ctl --url ... ARGS`; (exit code, stdout, stderr).
fn ctl(broker: &Broker, args: &[&str]) -> (i32, String, String) {
    ctl_at(&format!("http://{}", broker.http.unwrap()), args)
}

fn ctl_at(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(binary()).arg("ctl").arg("--url").arg(url).args(args).output().expect("run ferrymq ctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn ok(broker: &Broker, args: &[&str]) -> String {
    let (code, out, err) = ctl(broker, args);
    assert_eq!(code, 0, "ctl {args:?}: {err}{out}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_declares_publishes_lists_gets_and_closes() {
    let broker = Broker::start();
    assert_eq!(ok(&broker, &["declare-queue", "jobs"]), "queue jobs declared\n");
    ok(&broker, &["declare-exchange", "work", "--type", "topic"]);
    ok(&broker, &["bind", "work", "jobs", "--key", "jobs.#"]);
    assert_eq!(ok(&broker, &["publish", "work", "jobs.a", "hello"]), "published (routed)\n");
    let (code, _, err) = ctl(&broker, &["publish", "work", "nowhere", "lost"]);
    assert_eq!(code, 1, "an unroutable publish is an error for scripts: {err}");
    for _ in 0..3 {
        ok(&broker, &["publish", "", "jobs", &"x".repeat(1024)]);
    }
    let table = ok(&broker, &["list", "queues"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["vhost", "name", "type", "ready", "unacked", "messages", "bytes", "consumers"]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(&row[..4], ["/", "jobs", "classic", "4"], "{table}");
    assert_eq!(&row[6..8], ["3.0", "KiB"], "human sizes: {table}");
    assert_eq!(
        lines[0].find("ready").map(|i| i + 5),
        lines[1].find(" 4").map(|i| i + 2),
        "numbers right-aligned:\n{table}"
    );
    let json: serde_json::Value = serde_json::from_str(&ok(&broker, &["list", "queues", "--json"])).unwrap();
    assert_eq!(json[0]["messages"], 4);
    let got = ok(&broker, &["get", "jobs", "--count", "1"]);
    assert!(got.contains("hello") && got.contains("jobs.a"), "{got}");
    assert_eq!(ok(&broker, &["get", "jobs", "--count", "10", "--take", "--json"]).matches("\"payload\"").count(), 4);
    assert!(ok(&broker, &["list", "bindings"]).contains("jobs.#"));

    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", broker.amqp.unwrap())).await.unwrap();
    let mut events = events(&conn);
    let listed = common::eventually("the connection is listed", WAIT, || async {
        let out = ok(&broker, &["list", "connections", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["name"].as_str().map(str::to_owned)
    })
    .await;
    assert!(ok(&broker, &["list", "connections"]).contains("AMQP 0-9-1"));
    ok(&broker, &["close", &listed, "--reason", "maintenance"]);
    assert_eq!(server_closed(&mut events).await, (320, "CONNECTION_FORCED - maintenance".to_string()));
    assert_eq!(ctl(&broker, &["close", "nobody"]).0, 1, "404 is exit code 1");
    ok(&broker, &["delete-queue", "jobs"]);
    assert_eq!(ctl(&broker, &["purge", "jobs"]).0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_exports_imports_resets_groups_and_reports_health_by_exit_code() {
    let broker = Broker::start();
    ok(&broker, &["declare-queue", "events", "--stream"]);
    for i in 0..5 {
        ok(&broker, &["publish", "", "events", &format!("e{i}")]);
    }
    assert_eq!(
        ok(&broker, &["reset-group", "events", "billing", "--offset", "3"]),
        "group billing of events now at offset 3\n"
    );
    let groups = ok(&broker, &["groups", "events"]);
    assert!(groups.starts_with("stream events: offsets 0 to 5\n"), "{groups}");
    let row: Vec<&str> = groups.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(row, ["billing", "3", "5", "2", "0"], "{groups}");
    assert_eq!(ctl(&broker, &["reset-group", "events", "billing"]).0, 1, "a target is needed");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("defs.json");
    ok(&broker, &["export", file.to_str().unwrap()]);
    let other = Broker::start();
    let report = ok(&other, &["import", file.to_str().unwrap()]);
    assert!(report.starts_with("imported: "), "{report}");
    assert!(ok(&other, &["list", "queues"]).contains("events"));
    assert!(ok(&broker, &["health"]).contains("alarms: none"));
    assert!(ok(&broker, &["overview"]).starts_with("FerryMQ "));

    let alarmed = Broker::start_with(Opts::default().config("[broker]\nmemory_high_watermark_bytes = 1\n"));
    let (code, _, err) = ctl(&alarmed, &["health"]);
    assert_eq!(code, 4, "an alarm: {err}");
    let (code, _, err) = ctl(&broker, &["-p", "wrong", "overview"]);
    assert_eq!(code, 1, "{err}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (code, _, err) = ctl_at(&format!("http://{closed}"), &["overview"]);
    assert_eq!(code, 3, "unreachable: {err}");
    let (code, _, _) = ctl(&broker, &["list", "nonsense"]);
    assert_eq!(code, 2, "bad usage");
}

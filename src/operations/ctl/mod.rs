//! `ferrymq ctl`: the admin CLI, a client of the management HTTP API (so it works on a
//! running broker from anywhere the API is reachable). Output is for people (aligned
//! tables, human sizes; `--json` gives the API's JSON); exit codes are for scripts:
//! 0 done, 1 the broker refused or answered an error, 2 bad usage, 3 the broker could
//! not be reached, 4 a health check failed.
//!
//! - [`client`] — a small blocking HTTP/1.1 client.
//! - [`table`] — aligned tables, human sizes.

pub mod client;
pub mod table;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use client::{Client, ClientError};
use table::{col, render, Column, Format};

/// Exit code: the broker answered with an error.
pub const EXIT_REFUSED: i32 = 1;
/// Exit code: bad usage (clap's).
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the broker could not be reached.
pub const EXIT_UNREACHABLE: i32 = 3;
/// Exit code: a health check failed.
pub const EXIT_UNHEALTHY: i32 = 4;

/// `ferrymq ctl [OPTIONS] COMMAND`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The management API (the broker's `http.listen`).
    #[arg(long, default_value = "http://127.0.0.1:15672", global = true)]
    pub url: String,
    /// User (with a management tag).
    #[arg(long, short = 'u', default_value = "guest", global = true)]
    pub user: String,
    /// Password.
    #[arg(long, short = 'p', default_value = "guest", global = true)]
    pub password: String,
    /// Virtual host of the objects named.
    #[arg(long, default_value = "/", global = true)]
    pub vhost: String,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// What can be listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Listing {
    /// Queues and streams.
    Queues,
    /// Exchanges.
    Exchanges,
    /// Bindings.
    Bindings,
    /// Connections of both protocols.
    Connections,
    /// AMQP channels.
    Channels,
    /// AMQP consumers.
    Consumers,
    /// Connected MQTT clients.
    Clients,
    /// MQTT sessions, offline ones included.
    Sessions,
    /// Users.
    Users,
    /// Virtual hosts.
    Vhosts,
    /// MQTT bridges to other brokers.
    Bridges,
    /// AMQP shovels.
    Shovels,
}

/// `ctl cluster ...`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Members, the metadata group's leader and each member's role, last contact and
    /// replication progress, as the node asked sees them.
    Status,
    /// Add a member (a started one whose `cluster.peers` name the group joins by itself).
    Join {
        /// `name@host:port`: its node name and peer address.
        member: String,
    },
    /// Forget a member (lost, or leaving for good): a majority is counted without it.
    Forget {
        /// Its node name.
        name: String,
    },
    /// The member asked leaves the cluster for good (the others forget it); stop it after.
    Leave,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// The broker at a glance.
    Overview,
    /// A cluster's members and their state.
    Cluster {
        /// What to do.
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// List objects.
    List {
        /// What to list.
        what: Listing,
    },
    /// Declare a queue (`--stream` for a stream).
    DeclareQueue {
        /// Queue name.
        name: String,
        /// Not durable.
        #[arg(long)]
        transient: bool,
        /// A stream (`x-queue-type: stream`).
        #[arg(long)]
        stream: bool,
    },
    /// Declare an exchange.
    DeclareExchange {
        /// Exchange name.
        name: String,
        /// Type: direct, fanout, topic, headers, x-consistent-hash, ...
        #[arg(long = "type", default_value = "direct")]
        kind: String,
    },
    /// Bind a queue to an exchange.
    Bind {
        /// Source exchange.
        exchange: String,
        /// Destination queue.
        queue: String,
        /// Routing key.
        #[arg(long, default_value = "")]
        key: String,
    },
    /// Delete a queue.
    DeleteQueue {
        /// Queue name.
        name: String,
    },
    /// Delete an exchange.
    DeleteExchange {
        /// Exchange name.
        name: String,
    },
    /// Remove every ready message of a queue.
    Purge {
        /// Queue name.
        name: String,
    },
    /// Publish a message (persistent) to an exchange ("" or amq.default: the default one).
    Publish {
        /// Exchange.
        exchange: String,
        /// Routing key.
        routing_key: String,
        /// Body (text).
        payload: String,
    },
    /// Get messages from a queue (they stay unless `--take`).
    Get {
        /// Queue name.
        queue: String,
        /// Most messages.
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Remove them (acknowledge) instead of putting them back.
        #[arg(long)]
        take: bool,
    },
    /// Close a connection (AMQP 320, MQTT 5 DISCONNECT 0x98).
    Close {
        /// Connection name as `list connections` shows it.
        name: String,
        /// Reason given to the client.
        #[arg(long, default_value = "Closed by ferrymq ctl")]
        reason: String,
    },
    /// Disconnect an MQTT client by client id.
    Kick {
        /// Client id.
        client_id: String,
    },
    /// Write the definitions (RabbitMQ's JSON) to a file (`-` = stdout).
    Export {
        /// File.
        file: String,
    },
    /// Import a definitions file (RabbitMQ's or FerryMQ's JSON); prints what was not applied.
    Import {
        /// File.
        file: String,
    },
    /// A stream's consumer groups: committed offset, lag, members.
    Groups {
        /// Stream name.
        stream: String,
    },
    /// Move a stream consumer group to an offset, a time, or first/last/next.
    ResetGroup {
        /// Stream name.
        stream: String,
        /// Group name.
        group: String,
        /// An offset.
        #[arg(long, conflicts_with_all = ["timestamp", "to"])]
        offset: Option<u64>,
        /// A time, ms since the epoch.
        #[arg(long, conflicts_with = "to")]
        timestamp: Option<u64>,
        /// first, last or next.
        #[arg(long)]
        to: Option<String>,
    },
    /// Messages stored under a key (message_id, x-key, MQTT key).
    Lookup {
        /// The key.
        key: String,
        /// Most messages.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Alarms and listeners; exit code 4 when an alarm is raised.
    Health,
}

/// Why a command failed, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The broker could not be reached.
    #[error("{0}")]
    Unreachable(#[from] ClientError),
    /// The broker answered an error.
    #[error("{status}: {reason}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The API's reason.
        reason: String,
    },
    /// A local problem (a file).
    #[error("{0}")]
    Local(String),
    /// A health check failed.
    #[error("unhealthy: {0}")]
    Unhealthy(String),
}

impl CtlError {
    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            CtlError::Unreachable(_) => EXIT_UNREACHABLE,
            CtlError::Refused { .. } | CtlError::Local(_) => EXIT_REFUSED,
            CtlError::Unhealthy(_) => EXIT_UNHEALTHY,
        }
    }
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Api {
    client: Client,
}

impl Api {
    fn call(&self, method: &str, path: &str, body: Option<Value>, headers: &[(&str, &str)]) -> Result<Value, CtlError> {
        let text = body.map(|b| b.to_string());
        let answer = self.client.call(method, &format!("/api{path}"), text.as_deref(), headers)?;
        let json: Value = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
        if answer.status >= 400 {
            let reason = json["reason"].as_str().map(str::to_owned).unwrap_or(answer.body);
            return Err(CtlError::Refused { status: answer.status, reason });
        }
        Ok(json)
    }

    fn get(&self, path: &str) -> Result<Value, CtlError> {
        self.call("GET", path, None, &[])
    }
}

fn rows(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

fn listing(what: Listing) -> (&'static str, Vec<Column>) {
    use Format::*;
    match what {
        Listing::Queues => (
            "/queues",
            vec![
                col("vhost", "vhost", Plain),
                col("name", "name", Plain),
                col("type", "type", Plain),
                col("ready", "messages_ready", Count),
                col("unacked", "messages_unacknowledged", Count),
                col("messages", "messages", Count),
                col("bytes", "message_bytes", Bytes),
                col("consumers", "consumers", Count),
            ],
        ),
        Listing::Exchanges => (
            "/exchanges",
            vec![
                col("vhost", "vhost", Plain),
                col("name", "name", Plain),
                col("type", "type", Plain),
                col("durable", "durable", Plain),
            ],
        ),
        Listing::Bindings => (
            "/bindings",
            vec![
                col("vhost", "vhost", Plain),
                col("source", "source", Plain),
                col("destination", "destination", Plain),
                col("type", "destination_type", Plain),
                col("routing key", "routing_key", Plain),
            ],
        ),
        Listing::Connections => (
            "/connections",
            vec![
                col("name", "name", Plain),
                col("protocol", "protocol", Plain),
                col("user", "user", Plain),
                col("vhost", "vhost", Plain),
                col("channels", "channels", Count),
                col("received", "recv_oct", Bytes),
                col("sent", "send_oct", Bytes),
            ],
        ),
        Listing::Channels => (
            "/channels",
            vec![col("name", "name", Plain), col("user", "user", Plain), col("consumers", "consumer_count", Count)],
        ),
        Listing::Consumers => (
            "/consumers",
            vec![
                col("tag", "consumer_tag", Plain),
                col("queue", "queue.name", Plain),
                col("channel", "channel_details.name", Plain),
                col("ack", "ack_required", Plain),
                col("prefetch", "prefetch_count", Count),
            ],
        ),
        Listing::Clients => (
            "/ferrymq/mqtt/clients",
            vec![
                col("client id", "clientid", Plain),
                col("version", "proto_ver", Count),
                col("user", "username", Plain),
                col("address", "ip_address", Plain),
                col("keep-alive", "keepalive", Count),
                col("subscriptions", "subscriptions_cnt", Count),
                col("received", "recv_oct", Bytes),
                col("sent", "send_oct", Bytes),
            ],
        ),
        Listing::Sessions => (
            "/ferrymq/mqtt/sessions",
            vec![
                col("client id", "clientid", Plain),
                col("connected", "connected", Plain),
                col("persistent", "persistent", Plain),
                col("queued", "mqueue_len", Count),
            ],
        ),
        Listing::Users => ("/users", vec![col("name", "name", Plain), col("tags", "tags", Plain)]),
        Listing::Bridges => (
            "/ferrymq/bridges",
            vec![
                col("name", "name", Plain),
                col("remote", "remote", Plain),
                col("address", "address", Plain),
                col("state", "state", Plain),
                col("sent", "sent", Count),
                col("received", "received", Count),
                col("refused_in", "refused_in", Count),
                col("refused_out", "refused_out", Count),
                col("reason", "reason", Plain),
            ],
        ),
        Listing::Shovels => (
            "/shovels",
            vec![
                col("vhost", "vhost", Plain),
                col("name", "name", Plain),
                col("type", "type", Plain),
                col("state", "state", Plain),
                col("moved", "messages_moved", Count),
                col("reason", "reason", Plain),
            ],
        ),
        Listing::Vhosts => (
            "/vhosts",
            vec![
                col("name", "name", Plain),
                col("messages", "messages", Count),
                col("description", "description", Plain),
            ],
        ),
    }
}

/// Runs a command; returns what to print.
pub fn run(args: &CtlArgs) -> Result<String, CtlError> {
    let api = Api { client: Client::new(&args.url, &args.user, &args.password)? };
    let v = enc(&args.vhost);
    let show = |value: Value, columns: &[Column]| -> String {
        if args.json {
            serde_json::to_string_pretty(&value).unwrap_or_default() + "\n"
        } else {
            render(columns, &rows(&value))
        }
    };
    let done = |what: String| -> Result<String, CtlError> { Ok(format!("{what}\n")) };
    use Format::*;
    match &args.command {
        CtlCommand::Overview => {
            let o = api.get("/overview")?;
            if args.json {
                return Ok(serde_json::to_string_pretty(&o).unwrap_or_default() + "\n");
            }
            let t = &o["object_totals"];
            let q = &o["queue_totals"];
            let m = &o["message_stats"];
            let n = |v: &Value| table::count(v.as_u64().unwrap_or(0));
            let r = |v: &Value| format!("{:.1}/s", v["rate"].as_f64().unwrap_or(0.0));
            Ok(format!(
                "{} {} on {}\nconnections {}  channels {}  queues {}  consumers {}\nmessages {} (ready {}, unacked {})\npublish {}  deliver {}  ack {}\n",
                o["product_name"].as_str().unwrap_or(""),
                o["product_version"].as_str().unwrap_or(""),
                o["node"].as_str().unwrap_or(""),
                n(&t["connections"]),
                n(&t["channels"]),
                n(&t["queues"]),
                n(&t["consumers"]),
                n(&q["messages"]),
                n(&q["messages_ready"]),
                n(&q["messages_unacknowledged"]),
                r(&m["publish_details"]),
                r(&m["deliver_get_details"]),
                r(&m["ack_details"]),
            ))
        }
        CtlCommand::List { what } => {
            let (path, columns) = listing(*what);
            Ok(show(api.get(path)?, &columns))
        }
        CtlCommand::DeclareQueue { name, transient, stream } => {
            let arguments = if *stream { json!({"x-queue-type": "stream"}) } else { json!({}) };
            api.call(
                "PUT",
                &format!("/queues/{v}/{}", enc(name)),
                Some(json!({"durable": !transient, "arguments": arguments})),
                &[],
            )?;
            done(format!("queue {name} declared"))
        }
        CtlCommand::DeclareExchange { name, kind } => {
            api.call(
                "PUT",
                &format!("/exchanges/{v}/{}", enc(name)),
                Some(json!({"type": kind, "durable": true})),
                &[],
            )?;
            done(format!("exchange {name} declared"))
        }
        CtlCommand::Bind { exchange, queue, key } => {
            let path = format!("/bindings/{v}/e/{}/q/{}", enc(exchange), enc(queue));
            api.call("POST", &path, Some(json!({"routing_key": key, "arguments": {}})), &[])?;
            done(format!("{exchange} -> {queue} ({key}) bound"))
        }
        CtlCommand::DeleteQueue { name } => {
            api.call("DELETE", &format!("/queues/{v}/{}", enc(name)), None, &[])?;
            done(format!("queue {name} deleted"))
        }
        CtlCommand::DeleteExchange { name } => {
            api.call("DELETE", &format!("/exchanges/{v}/{}", enc(name)), None, &[])?;
            done(format!("exchange {name} deleted"))
        }
        CtlCommand::Purge { name } => {
            api.call("DELETE", &format!("/queues/{v}/{}/contents", enc(name)), None, &[])?;
            done(format!("queue {name} purged"))
        }
        CtlCommand::Publish { exchange, routing_key, payload } => {
            let x = if exchange.is_empty() { "amq.default" } else { exchange.as_str() };
            let body = json!({"routing_key": routing_key, "payload": payload, "payload_encoding": "string", "properties": {"delivery_mode": 2}});
            let r = api.call("POST", &format!("/exchanges/{v}/{}/publish", enc(x)), Some(body), &[])?;
            match r["routed"].as_bool() {
                Some(true) => done("published (routed)".into()),
                _ => Err(CtlError::Refused { status: 200, reason: "published but not routed to any queue".into() }),
            }
        }
        CtlCommand::Get { queue, count, take } => {
            let mode = if *take { "ack_requeue_false" } else { "ack_requeue_true" };
            let body = json!({"count": count, "ackmode": mode, "encoding": "auto", "truncate": 50000});
            let got = api.call("POST", &format!("/queues/{v}/{}/get", enc(queue)), Some(body), &[])?;
            let columns = [
                col("routing key", "routing_key", Plain),
                col("exchange", "exchange", Plain),
                col("redelivered", "redelivered", Plain),
                col("bytes", "payload_bytes", Bytes),
                col("payload", "payload", Plain),
            ];
            Ok(show(got, &columns))
        }
        CtlCommand::Close { name, reason } => {
            api.call("DELETE", &format!("/connections/{}", enc(name)), None, &[("X-Reason", reason)])?;
            done(format!("connection {name} closed"))
        }
        CtlCommand::Kick { client_id } => {
            api.call("DELETE", &format!("/ferrymq/mqtt/clients/{}", enc(client_id)), None, &[])?;
            done(format!("client {client_id} disconnected"))
        }
        CtlCommand::Export { file } => {
            let defs = serde_json::to_string_pretty(&api.get("/definitions")?).unwrap_or_default();
            if file == "-" {
                return Ok(defs + "\n");
            }
            std::fs::write(file, defs).map_err(|e| CtlError::Local(format!("cannot write {file}: {e}")))?;
            done(format!("definitions written to {file}"))
        }
        CtlCommand::Import { file } => {
            let text =
                std::fs::read_to_string(file).map_err(|e| CtlError::Local(format!("cannot read {file}: {e}")))?;
            let defs: Value =
                serde_json::from_str(&text).map_err(|e| CtlError::Local(format!("{file} is not JSON: {e}")))?;
            let report = api.call("POST", "/definitions", Some(defs), &[])?;
            if args.json {
                return Ok(serde_json::to_string_pretty(&report).unwrap_or_default() + "\n");
            }
            let mut out = format!("imported: {}\n", report["imported"]);
            for u in rows(&report["unsupported"]) {
                out.push_str(&format!(
                    "not applied: {} {} — {}\n",
                    u["kind"].as_str().unwrap_or(""),
                    u["name"].as_str().unwrap_or(""),
                    u["reason"].as_str().unwrap_or("")
                ));
            }
            Ok(out)
        }
        CtlCommand::Cluster { command: ClusterCommand::Status } => {
            let s = api.get("/ferrymq/cluster")?;
            if args.json {
                return Ok(serde_json::to_string_pretty(&s).unwrap_or_default() + "\n");
            }
            let columns = [
                col("member", "name", Plain),
                col("role", "role", Plain),
                col("running", "running", Plain),
                col("last contact ms", "last_contact_ms", Count),
                col("matched index", "matched_index", Count),
                col("lag", "lag", Count),
                col("in sync", "in_sync", Plain),
            ];
            let in_sync = match s["in_sync"].as_array() {
                Some(names) => format!(
                    "in sync: {} ({} of {} members)\n",
                    names.iter().filter_map(|n| n.as_str()).collect::<Vec<_>>().join(", "),
                    names.len(),
                    s["members"].as_array().map_or(0, |m| m.len())
                ),
                None => String::new(),
            };
            let names = |v: &serde_json::Value| {
                v.as_array()
                    .map_or(String::new(), |a| a.iter().filter_map(|n| n.as_str()).collect::<Vec<_>>().join(", "))
            };
            let groups: String = s["data_groups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| {
                    let learners = names(&g["learners"]);
                    format!(
                        "data group {}: leader {}, term {}, applied index {}, voters {}{}\n",
                        g["name"].as_str().unwrap_or("?"),
                        g["leader"].as_str().unwrap_or("none"),
                        g["term"],
                        g["applied_index"],
                        names(&g["voters"]),
                        if learners.is_empty() { String::new() } else { format!(", learners {learners}") }
                    )
                })
                .collect();
            Ok(format!(
                "cluster as {} sees it: leader {}, term {}, applied index {}\n{in_sync}{}{groups}",
                s["node"].as_str().unwrap_or("?"),
                s["leader"].as_str().unwrap_or("none"),
                s["term"],
                s["applied_index"],
                render(&columns, &rows(&s["members"]))
            ))
        }
        CtlCommand::Cluster { command: ClusterCommand::Join { member } } => {
            let (name, address) =
                member.rsplit_once('@').ok_or_else(|| CtlError::Local("give the member as name@host:port".into()))?;
            api.call("POST", "/ferrymq/cluster/members", Some(json!({ "name": name, "address": address })), &[])?;
            Ok(format!("{name} is a member\n"))
        }
        CtlCommand::Cluster { command: ClusterCommand::Forget { name } } => {
            api.call("DELETE", &format!("/ferrymq/cluster/members/{}", enc(name)), None, &[])?;
            Ok(format!("{name} is no longer a member\n"))
        }
        CtlCommand::Cluster { command: ClusterCommand::Leave } => {
            let status = api.get("/ferrymq/cluster")?;
            let name =
                status["node"].as_str().ok_or_else(|| CtlError::Local("the node did not say its name".into()))?;
            api.call("DELETE", &format!("/ferrymq/cluster/members/{}", enc(name)), None, &[])?;
            Ok(format!("{name} left the cluster: stop it now (started again, it must have an empty data directory to rejoin)\n"))
        }
        CtlCommand::Groups { stream } => {
            let s = api.get(&format!("/ferrymq/streams/{v}/{}/groups", enc(stream)))?;
            if args.json {
                return Ok(serde_json::to_string_pretty(&s).unwrap_or_default() + "\n");
            }
            let columns = [
                col("group", "name", Plain),
                col("committed", "committed_offset", Count),
                col("end", "end_offset", Count),
                col("lag", "lag", Count),
                col("members", "members", Count),
            ];
            Ok(format!(
                "stream {stream}: offsets {} to {}\n{}",
                s["first_offset"],
                s["end_offset"],
                render(&columns, &rows(&s["groups"]))
            ))
        }
        CtlCommand::ResetGroup { stream, group, offset, timestamp, to } => {
            let body = match (offset, timestamp, to) {
                (Some(o), _, _) => json!({"offset": o}),
                (_, Some(t), _) => json!({"timestamp": t}),
                (_, _, Some(to)) => json!({"to": to}),
                _ => return Err(CtlError::Local("give --offset, --timestamp or --to".into())),
            };
            let path = format!("/ferrymq/streams/{v}/{}/groups/{}/reset", enc(stream), enc(group));
            let r = api.call("POST", &path, Some(body), &[])?;
            done(format!("group {group} of {stream} now at offset {}", r["committed_offset"]))
        }
        CtlCommand::Lookup { key, limit } => {
            let found = api.get(&format!("/ferrymq/messages?key={}&limit={limit}", enc(key)))?;
            let columns = [
                col("position", "log_position", Count),
                col("exchange", "exchange", Plain),
                col("routing key", "routing_key", Plain),
                col("bytes", "payload_bytes", Bytes),
                col("payload", "payload", Plain),
            ];
            Ok(show(found, &columns))
        }
        CtlCommand::Health => {
            let alarms = api.client.call("GET", "/api/health/checks/alarms", None, &[])?;
            let nodes = api.get("/nodes")?;
            let n = &nodes[0];
            let mut out = format!(
                "node {}: up {} s, memory {} of {}, disk free {}\n",
                n["name"].as_str().unwrap_or(""),
                n["uptime"].as_u64().unwrap_or(0) / 1000,
                table::bytes(n["mem_used"].as_u64().unwrap_or(0)),
                table::bytes(n["mem_limit"].as_u64().unwrap_or(0)),
                table::bytes(n["disk_free"].as_u64().unwrap_or(0)),
            );
            match alarms.status {
                200 => {
                    out.push_str("alarms: none\n");
                    Ok(out)
                }
                401 | 403 => Err(CtlError::Refused { status: alarms.status, reason: alarms.body }),
                _ => Err(CtlError::Unhealthy(alarms.body)),
            }
        }
    }
}

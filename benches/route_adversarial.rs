//! Adversarial topic patterns: the worst-case latency of a publish whose 127-word routing
//! key meets a binding key of 1, 3, 6 or 12 `#` words, and what one route costs in the
//! routing table itself.
//!
//! `cargo bench --bench route_adversarial -- [PUBLISHES] [TIMEOUT_SECS]` (defaults 200, 10;
//! `-- 3 10` is a quick check).
//!
//! Part 1, the real broker: starts the `ferrymq` binary (`--log warn`) with the integration
//! tests' harness; over AMQP 0-9-1 (lapin, publisher confirms) binds a queue to a topic
//! exchange with `#.#. ... .#.x` (n `#` words, then a word no key has, so that nothing
//! matches and every way of splitting the key among the `#` words is a candidate), then
//! publishes PUBLISHES messages one at a time, each with a routing key of 127 words not
//! seen before (`a.a. ... .a.<i>`: a cache miss every time), and reports the confirm latency
//! (min, median, p99, max). A publish not confirmed within TIMEOUT_SECS ends the run: the
//! broker is stuck (the exponential matcher), and is killed.
//!
//! Part 2, in process: the same patterns in a [`Router`] (n up to 126 `#` words, stored as
//! one), the costliest single binding key (`#.a.#.a. ... .x`, 127 words), and 1,000
//! distinct bindings of 32 `#`/`*`/`a` words each on one exchange (the cost grows with the
//! bindings; such a walk ends off the runtime's workers), routed with 127-word keys.
//!
//! `BENCH_FERRYMQ_BINARY=/path/to/ferrymq` runs part 1 against another build (e.g. one of
//! main before the matcher was fixed), for a side-by-side comparison.

use std::time::{Duration, Instant};

use ferrymq::core::message::Message;
use ferrymq::core::router::{Binding, ExchangeDef, ExchangeKind, Router};
use lapin::options::QueueDeclareOptions;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

// The bench uses part of the harness.
#[allow(dead_code)]
#[path = "../tests/integration/common/broker.rs"]
mod broker;
use broker::{Broker, Opts};

/// `#` words in the binding keys of part 1.
const HASHES: [usize; 4] = [1, 3, 6, 12];

/// A routing key of 127 words, the last one `last`.
fn key(last: &str) -> String {
    let mut words = vec!["a"; 126];
    words.push(last);
    words.join(".")
}

/// `n` `#` words, then `tail`.
fn pattern(n: usize, tail: &str) -> String {
    format!("{}.{tail}", vec!["#"; n].join("."))
}

/// (min, median, p99, max) of `samples`.
fn spread(mut samples: Vec<Duration>) -> [Duration; 4] {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    [samples[0], at(0.5), at(0.99), samples[samples.len() - 1]]
}

fn show(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}

async fn broker_part(publishes: usize, timeout: Duration) {
    let broker = Broker::start_with(Opts::default().log("warn"));
    let amqp = broker.amqp.expect("an AMQP listener");
    let uri = format!("amqp://guest:guest@{amqp}/%2f");
    let conn = Connection::connect(&uri, ConnectionProperties::default()).await.expect("AMQP connect");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default()).await.expect("confirm.select");
    println!("part 1: the broker, {publishes} publishes of new 127-word keys per binding key, confirm latency");
    println!("| binding key | min | median | p99 | max |");
    println!("| --- | --- | --- | --- | --- |");
    for n in HASHES {
        let (exchange, queue) = (format!("hostile-{n}"), format!("sink-{n}"));
        ch.exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("exchange.declare");
        ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
            .await
            .expect("queue.declare");
        let binding_key = pattern(n, "x");
        ch.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            binding_key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("queue.bind");
        let mut samples = Vec::with_capacity(publishes);
        for i in 0..publishes {
            let routing_key = key(&i.to_string());
            let began = Instant::now();
            let published = ch.basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                BasicPublishOptions::default(),
                b"adversarial",
                BasicProperties::default(),
            );
            let confirmed = async { published.await.expect("basic.publish").await.expect("confirm") };
            if tokio::time::timeout(timeout, confirmed).await.is_err() {
                println!(
                    "| `#` x {n} | no confirm within {} s: the broker is stuck; run ended | | | |",
                    timeout.as_secs()
                );
                return;
            }
            samples.push(began.elapsed());
        }
        let [min, median, p99, max] = spread(samples);
        println!("| `#` x {n} | {} | {} | {} | {} |", show(min), show(median), show(p99), show(max));
    }
}

fn route_times(router: &Router, exchange: &str, routes: usize) -> [Duration; 4] {
    let samples = (0..routes)
        .map(|i| {
            let msg = Message {
                exchange: exchange.into(),
                routing_key: key(&i.to_string()),
                payload: Default::default(),
                qos: 0,
                retain: false,
                props: Default::default(),
                timestamp_ms: 0,
            };
            let began = Instant::now();
            let (found, _) = router.route("/", exchange, &msg, "").expect("route");
            let took = began.elapsed();
            assert!(found.queues.is_empty(), "nothing matches");
            took
        })
        .collect();
    spread(samples)
}

fn topic_exchange(router: &Router, name: &str) {
    let def = ExchangeDef {
        name: name.into(),
        kind: ExchangeKind::Topic,
        durable: false,
        auto_delete: false,
        internal: false,
        arguments: Vec::new(),
    };
    router.declare_exchange("/", def).expect("declare");
}

fn router_part(routes: usize) {
    println!("part 2: the routing table in process, {routes} routes of new 127-word keys each");
    println!("| bindings | min | median | p99 | max |");
    println!("| --- | --- | --- | --- | --- |");
    let router = Router::new();
    for n in [1, 3, 6, 12, 64, 126] {
        let name = format!("t{n}");
        topic_exchange(&router, &name);
        router.bind("/", &name, Binding::queue(ferrymq_storage::QueueId(1), &pattern(n, "x"), vec![])).unwrap();
        let [min, median, p99, max] = route_times(&router, &name, routes);
        println!("| one: `#` x {n} | {} | {} | {} | {} |", show(min), show(median), show(p99), show(max));
    }
    // The costliest single binding key: `#` separated by words the key has, so that each
    // of its 127 words can be live at each of the key's positions.
    topic_exchange(&router, "spaced");
    let spaced = format!("{}x", "#.a.".repeat(63));
    router.bind("/", "spaced", Binding::queue(ferrymq_storage::QueueId(1), &spaced, vec![])).unwrap();
    let [min, median, p99, max] = route_times(&router, "spaced", routes);
    println!("| one: `#.a.` x 63 then `x` | {} | {} | {} | {} |", show(min), show(median), show(p99), show(max));
    // Many distinct patterns, each of 32 words drawn from `#`, `*` and `a`, ending in a word
    // no key has: every node of every pattern can be live at many key positions.
    topic_exchange(&router, "many");
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for q in 0..1_000u64 {
        let words: Vec<&str> = (0..31)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ["#", "#", "*", "a"][(seed % 4) as usize]
            })
            .chain(["x"])
            .collect();
        router.bind("/", "many", Binding::queue(ferrymq_storage::QueueId(q), &words.join("."), vec![])).unwrap();
    }
    let [min, median, p99, max] = route_times(&router, "many", routes.min(50));
    println!(
        "| 1,000 distinct, 32 words of `#`/`*`/`a` | {} | {} | {} | {} |",
        show(min),
        show(median),
        show(p99),
        show(max)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let publishes = args.first().copied().unwrap_or(200) as usize;
    let timeout = Duration::from_secs(args.get(1).copied().unwrap_or(10));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(broker_part(publishes, timeout));
    router_part(publishes);
}

//! The operations surface on one HTTP listener (`http.listen`, RabbitMQ's management port
//! 15672): the management API under `/api` with the paths and JSON of RabbitMQ's
//! management plugin, so `rabbitmqadmin`, Terraform, Telegraf and curl scripts work
//! unchanged, Prometheus `/metrics` with RabbitMQ's metric names, and the web dashboard at `/`.
//!
//! - [`access`] — virtual hosts, users and permissions (read and write, durable).
//! - [`auth`] — HTTP Basic against the user store, and what each user tag may call.
//! - [`csrf`] — cross-site requests refused (`Origin`, `Sec-Fetch-Site`), JSON bodies only.
//! - [`permit`] — the proof every `/api` handler takes: the tag, virtual host and
//!   permissions its route demands, checked before it runs (a handler without one does
//!   not compile).
//! - [`limits`] — per-virtual-host and per-user limits (`/api/vhost-limits`, `/api/user-limits`).
//! - [`rules`] — topic permissions and the MQTT topic rules.
//! - [`shovels`] — shovels as runtime parameters, and their status.
//! - [`bridges`] — the bridges' state.
//! - [`dashboard`] — the web dashboard's static files at `/`.
//! - [`definitions`] — `/api/definitions`: RabbitMQ's definitions export and import.
//! - [`cluster`] — `/api/cluster-name` and `/api/global-parameters`.
//! - [`error`] — errors as RabbitMQ answers them (`{"error": ..., "reason": ...}`).
//! - [`rates`] — counters sampled every 5 s into RabbitMQ's `*_details.rate`.
//! - [`overview`] — `/api/overview`, `/api/nodes`, `/api/whoami`.
//! - [`queues`] — `/api/queues`: list (paged), declare, delete, purge, get.
//! - [`exchanges`] — `/api/exchanges` and `/api/bindings`, publish.
//! - [`connections`] — `/api/connections` of both protocols (close one), channels, consumers.
//! - [`health`] — `/api/health/checks/...` and `/api/aliveness-test`.
//! - [`mqtt`] — FerryMQ's MQTT views (EMQX's): clients, sessions, subscriptions, retained.
//! - [`streams`] — stream and super-stream consumer groups (lag, reset), message lookup by key.
//! - [`metrics`] — `/metrics` (OpenMetrics text).
//! - [`json`] — the JSON shapes shared by several calls (header values, pagination).
//! - [`listener`] — the listeners' sockets and connections: admission at accept, TLS
//!   (`http.tls_listen`), the header-read and idle timeouts, the peer address.

pub mod access;
pub mod auth;
pub mod bridges;
pub mod cluster;
pub mod connections;
pub mod csrf;
pub mod dashboard;
pub mod definitions;
pub mod error;
pub mod exchanges;
pub mod health;
pub mod json;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod mqtt;
pub mod overview;
pub mod permit;
pub mod queues;
pub mod rates;
pub mod rules;
pub mod shovels;
pub mod streams;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::{delete, get, post, put};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::access::auth::Users;
use crate::composition::config::HttpSection;
use crate::core::alarm::ResourceAlarm;
use crate::core::broker::Broker;
use crate::core::entities::Entities;
use crate::core::stats::Stats;
use crate::frontends::mqtt::MqttContext;

/// A listener the broker opened, as `/api/overview` lists it.
#[derive(Debug, Clone)]
pub struct ListenerInfo {
    /// RabbitMQ's protocol name: `amqp`, `amqp/ssl`, `mqtt`, `mqtt/ssl`, `http`, `https`,
    /// `http/prometheus`.
    pub protocol: &'static str,
    /// The bound address.
    pub addr: SocketAddr,
}

/// What the HTTP handlers share.
pub struct HttpContext {
    /// The core.
    pub broker: Arc<Broker>,
    /// The bridges' status.
    pub bridges: Arc<crate::links::Bridges>,
    /// The shovels.
    pub shovels: Arc<crate::links::shovel::Shovels>,
    /// The declared queues, exchanges and bindings (the core's, shared with AMQP).
    pub entities: Arc<Entities>,
    /// The MQTT front-end (its sessions).
    pub mqtt: Arc<MqttContext>,
    /// Who may call the API.
    pub users: Users,
    /// `[http]`.
    pub cfg: HttpSection,
    /// Virtual host metadata.
    pub access: access::AccessState,
    /// Permissions, topic permissions and MQTT rules (shared with both front-ends).
    pub authz: Arc<crate::access::authz::Authorizer>,
    /// Users that may only connect from loopback (`auth.loopback_users`), for users made at runtime.
    pub loopback_users: Vec<String>,
    /// The memory and disk alarms.
    pub alarm: Arc<ResourceAlarm>,
    /// Client sockets per kind of listener, within the open-files limit (HTTP's own too).
    pub sockets: Arc<crate::transport::accept::SocketBudget>,
    /// Every listener the broker opened (filled in once they are bound).
    pub listeners: parking_lot::RwLock<Vec<ListenerInfo>>,
    /// Message rates, sampled every 5 s.
    pub rates: rates::Rates,
    /// Per-queue rates, sampled with `rates`.
    pub queue_rates: rates::QueueRates,
    /// Per-connection byte rates, sampled with `rates`.
    pub connection_rates: rates::ConnectionRates,
    /// Delayed messages waiting for their time (MQTT `$delayed`, AMQP delayed
    /// publishes), as of the last sample; [`DELAYED_SCAN_LIMIT`] at most.
    pub delayed_pending: std::sync::atomic::AtomicU64,
    /// This member of a cluster (`[cluster]`), for `/api/nodes` and `/api/cluster`.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl HttpContext {
    /// The node name of every `node` field (a cluster member's `cluster.node_name`).
    pub fn node(&self) -> &str {
        match &self.cluster {
            Some(c) => c.name(),
            None => &self.cfg.node_name,
        }
    }

    /// Every virtual host, by name.
    pub fn vhosts(&self) -> Vec<String> {
        self.broker.routing().vhosts()
    }
}

/// Most stored timers a sample counts (the delayed-message count stops there).
pub const DELAYED_SCAN_LIMIT: usize = 1_000_000;

/// The routes of the API. The `/api` routes have a [`permit::Gate`] for state: their
/// handlers reach the context only through a [`permit::Permitted`] proof.
pub fn router(ctx: Arc<HttpContext>) -> Router {
    let api: Router<permit::Gate> = Router::new()
        .route("/overview", get(overview::overview))
        .route("/whoami", get(overview::whoami))
        .route("/nodes", get(overview::nodes))
        .route("/nodes/{name}", get(overview::node))
        .route("/ferrymq/cluster", get(cluster::status))
        .route("/ferrymq/cluster/members", post(cluster::add_member))
        .route("/ferrymq/cluster/members/{name}", delete(cluster::forget_member))
        .route("/ferrymq/cluster/data-groups/probe", post(cluster::probe_data_group))
        .route("/extensions", get(overview::extensions))
        .route("/vhosts", get(access::vhosts))
        .route("/vhosts/{vhost}", get(access::vhost).put(access::create_vhost).delete(access::remove_vhost))
        .route("/vhosts/{vhost}/permissions", get(access::vhost_permissions))
        .route("/users", get(access::users))
        .route("/users/{name}", get(access::user).put(access::create_user).delete(access::remove_user))
        .route("/users/{name}/permissions", get(access::user_permissions))
        .route("/vhost-limits", get(limits::vhost_limits))
        .route("/vhost-limits/{vhost}", get(limits::vhost_limits_of))
        .route("/vhost-limits/{vhost}/{name}", put(limits::set_vhost_limit).delete(limits::clear_vhost_limit))
        .route("/user-limits", get(limits::user_limits))
        .route("/user-limits/{user}", get(limits::user_limits_of))
        .route("/user-limits/{user}/{name}", put(limits::set_user_limit).delete(limits::clear_user_limit))
        .route("/permissions", get(access::permissions))
        .route("/topic-permissions", get(rules::all))
        .route("/topic-permissions/{vhost}/{user}", get(rules::of_pair).put(rules::set).delete(rules::clear))
        .route("/vhosts/{vhost}/topic-permissions", get(rules::of_vhost))
        .route("/users/{name}/topic-permissions", get(rules::of_user))
        .route("/mqtt/rules", get(rules::mqtt_rules).put(rules::set_mqtt_rules))
        .route(
            "/permissions/{vhost}/{user}",
            get(access::permission).put(access::set_permission).delete(access::clear_permission),
        )
        .route("/queues", get(queues::list_all))
        .route("/queues/{vhost}", get(queues::list_vhost))
        .route("/queues/{vhost}/{name}", get(queues::show).put(queues::declare).delete(queues::remove))
        .route("/queues/{vhost}/{name}/contents", delete(queues::purge))
        .route("/queues/{vhost}/{name}/get", post(queues::get_messages))
        .route("/queues/{vhost}/{name}/bindings", get(exchanges::queue_bindings))
        .route("/exchanges", get(exchanges::list_all))
        .route("/exchanges/{vhost}", get(exchanges::list_vhost))
        .route("/exchanges/{vhost}/{name}", get(exchanges::show).put(exchanges::declare).delete(exchanges::remove))
        .route("/exchanges/{vhost}/{name}/publish", post(exchanges::publish))
        .route("/bindings", get(exchanges::bindings_all))
        .route("/bindings/{vhost}", get(exchanges::bindings_vhost))
        .route(
            "/bindings/{vhost}/e/{source}/{kind}/{destination}",
            get(exchanges::bindings_between).post(exchanges::create_binding),
        )
        .route(
            "/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}",
            get(exchanges::binding).delete(exchanges::remove_binding),
        )
        .route("/definitions", get(definitions::export_all).post(definitions::import_all))
        .route("/cluster-name", get(cluster::cluster_name).put(cluster::put_cluster_name))
        .route("/global-parameters", get(cluster::list))
        .route("/global-parameters/{name}", get(cluster::get).put(cluster::put))
        .route("/definitions/{vhost}", get(definitions::export_vhost).post(definitions::import_vhost))
        .route("/connections", get(connections::list))
        .route("/connections/{name}", get(connections::show).delete(connections::close))
        .route("/vhosts/{vhost}/connections", get(connections::list_vhost))
        .route("/connections/{name}/channels", get(connections::connection_channels))
        .route("/channels", get(connections::channels))
        .route("/consumers", get(connections::consumers))
        .route("/consumers/{vhost}", get(connections::consumers_vhost))
        .route("/health/checks/alarms", get(health::alarms))
        .route("/health/checks/local-alarms", get(health::alarms))
        .route("/health/checks/virtual-hosts", get(health::virtual_hosts))
        .route("/health/checks/port-listener/{port}", get(health::port_listener))
        .route("/health/checks/protocol-listener/{protocol}", get(health::protocol_listener))
        .route("/health/checks/node-is-quorum-critical", get(health::ok_check))
        .route("/health/checks/node-is-mirror-sync-critical", get(health::ok_check))
        .route("/aliveness-test/{vhost}", get(health::aliveness))
        .route("/ferrymq/streams/{vhost}/{name}/groups", get(streams::stream_groups))
        .route("/ferrymq/streams/{vhost}/{name}/groups/{group}/reset", post(streams::reset_stream_group))
        .route("/ferrymq/super-streams/{vhost}/{exchange}/groups", get(streams::super_stream_groups))
        .route(
            "/ferrymq/super-streams/{vhost}/{exchange}/groups/{group}/reset",
            post(streams::reset_super_stream_group),
        )
        .route("/ferrymq/messages", get(streams::lookup))
        .route("/ferrymq/bridges", get(bridges::list))
        .route("/parameters/shovel", get(shovels::list_all))
        .route("/parameters/shovel/{vhost}", get(shovels::list_vhost))
        .route("/parameters/shovel/{vhost}/{name}", get(shovels::get).put(shovels::put).delete(shovels::delete))
        .route("/shovels", get(shovels::status_all))
        .route("/shovels/{vhost}", get(shovels::status_vhost))
        .route("/ferrymq/mqtt/clients", get(mqtt::clients))
        .route("/ferrymq/mqtt/clients/{clientid}", delete(mqtt::kick))
        .route("/ferrymq/mqtt/sessions", get(mqtt::sessions))
        .route("/ferrymq/mqtt/sessions/{clientid}", delete(mqtt::delete_session))
        .route("/ferrymq/mqtt/subscriptions", get(mqtt::subscriptions_list))
        .route("/ferrymq/mqtt/retained", get(mqtt::retained))
        .route("/ferrymq/mqtt/delayed", get(mqtt::delayed))
        .route("/ferrymq/mqtt/retained/{*topic}", delete(mqtt::delete_retained))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(ctx.clone(), auth::require_login))
        .layer(axum::middleware::from_fn_with_state(ctx.clone(), csrf::refuse_cross_site));
    let body_limit = axum::extract::DefaultBodyLimit::max(ctx.cfg.max_body_size);
    Router::new()
        .nest("/api", api.layer(body_limit).with_state(permit::Gate::new(ctx.clone())))
        .route("/metrics", get(metrics::metrics))
        .route("/metrics/per-object", get(metrics::per_object))
        .route("/", get(dashboard::index))
        .route("/index.html", get(dashboard::index))
        .route("/app.js", get(dashboard::app))
        .route("/style.css", get(dashboard::style))
        .route("/vendor/mqtt.min.js", get(dashboard::mqtt_js))
        .fallback(error::not_found)
        .with_state(ctx)
}

/// Only `/metrics` and `/metrics/per-object`, for a listener of their own
/// (`prometheus.listen`, as RabbitMQ's Prometheus plugin on 15692).
pub fn metrics_router(ctx: Arc<HttpContext>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/metrics/per-object", get(metrics::per_object))
        .fallback(error::not_found)
        .with_state(ctx)
}

/// The bound HTTP listeners, each optional.
#[derive(Default)]
pub struct Listeners {
    /// `http.listen`: the API, `/metrics` and the dashboard.
    pub http: Option<TcpListener>,
    /// `http.tls_listen`: the same over TLS.
    pub https: Option<(TcpListener, TlsAcceptor)>,
    /// `prometheus.listen`: `/metrics` only.
    pub prometheus: Option<TcpListener>,
}

/// Serves every listener until `stop` turns true, and samples the rates.
pub fn start(ctx: Arc<HttpContext>, listeners: Listeners, stop: watch::Receiver<bool>) {
    tokio::spawn(ctx.clone().sample_rates());
    let served = |app: Router| listener::Served {
        app,
        sockets: ctx.sockets.clone(),
        timeouts: listener::Timeouts::of(&ctx.cfg),
    };
    if let Some(l) = listeners.http {
        tokio::spawn(listener::serve(l, None, served(router(ctx.clone())), stop.clone()));
    }
    if let Some((l, tls)) = listeners.https {
        tokio::spawn(listener::serve(l, Some(tls), served(router(ctx.clone())), stop.clone()));
    }
    if let Some(l) = listeners.prometheus {
        tokio::spawn(listener::serve(l, None, served(metrics_router(ctx.clone())), stop));
    }
}

impl HttpContext {
    /// Samples the counters behind the rates every `http.collect_statistics_interval`.
    async fn sample_rates(self: Arc<Self>) {
        let every = self.cfg.collect_statistics_interval.max(std::time::Duration::from_millis(10));
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            self.rates.sample(&rates::Totals::now(&self.broker));
            self.queue_rates.sample(self.entities.all().iter().map(|q| (q.id, queues::sample(q).values())));
            if let Ok(n) = self.broker.delayed_pending(DELAYED_SCAN_LIMIT).await {
                self.delayed_pending.store(n, std::sync::atomic::Ordering::Relaxed);
            }
            let connections = self.broker.connections().list();
            self.connection_rates
                .sample(connections.iter().map(|c| (c.id, [Stats::get(&c.recv_oct), Stats::get(&c.send_oct)])));
        }
    }
}

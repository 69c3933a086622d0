//! The routing table through the door: MQTT subscriptions and virtual hosts change through
//! [`Broker`] methods; everything else reads it through a [`RoutingView`], which can look
//! routes, exchanges and bindings up but change nothing. Exchanges, queues and their
//! bindings change through [`crate::core::entities`] (RabbitMQ's checks, stored durably).

use std::sync::Arc;

use super::Broker;
use crate::core::dedup::DedupCache;
use crate::core::message::{now_ms, Message};
use crate::core::router::{
    Binding, Destination, ExchangeDef, ExchangeKind, MqttOptions, RouteCache, RouteError, Router, Routes,
};
use crate::core::store::StoreWrite;

impl Broker {
    /// The routing table, read-only: routes, exchanges, bindings, virtual hosts.
    pub fn routing(&self) -> RoutingView<'_> {
        RoutingView(&self.router)
    }

    /// MQTT SUBSCRIBE: binds `dest` (a session's queue or connection, a shared group's
    /// queue) to topic filter `filter` (MQTT syntax, without `$share/`) of the MQTT
    /// exchange with the subscription's options. True when the subscription is new.
    pub fn subscribe(&self, filter: &str, dest: Destination, opts: MqttOptions) -> bool {
        self.router.subscribe(filter, dest, opts)
    }

    /// MQTT UNSUBSCRIBE (or a session's end): removes the binding of `dest` to `filter`
    /// on the MQTT exchange. True when there was one.
    pub fn unsubscribe(&self, filter: &str, dest: &Destination) -> bool {
        self.router.unsubscribe(filter, dest)
    }

    /// Makes virtual host `name` with its standard exchanges (nothing when it exists).
    pub fn add_vhost(&self, name: &str) {
        self.router.add_vhost(name)
    }

    /// Removes virtual host `name` with its exchanges and bindings (its queues are the
    /// caller's to delete first, through [`crate::core::entities`]). True when it existed.
    pub fn remove_vhost(&self, name: &str) -> bool {
        self.router.remove_vhost(name)
    }

    /// Forgets the de-duplication ids whose time is up in every `x-message-deduplication`
    /// exchange, durably for those kept on disk (without asking for an fsync: an id a
    /// power loss brings back only expires again).
    pub async fn expire_dedup_ids(&self) {
        let now = now_ms();
        let caches: Vec<Arc<DedupCache>> = self.router.dedup_caches();
        for cache in caches {
            let write: StoreWrite = self.dedup_write(&cache.expire(now));
            if let Err(e) = self.commit(write, super::Commit::Relaxed).await {
                tracing::warn!(error = %e, "cannot forget expired de-duplication values");
            }
        }
    }
}

/// The routing table as the front-ends, links and the management API see it: lookups
/// only. Changes go through [`Broker::subscribe`], [`Broker::add_vhost`] and
/// [`crate::core::entities`].
#[derive(Debug, Clone, Copy)]
pub struct RoutingView<'a>(&'a Router);

impl<'a> RoutingView<'a> {
    /// The topic exchange of `/` that MQTT publishes and subscriptions use.
    pub fn mqtt_exchange(self) -> &'a str {
        self.0.mqtt_exchange()
    }

    /// Every target of a publish of `msg` to `exchange` of `vhost` by `publisher` (an MQTT
    /// client id, for no-local; "" otherwise), and whether the result may be cached
    /// ([`crate::core::router::Router::route`]).
    pub fn route(
        self,
        vhost: &str,
        exchange: &str,
        msg: &Message,
        publisher: &str,
    ) -> Result<(Routes, bool), RouteError> {
        self.0.route(vhost, exchange, msg, publisher)
    }

    /// [`RoutingView::route`] through a publisher's cache of routes.
    pub fn route_cached(
        self,
        cache: &mut RouteCache,
        vhost: &str,
        exchange: &str,
        msg: &Message,
        publisher: &str,
    ) -> Result<Arc<Routes>, RouteError> {
        cache.route(self.0, vhost, exchange, msg, publisher)
    }

    /// Routes of an MQTT publish `msg` (on the MQTT exchange) by `publisher`.
    pub fn resolve(self, msg: &Message, publisher: &str) -> Routes {
        self.0.resolve(msg, publisher)
    }

    /// [`RoutingView::resolve`] through a publisher's cache of routes.
    pub fn resolve_cached(self, cache: &mut RouteCache, msg: &Message, publisher: &str) -> Arc<Routes> {
        cache.resolve(self.0, msg, publisher)
    }

    /// Kind and `internal` flag of exchange `name` of `vhost`, through a publisher's cache.
    pub fn exchange_cached(self, cache: &mut RouteCache, vhost: &str, name: &str) -> Option<(ExchangeKind, bool)> {
        cache.exchange(self.0, vhost, name)
    }

    /// Exchange `name` of `vhost`.
    pub fn exchange(self, vhost: &str, name: &str) -> Option<ExchangeDef> {
        self.0.exchange(vhost, name)
    }

    /// Every exchange of `vhost`.
    pub fn exchanges(self, vhost: &str) -> Vec<ExchangeDef> {
        self.0.exchanges(vhost)
    }

    /// Every binding of `vhost`, with its source exchange.
    pub fn bindings(self, vhost: &str) -> Vec<(String, Binding)> {
        self.0.bindings(vhost)
    }

    /// The bindings whose source is `exchange` of `vhost`.
    pub fn bindings_of(self, vhost: &str, exchange: &str) -> Vec<Binding> {
        self.0.bindings_of(vhost, exchange)
    }

    /// True when virtual host `name` exists.
    pub fn has_vhost(self, name: &str) -> bool {
        self.0.has_vhost(name)
    }

    /// Every virtual host, by name.
    pub fn vhosts(self) -> Vec<String> {
        self.0.vhosts()
    }

    /// MQTT subscriptions in the table (`$SYS/broker/subscriptions/count`).
    pub fn subscriptions(self) -> usize {
        self.0.len()
    }

    /// Routes whose walk of a topic exchange finished off the runtime's workers
    /// (`ferrymq_routes_off_worker`).
    pub fn long_routes(self) -> u64 {
        self.0.long_routes()
    }
}

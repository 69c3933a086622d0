//! Proof of access for every `/api` handler: no handler reaches the broker without having
//! passed the check its route demands, and a handler that demands none does not compile.
//!
//! # How the guarantee is built
//!
//! - The `/api` router's state is a [`Gate`], whose context is private to this module: a
//!   handler asking for `State<Arc<HttpContext>>` is not a handler of that router (axum
//!   refuses it when the route is registered), and `State<Gate>` yields nothing usable.
//! - The login middleware ([`super::auth::require_login`]) files the caller under a type
//!   private to this module ([`admit`]); [`Caller`] is not `Clone`, so `Extension<Caller>`
//!   is no extractor either (an `Extension<Arc<Caller>>` compiles but is never filled: it
//!   fails closed with 500).
//! - The one way to the context and the caller is the extractor [`Permitted<C>`], which
//!   runs the check `C` on the caller and the route's path parameters before the handler
//!   is called and answers the refusal itself. A handler therefore names its check in its
//!   signature: `Permitted<Monitoring>`, `Permitted<Vhost>`, `Permitted<OnQueue<Configure>>`.
//! - Checks that need the request body (a dead-letter exchange, a binding key) are methods
//!   of a proof that already holds the virtual host ([`InVhost`]); making a binding takes a
//!   [`BindingGrant`], which only [`Permitted::grant_binding`] (or an administrator's
//!   definitions import) creates.
//!
//! So this is no `/api` handler (it would reach the context unchecked):
//!
//! ```compile_fail
//! # use std::sync::Arc;
//! # use axum::{extract::State, routing::get, Router};
//! # use ferrymq::operations::http::{permit::Gate, HttpContext};
//! async fn unchecked(State(ctx): State<Arc<HttpContext>>) {
//!     let _ = ctx.vhosts();
//! }
//! let _api: Router<Gate> = Router::new().route("/queues", get(unchecked));
//! ```
//!
//! nor is one that takes the caller without a check:
//!
//! ```compile_fail
//! # use axum::{routing::get, Extension, Router};
//! # use ferrymq::operations::http::{auth::Caller, permit::Gate};
//! async fn unchecked(Extension(caller): Extension<Caller>) {
//!     let _ = caller.name;
//! }
//! let _api: Router<Gate> = Router::new().route("/whoami", get(unchecked));
//! ```
//!
//! while this one is:
//!
//! ```
//! # use axum::{routing::get, Router};
//! # use ferrymq::operations::http::permit::{Gate, Monitoring, Permitted};
//! async fn checked(p: Permitted<Monitoring>) {
//!     let _ = p.ctx().vhosts();
//! }
//! let _api: Router<Gate> = Router::new().route("/nodes", get(checked));
//! ```
//!
//! A new route takes the proof of what it touches: a tag ([`Management`], [`Monitoring`],
//! [`Policymaker`], [`Administrator`]), a virtual host ([`Vhost`], [`VisibleVhost`]), or a
//! queue or exchange with a permission ([`OnQueue`], [`OnExchange`] with [`Configure`],
//! [`Write`], [`Read`]).
//!
//! # The rules (RabbitMQ's management plugin)
//!
//! - Tags: every API user has `management`, `policymaker`, `monitoring` or
//!   `administrator`; a route for a stronger tag answers 403 `Not ... user`.
//! - A route naming a virtual host needs access to it (the user has permissions there;
//!   administrators may always): otherwise 401 `not_authorised`, `User not authorised to
//!   access virtual host`; an unknown one is 404. Monitoring users see every virtual host
//!   in `/api/vhosts`; lists of queues, exchanges, bindings, consumers, shovels show the
//!   virtual hosts the user may open (every one to administrators).
//! - Resources, as RabbitMQ's AMQP checks (the same functions AMQP calls,
//!   [`crate::access::authz::checks`]): declare and delete need configure, purge, get and a stream
//!   group reset read, publish write (and the topic permissions), a binding write on its
//!   destination, read on its source and on a topic source read on its key (and the MQTT
//!   rules on the MQTT exchange). Refused: 401 `not_authorised` with RabbitMQ's text.
//! - Message bodies (get, retained messages, the key lookup) are shown only to a user
//!   who could receive them as a client, administrators included, as RabbitMQ's get.
//!
//! With `auth.authorization = false` every permission passes (as over AMQP) and every
//! virtual host may be opened; the tags still apply.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::ops::Deref;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;

use super::auth::{Access, Caller};
use super::error::ApiError;
use super::listener::Peer;
use super::HttpContext;
use crate::access::authz::{BindingRequest, BoundTo, Identity, Permission, Refused, ResourceKind, RouteRefused};
use crate::core::router::ExchangeKind;

/// The state of the `/api` router: the context, reachable only through [`Permitted`].
#[derive(Clone)]
pub struct Gate(Arc<HttpContext>);

impl Gate {
    /// The gate to `ctx`.
    pub fn new(ctx: Arc<HttpContext>) -> Gate {
        Gate(ctx)
    }
}

/// The authenticated caller, as the login middleware files it (private: no handler can
/// take it but through [`Permitted`]).
#[derive(Clone)]
struct Authenticated(Arc<Caller>);

/// Files `caller` as the request's authenticated caller.
pub fn admit(req: &mut Request, caller: Caller) {
    req.extensions_mut().insert(Authenticated(Arc::new(caller)));
}

/// The route's path parameters, by name, percent-decoded.
#[derive(Debug, Default)]
pub struct PathParams(HashMap<String, String>);

impl PathParams {
    /// The parameter `name` (404 when the route has none: the call names no such object).
    pub fn get(&self, name: &str) -> Result<&str, ApiError> {
        self.0.get(name).map(String::as_str).ok_or_else(ApiError::not_found)
    }
}

/// A check a route demands, run on the caller and the path before its handler.
pub trait Check: Sized + Send + Sync + 'static {
    /// The proof, or the answer that refuses the call.
    fn check(ctx: &HttpContext, caller: &Caller, path: &PathParams) -> Result<Self, ApiError>;
}

/// A call whose caller passed the check `C`: the only way for an `/api` handler to reach
/// the context and the caller. Dereferences to the proof.
pub struct Permitted<C> {
    ctx: Arc<HttpContext>,
    caller: Arc<Caller>,
    peer: Option<IpAddr>,
    proof: C,
}

impl<C: Check> FromRequestParts<Gate> for Permitted<C> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gate: &Gate) -> Result<Self, ApiError> {
        let Some(Authenticated(caller)) = parts.extensions.get::<Authenticated>().cloned() else {
            return Err(ApiError::unauthorized());
        };
        let peer = parts.extensions.get::<ConnectInfo<Peer>>().map(|c| c.0 .0.ip());
        let path = match RawPathParams::from_request_parts(parts, gate).await {
            Ok(raw) => PathParams(raw.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()),
            Err(axum::extract::rejection::RawPathParamsRejection::MissingPathParams(_)) => PathParams::default(),
            Err(e) => return Err(ApiError::bad_request(e.body_text())),
        };
        let proof = C::check(&gate.0, &caller, &path)?;
        Ok(Permitted { ctx: gate.0.clone(), caller, peer, proof })
    }
}

impl<C> Deref for Permitted<C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.proof
    }
}

/// A permission refused: 401 `not_authorised` with RabbitMQ's text.
fn refused(r: Refused) -> ApiError {
    ApiError::access_refused(r.0)
}

/// A route refused: as [`refused`], and 403 for a route into the MQTT exchange.
fn route_refused(r: RouteRefused) -> ApiError {
    match r {
        RouteRefused::Permission(r) => refused(r),
        RouteRefused::IntoMqttExchange(text) => ApiError::forbidden(text),
    }
}

/// True when `caller` may open `vhost`: administrators always (RabbitMQ's
/// `is_authorized_vhost`), others with permissions there (anyone with authorization off).
fn opens(ctx: &HttpContext, caller: &Caller, vhost: &str) -> bool {
    caller.access >= Access::Administrator || ctx.authz.vhost_access(&caller.name, vhost)
}

impl<C> Permitted<C> {
    /// The context.
    pub fn ctx(&self) -> &Arc<HttpContext> {
        &self.ctx
    }

    /// The caller.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The caller's decisions in `vhost`, as a client of that user would meet them.
    fn decisions(&self, vhost: &str) -> crate::access::authz::Access {
        let id = Identity {
            user: Some(self.caller.name.clone()),
            groups: self.caller.tags.clone(),
            peer: self.peer,
            ..Identity::default()
        };
        self.ctx.authz.access(id, vhost)
    }

    /// True when a list shows the objects of `vhost` to the caller (RabbitMQ's
    /// `filter_vhost`): every virtual host to administrators, the ones they may open to others.
    pub fn lists(&self, vhost: &str) -> bool {
        opens(&self.ctx, &self.caller, vhost)
    }

    /// True when `/api/vhosts` shows `vhost` to the caller: monitoring users and
    /// administrators see every one (RabbitMQ's `list_visible_vhosts`).
    pub fn sees_vhost(&self, vhost: &str) -> bool {
        self.caller.access >= Access::Monitoring || self.lists(vhost)
    }

    /// The judge of which stored messages the caller may read.
    pub fn message_reader(&self) -> MessageReader<'_, C> {
        MessageReader { permitted: self, decisions: HashMap::new() }
    }
}

/// Decides, message by message, whether the caller may see a stored message's contents:
/// only if it may open the message's virtual host and read it as a client
/// ([`crate::access::authz::Access::read_message`]), administrators included.
pub struct MessageReader<'a, C> {
    permitted: &'a Permitted<C>,
    decisions: HashMap<String, Option<crate::access::authz::Access>>,
}

impl<C> MessageReader<'_, C> {
    /// True when the caller may read a message published in `vhost` to `exchange` with `key`.
    pub fn may_read(&mut self, vhost: &str, exchange: &str, key: &str) -> bool {
        let p = self.permitted;
        let topic = p.ctx.broker.routing().exchange(vhost, exchange).is_none_or(|x| x.kind == ExchangeKind::Topic);
        let decisions = self
            .decisions
            .entry(vhost.to_owned())
            .or_insert_with(|| p.ctx.authz.vhost_access(&p.caller.name, vhost).then(|| p.decisions(vhost)));
        decisions.as_mut().is_some_and(|d| d.read_message(exchange, topic, key).is_ok())
    }

    /// True when the caller may read a message of `exchange` whose virtual host is not
    /// recorded: in every virtual host that has such an exchange now (every one if none has).
    pub fn may_read_anywhere(&mut self, exchange: &str, key: &str) -> bool {
        let ctx = &self.permitted.ctx;
        let all = ctx.vhosts();
        let holding: Vec<&String> =
            all.iter().filter(|v| ctx.broker.routing().exchange(v, exchange).is_some()).collect();
        let candidates = if holding.is_empty() { all.iter().collect() } else { holding };
        candidates.into_iter().all(|v| self.may_read(v, exchange, key))
    }
}

// ----- tags ------------------------------------------------------------------------------

/// A user tag a route demands.
pub trait Tag: Send + Sync + 'static {
    /// Refuses (403 `Not ... user`) a caller without it.
    fn require(caller: &Caller) -> Result<(), ApiError>;
}

macro_rules! tag {
    ($(#[$doc:meta])* $name:ident, $require:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name;

        impl Tag for $name {
            fn require(caller: &Caller) -> Result<(), ApiError> {
                let require: fn(&Caller) -> Result<(), ApiError> = $require;
                require(caller)
            }
        }

        impl Check for $name {
            fn check(_: &HttpContext, caller: &Caller, _: &PathParams) -> Result<Self, ApiError> {
                <$name as Tag>::require(caller)?;
                Ok($name)
            }
        }
    };
}

tag!(
    /// Any API user (`management`, `policymaker`, `monitoring`, `administrator`); what a
    /// list shows is then up to [`Permitted::lists`].
    Management,
    |c| c.require(Access::Management)
);
tag!(
    /// `monitoring` or `administrator`.
    Monitoring,
    |c| c.require(Access::Monitoring)
);
tag!(
    /// `administrator`.
    Administrator,
    |c| c.require(Access::Administrator)
);
tag!(
    /// `policymaker` or `administrator` (runtime parameters: shovels).
    Policymaker,
    |c| match c.access == Access::Administrator || c.tags.iter().any(|t| t == "policymaker") {
        true => Ok(()),
        false => Err(ApiError::forbidden("Not policymaker user")),
    }
);

// ----- virtual hosts ---------------------------------------------------------------------

/// A proof that holds the route's virtual host: checks that need the request body are
/// made through it.
pub trait InVhost {
    /// The virtual host.
    fn vhost(&self) -> &str;
}

/// The virtual host of the route (`{vhost}`) exists (404) and the caller, with tag `T`,
/// may open it (401 otherwise; administrators always may).
#[derive(Debug)]
pub struct Vhost<T = Management> {
    /// Its name.
    pub name: String,
    tag: PhantomData<T>,
}

fn known_vhost(ctx: &HttpContext, path: &PathParams) -> Result<String, ApiError> {
    let name = path.get("vhost")?;
    super::queues::known_vhost(ctx, name)?;
    Ok(name.to_owned())
}

impl<T: Tag> Check for Vhost<T> {
    fn check(ctx: &HttpContext, caller: &Caller, path: &PathParams) -> Result<Self, ApiError> {
        T::require(caller)?;
        let name = known_vhost(ctx, path)?;
        if !opens(ctx, caller, &name) {
            return Err(ApiError::access_refused("User not authorised to access virtual host"));
        }
        Ok(Vhost { name, tag: PhantomData })
    }
}

impl<T> InVhost for Vhost<T> {
    fn vhost(&self) -> &str {
        &self.name
    }
}

/// As [`Vhost`], but monitoring users see every virtual host (`GET /api/vhosts/{vhost}`).
#[derive(Debug)]
pub struct VisibleVhost {
    /// Its name.
    pub name: String,
}

impl Check for VisibleVhost {
    fn check(ctx: &HttpContext, caller: &Caller, path: &PathParams) -> Result<Self, ApiError> {
        caller.require(Access::Management)?;
        let name = known_vhost(ctx, path)?;
        if caller.access < Access::Monitoring && !opens(ctx, caller, &name) {
            return Err(ApiError::access_refused("User not authorised to access virtual host"));
        }
        Ok(VisibleVhost { name })
    }
}

// ----- queues and exchanges --------------------------------------------------------------

/// A permission a route demands on its queue or exchange.
pub trait Perm: Send + Sync + 'static {
    /// Which (`None`: access to the virtual host is enough).
    const PERMISSION: Option<Permission>;
}

/// No permission: the route shows the object to whoever may open its virtual host.
#[derive(Debug)]
pub struct View;
/// Configure: declare, delete.
#[derive(Debug)]
pub struct Configure;
/// Write: publish.
#[derive(Debug)]
pub struct Write;
/// Read: purge, get, reset a stream's consumer group.
#[derive(Debug)]
pub struct Read;

impl Perm for View {
    const PERMISSION: Option<Permission> = None;
}
impl Perm for Configure {
    const PERMISSION: Option<Permission> = Some(Permission::Configure);
}
impl Perm for Write {
    const PERMISSION: Option<Permission> = Some(Permission::Write);
}
impl Perm for Read {
    const PERMISSION: Option<Permission> = Some(Permission::Read);
}

/// One resource check in a virtual host the caller may open (none for [`View`]).
fn resource_check(
    ctx: &HttpContext,
    caller: &Caller,
    vhost: &str,
    kind: ResourceKind,
    name: &str,
    perm: Option<Permission>,
) -> Result<(), ApiError> {
    let Some(perm) = perm else { return Ok(()) };
    let id = Identity { user: Some(caller.name.clone()), groups: caller.tags.clone(), ..Identity::default() };
    ctx.authz.access(id, vhost).resource(kind, name, perm).map_err(refused)
}

/// The queue of the route (`{vhost}/{name}`), on which the caller holds `P` (the queue
/// need not exist: the handler answers 404).
#[derive(Debug)]
pub struct OnQueue<P> {
    /// The virtual host.
    pub vhost: String,
    /// The queue.
    pub name: String,
    perm: PhantomData<P>,
}

impl<P: Perm> Check for OnQueue<P> {
    fn check(ctx: &HttpContext, caller: &Caller, path: &PathParams) -> Result<Self, ApiError> {
        let vhost = Vhost::<Management>::check(ctx, caller, path)?.name;
        let name = path.get("name")?.to_owned();
        resource_check(ctx, caller, &vhost, ResourceKind::Queue, &name, P::PERMISSION)?;
        Ok(OnQueue { vhost, name, perm: PhantomData })
    }
}

impl<P> InVhost for OnQueue<P> {
    fn vhost(&self) -> &str {
        &self.vhost
    }
}

/// The exchange of the route (`{vhost}/{name}`, `amq.default` being the default
/// exchange `""`), on which the caller holds `P`.
#[derive(Debug)]
pub struct OnExchange<P> {
    /// The virtual host.
    pub vhost: String,
    /// The exchange (`""` for the default one).
    pub name: String,
    perm: PhantomData<P>,
}

/// The management API's name of the default exchange, `amq.default`, as `""`.
pub fn exchange_name(name: &str) -> &str {
    if name == "amq.default" {
        ""
    } else {
        name
    }
}

impl<P: Perm> Check for OnExchange<P> {
    fn check(ctx: &HttpContext, caller: &Caller, path: &PathParams) -> Result<Self, ApiError> {
        let vhost = Vhost::<Management>::check(ctx, caller, path)?.name;
        let name = exchange_name(path.get("name")?).to_owned();
        resource_check(ctx, caller, &vhost, ResourceKind::Exchange, &name, P::PERMISSION)?;
        Ok(OnExchange { vhost, name, perm: PhantomData })
    }
}

impl<P> InVhost for OnExchange<P> {
    fn vhost(&self) -> &str {
        &self.vhost
    }
}

// ----- bindings --------------------------------------------------------------------------

/// A binding's destination as the route names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingDestination {
    /// A queue (`q`).
    Queue(String),
    /// An exchange (`e`).
    Exchange(String),
}

/// The binding route `{vhost}/e/{source}/{q|e}/{destination}` in a virtual host the
/// caller may open; the binding itself is checked by [`Permitted::grant_binding`].
#[derive(Debug)]
pub struct BindingPath {
    /// The virtual host.
    pub vhost: String,
    /// The source exchange (`""` for the default one).
    pub source: String,
    /// The destination.
    pub destination: BindingDestination,
}

impl Check for BindingPath {
    fn check(ctx: &HttpContext, caller: &Caller, path: &PathParams) -> Result<Self, ApiError> {
        let vhost = Vhost::<Management>::check(ctx, caller, path)?.name;
        let source = exchange_name(path.get("source")?).to_owned();
        let name = path.get("destination")?.to_owned();
        let destination = match path.get("kind")? {
            "q" => BindingDestination::Queue(name),
            "e" => BindingDestination::Exchange(exchange_name(&name).to_owned()),
            _ => return Err(ApiError::not_found()),
        };
        Ok(BindingPath { vhost, source, destination })
    }
}

impl InVhost for BindingPath {
    fn vhost(&self) -> &str {
        &self.vhost
    }
}

/// Proof that a binding may be made or removed: what
/// [`super::exchanges::set_binding`] demands.
#[derive(Debug)]
pub struct BindingGrant(());

impl BindingGrant {
    /// A definitions import's binding: an administrator's (or the configuration's, at
    /// start), applied without a user's permissions as RabbitMQ imports definitions.
    pub(super) fn imported() -> BindingGrant {
        BindingGrant(())
    }
}

impl Permitted<BindingPath> {
    /// The binding of this route with `key`, made (`bind`) or removed: checked as AMQP
    /// checks `queue.bind` / `exchange.bind` ([`crate::access::authz::Access::binding`]).
    pub fn grant_binding(&self, key: &str, bind: bool) -> Result<BindingGrant, ApiError> {
        let b = &self.proof;
        let topic =
            self.ctx.broker.routing().exchange(&b.vhost, &b.source).is_some_and(|x| x.kind == ExchangeKind::Topic);
        let destination = match &b.destination {
            BindingDestination::Queue(q) => BoundTo::Queue(q),
            BindingDestination::Exchange(x) => BoundTo::Exchange(x),
        };
        let request = BindingRequest { source: &b.source, topic, destination, key, bind };
        self.decisions(&b.vhost).binding(&request).map_err(route_refused)?;
        Ok(BindingGrant(()))
    }
}

// ----- checks made with the body ---------------------------------------------------------

impl<C: InVhost> Permitted<C> {
    /// `perm` on the queue or exchange `name` of the proven virtual host.
    pub fn resource(&self, kind: ResourceKind, name: &str, perm: Permission) -> Result<(), ApiError> {
        self.decisions(self.proof.vhost()).resource(kind, name, perm).map_err(refused)
    }

    /// A route into `exchange` (an alternate or dead-letter exchange), as over AMQP
    /// ([`crate::access::authz::Access::route_into`]).
    pub fn route_into(&self, exchange: &str) -> Result<(), ApiError> {
        self.decisions(self.proof.vhost()).route_into(exchange).map_err(route_refused)
    }

    /// A publish to `exchange` with `key`, as over AMQP ([`crate::access::authz::Access::publish`]).
    pub fn publish(&self, exchange: &str, topic: bool, key: &str) -> Result<(), ApiError> {
        self.decisions(self.proof.vhost()).publish(exchange, topic, key).map_err(refused)
    }
}

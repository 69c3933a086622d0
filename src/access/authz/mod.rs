//! Authorization: what a logged-in client may do, for both protocols, in one policy.
//!
//! - AMQP, RabbitMQ's model ([`permissions`]): per user and virtual host, `configure`,
//!   `write` and `read` regular expressions over exchange and queue names, and topic
//!   permissions (`write` / `read` expressions over routing keys, per topic exchange).
//! - MQTT ([`rules`]): topic rules, first match wins, from `[[auth.rules]]`, Mosquitto's
//!   `acl_file` ([`mosquitto_acl`]), EMQX's `acl.conf` ([`emqx_acl`]) or the management API.
//!
//! The two meet at the MQTT exchange: an MQTT publish to `a/b` is a write to that exchange
//! with routing key `a.b`. An MQTT request no rule decides falls back to the user's
//! RabbitMQ permissions on the MQTT exchange (as RabbitMQ's MQTT plugin checks them); an
//! AMQP publish or binding on the MQTT exchange must also pass the MQTT rules that match it.
//! With authorization off for a protocol everything is allowed there, as before.
//!
//! The checks that combine several of these (a binding, a route into an exchange, a
//! publish, reading a stored message) are [`checks`], shared by AMQP and the management API.
//!
//! Each connection keeps an [`Access`]: the policy snapshot it decides with and a cache of
//! its decisions, dropped when the policy changes (a generation counter), so a publish
//! costs one hash lookup however many rules there are.

pub(crate) mod checks;
pub(crate) mod emqx_acl;
pub(crate) mod mosquitto_acl;
pub(crate) mod permissions;
pub(crate) mod rules;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::access::auth::FileError;
use crate::composition::config::{AuthSection, ConfigError};
use crate::core::message::mqtt_to_key;
use crate::core::store::{AccessRecords, PermissionRecord, TopicPermissionRecord};
pub(crate) use checks::{BindingRequest, BoundTo, RouteRefused};
pub(crate) use permissions::{Permission, ResourceKind, TopicPermissions, VhostPermissions};
pub(crate) use rules::{Actions, Permit, Request, Rule, RuleEntry};

/// The virtual host MQTT clients live in.
pub(crate) const MQTT_VHOST: &str = "/";

/// Who is asking: what rules and permissions are matched against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The user (`None`: an anonymous MQTT client).
    pub user: Option<String>,
    /// The user's tags (a rule's `group`).
    pub groups: Vec<String>,
    /// MQTT client id; AMQP's `client_id` client property.
    pub client_id: String,
    /// Source address.
    pub peer: Option<IpAddr>,
    /// Common name of the client's TLS certificate.
    pub cert_cn: Option<String>,
}

/// Everything decisions are made from; replaced as a whole when anything changes.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The tags of the users FerryMQ knows, the groups rules name: kept here so that a
    /// change of a user's tags reaches the open connections as a rule change does.
    pub user_tags: BTreeMap<String, Vec<String>>,
    /// RabbitMQ permissions by (vhost, user).
    pub permissions: BTreeMap<(String, String), VhostPermissions>,
    /// RabbitMQ topic permissions by (vhost, user, exchange).
    pub topic_permissions: BTreeMap<(String, String, String), TopicPermissions>,
    /// MQTT rules from `[[auth.rules]]` or, once set through the API, the API's.
    pub rules: Vec<Rule>,
    /// `rules` as written.
    pub rule_entries: Vec<RuleEntry>,
    /// MQTT rules from the ACL files (after `rules`).
    pub file_rules: Vec<Rule>,
    /// The MQTT exchange (in [`MQTT_VHOST`]).
    pub mqtt_exchange: String,
    /// `rules` were set through the management API (they replace `[[auth.rules]]`).
    pub api_rules: bool,
    /// The RabbitMQ permissions are enforced (`auth.authorization`): only then does an
    /// MQTT request no rule decides fall back to them (with only an ACL file, what no
    /// line grants is refused, as Mosquitto).
    pub permissions_enforced: bool,
}

/// The rules of `[[auth.rules]]` entries; the error names the entry.
pub(crate) fn rules_of(entries: &[RuleEntry]) -> Result<Vec<Rule>, String> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| Rule::from_entry(e).map_err(|err| format!("rule {}: {err}", i + 1)))
        .collect()
}

/// Checks the access entries of `[auth]` as the policy compiles them: every MQTT rule,
/// permission and topic permission. The error names the key and the entry.
pub(crate) fn check_entries(auth: &AuthSection) -> Result<(), ConfigError> {
    rules_of(&auth.rules).map_err(|e| ConfigError::invalid("auth.rules", e))?;
    for p in &auth.permissions {
        VhostPermissions::new(&p.configure, &p.write, &p.read).map_err(|e| {
            ConfigError::invalid("auth.permissions", format!("user `{}` in vhost `{}`: {e}", p.user, p.vhost))
        })?;
    }
    for p in &auth.topic_permissions {
        TopicPermissions::new(&p.write, &p.read).map_err(|e| {
            ConfigError::invalid("auth.topic_permissions", format!("user `{}` on `{}`: {e}", p.user, p.exchange))
        })?;
    }
    Ok(())
}

/// The rules of `auth.mosquitto_acl_file`, then of `auth.emqx_acl_file`, then, with a
/// Mosquitto file, Mosquitto's grant of every subscription (last, so that no rule before
/// it is shadowed: an EMQX subscribe deny still refuses).
pub(crate) fn file_rules(auth: &AuthSection) -> Result<Vec<Rule>, FileError> {
    let mut rules = Vec::new();
    if let Some(path) = &auth.mosquitto_acl_file {
        rules.extend(mosquitto_acl::read(path)?);
    }
    if let Some(path) = &auth.emqx_acl_file {
        rules.extend(emqx_acl::read(path)?);
    }
    if auth.mosquitto_acl_file.is_some() {
        rules.push(mosquitto_acl::every_subscription());
    }
    Ok(rules)
}

impl Policy {
    /// The policy at start: permissions from the configuration (with authorization off,
    /// `.*` for every configured user in every configured vhost, as before; on, only the
    /// default user has them, and `auth.permissions`), stored ones over them; the MQTT
    /// rules of the API if ever set, else `[[auth.rules]]`; then the ACL files' rules.
    pub fn load(auth: &AuthSection, mqtt_exchange: &str, stored: &AccessRecords) -> anyhow::Result<Policy> {
        let mut p = Policy {
            mqtt_exchange: mqtt_exchange.to_owned(),
            permissions_enforced: auth.authorization,
            ..Policy::default()
        };
        let all = || VhostPermissions::new(".*", ".*", ".*").expect("`.*` compiles");
        let granted: Vec<String> = if auth.authorization {
            (!auth.default_user.is_empty()).then(|| auth.default_user.clone()).into_iter().collect()
        } else {
            auth.all_users().into_iter().map(|u| u.name).collect()
        };
        for user in &granted {
            for vhost in &auth.vhosts {
                p.permissions.insert((vhost.clone(), user.clone()), all());
            }
        }
        let records = auth.permissions.iter().map(|e| PermissionRecord {
            vhost: e.vhost.clone(),
            user: e.user.clone(),
            configure: e.configure.clone(),
            write: e.write.clone(),
            read: e.read.clone(),
            cleared: false,
        });
        for r in records.chain(stored.permissions.iter().cloned()) {
            p.set_permission(&r).map_err(anyhow::Error::msg)?;
        }
        let topic = auth.topic_permissions.iter().map(|e| TopicPermissionRecord {
            vhost: e.vhost.clone(),
            user: e.user.clone(),
            exchange: e.exchange.clone(),
            write: e.write.clone(),
            read: e.read.clone(),
        });
        for r in topic.chain(stored.topic_permissions.iter().cloned()) {
            p.set_topic_permission(&r).map_err(anyhow::Error::msg)?;
        }
        match &stored.mqtt_rules {
            Some(json) => {
                let entries: Vec<RuleEntry> = serde_json::from_str(json)?;
                p.rules = rules_of(&entries).map_err(anyhow::Error::msg)?;
                p.rule_entries = entries;
                p.api_rules = true;
            }
            None => {
                p.rules = rules_of(&auth.rules).map_err(|e| anyhow::anyhow!("auth.rules: {e}"))?;
                p.rule_entries = auth.rules.clone();
            }
        }
        p.file_rules = file_rules(auth)?;
        Ok(p)
    }

    /// Sets a user's permissions in a vhost, or clears them (a tombstone, RabbitMQ's
    /// `clear_permissions`). Three empty expressions still open the vhost, as RabbitMQ's.
    pub fn set_permission(&mut self, r: &PermissionRecord) -> Result<(), String> {
        let key = (r.vhost.clone(), r.user.clone());
        if r.cleared {
            self.permissions.remove(&key);
        } else {
            self.permissions.insert(key, VhostPermissions::new(&r.configure, &r.write, &r.read)?);
        }
        Ok(())
    }

    /// Sets a user's topic permissions on an exchange.
    pub fn set_topic_permission(&mut self, r: &TopicPermissionRecord) -> Result<(), String> {
        let key = (r.vhost.clone(), r.user.clone(), r.exchange.clone());
        self.topic_permissions.insert(key, TopicPermissions::new(&r.write, &r.read)?);
        Ok(())
    }

    /// The permissions as records, in (vhost, user) order.
    pub fn permission_records(&self) -> Vec<PermissionRecord> {
        self.permissions
            .iter()
            .map(|((vhost, user), p)| PermissionRecord {
                vhost: vhost.clone(),
                user: user.clone(),
                configure: p.source[0].clone(),
                write: p.source[1].clone(),
                read: p.source[2].clone(),
                cleared: false,
            })
            .collect()
    }

    /// The topic permissions as records, in (vhost, user, exchange) order.
    pub fn topic_permission_records(&self) -> Vec<TopicPermissionRecord> {
        self.topic_permissions
            .iter()
            .map(|((vhost, user, exchange), t)| TopicPermissionRecord {
                vhost: vhost.clone(),
                user: user.clone(),
                exchange: exchange.clone(),
                write: t.write.clone(),
                read: t.read.clone(),
            })
            .collect()
    }

    fn mqtt_rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().chain(self.file_rules.iter())
    }

    fn decide_rules(&self, id: &Identity, request: Request<'_>) -> Option<Permit> {
        self.mqtt_rules().find_map(|r| r.decide(id, request))
    }

    /// True when `user` may open `vhost` (has permissions there).
    pub fn vhost_access(&self, user: &str, vhost: &str) -> bool {
        self.permissions.contains_key(&(vhost.to_owned(), user.to_owned()))
    }

    /// RabbitMQ's resource check.
    fn resource(&self, user: &str, vhost: &str, name: &str, perm: Permission) -> bool {
        self.permissions.get(&(vhost.to_owned(), user.to_owned())).is_some_and(|p| p.allows(perm, name))
    }

    /// RabbitMQ's topic check: no topic permission on the exchange allows everything.
    fn topic(&self, id: &Identity, vhost: &str, exchange: &str, key: &str, perm: Permission) -> bool {
        let Some(user) = id.user.as_deref() else { return true };
        match self.topic_permissions.get(&(vhost.to_owned(), user.to_owned(), exchange.to_owned())) {
            None => true,
            Some(t) => t.allows(perm, key, user, vhost, &id.client_id),
        }
    }

    /// An MQTT request: the first matching rule, else the user's RabbitMQ permissions on
    /// the MQTT exchange, else refused.
    fn mqtt(&self, id: &Identity, request: Request<'_>) -> bool {
        if let Some(permit) = self.decide_rules(id, request) {
            return permit == Permit::Allow;
        }
        let Some(user) = id.user.as_deref().filter(|_| self.permissions_enforced) else { return false };
        let x = &self.mqtt_exchange;
        match request {
            Request::Publish(t) => {
                self.resource(user, MQTT_VHOST, x, Permission::Write)
                    && self.topic(id, MQTT_VHOST, x, &mqtt_to_key(t), Permission::Write)
            }
            Request::Subscribe(f) => {
                self.resource(user, MQTT_VHOST, x, Permission::Read)
                    && self.topic(id, MQTT_VHOST, x, &filter_to_key(f), Permission::Read)
            }
            Request::Receive(_) | Request::Bind(_) => self.resource(user, MQTT_VHOST, x, Permission::Read),
        }
    }
}

/// How many of the topics a filter matches a client may publish or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Every one.
    All,
    /// Some, not all.
    Part,
    /// None.
    Nothing,
}

impl Policy {
    /// How many of the topics `filter` matches `id` may publish (`action` [`Actions::PUBLISH`])
    /// or receive ([`Actions::RECEIVE`]): the rules in order (the first that decides a topic
    /// wins), then, for the topics no rule decides, the user's RabbitMQ permissions on the
    /// MQTT exchange, as [`Policy::mqtt`] decides one topic.
    fn reach(&self, id: &Identity, action: Actions, filter: &str) -> Reach {
        let (mut some_allowed, mut some_denied) = (false, false);
        for rule in self.mqtt_rules() {
            match rule.reach(id, action, filter) {
                None => {}
                Some((Permit::Allow, true)) => return if some_denied { Reach::Part } else { Reach::All },
                Some((Permit::Deny, true)) => return if some_allowed { Reach::Part } else { Reach::Nothing },
                Some((Permit::Allow, false)) => some_allowed = true,
                Some((Permit::Deny, false)) => some_denied = true,
            }
        }
        let rest_allowed = match id.user.as_deref().filter(|_| self.permissions_enforced) {
            None => false,
            Some(user) => {
                let (x, key) = (&self.mqtt_exchange, filter_to_key(filter));
                let perm = if action == Actions::PUBLISH { Permission::Write } else { Permission::Read };
                self.resource(user, MQTT_VHOST, x, perm) && self.topic(id, MQTT_VHOST, x, &key, perm)
            }
        };
        match (rest_allowed, some_allowed, some_denied) {
            (true, _, false) => Reach::All,
            (false, false, _) => Reach::Nothing,
            _ => Reach::Part,
        }
    }
}

/// An MQTT filter as a binding key (`+` is `*`).
pub(crate) fn filter_to_key(filter: &str) -> String {
    mqtt_to_key(filter).split('.').map(|w| if w == "+" { "*" } else { w }).collect::<Vec<_>>().join(".")
}

/// A binding key as an MQTT filter (`*` is `+`).
pub(crate) fn key_to_filter(key: &str) -> String {
    mqtt_to_key(key).split('/').map(|w| if w == "*" { "+" } else { w }).collect::<Vec<_>>().join("/")
}

/// Where authorization is on, and the policy; shared by every connection and the API.
#[derive(Debug)]
pub struct Authorizer {
    amqp: bool,
    mqtt: bool,
    policy: RwLock<Arc<Policy>>,
    generation: AtomicU64,
}

impl Authorizer {
    /// An authorizer deciding with `policy`; `amqp` / `mqtt` say where it is on.
    pub fn new(amqp: bool, mqtt: bool, policy: Policy) -> Arc<Authorizer> {
        Arc::new(Authorizer { amqp, mqtt, policy: RwLock::new(Arc::new(policy)), generation: AtomicU64::new(0) })
    }

    /// Authorization off everywhere (every request allowed).
    pub fn off() -> Arc<Authorizer> {
        Authorizer::new(false, false, Policy::default())
    }

    /// True when AMQP requests are checked.
    pub fn amqp_enabled(&self) -> bool {
        self.amqp
    }

    /// True when MQTT requests are checked.
    pub fn mqtt_enabled(&self) -> bool {
        self.mqtt
    }

    /// The current policy.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().clone()
    }

    /// Changes the policy; every connection decides with the new one from its next request.
    pub fn update<T>(&self, change: impl FnOnce(&mut Policy) -> T) -> T {
        let mut guard = self.policy.write();
        let mut next = Policy::clone(&guard);
        let out = change(&mut next);
        *guard = Arc::new(next);
        self.generation.fetch_add(1, Ordering::Release);
        out
    }

    /// How many of the topics of `filter` the MQTT client `id` may publish (`publish`) or
    /// subscribe to and receive (always all with MQTT authorization off): what a bridge's
    /// local side is checked with at start.
    pub fn mqtt_reach(&self, mut id: Identity, publish: bool, filter: &str) -> Reach {
        if !self.mqtt {
            return Reach::All;
        }
        let policy = self.policy();
        if let Some(tags) = id.user.as_ref().and_then(|u| policy.user_tags.get(u)) {
            id.groups.clone_from(tags);
        }
        if publish {
            return policy.reach(&id, Actions::PUBLISH, filter);
        }
        if !policy.mqtt(&id, Request::Subscribe(filter)) {
            return Reach::Nothing;
        }
        policy.reach(&id, Actions::RECEIVE, filter)
    }

    /// True when `user` may open `vhost` (always, with AMQP authorization off).
    pub fn vhost_access(&self, user: &str, vhost: &str) -> bool {
        !self.amqp || self.policy.read().vhost_access(user, vhost)
    }

    /// A connection's view, deciding for `id` in `vhost`.
    pub fn access(self: &Arc<Self>, id: Identity, vhost: &str) -> Access {
        let mut access = Access {
            authz: self.clone(),
            generation: self.generation.load(Ordering::Acquire),
            policy: self.policy(),
            id,
            vhost: vhost.to_owned(),
            cache: Cache::default(),
        };
        access.take_groups();
        access
    }
}

/// Decisions cached per connection (cleared when full: a client cycling through many
/// topics pays the rule walk again, nothing grows without bound).
const CACHE_LIMIT: usize = 4096;

/// A connection's cached decisions, looked up by `&str` (no allocation on a hit).
#[derive(Debug, Default)]
struct Cache {
    /// MQTT publish / subscribe / receive / bind by topic or filter, and receive by
    /// routing key.
    mqtt: [HashMap<String, bool>; 5],
    /// Resource checks by (permission, kind), by name.
    resources: [HashMap<String, bool>; 6],
    /// Topic checks by permission (write, read), by exchange, by routing key.
    topics: [HashMap<String, HashMap<String, bool>>; 2],
    entries: usize,
}

impl Cache {
    fn note(&mut self) {
        self.entries += 1;
        if self.entries > CACHE_LIMIT {
            *self = Cache::default();
        }
    }
}

fn perm_index(perm: Permission) -> usize {
    match perm {
        Permission::Configure => 0,
        Permission::Write => 1,
        Permission::Read => 2,
    }
}

/// A refused AMQP request: RabbitMQ's text (after `ACCESS_REFUSED - `).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// One connection's decisions.
#[derive(Debug)]
pub struct Access {
    authz: Arc<Authorizer>,
    generation: u64,
    policy: Arc<Policy>,
    id: Identity,
    vhost: String,
    cache: Cache,
}

impl Access {
    /// Who this connection is.
    pub fn identity(&self) -> &Identity {
        &self.id
    }

    /// Picks up a changed policy (and forgets what was decided with the old one).
    fn refresh(&mut self) {
        let now = self.authz.generation.load(Ordering::Acquire);
        if now != self.generation {
            self.generation = now;
            self.policy = self.authz.policy();
            self.cache = Cache::default();
            self.take_groups();
        }
    }

    /// The user's groups as the policy knows them now (its tags).
    fn take_groups(&mut self) {
        if let Some(tags) = self.id.user.as_ref().and_then(|u| self.policy.user_tags.get(u)) {
            self.id.groups.clone_from(tags);
        }
    }

    /// An MQTT request (always allowed with MQTT authorization off).
    pub fn mqtt(&mut self, request: Request<'_>) -> bool {
        if !self.authz.mqtt {
            return true;
        }
        self.refresh();
        let (i, s) = match request {
            Request::Publish(s) => (0, s),
            Request::Subscribe(s) => (1, s),
            Request::Receive(s) => (2, s),
            Request::Bind(s) => (4, s),
        };
        if let Some(&d) = self.cache.mqtt[i].get(s) {
            return d;
        }
        let d = self.policy.mqtt(&self.id, request);
        self.cache.mqtt[i].insert(s.to_owned(), d);
        self.cache.note();
        d
    }

    /// An MQTT receive of a message with routing key `key` (`a.b` for topic `a/b`):
    /// cached by key, so a repeated topic costs one lookup and no conversion.
    pub fn mqtt_receive(&mut self, key: &str) -> bool {
        if !self.authz.mqtt {
            return true;
        }
        self.refresh();
        if let Some(&d) = self.cache.mqtt[3].get(key) {
            return d;
        }
        let d = self.policy.mqtt(&self.id, Request::Receive(&mqtt_to_key(key)));
        self.cache.mqtt[3].insert(key.to_owned(), d);
        self.cache.note();
        d
    }

    fn user(&self) -> &str {
        self.id.user.as_deref().unwrap_or_default()
    }

    /// RabbitMQ's resource check: `perm` on the exchange or queue `name` (the default
    /// exchange is `amq.default`).
    pub fn resource(&mut self, kind: ResourceKind, name: &str, perm: Permission) -> Result<(), Refused> {
        if !self.authz.amqp {
            return Ok(());
        }
        self.refresh();
        let name = if kind == ResourceKind::Exchange && name.is_empty() { "amq.default" } else { name };
        let i = perm_index(perm) * 2 + usize::from(kind == ResourceKind::Queue);
        let ok = match self.cache.resources[i].get(name) {
            Some(&d) => d,
            None => {
                let d = self.policy.resource(self.user(), &self.vhost, name, perm);
                self.cache.resources[i].insert(name.to_owned(), d);
                self.cache.note();
                d
            }
        };
        ok.then_some(()).ok_or_else(|| {
            Refused(format!(
                "{} access to {} '{name}' in vhost '{}' refused for user '{}'",
                perm.name(),
                kind.name(),
                self.vhost,
                self.user()
            ))
        })
    }

    /// RabbitMQ's topic check on a topic exchange (`write` when publishing, `read` when
    /// binding), and on the MQTT exchange the MQTT rules that decide the same request.
    pub fn topic(&mut self, exchange: &str, key: &str, perm: Permission) -> Result<(), Refused> {
        let mqtt = self.authz.mqtt && self.vhost == MQTT_VHOST && exchange == self.policy.mqtt_exchange;
        if !self.authz.amqp && !mqtt {
            return Ok(());
        }
        self.refresh();
        let i = usize::from(perm != Permission::Write);
        let cached = self.cache.topics[i].get(exchange).and_then(|keys| keys.get(key)).copied();
        let ok = match cached {
            Some(d) => d,
            None => {
                let d = self.decide_topic(exchange, key, perm, mqtt);
                self.cache.topics[i].entry(exchange.to_owned()).or_default().insert(key.to_owned(), d);
                self.cache.note();
                d
            }
        };
        ok.then_some(()).ok_or_else(|| {
            Refused(format!(
                "{} access to topic '{key}' in exchange '{exchange}' in vhost '{}' refused for user '{}'",
                perm.name(),
                self.vhost,
                self.user()
            ))
        })
    }

    fn decide_topic(&self, exchange: &str, key: &str, perm: Permission, mqtt: bool) -> bool {
        let p = &self.policy;
        if self.authz.amqp && !p.topic(&self.id, &self.vhost, exchange, key, perm) {
            return false;
        }
        if !mqtt {
            return true;
        }
        let decided = if perm == Permission::Write {
            p.decide_rules(&self.id, Request::Publish(&mqtt_to_key(key)))
        } else {
            p.decide_rules(&self.id, Request::Bind(&key_to_filter(key)))
        };
        decided != Some(Permit::Deny)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rules::{Actions, TopicPattern, Who};

    fn policy() -> Policy {
        let mut p = Policy { mqtt_exchange: "amq.topic".into(), permissions_enforced: true, ..Policy::default() };
        p.permissions.insert(
            ("/".into(), "app".into()),
            VhostPermissions::new("^app\\.", "^(amq\\.topic|app\\..*)$", "^app\\.").unwrap(),
        );
        p.topic_permissions.insert(
            ("/".into(), "app".into(), "amq.topic".into()),
            TopicPermissions::new("^devices\\.{username}\\.", "^devices\\.").unwrap(),
        );
        p.rules.push(Rule {
            permit: Permit::Deny,
            who: Who::All,
            actions: Actions::ALL,
            topics: vec![TopicPattern::Filter("devices/secret/#".into())],
        });
        p.rules.push(Rule {
            permit: Permit::Allow,
            who: Who::Anonymous,
            actions: Actions::READ,
            topics: vec![TopicPattern::Filter("public/#".into())],
        });
        p
    }

    fn app() -> Identity {
        Identity { user: Some("app".into()), ..Identity::default() }
    }

    #[test]
    fn amqp_resources_and_topics() {
        let a = Authorizer::new(true, true, policy());
        let mut access = a.access(app(), "/");
        assert_eq!(access.resource(ResourceKind::Queue, "app.q", Permission::Configure), Ok(()));
        let refused = access.resource(ResourceKind::Exchange, "", Permission::Write).unwrap_err();
        assert_eq!(refused.0, "write access to exchange 'amq.default' in vhost '/' refused for user 'app'");
        assert_eq!(access.topic("amq.topic", "devices.app.t", Permission::Write), Ok(()));
        let refused = access.topic("amq.topic", "devices.bob.t", Permission::Write).unwrap_err();
        assert_eq!(
            refused.0,
            "write access to topic 'devices.bob.t' in exchange 'amq.topic' in vhost '/' refused for user 'app'"
        );
        // The MQTT rule denying devices/secret/# also governs AMQP on the MQTT exchange.
        assert!(access.topic("amq.topic", "devices.secret.x", Permission::Read).is_err());
        assert!(a.vhost_access("app", "/"));
        assert!(!a.vhost_access("app", "other"));
    }

    #[test]
    fn mqtt_rules_then_rabbitmq_permissions() {
        let a = Authorizer::new(true, true, policy());
        let mut app = a.access(app(), MQTT_VHOST);
        // No rule matches: the user's permissions on amq.topic decide (topic key devices.app.t).
        assert!(app.mqtt(Request::Publish("devices/app/t")));
        assert!(!app.mqtt(Request::Publish("devices/bob/t")));
        assert!(!app.mqtt(Request::Publish("devices/secret/x")));
        let mut anon = a.access(Identity::default(), MQTT_VHOST);
        assert!(anon.mqtt(Request::Subscribe("public/#")));
        assert!(anon.mqtt(Request::Receive("public/news")));
        assert!(!anon.mqtt(Request::Publish("public/news")));
        assert!(!anon.mqtt(Request::Subscribe("#")));
    }

    #[test]
    fn a_policy_change_reaches_open_connections() {
        let a = Authorizer::new(false, true, policy());
        let mut anon = a.access(Identity::default(), MQTT_VHOST);
        assert!(!anon.mqtt(Request::Publish("public/news")));
        a.update(|p| {
            p.rules.insert(
                0,
                Rule {
                    permit: Permit::Allow,
                    who: Who::All,
                    actions: Actions::PUBLISH,
                    topics: vec![TopicPattern::Filter("public/#".into())],
                },
            )
        });
        assert!(anon.mqtt(Request::Publish("public/news")));
        // AMQP authorization off: resources are not checked.
        let mut amqp = a.access(app(), "/");
        assert_eq!(amqp.resource(ResourceKind::Queue, "x", Permission::Configure), Ok(()));
    }

    #[test]
    fn an_amqp_binding_on_the_mqtt_exchange_may_not_reach_a_denied_topic() {
        let acl = "user alice\ntopic read sensors/#\ntopic deny sensors/secret\n";
        let mut p = policy();
        p.rules = mosquitto_acl::parse("acl", acl).unwrap();
        p.rules.push(mosquitto_acl::every_subscription());
        p.permissions.insert(("/".into(), "alice".into()), VhostPermissions::new(".*", ".*", ".*").unwrap());
        let a = Authorizer::new(true, true, p);
        let mut alice = a.access(Identity { user: Some("alice".into()), ..Identity::default() }, "/");
        // MQTT: granted and filtered at delivery, as Mosquitto.
        assert!(alice.mqtt(Request::Subscribe("sensors/#")));
        assert!(!alice.mqtt(Request::Receive("sensors/secret")));
        // AMQP deliveries are not filtered: a binding that would receive it is refused.
        assert!(alice.topic("amq.topic", "sensors.#", Permission::Read).is_err());
        assert!(alice.topic("amq.topic", "sensors.secret", Permission::Read).is_err());
        assert_eq!(alice.topic("amq.topic", "sensors.room1", Permission::Read), Ok(()));
    }

    #[test]
    fn the_reach_of_a_filter_under_an_acl_file() {
        let acl = "user bridge\ntopic readwrite #\ntopic deny secret/#\nuser partial\ntopic read a/#\n";
        let mut p = Policy { mqtt_exchange: "amq.topic".into(), ..Policy::default() };
        p.file_rules = mosquitto_acl::parse("acl", acl).unwrap();
        p.file_rules.push(mosquitto_acl::every_subscription());
        let a = Authorizer::new(false, true, p);
        let id = |user: Option<&str>| Identity { user: user.map(str::to_owned), ..Identity::default() };
        // Anonymous: subscribing is granted (Mosquitto's way), receiving and publishing nothing.
        assert_eq!(a.mqtt_reach(id(None), true, "#"), Reach::Nothing);
        assert_eq!(a.mqtt_reach(id(None), false, "#"), Reach::Nothing);
        // The bridge's user: everything but what a deny line takes out.
        assert_eq!(a.mqtt_reach(id(Some("bridge")), true, "#"), Reach::Part);
        assert_eq!(a.mqtt_reach(id(Some("bridge")), false, "sensors/#"), Reach::All);
        assert_eq!(a.mqtt_reach(id(Some("bridge")), true, "secret/+"), Reach::Nothing);
        assert_eq!(a.mqtt_reach(id(Some("partial")), false, "#"), Reach::Part);
        assert_eq!(a.mqtt_reach(id(Some("partial")), false, "a/b/#"), Reach::All);
        assert_eq!(a.mqtt_reach(id(Some("partial")), true, "a/#"), Reach::Nothing);
        // MQTT authorization off: all.
        assert_eq!(Authorizer::off().mqtt_reach(id(None), true, "#"), Reach::All);
        // Without rules deciding, the user's permissions on the MQTT exchange (topic keys).
        let a = Authorizer::new(true, true, policy());
        assert_eq!(a.mqtt_reach(app(), true, "devices/app/#"), Reach::All);
        assert_eq!(a.mqtt_reach(app(), true, "devices/bob/#"), Reach::Nothing);
        assert_eq!(a.mqtt_reach(app(), false, "devices/#"), Reach::Nothing, "no read permission on amq.topic");
    }

    #[test]
    fn filters_and_keys() {
        assert_eq!(filter_to_key("a/+/#"), "a.*.#");
        assert_eq!(key_to_filter("a.*.#"), "a/+/#");
        assert_eq!(filter_to_key("a.b/c"), "a/b.c");
    }
}

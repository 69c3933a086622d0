//! Opt-in message de-duplication, on the conventions of the rabbitmq-message-deduplication
//! plugin: an exchange of type `x-message-deduplication` routes a message that carries the
//! header `x-deduplication-header` only once per value while the value is in its cache,
//! and a queue declared with `x-message-deduplication: true` refuses a message whose
//! value is already in the queue. Without either, message ids and headers are never
//! compared: they are application data.
//!
//! An exchange's cache holds at most `x-cache-size` values (when full, the value that
//! expires first makes room), each for `x-cache-ttl` ms (exchange argument, or the
//! message's own `x-cache-ttl` header; none: until evicted). With
//! `x-cache-persistence: disk` the values are kept in the
//! [`DedupStore`](crate::core::store::DedupStore), written with the message they came
//! with, so the cache survives restarts; `memory` (the default) starts empty after one.
//!
//! This module owns the arguments, the header and the caches themselves, and uses nothing
//! of the core but header values: the routing table and the queues hold it. The broker
//! commits the caches' changes ([`Broker::dedup_write`]) and fills them at start-up
//! ([`Broker::restore_dedup_caches`]).
//!
//! [`Broker::dedup_write`]: super::broker::Broker::dedup_write
//! [`Broker::restore_dedup_caches`]: super::broker::Broker::restore_dedup_caches

use std::collections::{BTreeSet, HashMap};

use parking_lot::Mutex;

use super::value::Value;

/// The exchange type name.
pub(crate) const EXCHANGE_TYPE: &str = "x-message-deduplication";
/// The message header whose value is de-duplicated.
pub(crate) const HEADER: &str = "x-deduplication-header";
/// Exchange argument (and message header) giving how long a value is kept, ms.
pub(crate) const CACHE_TTL: &str = "x-cache-ttl";
/// Exchange argument: most values in the cache (required).
pub(crate) const CACHE_SIZE: &str = "x-cache-size";
/// Exchange argument: `memory` (default) or `disk`.
pub(crate) const CACHE_PERSISTENCE: &str = "x-cache-persistence";
/// Queue argument turning queue-level de-duplication on.
pub(crate) const QUEUE_ARGUMENT: &str = "x-message-deduplication";

/// Expiry of a value kept until evicted.
const NEVER: u64 = u64::MAX;

/// Why de-duplication arguments are refused (the text follows the plugin's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DedupArgError {
    /// `x-cache-size` is missing or not a positive integer.
    #[error("Missing or invalid argument, '{CACHE_SIZE}' must be an integer greater than 0")]
    CacheSize,
    /// `x-cache-ttl` is not a non-negative integer.
    #[error("Invalid argument, '{CACHE_TTL}' must be an integer greater than or equal to 0")]
    CacheTtl,
    /// `x-cache-persistence` is neither `memory` nor `disk`.
    #[error("Invalid argument, '{CACHE_PERSISTENCE}' must be either 'disk' or 'memory'")]
    Persistence,
}

/// A change of a disk-persistent cache the core stores with the publish that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupChange {
    /// `id` is in the cache of `scope` until `expiry_ms` (`u64::MAX`: until evicted).
    Seen {
        /// The exchange's store scope ([`DedupCache::scope`]).
        scope: String,
        /// The header value.
        id: String,
        /// When it leaves the cache.
        expiry_ms: u64,
    },
    /// `id` left the cache of `scope` (expired or evicted).
    Forgotten {
        /// The exchange's store scope.
        scope: String,
        /// The header value.
        id: String,
    },
}

/// The settings of a de-duplication exchange, from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Most values kept.
    pub size: usize,
    /// Default time a value is kept, ms (`None`: until evicted).
    pub ttl_ms: Option<u64>,
    /// Values are stored and survive restarts.
    pub disk: bool,
}

impl CacheSettings {
    /// Reads and checks an exchange's `x-cache-*` arguments.
    pub fn from_arguments(args: &[(String, Value)]) -> Result<CacheSettings, DedupArgError> {
        let arg = |name: &str| args.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let size = arg(CACHE_SIZE)
            .and_then(Value::as_i64)
            .filter(|n| *n > 0)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(DedupArgError::CacheSize)?;
        let ttl_ms = match arg(CACHE_TTL) {
            None => None,
            Some(v) => Some(v.as_i64().and_then(|n| u64::try_from(n).ok()).ok_or(DedupArgError::CacheTtl)?),
        };
        let disk = match arg(CACHE_PERSISTENCE).map(|v| v.as_str()) {
            None | Some(Some("memory")) => false,
            Some(Some("disk")) => true,
            Some(_) => return Err(DedupArgError::Persistence),
        };
        Ok(CacheSettings { size, ttl_ms, disk })
    }
}

/// The value a message is de-duplicated by: its `x-deduplication-header` header as text.
pub(crate) fn message_key(headers: &[(String, Value)]) -> Option<String> {
    let (_, v) = headers.iter().find(|(k, _)| k == HEADER)?;
    Some(match v {
        Value::Str(s) => s.clone(),
        Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        other => match other.as_i64() {
            Some(n) => n.to_string(),
            None => format!("{other:?}"),
        },
    })
}

/// The message's own `x-cache-ttl` header, ms.
fn message_ttl(headers: &[(String, Value)]) -> Option<u64> {
    headers.iter().find(|(k, _)| k == CACHE_TTL).and_then(|(_, v)| v.as_i64()).and_then(|n| u64::try_from(n).ok())
}

/// The de-duplication cache of one `x-message-deduplication` exchange.
#[derive(Debug)]
pub struct DedupCache {
    scope: String,
    settings: CacheSettings,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    expiry_of: HashMap<String, u64>,
    by_expiry: BTreeSet<(u64, String)>,
}

impl CacheState {
    fn remove(&mut self, id: &str) {
        if let Some(at) = self.expiry_of.remove(id) {
            self.by_expiry.remove(&(at, id.to_owned()));
        }
    }

    fn insert(&mut self, id: String, expiry: u64) {
        self.remove(&id);
        self.by_expiry.insert((expiry, id.clone()));
        self.expiry_of.insert(id, expiry);
    }
}

impl DedupCache {
    /// An empty cache for exchange `name` of `vhost`.
    pub fn new(vhost: &str, name: &str, settings: CacheSettings) -> DedupCache {
        DedupCache { scope: scope(vhost, name), settings, state: Mutex::new(CacheState::default()) }
    }

    /// The store scope of the exchange's values.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The exchange's settings.
    pub fn settings(&self) -> CacheSettings {
        self.settings
    }

    /// Decides whether a message with `headers` is routed at `now_ms`: true unless its
    /// header value is in the cache. A routed value enters the cache. Changes of a
    /// disk-persistent cache are added to `changes`.
    pub fn admit(&self, headers: &[(String, Value)], now_ms: u64, changes: &mut Vec<DedupChange>) -> bool {
        let Some(id) = message_key(headers) else { return true };
        let mut st = self.state.lock();
        if st.expiry_of.get(&id).is_some_and(|at| *at > now_ms) {
            return false;
        }
        let expiry = match message_ttl(headers).or(self.settings.ttl_ms) {
            Some(ttl) => now_ms.saturating_add(ttl),
            None => NEVER,
        };
        st.remove(&id);
        while st.expiry_of.len() >= self.settings.size {
            let Some((_, oldest)) = st.by_expiry.pop_first() else { break };
            st.expiry_of.remove(&oldest);
            if self.settings.disk {
                changes.push(DedupChange::Forgotten { scope: self.scope.clone(), id: oldest });
            }
        }
        if self.settings.disk {
            changes.push(DedupChange::Seen { scope: self.scope.clone(), id: id.clone(), expiry_ms: expiry });
        }
        st.insert(id, expiry);
        true
    }

    /// Drops the values whose time passed at `now_ms`; returns the changes to store.
    pub fn expire(&self, now_ms: u64) -> Vec<DedupChange> {
        let mut st = self.state.lock();
        let mut changes = Vec::new();
        while st.by_expiry.first().is_some_and(|(at, _)| *at <= now_ms) {
            let Some((_, id)) = st.by_expiry.pop_first() else { break };
            st.expiry_of.remove(&id);
            if self.settings.disk {
                changes.push(DedupChange::Forgotten { scope: self.scope.clone(), id });
            }
        }
        changes
    }

    /// Fills the cache with stored values (at start-up), keeping the ones that expire
    /// last when there are more than fit; returns the changes that forget the others.
    pub fn restore(&self, values: impl IntoIterator<Item = (String, u64)>, now_ms: u64) -> Vec<DedupChange> {
        let mut st = self.state.lock();
        let mut dropped = Vec::new();
        for (id, expiry) in values {
            if expiry > now_ms {
                st.insert(id, expiry);
            } else {
                dropped.push(DedupChange::Forgotten { scope: self.scope.clone(), id });
            }
        }
        while st.expiry_of.len() > self.settings.size {
            let Some((_, oldest)) = st.by_expiry.pop_first() else { break };
            st.expiry_of.remove(&oldest);
            dropped.push(DedupChange::Forgotten { scope: self.scope.clone(), id: oldest });
        }
        dropped
    }

    /// Values in the cache now.
    pub fn len(&self) -> usize {
        self.state.lock().expiry_of.len()
    }

    /// True when the cache holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The store scope of exchange `name` of `vhost` (unambiguous whatever the names hold).
pub(crate) fn scope(vhost: &str, name: &str) -> String {
    format!("x{}:{vhost}{name}", vhost.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    fn with_key(key: &str) -> Vec<(String, Value)> {
        args(&[(HEADER, Value::Str(key.into()))])
    }

    fn cache(size: i64, ttl: Option<i64>, disk: bool) -> DedupCache {
        let mut a = vec![(CACHE_SIZE.to_owned(), Value::Int(size))];
        if let Some(t) = ttl {
            a.push((CACHE_TTL.to_owned(), Value::Int(t)));
        }
        if disk {
            a.push((CACHE_PERSISTENCE.to_owned(), Value::Str("disk".into())));
        }
        DedupCache::new("/", "x", CacheSettings::from_arguments(&a).unwrap())
    }

    #[test]
    fn arguments_follow_the_plugin() {
        assert_eq!(CacheSettings::from_arguments(&[]), Err(DedupArgError::CacheSize), "x-cache-size is required");
        assert_eq!(CacheSettings::from_arguments(&args(&[(CACHE_SIZE, Value::Int(0))])), Err(DedupArgError::CacheSize));
        let ok = CacheSettings::from_arguments(&args(&[(CACHE_SIZE, Value::Int32(10))])).unwrap();
        assert_eq!(ok, CacheSettings { size: 10, ttl_ms: None, disk: false });
        let full = args(&[
            (CACHE_SIZE, Value::Int(10)),
            (CACHE_TTL, Value::Int(500)),
            (CACHE_PERSISTENCE, Value::Str("disk".into())),
        ]);
        assert_eq!(
            CacheSettings::from_arguments(&full).unwrap(),
            CacheSettings { size: 10, ttl_ms: Some(500), disk: true }
        );
        let bad_ttl = args(&[(CACHE_SIZE, Value::Int(1)), (CACHE_TTL, Value::Int(-1))]);
        assert_eq!(CacheSettings::from_arguments(&bad_ttl), Err(DedupArgError::CacheTtl));
        let bad_p = args(&[(CACHE_SIZE, Value::Int(1)), (CACHE_PERSISTENCE, Value::Str("ram".into()))]);
        assert_eq!(CacheSettings::from_arguments(&bad_p), Err(DedupArgError::Persistence));
    }

    #[test]
    fn only_messages_with_the_header_are_compared() {
        let c = cache(10, None, false);
        let mut changes = Vec::new();
        assert!(c.admit(&[], 0, &mut changes));
        assert!(c.admit(&args(&[("message-id", Value::Str("a".into()))]), 0, &mut changes));
        assert!(c.admit(&[], 0, &mut changes), "no header, never a duplicate");
        assert!(c.admit(&with_key("a"), 0, &mut changes));
        assert!(!c.admit(&with_key("a"), 1, &mut changes), "same value: not routed");
        assert!(c.admit(&with_key("b"), 1, &mut changes));
        assert!(changes.is_empty(), "a memory cache stores nothing");
        let int = args(&[(HEADER, Value::Int(42))]);
        assert!(c.admit(&int, 2, &mut changes));
        assert!(!c.admit(&args(&[(HEADER, Value::Int32(42))]), 2, &mut changes), "integers compare by value");
    }

    #[test]
    fn values_expire_after_the_exchange_or_message_ttl() {
        let c = cache(10, Some(100), false);
        let mut changes = Vec::new();
        assert!(c.admit(&with_key("a"), 0, &mut changes));
        assert!(!c.admit(&with_key("a"), 99, &mut changes));
        assert!(c.admit(&with_key("a"), 100, &mut changes), "the exchange's TTL passed");
        let mut own = with_key("b");
        own.push((CACHE_TTL.to_owned(), Value::Int(1000)));
        assert!(c.admit(&own, 0, &mut changes));
        assert!(!c.admit(&with_key("b"), 999, &mut changes), "the message's TTL overrides");
        assert!(c.admit(&with_key("b"), 1000, &mut changes));
        c.expire(5000);
        assert!(c.is_empty());
    }

    #[test]
    fn a_full_cache_makes_room_with_the_value_that_expires_first() {
        let c = cache(2, None, true);
        let mut changes = Vec::new();
        let mut short = with_key("short");
        short.push((CACHE_TTL.to_owned(), Value::Int(10)));
        assert!(c.admit(&short, 0, &mut changes));
        assert!(c.admit(&with_key("long"), 0, &mut changes));
        assert!(c.admit(&with_key("third"), 1, &mut changes));
        assert_eq!(c.len(), 2);
        assert!(!c.admit(&with_key("long"), 2, &mut changes), "'long' stayed");
        assert!(c.admit(&short, 2, &mut changes), "'short' was evicted");
        let scope = c.scope().to_owned();
        assert!(changes.contains(&DedupChange::Forgotten { scope: scope.clone(), id: "short".into() }));
        assert!(changes.contains(&DedupChange::Seen { scope, id: "third".into(), expiry_ms: NEVER }));
    }

    #[test]
    fn a_disk_cache_reports_expiries_and_restores() {
        let c = cache(10, Some(100), true);
        let mut changes = Vec::new();
        assert!(c.admit(&with_key("a"), 0, &mut changes));
        assert_eq!(changes, vec![DedupChange::Seen { scope: c.scope().into(), id: "a".into(), expiry_ms: 100 }]);
        assert_eq!(c.expire(99), vec![]);
        assert_eq!(c.expire(100), vec![DedupChange::Forgotten { scope: c.scope().into(), id: "a".into() }]);

        let restored = cache(1, None, true);
        let dropped =
            restored.restore([("old".to_owned(), 50), ("keep".to_owned(), 500), ("later".to_owned(), 400)], 60);
        assert_eq!(restored.len(), 1, "no more than fit");
        let scope = restored.scope().to_owned();
        assert_eq!(
            dropped,
            vec![
                DedupChange::Forgotten { scope: scope.clone(), id: "old".into() },
                DedupChange::Forgotten { scope, id: "later".into() }
            ],
            "expired and evicted values leave the store"
        );
        assert!(!restored.admit(&with_key("keep"), 70, &mut Vec::new()), "the value expiring last stays");
    }

    #[test]
    fn scopes_do_not_collide() {
        assert_ne!(scope("a/b", "c"), scope("a", "b/c"));
        assert_ne!(scope("/", "x"), scope("", "/x"));
    }
}

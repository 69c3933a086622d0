//! The user store shared by both front-ends and the management API: who may log in (AMQP
//! always, MQTT when `auth.mqtt` is on or a Mosquitto password file is given, HTTP Basic),
//! from where (RabbitMQ's default `guest` user may only connect from loopback), and with
//! which tags. Users come from the configuration, a Mosquitto password file, the
//! management API or an imported definitions file. Passwords are only ever kept hashed: a
//! clear one in the configuration is hashed at load; hashes are verified as RabbitMQ makes
//! them (salted SHA-256 / SHA-512 / MD5) and as `mosquitto_passwd` makes them (`$7$`
//! PBKDF2-SHA512, `$6$` SHA-512), so users move over from either broker as they are.
//! Failed logins are counted per source address and user name and per address; past a
//! limit the next attempts wait before they are answered, and the logins one address may
//! have under way at once are limited ([`LoginThrottle`]). Every clone of a [`Users`] sees the
//! same users.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use indexmap::IndexMap;
use parking_lot::{Mutex, RwLock};
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};

use crate::composition::config::{ConfigError, UserEntry};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Why a login was refused (the text goes into the refusal, as RabbitMQ words it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Unknown user or wrong password.
    #[error(
        "ACCESS_REFUSED - Login was refused using authentication mechanism {0}. For details see the broker logfile."
    )]
    BadCredentials(String),
    /// The user may only connect from loopback.
    #[error("ACCESS_REFUSED - user '{0}' can only connect via localhost")]
    LoopbackOnly(String),
    /// Too many logins from the client's address are under way; refused unchecked.
    #[error("ACCESS_REFUSED - too many logins from this address at once; try again later")]
    TooManyPending,
}

/// The password hashing algorithms FerryMQ verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashingAlgorithm {
    /// `rabbit_password_hashing_sha256` (RabbitMQ's default).
    Sha256,
    /// `rabbit_password_hashing_sha512`.
    Sha512,
    /// `rabbit_password_hashing_md5` (RabbitMQ before 3.6).
    Md5,
    /// A `mosquitto_passwd` hash, `$7$ITERATIONS$SALT$HASH` (PBKDF2-HMAC-SHA512) or
    /// `$6$SALT$HASH` (SHA-512 of password ++ salt), salt and hash in base64.
    Mosquitto,
}

impl HashingAlgorithm {
    /// Parses RabbitMQ's module name, or `mosquitto_passwd` (`None` for one FerryMQ cannot
    /// verify).
    pub fn parse(name: &str) -> Option<HashingAlgorithm> {
        match name {
            "rabbit_password_hashing_sha256" | "" => Some(HashingAlgorithm::Sha256),
            "rabbit_password_hashing_sha512" => Some(HashingAlgorithm::Sha512),
            "rabbit_password_hashing_md5" => Some(HashingAlgorithm::Md5),
            "mosquitto_passwd" => Some(HashingAlgorithm::Mosquitto),
            _ => None,
        }
    }

    /// RabbitMQ's module name (`mosquitto_passwd` for Mosquitto's hashes).
    pub fn name(self) -> &'static str {
        match self {
            HashingAlgorithm::Sha256 => "rabbit_password_hashing_sha256",
            HashingAlgorithm::Sha512 => "rabbit_password_hashing_sha512",
            HashingAlgorithm::Md5 => "rabbit_password_hashing_md5",
            HashingAlgorithm::Mosquitto => "mosquitto_passwd",
        }
    }

    /// RabbitMQ's salted digest: hash(salt ++ password).
    fn digest(self, salt: &[u8], password: &[u8]) -> Vec<u8> {
        let alg = match self {
            HashingAlgorithm::Sha256 => &digest::SHA256,
            HashingAlgorithm::Sha512 | HashingAlgorithm::Mosquitto => &digest::SHA512,
            HashingAlgorithm::Md5 => {
                use md5::Digest;
                let mut h = md5::Md5::new();
                h.update(salt);
                h.update(password);
                return h.finalize().to_vec();
            }
        };
        let mut ctx = digest::Context::new(alg);
        ctx.update(salt);
        ctx.update(password);
        ctx.finish().as_ref().to_vec()
    }
}

/// RabbitMQ's password hash: base64 of a 4-byte salt followed by hash(salt ++ password).
pub fn hash_password(alg: HashingAlgorithm, password: &str) -> String {
    let mut salt = [0u8; 4];
    SystemRandom::new().fill(&mut salt).expect("the system random generator");
    let mut out = salt.to_vec();
    out.extend(alg.digest(&salt, password.as_bytes()));
    B64.encode(out)
}

/// A parsed `mosquitto_passwd` hash.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MosquittoHash {
    /// `$6$`: SHA-512(password ++ salt).
    Sha512 { salt: Vec<u8>, hash: Vec<u8> },
    /// `$7$`: PBKDF2-HMAC-SHA512 with `iterations`.
    Pbkdf2 { iterations: NonZeroU32, salt: Vec<u8>, hash: Vec<u8> },
}

impl MosquittoHash {
    /// Parses `$6$SALT$HASH` or `$7$ITERATIONS$SALT$HASH`; the error says what is wrong.
    fn parse(s: &str) -> Result<MosquittoHash, String> {
        let b64 = |part: &str, what: &str| B64.decode(part).map_err(|_| format!("the {what} is not base64"));
        match s.split('$').collect::<Vec<_>>().as_slice() {
            ["", "6", salt, hash] => Ok(MosquittoHash::Sha512 { salt: b64(salt, "salt")?, hash: b64(hash, "hash")? }),
            ["", "7", iterations, salt, hash] => {
                let iterations = iterations
                    .parse::<u32>()
                    .ok()
                    .and_then(NonZeroU32::new)
                    .ok_or_else(|| format!("`{iterations}` is not an iteration count"))?;
                Ok(MosquittoHash::Pbkdf2 { iterations, salt: b64(salt, "salt")?, hash: b64(hash, "hash")? })
            }
            _ => Err("not a mosquitto_passwd hash ($7$ITERATIONS$SALT$HASH or $6$SALT$HASH); \
                      a clear password has to be hashed first (mosquitto_passwd -U)"
                .into()),
        }
    }

    fn matches(&self, password: &str) -> bool {
        match self {
            MosquittoHash::Sha512 { salt, hash } => {
                let mut ctx = digest::Context::new(&digest::SHA512);
                ctx.update(password.as_bytes());
                ctx.update(salt);
                constant_time_eq(ctx.finish().as_ref(), hash)
            }
            MosquittoHash::Pbkdf2 { iterations, salt, hash } => {
                ring::pbkdf2::verify(ring::pbkdf2::PBKDF2_HMAC_SHA512, *iterations, salt, password.as_bytes(), hash)
                    .is_ok()
            }
        }
    }
}

/// How a user's password is checked: always a hash, never the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// The algorithm.
    pub algorithm: HashingAlgorithm,
    /// RabbitMQ's: base64 of salt ++ hash; Mosquitto's: the `$7$...` / `$6$...` string.
    /// Empty = the user cannot log in with a password.
    pub hash: String,
}

impl Secret {
    /// A clear password, hashed (RabbitMQ's sha256 with a fresh salt).
    pub fn from_password(password: &str) -> Secret {
        Secret { algorithm: HashingAlgorithm::Sha256, hash: hash_password(HashingAlgorithm::Sha256, password) }
    }

    /// A stored hash, checked to be one FerryMQ can verify (the error says why not). An
    /// algorithm that is not named is Mosquitto's for a `$6$` / `$7$` hash, else RabbitMQ's
    /// default (sha256).
    pub fn from_hash(hash: &str, algorithm: Option<&str>) -> Result<Secret, String> {
        let algorithm = match algorithm {
            Some(name) => {
                HashingAlgorithm::parse(name).ok_or_else(|| format!("hashing algorithm {name} is not supported"))?
            }
            None if hash.starts_with('$') => HashingAlgorithm::Mosquitto,
            None => HashingAlgorithm::Sha256,
        };
        match algorithm {
            HashingAlgorithm::Mosquitto => drop(MosquittoHash::parse(hash)?),
            _ if hash.is_empty() => {}
            _ => match B64.decode(hash) {
                Ok(raw) if raw.len() > 4 => {}
                _ => return Err("the password hash is not base64 of a salt and a digest".into()),
            },
        }
        Ok(Secret { algorithm, hash: hash.to_owned() })
    }

    /// Whether `password` is the one hashed.
    pub fn matches(&self, password: &str) -> bool {
        if self.algorithm == HashingAlgorithm::Mosquitto {
            return MosquittoHash::parse(&self.hash).is_ok_and(|h| h.matches(password));
        }
        let Ok(raw) = B64.decode(&self.hash) else { return false };
        if raw.len() <= 4 {
            return false;
        }
        let (salt, expected) = raw.split_at(4);
        constant_time_eq(&self.algorithm.digest(salt, password.as_bytes()), expected)
    }

    /// The hash and algorithm name as a definitions export carries them.
    pub fn exported(&self) -> (String, &'static str) {
        (self.hash.clone(), self.algorithm.name())
    }
}

/// Why a password or ACL file could not be read: the file, the line and the problem.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A line is not `user:hash` with a hash `mosquitto_passwd` makes.
    #[error("{path}:{line}: {problem}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
}

/// A configuration file's text and the name errors give it (its path as shown).
pub fn read_file(path: &Path) -> Result<(String, String), FileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read { path: shown.clone(), source })?;
    Ok((shown, text))
}

/// Reads a Mosquitto password file (`mosquitto_passwd`'s `user:$7$...` lines; blank lines
/// and `#` comments skipped): its users, without tags (no management access). Any bad line
/// fails the whole file, so nothing is half-applied.
pub fn read_mosquitto_password_file(path: &Path) -> Result<Vec<User>, FileError> {
    let (shown, text) = read_file(path)?;
    let mut users: Vec<User> = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |problem: String| FileError::Line { path: shown.clone(), line: i + 1, problem };
        let Some((name, hash)) = line.split_once(':') else {
            return Err(bad("expected `username:password-hash`".into()));
        };
        if name.is_empty() {
            return Err(bad("the user name is empty".into()));
        }
        MosquittoHash::parse(hash).map_err(bad)?;
        if !names.insert(name) {
            return Err(bad(format!("user `{name}` is listed twice")));
        }
        let secret = Secret { algorithm: HashingAlgorithm::Mosquitto, hash: hash.to_owned() };
        users.push(User { name: name.to_owned(), secret, loopback_only: false, tags: Vec::new() });
    }
    Ok(users)
}

/// One user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// User name, as sent at login.
    pub name: String,
    /// How its password is checked.
    pub secret: Secret,
    /// Only connections from loopback addresses may use it.
    pub loopback_only: bool,
    /// RabbitMQ's user tags.
    pub tags: Vec<String>,
}

impl User {
    /// A configured user, its password hashed (the error says what is wrong with it).
    pub fn from_entry(u: &UserEntry) -> Result<User, String> {
        let secret = match (&u.password, &u.password_hash) {
            (Some(p), None) => Secret::from_password(p),
            (None, Some(h)) => Secret::from_hash(h, u.hashing_algorithm.as_deref())?,
            (Some(_), Some(_)) => return Err("give either password or password_hash, not both".into()),
            (None, None) => return Err("a password or a password_hash is needed".into()),
        };
        Ok(User { name: u.name.clone(), secret, loopback_only: u.loopback_only, tags: u.tags.clone() })
    }
}

/// Checks the users of `auth.users` as start-up makes them ([`User::from_entry`]); the
/// error names the user.
pub fn check_entries(entries: &[UserEntry]) -> Result<(), ConfigError> {
    for u in entries {
        User::from_entry(u).map_err(|e| ConfigError::invalid("auth.users", format!("user `{}`: {e}", u.name)))?;
    }
    Ok(())
}

/// The limits of a [`LoginThrottle`] (`[auth]`'s `max_login_failures`,
/// `max_login_failures_per_address`, `login_failure_window_secs`, `login_failure_delay_ms`,
/// `max_pending_logins_per_address`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginLimits {
    /// Failed logins with one user name from one address within `window` after which that
    /// pair's next attempts wait `delay` (0 = not counted).
    pub max_failures: u32,
    /// Failed logins from one address, whatever the user names, within `window` after which
    /// all its attempts wait `delay` (0 = not counted).
    pub max_failures_per_address: u32,
    /// The window failures are counted in, from the first one.
    pub window: Duration,
    /// How long an attempt held back waits before it is checked and answered.
    pub delay: Duration,
    /// Logins from one address under way at once (waiting or being checked); the attempts
    /// past it are refused at once, unchecked (0 = no limit).
    pub max_pending_per_address: u32,
}

impl LoginLimits {
    /// No counting and no limit.
    pub const OFF: LoginLimits = LoginLimits {
        max_failures: 0,
        max_failures_per_address: 0,
        window: Duration::ZERO,
        delay: Duration::ZERO,
        max_pending_per_address: 0,
    };
}

/// Failures counted since `since` (a window starts with its first failure).
#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    since: Instant,
}

/// What [`LoginThrottle`] keeps, under one lock taken a few times per login (never per message).
#[derive(Debug, Default)]
struct Tables {
    /// Failures per (address, keyed hash of the user name).
    pairs: HashMap<(IpAddr, u64), Failures>,
    /// Failures per address.
    addresses: HashMap<IpAddr, Failures>,
    /// Logins under way per address (entries at zero are removed).
    pending: HashMap<IpAddr, u32>,
}

/// Failed logins per (source address, user name) and per source address: once a pair is
/// past `max_failures`, or its address past `max_failures_per_address`, within the window,
/// each next attempt waits `delay` before it is checked and answered; a successful login
/// forgets the failures of its own pair only (an attacker's own account resets nothing of
/// another user's), and the address's count runs out with its window. At most
/// `max_pending_per_address` attempts from one address are under way at once, so that
/// parallel connections cannot multiply the guesses a delay allows: the others are refused
/// at once, without their password being looked at ([`AuthError::TooManyPending`]). User
/// names are kept as keyed hashes, so what clients send does not grow the tables.
#[derive(Debug)]
pub struct LoginThrottle {
    limits: LoginLimits,
    hasher: std::collections::hash_map::RandomState,
    tables: Mutex<Tables>,
    /// A table was full once (logged once).
    overflowed: AtomicBool,
    /// Attempts refused at once as too many pending.
    refused_pending: AtomicU64,
}

/// Addresses and (address, user) pairs [`LoginThrottle`] tracks at most, each.
const THROTTLE_TRACKED: usize = 100_000;

/// A login under way from an address, counted until it is dropped.
#[derive(Debug)]
pub struct PendingLogin<'a> {
    throttle: &'a LoginThrottle,
    ip: IpAddr,
    counted: bool,
    /// How long it waits before it is checked.
    pub wait: Option<Duration>,
}

impl Drop for PendingLogin<'_> {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut tables = self.throttle.tables.lock();
        if let std::collections::hash_map::Entry::Occupied(mut e) = tables.pending.entry(self.ip) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

impl LoginThrottle {
    /// A throttle with `limits`.
    pub fn new(limits: LoginLimits) -> LoginThrottle {
        LoginThrottle {
            limits,
            hasher: Default::default(),
            tables: Mutex::default(),
            overflowed: AtomicBool::new(false),
            refused_pending: AtomicU64::new(0),
        }
    }

    fn key(&self, ip: IpAddr, user: &str) -> (IpAddr, u64) {
        use std::hash::BuildHasher;
        (ip, self.hasher.hash_one(user))
    }

    /// Whether `f` holds back: at least `limit` failures (limit > 0) in a window still open.
    fn past(&self, f: Option<&Failures>, limit: u32, now: Instant) -> bool {
        limit > 0 && f.is_some_and(|f| f.count >= limit && now.duration_since(f.since) < self.limits.window)
    }

    fn delay_in(&self, tables: &Tables, ip: IpAddr, user: &str, now: Instant) -> Option<Duration> {
        let pair = self.past(tables.pairs.get(&self.key(ip, user)), self.limits.max_failures, now);
        let address = self.past(tables.addresses.get(&ip), self.limits.max_failures_per_address, now);
        (pair || address).then_some(self.limits.delay)
    }

    /// How long an attempt from `ip` as `user` waits before it is checked.
    pub fn delay_for(&self, ip: IpAddr, user: &str) -> Option<Duration> {
        self.delay_in(&self.tables.lock(), ip, user, Instant::now())
    }

    /// Admits an attempt from `ip` as `user`: how long it waits, counted as pending until
    /// dropped; `None` when the address has `max_pending_per_address` under way already.
    pub fn admit(&self, ip: IpAddr, user: &str) -> Option<PendingLogin<'_>> {
        let l = &self.limits;
        if l.max_failures == 0 && l.max_failures_per_address == 0 && l.max_pending_per_address == 0 {
            return Some(PendingLogin { throttle: self, ip, counted: false, wait: None });
        }
        let mut tables = self.tables.lock();
        let wait = self.delay_in(&tables, ip, user, Instant::now());
        let cap = self.limits.max_pending_per_address;
        if cap > 0 {
            let pending = tables.pending.entry(ip).or_insert(0);
            if *pending >= cap {
                if self.refused_pending.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        peer = %ip,
                        max_pending_logins_per_address = cap,
                        "too many logins under way from one address: the others are refused at once \
                         (counted in ferrymq_logins_refused_pending; logged once)"
                    );
                }
                return None;
            }
            *pending += 1;
        }
        Some(PendingLogin { throttle: self, ip, counted: cap > 0, wait })
    }

    /// How long an attempt held back waits (`auth.login_failure_delay_ms`).
    pub fn delay(&self) -> Duration {
        self.limits.delay
    }

    /// Attempts refused at once as too many pending, since start.
    pub fn refused_pending(&self) -> u64 {
        self.refused_pending.load(Ordering::Relaxed)
    }

    /// Counts a checked login's outcome: a success forgets its own pair's failures only, a
    /// failure counts for its pair and its address.
    pub fn record(&self, ip: IpAddr, user: &str, ok: bool) {
        let LoginLimits { max_failures, max_failures_per_address, window, .. } = self.limits;
        if max_failures == 0 && max_failures_per_address == 0 {
            return;
        }
        let key = self.key(ip, user);
        let mut tables = self.tables.lock();
        if ok {
            tables.pairs.remove(&key);
            return;
        }
        let now = Instant::now();
        if max_failures > 0 {
            self.count(&mut tables.pairs, key, now, window);
        }
        if max_failures_per_address > 0 {
            self.count(&mut tables.addresses, ip, now, window);
        }
    }

    /// One more failure for `key` in `table` (a window past starts again; a full table is
    /// pruned of closed windows first, and what still finds no room is not counted).
    fn count<K: std::hash::Hash + Eq + Copy>(
        &self,
        table: &mut HashMap<K, Failures>,
        key: K,
        now: Instant,
        window: Duration,
    ) {
        if table.len() >= THROTTLE_TRACKED && !table.contains_key(&key) {
            table.retain(|_, f| now.duration_since(f.since) < window);
            if table.len() >= THROTTLE_TRACKED {
                if !self.overflowed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(tracked = THROTTLE_TRACKED, "too many addresses failing logins to track them all");
                }
                return;
            }
        }
        let f = table.entry(key).or_insert(Failures { count: 0, since: now });
        if now.duration_since(f.since) >= window {
            *f = Failures { count: 0, since: now };
        }
        f.count += 1;
    }
}

impl Default for LoginThrottle {
    /// Off.
    fn default() -> LoginThrottle {
        LoginThrottle::new(LoginLimits::OFF)
    }
}

/// Who may log in ([`AuthSection::all_users`](crate::composition::config::AuthSection::all_users) and
/// the users added at runtime): checked on every AMQP login, on MQTT logins when
/// `auth.mqtt` is on, and on every management API call.
#[derive(Debug, Clone, Default)]
pub struct Users {
    /// By name, in the order they were added (a password file may hold a whole fleet).
    users: Arc<RwLock<IndexMap<String, User>>>,
    throttle: Arc<LoginThrottle>,
}

impl Users {
    /// A store over `users` (a later one replaces an earlier one of the same name), with
    /// `throttle` for failed logins.
    pub fn new(users: Vec<User>, throttle: LoginThrottle) -> Users {
        let users = users.into_iter().map(|u| (u.name.clone(), u)).collect();
        Users { users: Arc::new(RwLock::new(users)), throttle: Arc::new(throttle) }
    }

    /// Replaces the users a password file gave before (`previous`, by name) with those it
    /// gives now: a user gone from the file goes, a changed one gets its new hash, a new
    /// one is added. Returns the names the file gives now.
    pub fn reload_file(&self, previous: &[String], now: Vec<User>) -> Vec<String> {
        let names: Vec<String> = now.iter().map(|u| u.name.clone()).collect();
        let kept: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        let mut users = self.users.write();
        for gone in previous.iter().filter(|n| !kept.contains(n.as_str())) {
            users.shift_remove(gone);
        }
        for u in now {
            users.insert(u.name.clone(), u);
        }
        names
    }

    /// A login attempt from `peer`: waits first if the address or this user name from it
    /// failed too often, is refused at once when too many from the address are under way
    /// ([`LoginThrottle`]), then checks as [`Users::authenticate`] and counts the outcome.
    pub async fn login(
        &self,
        username: &str,
        password: &str,
        peer: IpAddr,
        mechanism: &str,
    ) -> Result<User, AuthError> {
        self.throttled(peer, username, || self.verify(username, Some(password), peer, mechanism)).await
    }

    /// A login whose identity a verified TLS client certificate vouches for (AMQP SASL
    /// EXTERNAL, MQTT `use_identity_as_username`): the user must exist; no password.
    pub async fn login_external(&self, username: &str, peer: IpAddr) -> Result<User, AuthError> {
        self.throttled(peer, username, || self.verify(username, None, peer, "EXTERNAL")).await
    }

    async fn throttled(
        &self,
        peer: IpAddr,
        username: &str,
        check: impl FnOnce() -> Result<User, AuthError>,
    ) -> Result<User, AuthError> {
        let Some(pending) = self.throttle.admit(peer, username) else {
            return Err(AuthError::TooManyPending);
        };
        if let Some(wait) = pending.wait {
            tokio::time::sleep(wait).await;
        }
        let outcome = check();
        self.throttle.record(peer, username, outcome.is_ok());
        drop(pending);
        outcome
    }

    /// The failed-login throttle (its counters for `/metrics`).
    pub fn throttle(&self) -> &LoginThrottle {
        &self.throttle
    }

    /// Checks a login from `peer` with `mechanism` (for the refusal's text) and returns
    /// the user (its tags). The password is compared outside the store's lock.
    pub fn authenticate(
        &self,
        username: &str,
        password: &str,
        peer: IpAddr,
        mechanism: &str,
    ) -> Result<User, AuthError> {
        self.verify(username, Some(password), peer, mechanism)
    }

    /// The user, when it exists, `password` (if any) matches and it may log in from `peer`.
    fn verify(&self, username: &str, password: Option<&str>, peer: IpAddr, mechanism: &str) -> Result<User, AuthError> {
        let Some(u) = self.get(username) else {
            return Err(AuthError::BadCredentials(mechanism.to_owned()));
        };
        if password.is_some_and(|p| !u.secret.matches(p)) {
            return Err(AuthError::BadCredentials(mechanism.to_owned()));
        }
        if u.loopback_only && !peer.is_loopback() {
            return Err(AuthError::LoopbackOnly(username.to_owned()));
        }
        Ok(u)
    }

    /// Every user, in the order they were added.
    pub fn all(&self) -> Vec<User> {
        self.users.read().values().cloned().collect()
    }

    /// The user `name`.
    pub fn get(&self, name: &str) -> Option<User> {
        self.users.read().get(name).cloned()
    }

    /// Adds a user or replaces the one of that name (keeping its place); true if it is new.
    pub fn put(&self, user: User) -> bool {
        self.users.write().insert(user.name.clone(), user).is_none()
    }

    /// Removes a user; true if it existed. Its open connections stay (as in RabbitMQ,
    /// until they reconnect).
    pub fn remove(&self, name: &str) -> bool {
        self.users.write().shift_remove(name).is_some()
    }

    /// Decides a Connection.Update-Secret of `username`'s connection, as RabbitMQ's internal
    /// backend does: a password user's credentials do not expire, so the new secret is
    /// accepted (not compared) while the user still exists; refused once it is gone.
    pub fn update_secret(&self, username: &str) -> Result<(), AuthError> {
        match self.users.read().contains_key(username) {
            true => Ok(()),
            false => Err(AuthError::BadCredentials("update-secret".to_owned())),
        }
    }
}

/// A stored user as a [`User`] (`None` when its hashing algorithm is not one FerryMQ verifies);
/// it may only connect from loopback when `loopback_users` names it.
pub fn user_from_record(u: &crate::core::store::UserRecord, loopback_users: &[String]) -> Option<User> {
    let algorithm = HashingAlgorithm::parse(&u.hashing_algorithm)?;
    Some(User {
        name: u.name.clone(),
        secret: Secret { algorithm, hash: u.password_hash.clone() },
        loopback_only: loopback_users.contains(&u.name),
        tags: u.tags.clone(),
    })
}

/// Compares without stopping at the first difference (no timing hint about the password).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, password: &str, loopback_only: bool) -> User {
        User { name: name.into(), secret: Secret::from_password(password), loopback_only, tags: vec![] }
    }

    fn users() -> Users {
        Users::new(vec![entry("guest", "guest", true), entry("app", "secret", false)], LoginThrottle::default())
    }

    #[test]
    fn a_secret_update_is_accepted_while_the_user_exists() {
        assert_eq!(users().update_secret("guest"), Ok(()), "the new secret is not compared");
        assert!(users().update_secret("gone").is_err());
    }

    #[test]
    fn checks_passwords_and_loopback() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let remote: IpAddr = "10.0.0.5".parse().unwrap();
        let u = users();
        assert!(u.authenticate("guest", "guest", local, "PLAIN").is_ok());
        assert!(matches!(u.authenticate("guest", "guest", remote, "PLAIN"), Err(AuthError::LoopbackOnly(_))));
        assert!(u.authenticate("app", "secret", remote, "PLAIN").is_ok());
        assert!(matches!(u.authenticate("app", "wrong", local, "PLAIN"), Err(AuthError::BadCredentials(_))));
        assert!(matches!(u.authenticate("nobody", "x", local, "AMQPLAIN"), Err(AuthError::BadCredentials(_))));
    }

    #[test]
    fn a_configured_password_is_kept_only_hashed() {
        let u = User::from_entry(&UserEntry {
            name: "app".into(),
            password: Some("secret".into()),
            password_hash: None,
            hashing_algorithm: None,
            loopback_only: false,
            tags: vec![],
        })
        .unwrap();
        assert_eq!(u.secret.algorithm, HashingAlgorithm::Sha256);
        assert!(!u.secret.hash.contains("secret"));
        assert!(u.secret.matches("secret"));
        let both = UserEntry { password_hash: Some(u.secret.hash.clone()), ..entry_of("x") };
        assert!(User::from_entry(&both).unwrap_err().contains("not both"));
        let neither = UserEntry { password: None, ..entry_of("x") };
        assert!(User::from_entry(&neither).unwrap_err().contains("needed"));
    }

    fn entry_of(name: &str) -> UserEntry {
        UserEntry {
            name: name.into(),
            password: Some("pw".into()),
            password_hash: None,
            hashing_algorithm: None,
            loopback_only: false,
            tags: vec![],
        }
    }

    #[test]
    fn hashed_passwords_verify_as_rabbitmq_hashes_them() {
        // Made with RabbitMQ's algorithm by hand: salt 0x908DC60A, sha256(salt ++ "test12").
        let salt = [0x90u8, 0x8d, 0xc6, 0x0a];
        let mut raw = salt.to_vec();
        raw.extend(HashingAlgorithm::Sha256.digest(&salt, b"test12"));
        let s = Secret::from_hash(&B64.encode(raw), None).unwrap();
        assert!(s.matches("test12"));
        assert!(!s.matches("test13"));
        for alg in [HashingAlgorithm::Sha256, HashingAlgorithm::Sha512, HashingAlgorithm::Md5] {
            let hash = hash_password(alg, "pw");
            assert!(Secret::from_hash(&hash, Some(alg.name())).unwrap().matches("pw"));
            assert_ne!(hash, hash_password(alg, "pw"), "a fresh salt each time");
        }
        // Python's hashlib: base64(salt ++ md5(salt ++ b"old-pw")), salt 0x908DC60A.
        let md5 = Secret::from_hash("kI3GCiC0t63QXHQeorDv97ma+YI=", Some("rabbit_password_hashing_md5")).unwrap();
        assert!(md5.matches("old-pw") && !md5.matches("old-px"));
        assert!(!Secret::from_hash("", None).unwrap().matches(""));
        assert!(Secret::from_hash("x", Some("rabbit_password_hashing_sha1")).is_err());
        assert!(Secret::from_hash("not base64!", None).is_err());
    }

    #[test]
    fn mosquitto_hashes_verify_as_mosquitto_passwd_makes_them() {
        // tests/fixtures/mosquitto_passwd: `mosquitto_passwd -c -b` of Debian's mosquitto 2.0.11.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mosquitto_passwd");
        let users = read_mosquitto_password_file(&path).unwrap();
        let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["device-1", "backend"]);
        assert!(users[0].secret.matches("d3vice-secret"));
        assert!(!users[0].secret.matches("d3vice-secreT"));
        assert!(users[1].secret.matches("back end pw"));
        // Python's hashlib, salt b"0123456789ab": $6$ = sha512(password ++ salt) (Mosquitto
        // 1.x), $7$ = PBKDF2-HMAC-SHA512 with 1000 iterations.
        let six = "$6$MDEyMzQ1Njc4OWFi$Iaieve2OIQIvF7lTs1OO2K5elMlueJ4kQKriQzlOypynYGRWcw6OlmeyvynDN49339LG4YZoArIc+8Z1l4brvw==";
        let seven = "$7$1000$MDEyMzQ1Njc4OWFi$cutkzp3iGuSzFkVyez1zCfUmZTe4Ah76cG9Lk7XoVDrgy3wtlezxaK/kThf0AXW1oqsqIaKz1HsZwIOCdVEjZA==";
        let six = Secret::from_hash(six, None).unwrap();
        assert_eq!(six.algorithm, HashingAlgorithm::Mosquitto);
        assert!(six.matches("legacy-pw") && !six.matches("legacy-px"));
        assert!(Secret::from_hash(seven, None).unwrap().matches("pbkdf-pw"));
    }

    #[test]
    fn a_bad_password_file_names_the_line_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        for (text, line, problem) in [
            ("# devices\n\nok:$6$MDEy$MDEy\nplain:secret\n", 4, "mosquitto_passwd -U"),
            ("nocolon\n", 1, "username:password-hash"),
            ("a:$7$x$MDEy$MDEy\n", 1, "iteration count"),
            ("a:$6$MDEy$MDEy\na:$6$MDEy$MDEy\n", 2, "twice"),
            ("a:$6$!!$MDEy\n", 1, "base64"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read_mosquitto_password_file(&path).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{}:{line}: ", path.display())), "{e}");
            assert!(e.contains(problem), "{e}");
        }
        let e = read_mosquitto_password_file(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
    }

    fn limits(pair: u32, address: u32, pending: u32) -> LoginLimits {
        LoginLimits {
            max_failures: pair,
            max_failures_per_address: address,
            window: Duration::from_secs(60),
            delay: Duration::from_millis(500),
            max_pending_per_address: pending,
        }
    }

    #[test]
    fn a_user_name_past_the_failure_limit_waits_until_it_logs_in() {
        let t = LoginThrottle::new(limits(3, 0, 0));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..2 {
            t.record(a, "victim", false);
        }
        assert_eq!(t.delay_for(a, "victim"), None, "under the limit");
        t.record(a, "victim", false);
        assert_eq!(t.delay_for(a, "victim"), Some(Duration::from_millis(500)));
        assert_eq!(t.delay_for(b, "victim"), None, "other addresses are not held back");
        assert_eq!(t.delay_for(a, "other"), None, "nor other user names (no address limit here)");
        t.record(a, "attacker", true);
        assert_eq!(t.delay_for(a, "victim"), Some(Duration::from_millis(500)), "another user's login resets nothing");
        t.record(a, "victim", true);
        assert_eq!(t.delay_for(a, "victim"), None, "its own login forgets the failures");
        let short = LoginThrottle::new(LoginLimits { window: Duration::ZERO, ..limits(1, 1, 0) });
        short.record(a, "u", false);
        assert_eq!(short.delay_for(a, "u"), None, "failures older than the window do not count");
        let off = LoginThrottle::default();
        off.record(a, "u", false);
        assert_eq!(off.delay_for(a, "u"), None);
    }

    #[test]
    fn an_address_past_its_budget_waits_whatever_the_user_name_and_logins_do_not_reset_it() {
        let t = LoginThrottle::new(limits(3, 5, 0));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        for i in 0..5 {
            assert_eq!(t.delay_for(a, "fresh"), None, "after {i} failures");
            t.record(a, &format!("user-{i}"), false);
        }
        assert_eq!(t.delay_for(a, "fresh"), Some(Duration::from_millis(500)), "sprayed over user names");
        t.record(a, "attacker", true);
        assert_eq!(t.delay_for(a, "fresh"), Some(Duration::from_millis(500)));
    }

    #[test]
    fn logins_under_way_per_address_are_limited() {
        let t = LoginThrottle::new(limits(3, 0, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = t.admit(a, "u").unwrap();
        let second = t.admit(a, "v").unwrap();
        assert!(t.admit(a, "w").is_none(), "a third at once is refused");
        assert_eq!(t.refused_pending(), 1);
        let other = t.admit(b, "u").expect("another address has its own limit");
        drop(first);
        let third = t.admit(a, "w").expect("room again once one is answered");
        drop((second, third, other));
        assert!(t.tables.lock().pending.is_empty(), "nothing left counted");
        assert!(LoginThrottle::new(limits(3, 0, 0)).admit(a, "u").is_some());
    }

    #[test]
    fn clones_share_the_users_added_and_removed() {
        let a = users();
        let b = a.clone();
        let hash = hash_password(HashingAlgorithm::Sha512, "pw");
        let added = User {
            name: "ops".into(),
            secret: Secret { algorithm: HashingAlgorithm::Sha512, hash },
            loopback_only: false,
            tags: vec!["monitoring".into()],
        };
        assert!(a.put(added));
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(b.authenticate("ops", "pw", local, "PLAIN").unwrap().tags, ["monitoring"]);
        assert!(b.remove("ops"));
        assert!(a.authenticate("ops", "pw", local, "PLAIN").is_err());
    }
}

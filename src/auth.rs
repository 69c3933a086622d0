//! The user store shared by both front-ends and the management API: who may log in (AMQP
//! always, MQTT when `auth.mqtt` is on, HTTP Basic), from where (RabbitMQ's default
//! `guest` user may only connect from loopback), and with which tags. Users come from the
//! configuration and from the management API or an imported definitions file; the latter
//! are kept as RabbitMQ keeps them, as salted password hashes
//! (`rabbit_password_hashing_sha256` / `_sha512`), so definitions move between FerryMQ and
//! RabbitMQ both ways. Every clone of a [`Users`] sees the same users.

use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine;
use parking_lot::RwLock;
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};

use crate::config::UserEntry;

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
}

/// RabbitMQ's password hashing algorithms that FerryMQ verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashingAlgorithm {
    /// `rabbit_password_hashing_sha256` (RabbitMQ's default).
    Sha256,
    /// `rabbit_password_hashing_sha512`.
    Sha512,
}

impl HashingAlgorithm {
    /// Parses RabbitMQ's module name (`None` for an algorithm FerryMQ cannot verify, e.g. md5).
    pub fn parse(name: &str) -> Option<HashingAlgorithm> {
        match name {
            "rabbit_password_hashing_sha256" | "" => Some(HashingAlgorithm::Sha256),
            "rabbit_password_hashing_sha512" => Some(HashingAlgorithm::Sha512),
            _ => None,
        }
    }

    /// RabbitMQ's module name.
    pub fn name(self) -> &'static str {
        match self {
            HashingAlgorithm::Sha256 => "rabbit_password_hashing_sha256",
            HashingAlgorithm::Sha512 => "rabbit_password_hashing_sha512",
        }
    }

    fn digest(self, salt: &[u8], password: &[u8]) -> Vec<u8> {
        let alg = match self {
            HashingAlgorithm::Sha256 => &digest::SHA256,
            HashingAlgorithm::Sha512 => &digest::SHA512,
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
    base64::engine::general_purpose::STANDARD.encode(out)
}

/// How a user's password is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Secret {
    /// Given in clear in the configuration.
    Clear(String),
    /// A RabbitMQ password hash (base64); empty = the user cannot log in with a password.
    Hashed {
        /// The algorithm.
        algorithm: HashingAlgorithm,
        /// Base64 of salt ++ hash.
        hash: String,
    },
}

impl Secret {
    fn matches(&self, password: &str) -> bool {
        match self {
            Secret::Clear(p) => constant_time_eq(p.as_bytes(), password.as_bytes()),
            Secret::Hashed { algorithm, hash } => {
                let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(hash) else { return false };
                if raw.len() <= 4 {
                    return false;
                }
                let (salt, expected) = raw.split_at(4);
                constant_time_eq(&algorithm.digest(salt, password.as_bytes()), expected)
            }
        }
    }

    /// The hash RabbitMQ would export (a clear password is hashed with sha256 and a fresh salt).
    pub fn exported(&self) -> (String, &'static str) {
        match self {
            Secret::Clear(p) => (hash_password(HashingAlgorithm::Sha256, p), HashingAlgorithm::Sha256.name()),
            Secret::Hashed { algorithm, hash } => (hash.clone(), algorithm.name()),
        }
    }
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

impl From<UserEntry> for User {
    fn from(u: UserEntry) -> User {
        User { name: u.name, secret: Secret::Clear(u.password), loopback_only: u.loopback_only, tags: u.tags }
    }
}

/// Who may log in ([`AuthSection::all_users`](crate::config::AuthSection::all_users) and
/// the users added at runtime): checked on every AMQP login, on MQTT logins when
/// `auth.mqtt` is on, and on every management API call.
#[derive(Debug, Clone, Default)]
pub struct Users {
    users: Arc<RwLock<Vec<User>>>,
}

impl Users {
    /// A store over the configured users.
    pub fn new(users: Vec<UserEntry>) -> Users {
        Users { users: Arc::new(RwLock::new(users.into_iter().map(User::from).collect())) }
    }

    /// Checks a login from `peer` with `mechanism` (for the message).
    pub fn check(&self, username: &str, password: &str, peer: IpAddr, mechanism: &str) -> Result<(), AuthError> {
        self.authenticate(username, password, peer, mechanism).map(|_| ())
    }

    /// Checks a login as [`Users::check`] does and returns the user (its tags).
    pub fn authenticate(
        &self,
        username: &str,
        password: &str,
        peer: IpAddr,
        mechanism: &str,
    ) -> Result<User, AuthError> {
        let users = self.users.read();
        let Some(u) = users.iter().find(|u| u.name == username) else {
            return Err(AuthError::BadCredentials(mechanism.to_owned()));
        };
        if !u.secret.matches(password) {
            return Err(AuthError::BadCredentials(mechanism.to_owned()));
        }
        if u.loopback_only && !peer.is_loopback() {
            return Err(AuthError::LoopbackOnly(username.to_owned()));
        }
        Ok(u.clone())
    }

    /// Every user, in the order they were added.
    pub fn all(&self) -> Vec<User> {
        self.users.read().clone()
    }

    /// The user `name`.
    pub fn get(&self, name: &str) -> Option<User> {
        self.users.read().iter().find(|u| u.name == name).cloned()
    }

    /// Adds a user or replaces the one of that name (keeping its place); true if it is new.
    pub fn put(&self, user: User) -> bool {
        let mut users = self.users.write();
        match users.iter_mut().find(|u| u.name == user.name) {
            Some(existing) => {
                *existing = user;
                false
            }
            None => {
                users.push(user);
                true
            }
        }
    }

    /// Removes a user; true if it existed. Its open connections stay (as in RabbitMQ,
    /// until they reconnect).
    pub fn remove(&self, name: &str) -> bool {
        let mut users = self.users.write();
        let before = users.len();
        users.retain(|u| u.name != name);
        users.len() != before
    }

    /// Decides a Connection.Update-Secret of `username`'s connection, as RabbitMQ's internal
    /// backend does: a password user's credentials do not expire, so the new secret is
    /// accepted (not compared) while the user still exists; refused once it is gone.
    pub fn update_secret(&self, username: &str) -> Result<(), AuthError> {
        match self.users.read().iter().any(|u| u.name == username) {
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
        secret: Secret::Hashed { algorithm, hash: u.password_hash.clone() },
        loopback_only: loopback_users.contains(&u.name),
        tags: u.tags.clone(),
    })
}

/// Compares without stopping at the first difference (no timing hint about the password).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, password: &str, loopback_only: bool) -> UserEntry {
        UserEntry { name: name.into(), password: password.into(), loopback_only, tags: vec![] }
    }

    fn users() -> Users {
        Users::new(vec![entry("guest", "guest", true), entry("app", "secret", false)])
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
        assert_eq!(u.check("guest", "guest", local, "PLAIN"), Ok(()));
        assert!(matches!(u.check("guest", "guest", remote, "PLAIN"), Err(AuthError::LoopbackOnly(_))));
        assert_eq!(u.check("app", "secret", remote, "PLAIN"), Ok(()));
        assert!(matches!(u.check("app", "wrong", local, "PLAIN"), Err(AuthError::BadCredentials(_))));
        assert!(matches!(u.check("nobody", "x", local, "AMQPLAIN"), Err(AuthError::BadCredentials(_))));
    }

    #[test]
    fn hashed_passwords_verify_as_rabbitmq_hashes_them() {
        // Made with RabbitMQ's algorithm by hand: salt 0x908DC60A, sha256(salt ++ "test12").
        let salt = [0x90u8, 0x8d, 0xc6, 0x0a];
        let mut raw = salt.to_vec();
        raw.extend(HashingAlgorithm::Sha256.digest(&salt, b"test12"));
        let hash = base64::engine::general_purpose::STANDARD.encode(raw);
        let s = Secret::Hashed { algorithm: HashingAlgorithm::Sha256, hash };
        assert!(s.matches("test12"));
        assert!(!s.matches("test13"));
        for alg in [HashingAlgorithm::Sha256, HashingAlgorithm::Sha512] {
            let hash = hash_password(alg, "pw");
            assert!(Secret::Hashed { algorithm: alg, hash: hash.clone() }.matches("pw"));
            assert_ne!(hash, hash_password(alg, "pw"), "a fresh salt each time");
        }
        assert!(!Secret::Hashed { algorithm: HashingAlgorithm::Sha256, hash: String::new() }.matches(""));
        assert_eq!(HashingAlgorithm::parse("rabbit_password_hashing_md5"), None);
    }

    #[test]
    fn clones_share_the_users_added_and_removed() {
        let a = users();
        let b = a.clone();
        let hash = hash_password(HashingAlgorithm::Sha512, "pw");
        let added = User {
            name: "ops".into(),
            secret: Secret::Hashed { algorithm: HashingAlgorithm::Sha512, hash },
            loopback_only: false,
            tags: vec!["monitoring".into()],
        };
        assert!(a.put(added));
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(b.authenticate("ops", "pw", local, "PLAIN").unwrap().tags, ["monitoring"]);
        assert!(b.remove("ops"));
        assert!(a.check("ops", "pw", local, "PLAIN").is_err());
    }
}

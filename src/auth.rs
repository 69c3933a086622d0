//! The user store shared by both front-ends: who may log in (AMQP always, MQTT when
//! `auth.mqtt` is on), and from where (RabbitMQ's default `guest` user may only connect from loopback).

use std::net::IpAddr;

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

/// Who may log in ([`AuthSection::all_users`](crate::config::AuthSection::all_users)): checked on every AMQP
/// login, and on MQTT logins when `auth.mqtt` is on.
#[derive(Debug, Clone, Default)]
pub struct Users {
    users: Vec<UserEntry>,
}

impl Users {
    /// A store over the configured users.
    pub fn new(users: Vec<UserEntry>) -> Users {
        Users { users }
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
    ) -> Result<&UserEntry, AuthError> {
        let Some(u) = self.users.iter().find(|u| u.name == username) else {
            return Err(AuthError::BadCredentials(mechanism.to_owned()));
        };
        if !constant_time_eq(u.password.as_bytes(), password.as_bytes()) {
            return Err(AuthError::BadCredentials(mechanism.to_owned()));
        }
        if u.loopback_only && !peer.is_loopback() {
            return Err(AuthError::LoopbackOnly(username.to_owned()));
        }
        Ok(u)
    }

    /// Every user, in configuration order.
    pub fn all(&self) -> &[UserEntry] {
        &self.users
    }
}

impl Users {
    /// Decides a Connection.Update-Secret of `username`'s connection, as RabbitMQ's internal
    /// backend does: a password user's credentials do not expire, so the new secret is
    /// accepted (not compared) while the user still exists; refused once it is gone.
    pub fn update_secret(&self, username: &str) -> Result<(), AuthError> {
        match self.users.iter().any(|u| u.name == username) {
            true => Ok(()),
            false => Err(AuthError::BadCredentials("update-secret".to_owned())),
        }
    }
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

    fn users() -> Users {
        Users::new(vec![
            UserEntry { name: "guest".into(), password: "guest".into(), loopback_only: true, tags: vec![] },
            UserEntry { name: "app".into(), password: "secret".into(), loopback_only: false, tags: vec![] },
        ])
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
}

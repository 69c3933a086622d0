//! The typed values of settings and how they are read: enums spelled as the
//! configuration spells them (serde's names), listener addresses ("" = off), durations
//! from keys in seconds or milliseconds, optional paths ("" = none). A value that does not
//! read is refused with a message naming it and what is allowed; [`super::ConfigError`]
//! puts the key in front.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, DeserializeOwned, IntoDeserializer};
use serde::{Deserialize, Deserializer};

use crate::transport::origin::Origin;

/// `storage.fsync`: when an acknowledgement of a stored message is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fsync {
    /// Once the message is fsynced (group commit).
    Always,
    /// Once the write reached the OS; fsync every `storage.interval_ms`.
    Interval,
    /// Flushing is left to the OS.
    Never,
}

/// `tls.verify_client`: whether TLS clients are asked for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyClient {
    /// Not asked for.
    None,
    /// Verified when presented; a client without one still connects.
    Optional,
    /// A client without a valid certificate fails the handshake.
    Required,
}

/// `amqp.ssl_cert_login_from`: what SASL EXTERNAL takes from the client certificate as the
/// user name (RabbitMQ's setting and spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertLoginFrom {
    /// The subject, RFC 4514 (`O=client,CN=app`).
    DistinguishedName,
    /// The subject's common name.
    CommonName,
}

/// `mqtt.qos0_when_full`, accepted so that older files load and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Qos0WhenFull {
    /// Publishers waited for a full subscriber (no longer: warned about at start).
    Wait,
    /// Dropped for that subscriber (what happens either way).
    Drop,
}

/// Why a name is not one of an enum's: the names allowed, or what else serde said.
#[derive(Debug)]
struct NotOneOf {
    allowed: Option<&'static [&'static str]>,
    other: String,
}

impl fmt::Display for NotOneOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.other)
    }
}

impl std::error::Error for NotOneOf {}

impl de::Error for NotOneOf {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        NotOneOf { allowed: None, other: msg.to_string() }
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        NotOneOf { allowed: Some(expected), other: String::new() }
    }
}

/// `name` as the enum `T` spells its values; the error lists them:
/// "`sometimes` is not one of always, interval, never".
fn one_of<T: DeserializeOwned>(name: &str) -> Result<T, String> {
    T::deserialize(IntoDeserializer::<NotOneOf>::into_deserializer(name)).map_err(|e| match e.allowed {
        Some(allowed) => format!("`{name}` is not one of {}", allowed.join(", ")),
        None => format!("`{name}`: {}", e.other),
    })
}

/// Reads an enum setting by name (`#[serde(deserialize_with = "value::choice")]`).
pub(crate) fn choice<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<T, D::Error> {
    one_of(&String::deserialize(d)?).map_err(de::Error::custom)
}

/// Reads an enum setting that may be left empty ("" = unset).
pub(crate) fn choice_or_unset<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    match String::deserialize(d)?.as_str() {
        "" => Ok(None),
        name => one_of(name).map(Some).map_err(de::Error::custom),
    }
}

/// Reads a listener's address: `None` for "" (the listener is off).
pub(crate) fn listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| de::Error::custom(format!("`{text}` is not an address like 127.0.0.1:1883")))
}

/// Reads a path that may be left empty ("" = none).
pub(crate) fn path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let text = String::deserialize(d)?;
    Ok((!text.is_empty()).then(|| PathBuf::from(text)))
}

/// Reads a duration from a key in seconds (`_secs`).
pub(crate) fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_secs)
}

/// Reads a duration from a key in milliseconds (`_ms`).
pub(crate) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

/// Reads a duration in seconds where 0 means none (a period that is off, no age limit).
pub(crate) fn secs_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    secs(d).map(|t| (!t.is_zero()).then_some(t))
}

/// Reads browser origins (`scheme://host[:port]`), each checked.
pub(crate) fn origins<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Origin>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|o| {
            Origin::parse(o).ok_or_else(|| de::Error::custom(format!("`{o}` is not an origin (scheme://host[:port])")))
        })
        .collect()
}

/// True for the messages of the readers above, which begin with the refused value in
/// backticks (serde's own messages never do: `unknown field ...`, `invalid type ...`):
/// [`super::ConfigError`] puts the key in front of these.
pub(crate) fn is_refusal(message: &str) -> bool {
    message.starts_with('`')
}

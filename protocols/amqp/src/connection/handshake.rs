//! The handshake's content: Connection.Start's server properties, Tune-Ok negotiation as
//! RabbitMQ validates it, and the client capabilities announced in Start-Ok.

use amq_protocol::protocol::connection;
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::Config;
use crate::frame::FRAME_MIN_SIZE;
use crate::sasl;

/// Capabilities announced to clients (RabbitMQ's list).
const CAPABILITIES: [&str; 9] = [
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
];

fn key(s: &str) -> ShortString {
    ShortString::try_new(crate::wire::short(s)).unwrap_or_default()
}

fn longstr(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes()))
}

/// Connection.Start: version 0-9, server properties, `PLAIN AMQPLAIN`, `en_US`.
pub(super) fn start(config: &Config) -> connection::Start {
    let mut caps = FieldTable::default();
    for c in CAPABILITIES {
        caps.insert(key(c), AMQPValue::Boolean(true));
    }
    let version = if config.version.is_empty() { env!("CARGO_PKG_VERSION") } else { config.version.as_str() };
    let mut props = FieldTable::default();
    props.insert(key("capabilities"), AMQPValue::FieldTable(caps));
    props.insert(key("product"), longstr(&config.product));
    props.insert(key("version"), longstr(version));
    props.insert(key("platform"), longstr("Rust"));
    props.insert(key("cluster_name"), longstr(&config.product));
    props.insert(key("copyright"), longstr("Copyright (c) the FerryMQ authors"));
    props.insert(key("information"), longstr("Licensed under the Apache License 2.0"));
    connection::Start {
        version_major: 0,
        version_minor: 9,
        server_properties: props,
        mechanisms: LongString::from(
            if config.sasl_external { sasl::MECHANISMS_WITH_EXTERNAL } else { sasl::MECHANISMS }.as_bytes(),
        ),
        locales: LongString::from(&b"en_US"[..]),
    }
}

/// `frame_max` the server accepts and proposes (at least [`FRAME_MIN_SIZE`]).
pub(super) fn server_frame_max(config: &Config) -> u32 {
    config.frame_max.max(FRAME_MIN_SIZE)
}

/// `channel_max` the server accepts and proposes (0 = no limit = 65535).
pub(super) fn server_channel_max(config: &Config) -> u16 {
    if config.channel_max == 0 {
        u16::MAX
    } else {
        config.channel_max
    }
}

/// Values agreed in Tune-Ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tuned {
    /// Largest frame either side may send.
    pub frame_max: u32,
    /// Highest channel number.
    pub channel_max: u16,
    /// Heartbeat interval in seconds (0 = none).
    pub heartbeat: u16,
}

/// Validates Tune-Ok as RabbitMQ does (a value of 0 takes the server's; a value above the
/// server's, or a frame_max under 4096, is refused with 530 NOT_ALLOWED); the error is
/// the explanation for the Close.
pub(super) fn negotiate(config: &Config, tune_ok: &connection::TuneOk) -> Result<Tuned, String> {
    let server_frame = server_frame_max(config);
    let server_channels = server_channel_max(config);
    let frame_max = match tune_ok.frame_max {
        0 => server_frame,
        v if v < FRAME_MIN_SIZE => {
            return Err(format!(
                "negotiated frame_max = {v} is lower than the minimum allowed value ({FRAME_MIN_SIZE})"
            ))
        }
        v if v > server_frame => {
            return Err(format!("negotiated frame_max = {v} is higher than the maximum allowed value ({server_frame})"))
        }
        v => v,
    };
    let channel_max = match tune_ok.channel_max {
        0 => server_channels,
        v if v > server_channels => {
            return Err(format!(
                "negotiated channel_max = {v} is higher than the maximum allowed value ({server_channels})"
            ))
        }
        v => v,
    };
    Ok(Tuned { frame_max, channel_max, heartbeat: tune_ok.heartbeat })
}

/// True if the client properties announce `capabilities.<name> = true`.
pub(super) fn has_capability(client_properties: &FieldTable, name: &str) -> bool {
    match client_properties.inner().get("capabilities") {
        Some(AMQPValue::FieldTable(caps)) => matches!(caps.inner().get(name), Some(AMQPValue::Boolean(true))),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tune_ok(channel_max: u16, frame_max: u32, heartbeat: u16) -> connection::TuneOk {
        connection::TuneOk { channel_max, frame_max, heartbeat }
    }

    #[test]
    fn negotiation() {
        let c = Config::default();
        assert_eq!(negotiate(&c, &tune_ok(0, 0, 0)), Ok(Tuned { frame_max: 131_072, channel_max: 2047, heartbeat: 0 }));
        assert_eq!(
            negotiate(&c, &tune_ok(10, 4096, 30)),
            Ok(Tuned { frame_max: 4096, channel_max: 10, heartbeat: 30 })
        );
        assert!(negotiate(&c, &tune_ok(0, 4095, 0)).unwrap_err().contains("lower than the minimum"));
        assert!(negotiate(&c, &tune_ok(0, 131_073, 0)).unwrap_err().contains("frame_max = 131073 is higher"));
        assert!(negotiate(&c, &tune_ok(2048, 0, 0)).unwrap_err().contains("channel_max = 2048 is higher"));
        let unlimited = Config { channel_max: 0, frame_max: 0, ..Config::default() };
        assert_eq!(negotiate(&unlimited, &tune_ok(0, 0, 5)).map(|t| (t.channel_max, t.frame_max)), Ok((65535, 4096)));
    }

    #[test]
    fn capabilities() {
        let mut caps = FieldTable::default();
        caps.insert("connection.blocked".into(), AMQPValue::Boolean(true));
        caps.insert("basic.nack".into(), AMQPValue::Boolean(false));
        let mut props = FieldTable::default();
        props.insert("capabilities".into(), AMQPValue::FieldTable(caps));
        assert!(has_capability(&props, "connection.blocked"));
        assert!(!has_capability(&props, "basic.nack"));
        assert!(!has_capability(&props, "other"));
        assert!(!has_capability(&FieldTable::default(), "connection.blocked"));
    }

    #[test]
    fn start_properties() {
        let s = start(&Config::default());
        let p = s.server_properties.inner();
        assert_eq!(p.get("product"), Some(&longstr("FerryMQ")));
        assert_eq!(p.get("platform"), Some(&longstr("Rust")));
        assert!(p.contains_key("version") && p.contains_key("copyright") && p.contains_key("information"));
        assert!(p.contains_key("cluster_name"));
        for c in CAPABILITIES {
            assert!(has_capability(&s.server_properties, c), "{c}");
        }
        assert_eq!(s.mechanisms.as_bytes(), b"PLAIN AMQPLAIN");
    }
}

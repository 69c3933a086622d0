//! The handshake and the other methods on channel 0: the protocol header, Connection.Start
//! with its server properties, Start-Ok (SASL parsed here, the credentials checked by the
//! broker through [`Connection::accept_login`] / [`Connection::refuse_login`]), Tune and
//! Tune-Ok negotiation as RabbitMQ validates it, Open / Open-Ok, the client capabilities
//! announced in Start-Ok, and Connection.Close / Update-Secret once running.

use amq_protocol::protocol::connection;
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use bytes::{Buf, BytesMut};

use super::fault::Fault;
use super::outbound::Blocked;
#[cfg(doc)]
use super::CLOSE_TIMEOUT;
use super::{CloseReason, Config, Connection, Event, Phase, ProtocolError};
use crate::frame::{self, FRAME_MIN_SIZE};
use crate::{reply, sasl, wire, AMQPClass};

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

impl Connection {
    /// Accepts the login: sends Connection.Tune.
    pub fn accept_login(&mut self) {
        if self.phase != Phase::Login {
            return;
        }
        let tune = connection::Tune {
            channel_max: server_channel_max(&self.config),
            frame_max: server_frame_max(&self.config),
            heartbeat: self.config.heartbeat,
        };
        wire::put_method_frame(self.output(), 0, &AMQPClass::Connection(connection::AMQPMethod::Tune(tune)));
        self.phase = Phase::TuneOk;
        self.resume();
    }

    /// Refuses the login: Connection.Close 403 ACCESS_REFUSED with `text` (clients that
    /// announce `authentication_failure_close` expect exactly this), then closes (after
    /// the client's Close-Ok, or [`CLOSE_TIMEOUT`]).
    pub fn refuse_login(&mut self, text: &str) {
        if self.phase != Phase::Login {
            return;
        }
        self.send_close(
            reply::ACCESS_REFUSED,
            text,
            (10, 11),
            CloseReason::ServerClosed { code: reply::ACCESS_REFUSED },
            false,
        );
    }

    /// Answers Connection.Open with Open-Ok.
    pub fn open_ok(&mut self) {
        if self.phase != Phase::OpenOk {
            return;
        }
        wire::put_method_frame(
            self.output(),
            0,
            &AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
        );
        self.phase = Phase::Running;
        if let Blocked::Pending(reason) = std::mem::replace(&mut self.blocked, Blocked::No) {
            self.blocked(&reason);
        }
        self.resume();
    }

    /// Checks the protocol header; sends Start. False if more bytes are needed or the
    /// header is wrong (then the supported header is sent and the connection finished).
    pub(super) fn read_protocol_header(&mut self, buf: &mut BytesMut) -> bool {
        let n = buf.len().min(frame::PROTOCOL_HEADER.len());
        if buf.get(..n) != frame::PROTOCOL_HEADER.get(..n) {
            self.output().extend_from_slice(frame::PROTOCOL_HEADER);
            self.drop_connection(ProtocolError::BadHeader);
            return false;
        }
        if n < frame::PROTOCOL_HEADER.len() {
            return false;
        }
        buf.advance(n);
        let start = start(&self.config);
        wire::put_method_frame(self.output(), 0, &AMQPClass::Connection(connection::AMQPMethod::Start(start)));
        self.phase = Phase::StartOk;
        true
    }

    /// A method on channel 0.
    pub(super) fn on_connection_method(&mut self, payload: &[u8]) {
        let Some(method) = self.decode(payload) else {
            return;
        };
        let ids = (method.get_amqp_class_id(), method.get_amqp_method_id());
        let AMQPClass::Connection(m) = method else {
            self.fail(self.wrong_state(ids));
            return;
        };
        match (self.phase, m) {
            (_, connection::AMQPMethod::Close(c)) => {
                wire::put_method_frame(
                    self.output(),
                    0,
                    &AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
                );
                self.finish(CloseReason::ClientClosed { code: c.reply_code, text: c.reply_text.to_string() });
            }
            (Phase::StartOk, connection::AMQPMethod::StartOk(s)) => self.on_start_ok(s),
            (Phase::TuneOk, connection::AMQPMethod::TuneOk(t)) => self.on_tune_ok(&t),
            (Phase::Open, connection::AMQPMethod::Open(o)) => {
                self.phase = Phase::OpenOk;
                self.events.push_back(Event::Open { vhost: o.virtual_host.to_string() });
            }
            (Phase::Running, m @ connection::AMQPMethod::UpdateSecret(_)) => {
                self.events.push_back(Event::Method { channel: 0, method: Box::new(AMQPClass::Connection(m)) });
            }
            _ => self.fail(self.wrong_state(ids)),
        }
    }

    /// 504 for a method not valid on channel 0 now (RabbitMQ's wording).
    fn wrong_state(&self, ids: (u16, u16)) -> Fault {
        let text = format!("unexpected method in connection state {}", self.phase.name());
        Fault::new(ProtocolError::Channel("unexpected method on channel 0"), &text, ids)
    }

    fn on_start_ok(&mut self, start_ok: connection::StartOk) {
        let mechanism = start_ok.mechanism.as_str();
        match sasl::credentials(mechanism, start_ok.response.as_bytes(), self.config.sasl_external) {
            Ok((username, password)) => {
                self.cap_blocked = has_capability(&start_ok.client_properties, "connection.blocked");
                self.phase = Phase::Login;
                self.events.push_back(Event::Login {
                    mechanism: mechanism.to_owned(),
                    username,
                    password,
                    client_properties: start_ok.client_properties,
                });
            }
            Err(sasl::SaslError::UnsupportedMechanism) => {
                let text = format!("unsupported authentication mechanism '{}'", wire::short(mechanism));
                self.fail(Fault::new(
                    ProtocolError::AccessRefused("unsupported authentication mechanism"),
                    &text,
                    (10, 11),
                ));
            }
            Err(sasl::SaslError::Malformed) => {
                let text = format!("invalid {mechanism} response");
                self.fail(Fault::new(ProtocolError::AccessRefused("malformed SASL response"), &text, (10, 11)));
            }
        }
    }

    fn on_tune_ok(&mut self, tune_ok: &connection::TuneOk) {
        match negotiate(&self.config, tune_ok) {
            Ok(t) => {
                self.frame_max = t.frame_max;
                self.channel_max = t.channel_max;
                self.heartbeat = t.heartbeat;
                self.last_recv = self.clock;
                self.last_send = self.clock;
                self.phase = Phase::Open;
            }
            Err(text) => {
                self.fail(Fault::new(ProtocolError::NotAllowed("tune-ok outside the server's limits"), &text, (10, 30)))
            }
        }
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

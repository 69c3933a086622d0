//! MQTT 5 reason codes, and their mapping to MQTT 3.x CONNACK return codes.

/// An MQTT 5 reason code. 3.x return codes are mapped onto these by the codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReasonCode(pub u8);

#[allow(missing_docs)]
impl ReasonCode {
    pub const SUCCESS: ReasonCode = ReasonCode(0x00);
    pub const NORMAL_DISCONNECTION: ReasonCode = ReasonCode(0x00);
    pub const GRANTED_QOS_0: ReasonCode = ReasonCode(0x00);
    pub const GRANTED_QOS_1: ReasonCode = ReasonCode(0x01);
    pub const GRANTED_QOS_2: ReasonCode = ReasonCode(0x02);
    pub const DISCONNECT_WITH_WILL: ReasonCode = ReasonCode(0x04);
    pub const NO_MATCHING_SUBSCRIBERS: ReasonCode = ReasonCode(0x10);
    pub const NO_SUBSCRIPTION_EXISTED: ReasonCode = ReasonCode(0x11);
    pub const CONTINUE_AUTHENTICATION: ReasonCode = ReasonCode(0x18);
    pub const REAUTHENTICATE: ReasonCode = ReasonCode(0x19);
    pub const UNSPECIFIED_ERROR: ReasonCode = ReasonCode(0x80);
    pub const MALFORMED_PACKET: ReasonCode = ReasonCode(0x81);
    pub const PROTOCOL_ERROR: ReasonCode = ReasonCode(0x82);
    pub const IMPLEMENTATION_SPECIFIC_ERROR: ReasonCode = ReasonCode(0x83);
    pub const UNSUPPORTED_PROTOCOL_VERSION: ReasonCode = ReasonCode(0x84);
    pub const CLIENT_IDENTIFIER_NOT_VALID: ReasonCode = ReasonCode(0x85);
    pub const BAD_USER_NAME_OR_PASSWORD: ReasonCode = ReasonCode(0x86);
    pub const NOT_AUTHORIZED: ReasonCode = ReasonCode(0x87);
    pub const SERVER_UNAVAILABLE: ReasonCode = ReasonCode(0x88);
    pub const SERVER_BUSY: ReasonCode = ReasonCode(0x89);
    pub const BANNED: ReasonCode = ReasonCode(0x8A);
    pub const SERVER_SHUTTING_DOWN: ReasonCode = ReasonCode(0x8B);
    pub const BAD_AUTHENTICATION_METHOD: ReasonCode = ReasonCode(0x8C);
    pub const KEEP_ALIVE_TIMEOUT: ReasonCode = ReasonCode(0x8D);
    pub const SESSION_TAKEN_OVER: ReasonCode = ReasonCode(0x8E);
    pub const TOPIC_FILTER_INVALID: ReasonCode = ReasonCode(0x8F);
    pub const TOPIC_NAME_INVALID: ReasonCode = ReasonCode(0x90);
    pub const PACKET_IDENTIFIER_IN_USE: ReasonCode = ReasonCode(0x91);
    pub const PACKET_IDENTIFIER_NOT_FOUND: ReasonCode = ReasonCode(0x92);
    pub const RECEIVE_MAXIMUM_EXCEEDED: ReasonCode = ReasonCode(0x93);
    pub const TOPIC_ALIAS_INVALID: ReasonCode = ReasonCode(0x94);
    pub const PACKET_TOO_LARGE: ReasonCode = ReasonCode(0x95);
    pub const MESSAGE_RATE_TOO_HIGH: ReasonCode = ReasonCode(0x96);
    pub const QUOTA_EXCEEDED: ReasonCode = ReasonCode(0x97);
    pub const ADMINISTRATIVE_ACTION: ReasonCode = ReasonCode(0x98);
    pub const PAYLOAD_FORMAT_INVALID: ReasonCode = ReasonCode(0x99);
    pub const RETAIN_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9A);
    pub const QOS_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9B);
    pub const USE_ANOTHER_SERVER: ReasonCode = ReasonCode(0x9C);
    pub const SERVER_MOVED: ReasonCode = ReasonCode(0x9D);
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9E);
    pub const CONNECTION_RATE_EXCEEDED: ReasonCode = ReasonCode(0x9F);
    pub const MAXIMUM_CONNECT_TIME: ReasonCode = ReasonCode(0xA0);
    pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: ReasonCode = ReasonCode(0xA1);
    pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: ReasonCode = ReasonCode(0xA2);

    /// True for codes >= 0x80.
    pub fn is_error(self) -> bool {
        self.0 >= 0x80
    }

    /// The MQTT 3.x CONNACK return code for this reason: 0 success, 1 unacceptable
    /// protocol version (0x84), 2 identifier rejected (0x85), 3 server unavailable
    /// (0x88, 0x89, 0x8B), 4 bad user name or password (0x86), 5 not authorized
    /// (0x87, 0x8C and every other error).
    pub fn to_v3_connack(self) -> u8 {
        match self.0 {
            0x00 => 0,
            0x84 => 1,
            0x85 => 2,
            0x88 | 0x89 | 0x8B => 3,
            0x86 => 4,
            _ => 5,
        }
    }

    /// The reason for an MQTT 3.x CONNACK return code (0-5); `None` for reserved codes.
    pub fn from_v3_connack(code: u8) -> Option<ReasonCode> {
        Some(match code {
            0 => ReasonCode::SUCCESS,
            1 => ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
            2 => ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            3 => ReasonCode::SERVER_UNAVAILABLE,
            4 => ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            5 => ReasonCode::NOT_AUTHORIZED,
            _ => return None,
        })
    }

    /// The MQTT 3.x SUBACK return code: granted QoS 0-2 as is, anything else 0x80.
    pub fn to_v3_suback(self) -> u8 {
        if self.0 <= 2 {
            self.0
        } else {
            0x80
        }
    }
}

/// Which packet a reason code appears in, for validating received codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReasonContext {
    ConnAck,
    PubAck,
    PubRel,
    SubAck,
    UnsubAck,
    Disconnect,
    Auth,
}

impl ReasonCode {
    /// True if MQTT 5 allows this code in the given packet.
    pub(crate) fn valid_in(self, ctx: ReasonContext) -> bool {
        let c = self.0;
        match ctx {
            ReasonContext::ConnAck => {
                c == 0x00 || (0x80..=0x8A).contains(&c) || matches!(c, 0x8C | 0x90 | 0x95 | 0x97 | 0x99..=0x9D | 0x9F)
            }
            ReasonContext::PubAck => matches!(c, 0x00 | 0x10 | 0x80 | 0x83 | 0x87 | 0x90 | 0x91 | 0x97 | 0x99),
            ReasonContext::PubRel => matches!(c, 0x00 | 0x92),
            ReasonContext::SubAck => {
                matches!(c, 0x00..=0x02 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91 | 0x97 | 0x9E | 0xA1 | 0xA2)
            }
            ReasonContext::UnsubAck => matches!(c, 0x00 | 0x11 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91),
            ReasonContext::Disconnect => {
                matches!(c, 0x00 | 0x04 | 0x80..=0x83 | 0x87 | 0x89 | 0x8B | 0x8D..=0x90 | 0x93..=0xA2)
            }
            ReasonContext::Auth => matches!(c, 0x00 | 0x18 | 0x19),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v3_connack_mapping() {
        assert_eq!(ReasonCode::SUCCESS.to_v3_connack(), 0);
        assert_eq!(ReasonCode::UNSUPPORTED_PROTOCOL_VERSION.to_v3_connack(), 1);
        assert_eq!(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID.to_v3_connack(), 2);
        assert_eq!(ReasonCode::SERVER_UNAVAILABLE.to_v3_connack(), 3);
        assert_eq!(ReasonCode::SERVER_BUSY.to_v3_connack(), 3);
        assert_eq!(ReasonCode::SERVER_SHUTTING_DOWN.to_v3_connack(), 3);
        assert_eq!(ReasonCode::BAD_USER_NAME_OR_PASSWORD.to_v3_connack(), 4);
        assert_eq!(ReasonCode::NOT_AUTHORIZED.to_v3_connack(), 5);
        assert_eq!(ReasonCode::BAD_AUTHENTICATION_METHOD.to_v3_connack(), 5);
        assert_eq!(ReasonCode::BANNED.to_v3_connack(), 5);
        for code in 0..=5u8 {
            let r = ReasonCode::from_v3_connack(code).unwrap();
            assert_eq!(r.to_v3_connack(), code);
        }
        assert_eq!(ReasonCode::from_v3_connack(6), None);
    }

    #[test]
    fn v3_suback_mapping() {
        assert_eq!(ReasonCode::GRANTED_QOS_0.to_v3_suback(), 0);
        assert_eq!(ReasonCode::GRANTED_QOS_2.to_v3_suback(), 2);
        assert_eq!(ReasonCode::NOT_AUTHORIZED.to_v3_suback(), 0x80);
        assert_eq!(ReasonCode::TOPIC_FILTER_INVALID.to_v3_suback(), 0x80);
        assert_eq!(ReasonCode(0x10).to_v3_suback(), 0x80);
    }

    #[test]
    fn contexts() {
        assert!(ReasonCode::PACKET_IDENTIFIER_NOT_FOUND.valid_in(ReasonContext::PubRel));
        assert!(!ReasonCode::NOT_AUTHORIZED.valid_in(ReasonContext::PubRel));
        assert!(ReasonCode::DISCONNECT_WITH_WILL.valid_in(ReasonContext::Disconnect));
        assert!(!ReasonCode(0x05).valid_in(ReasonContext::Disconnect));
        assert!(ReasonCode::CONTINUE_AUTHENTICATION.valid_in(ReasonContext::Auth));
    }
}

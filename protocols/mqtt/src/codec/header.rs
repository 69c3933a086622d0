//! Fixed header: packet type, reserved flag bits and the remaining length, read before
//! the body is buffered so oversized packets are refused early.

use super::DecodeError;
use crate::packet::ProtocolLevel;

/// Packet type numbers.
pub(crate) const CONNECT: u8 = 1;
pub(crate) const CONNACK: u8 = 2;
pub(crate) const PUBLISH: u8 = 3;
pub(crate) const PUBACK: u8 = 4;
pub(crate) const PUBREC: u8 = 5;
pub(crate) const PUBREL: u8 = 6;
pub(crate) const PUBCOMP: u8 = 7;
pub(crate) const SUBSCRIBE: u8 = 8;
pub(crate) const SUBACK: u8 = 9;
pub(crate) const UNSUBSCRIBE: u8 = 10;
pub(crate) const UNSUBACK: u8 = 11;
pub(crate) const PINGREQ: u8 = 12;
pub(crate) const PINGRESP: u8 = 13;
pub(crate) const DISCONNECT: u8 = 14;
pub(crate) const AUTH: u8 = 15;

/// The fixed header at the front of a packet, parsed before its body is buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FixedHeader {
    /// First byte (type and flags).
    pub byte1: u8,
    /// Bytes of the fixed header (2 to 5).
    pub header_len: usize,
    /// Remaining Length: bytes of the packet after the fixed header.
    pub remaining: usize,
}

impl FixedHeader {
    pub(crate) fn packet_type(&self) -> u8 {
        self.byte1 >> 4
    }
    pub(crate) fn flags(&self) -> u8 {
        self.byte1 & 0x0F
    }
    /// Whole packet size.
    pub(crate) fn total(&self) -> usize {
        self.header_len + self.remaining
    }
}

/// Parses the fixed header at the front of `buf`; `Ok(None)` if incomplete.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<FixedHeader>, DecodeError> {
    let Some(&byte1) = buf.first() else {
        return Ok(None);
    };
    let mut remaining = 0usize;
    for i in 0..4usize {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        remaining |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some(FixedHeader { byte1, header_len: 2 + i, remaining }));
        }
    }
    Err(DecodeError::Malformed("remaining length longer than 4 bytes"))
}

/// Checks the reserved flag bits of the first byte (MQTT-2.1.3-1), the reserved packet
/// type 0, and QoS 3 / DUP on QoS 0 for PUBLISH.
///
/// `level` is the connection's protocol level (`None` before CONNECT). MQTT 3.1 has no
/// reserved flags: its fixed header carries DUP, QoS and RETAIN on every packet, set on
/// retransmission (DUP on PUBREL, SUBSCRIBE and UNSUBSCRIBE) and "not used" elsewhere, so
/// a 3.1 connection's flags are checked on PUBLISH only, as Mosquitto does.
pub(crate) fn check_flags(byte1: u8, level: Option<ProtocolLevel>) -> Result<(), DecodeError> {
    let flags = byte1 & 0x0F;
    match byte1 >> 4 {
        0 => Err(DecodeError::Protocol("reserved packet type 0")),
        PUBLISH => {
            let qos = (flags >> 1) & 0x03;
            if qos == 3 {
                return Err(DecodeError::Malformed("PUBLISH with QoS 3"));
            }
            if qos == 0 && flags & 0x08 != 0 {
                return Err(DecodeError::Protocol("DUP flag set on QoS 0 PUBLISH"));
            }
            Ok(())
        }
        _ if level == Some(ProtocolLevel::V3_1) => Ok(()),
        PUBREL | SUBSCRIBE | UNSUBSCRIBE => {
            if flags != 0b0010 {
                return Err(DecodeError::Malformed("reserved fixed header flags must be 0010"));
            }
            Ok(())
        }
        _ => {
            if flags != 0 {
                return Err(DecodeError::Malformed("reserved fixed header flags must be 0000"));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_and_complete() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&[0x30]), Ok(None));
        assert_eq!(parse(&[0x30, 0x80]), Ok(None));
        assert_eq!(parse(&[0x30, 0x80, 0x01]), Ok(Some(FixedHeader { byte1: 0x30, header_len: 3, remaining: 128 })));
        assert_eq!(parse(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F]).unwrap().unwrap().remaining, 268_435_455);
        assert!(parse(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF]).is_err());
        assert!(parse(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]).is_err());
    }

    /// MQTT 3.1 retransmits PUBREL, SUBSCRIBE and UNSUBSCRIBE with DUP set (0x6A, 0x8A,
    /// 0xAA); 3.1.1 and 5.0 reserve those flags.
    #[test]
    fn v3_1_has_no_reserved_flags() {
        for byte1 in [0x6A, 0x8A, 0xAA, 0x62, 0x41, 0xC1] {
            assert_eq!(check_flags(byte1, Some(ProtocolLevel::V3_1)), Ok(()), "{byte1:#04x}");
            for level in [None, Some(ProtocolLevel::V3_1_1), Some(ProtocolLevel::V5)] {
                assert_eq!(check_flags(byte1, level).is_ok(), byte1 == 0x62, "{byte1:#04x} at {level:?}");
            }
        }
        // PUBLISH keeps its rules at 3.1.
        assert!(check_flags(0x36, Some(ProtocolLevel::V3_1)).is_err());
        assert!(check_flags(0x38, Some(ProtocolLevel::V3_1)).is_err());
        assert!(check_flags(0x00, Some(ProtocolLevel::V3_1)).is_err());
    }

    #[test]
    fn flags() {
        let check_flags = |b| check_flags(b, Some(ProtocolLevel::V3_1_1));
        assert!(check_flags(0x00).is_err());
        assert!(check_flags(0x10).is_ok());
        assert!(check_flags(0x11).is_err());
        assert!(check_flags(0x62).is_ok());
        assert!(check_flags(0x60).is_err());
        assert!(check_flags(0x82).is_ok());
        assert!(check_flags(0x80).is_err());
        assert!(check_flags(0xA2).is_ok());
        assert!(check_flags(0xA3).is_err());
        assert!(check_flags(0xC1).is_err());
        assert!(check_flags(0x36).is_err()); // QoS 3
        assert!(check_flags(0x38).is_err()); // DUP on QoS 0
        assert!(check_flags(0x3B).is_ok()); // DUP, QoS 1, retain
        assert!(check_flags(0xF0).is_ok());
        assert!(check_flags(0xF1).is_err());
    }
}

//! PUBACK, PUBREC, PUBREL and PUBCOMP: packet id, and for MQTT 5 an optional reason
//! code and properties (short forms when they are the defaults).

use super::props::{self, ReasonProps};
use super::wire::{Reader, Sink};
use super::DecodeError;
use crate::packet::ProtocolLevel;
use crate::reason::{ReasonCode, ReasonContext};

/// Non-zero packet id.
pub(crate) fn read_pkid(r: &mut Reader) -> Result<u16, DecodeError> {
    let id = r.u16()?;
    if id == 0 {
        return Err(DecodeError::Protocol("packet identifier 0"));
    }
    Ok(id)
}

/// Decoded PUBACK/PUBREC/PUBREL/PUBCOMP fields.
pub(crate) struct Ack {
    pub pkid: u16,
    pub reason: ReasonCode,
    pub reason_string: Option<String>,
}

pub(crate) fn read_ack(r: &mut Reader, level: ProtocolLevel, ctx: ReasonContext) -> Result<Ack, DecodeError> {
    let pkid = read_pkid(r)?;
    let mut ack = Ack { pkid, reason: ReasonCode::SUCCESS, reason_string: None };
    if level.is_v5() && !r.is_empty() {
        ack.reason = ReasonCode(r.u8()?);
        if !ack.reason.valid_in(ctx) {
            return Err(DecodeError::Protocol("invalid reason code"));
        }
        if !r.is_empty() {
            ack.reason_string = props::read(r, props::ACK, false)?.reason_string;
        }
    }
    if !r.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after acknowledgement"));
    }
    Ok(ack)
}

pub(crate) fn put_ack<S: Sink>(
    pkid: u16,
    reason: ReasonCode,
    reason_string: Option<&str>,
    level: ProtocolLevel,
    s: &mut S,
) {
    s.put_u16(pkid);
    if !level.is_v5() {
        return;
    }
    if reason_string.is_some() {
        s.put_u8(reason.0);
        props::write(s, &ReasonProps { reason_string });
    } else if reason != ReasonCode::SUCCESS {
        s.put_u8(reason.0);
    }
}

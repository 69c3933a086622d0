//! SUBSCRIBE, SUBACK, UNSUBSCRIBE and UNSUBACK.

use super::ack::read_pkid;
use super::props::{self, PropSet, ReasonProps};
use super::wire::{Reader, Sink};
use super::DecodeError;
use crate::packet::*;
use crate::reason::{ReasonCode, ReasonContext};

pub(crate) fn read_subscribe(r: &mut Reader, level: ProtocolLevel) -> Result<Subscribe, DecodeError> {
    let pkid = read_pkid(r)?;
    let (subscription_identifier, user_properties) = if level.is_v5() {
        let p = props::read(r, props::SUBSCRIBE, false)?;
        (p.subscription_identifiers.first().copied(), p.user_properties)
    } else {
        (None, Vec::new())
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        let options = r.u8()?;
        let qos = QoS::from_u8(options & 0x03).ok_or(DecodeError::Malformed("subscription QoS 3"))?;
        let reserved = if level.is_v5() { 0xC0 } else { 0xFC };
        if options & reserved != 0 {
            return Err(DecodeError::Malformed("reserved subscription option bits set"));
        }
        let retain_handling = (options >> 4) & 0x03;
        if retain_handling == 3 {
            return Err(DecodeError::Protocol("retain handling 3"));
        }
        filters.push(SubscribeFilter {
            filter,
            qos,
            no_local: options & 0x04 != 0,
            retain_as_published: options & 0x08 != 0,
            retain_handling,
        });
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("SUBSCRIBE without topic filters"));
    }
    Ok(Subscribe { pkid, filters, subscription_identifier, user_properties })
}

struct SubscribeProps<'a>(&'a Subscribe);

impl PropSet for SubscribeProps<'_> {
    fn put<S: Sink>(&self, s: &mut S) {
        if let Some(id) = self.0.subscription_identifier {
            s.put_u8(props::SUBSCRIPTION_IDENTIFIER);
            s.put_varint(id as usize);
        }
        props::users(s, &self.0.user_properties);
    }
}

pub(crate) fn put_subscribe<S: Sink>(sub: &Subscribe, level: ProtocolLevel, s: &mut S) {
    s.put_u16(sub.pkid);
    if level.is_v5() {
        props::write(s, &SubscribeProps(sub));
    }
    for f in &sub.filters {
        s.put_str(&f.filter);
        let mut options = f.qos as u8;
        if level.is_v5() {
            options |= u8::from(f.no_local) << 2;
            options |= u8::from(f.retain_as_published) << 3;
            options |= (f.retain_handling & 0x03) << 4;
        }
        s.put_u8(options);
    }
}

pub(crate) fn read_unsubscribe(r: &mut Reader, level: ProtocolLevel) -> Result<Unsubscribe, DecodeError> {
    let pkid = read_pkid(r)?;
    let user_properties =
        if level.is_v5() { props::read(r, props::UNSUBSCRIBE, false)?.user_properties } else { Vec::new() };
    let mut filters = Vec::new();
    while !r.is_empty() {
        filters.push(r.string()?);
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("UNSUBSCRIBE without topic filters"));
    }
    Ok(Unsubscribe { pkid, filters, user_properties })
}

struct Users<'a>(&'a [UserProperty]);

impl PropSet for Users<'_> {
    fn put<S: Sink>(&self, s: &mut S) {
        props::users(s, self.0);
    }
}

pub(crate) fn put_unsubscribe<S: Sink>(u: &Unsubscribe, level: ProtocolLevel, s: &mut S) {
    s.put_u16(u.pkid);
    if level.is_v5() {
        props::write(s, &Users(&u.user_properties));
    }
    for f in &u.filters {
        s.put_str(f);
    }
}

/// SUBACK (`suback`) or UNSUBACK: packet id, reason string, reason codes.
pub(crate) fn read_sub_ack(r: &mut Reader, level: ProtocolLevel, suback: bool) -> Result<Packet, DecodeError> {
    let pkid = read_pkid(r)?;
    let reason_string = if level.is_v5() { props::read(r, props::ACK, false)?.reason_string } else { None };
    let mut reasons = Vec::new();
    if suback || level.is_v5() {
        let ctx = if suback { ReasonContext::SubAck } else { ReasonContext::UnsubAck };
        while !r.is_empty() {
            let code = ReasonCode(r.u8()?);
            let ok = if level.is_v5() { code.valid_in(ctx) } else { matches!(code.0, 0..=2 | 0x80) };
            if !ok {
                return Err(DecodeError::Protocol("invalid reason code"));
            }
            reasons.push(code);
        }
        if reasons.is_empty() {
            return Err(DecodeError::Protocol("acknowledgement without reason codes"));
        }
    }
    if !r.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after UNSUBACK"));
    }
    Ok(if suback {
        Packet::SubAck { pkid, reasons, reason_string }
    } else {
        Packet::UnsubAck { pkid, reasons, reason_string }
    })
}

pub(crate) fn put_sub_ack<S: Sink>(
    pkid: u16,
    reasons: &[ReasonCode],
    reason_string: Option<&str>,
    level: ProtocolLevel,
    suback: bool,
    s: &mut S,
) {
    s.put_u16(pkid);
    if level.is_v5() {
        props::write(s, &ReasonProps { reason_string });
        for r in reasons {
            s.put_u8(r.0);
        }
    } else if suback {
        for r in reasons {
            s.put_u8(r.to_v3_suback());
        }
    }
}

//! DISCONNECT (both directions) and the MQTT 5 AUTH packet, which `mqttbytes` lacks.

use bytes::Bytes;

use super::props::{self, PropSet};
use super::wire::{Reader, Sink};
use super::DecodeError;
use crate::packet::*;
use crate::reason::{ReasonCode, ReasonContext};

pub(crate) fn read_disconnect(r: &mut Reader, level: ProtocolLevel) -> Result<Disconnect, DecodeError> {
    let mut d = Disconnect {
        reason: ReasonCode::NORMAL_DISCONNECTION,
        session_expiry_interval: None,
        reason_string: None,
        server_reference: None,
    };
    if level.is_v5() && !r.is_empty() {
        d.reason = ReasonCode(r.u8()?);
        if !d.reason.valid_in(ReasonContext::Disconnect) {
            return Err(DecodeError::Protocol("invalid DISCONNECT reason code"));
        }
        if !r.is_empty() {
            let p = props::read(r, props::DISCONNECT, false)?;
            d.session_expiry_interval = p.session_expiry_interval;
            d.reason_string = p.reason_string;
            d.server_reference = p.server_reference;
        }
    }
    if !r.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after DISCONNECT"));
    }
    Ok(d)
}

impl PropSet for Disconnect {
    fn put<S: Sink>(&self, s: &mut S) {
        props::opt_u32(s, props::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        props::opt_str(s, props::REASON_STRING, self.reason_string.as_deref());
        props::opt_str(s, props::SERVER_REFERENCE, self.server_reference.as_deref());
    }
}

pub(crate) fn put_disconnect<S: Sink>(d: &Disconnect, level: ProtocolLevel, s: &mut S) {
    if !level.is_v5() {
        return;
    }
    let has_props = d.session_expiry_interval.is_some() || d.reason_string.is_some() || d.server_reference.is_some();
    if has_props {
        s.put_u8(d.reason.0);
        props::write(s, d);
    } else if d.reason != ReasonCode::NORMAL_DISCONNECTION {
        s.put_u8(d.reason.0);
    }
}

pub(crate) fn read_auth(r: &mut Reader) -> Result<Packet, DecodeError> {
    let mut reason = ReasonCode::SUCCESS;
    let mut method = None;
    let mut data = None;
    if !r.is_empty() {
        reason = ReasonCode(r.u8()?);
        if !reason.valid_in(ReasonContext::Auth) {
            return Err(DecodeError::Protocol("invalid AUTH reason code"));
        }
        if !r.is_empty() {
            let p = props::read(r, props::AUTH, false)?;
            method = p.authentication_method;
            data = p.authentication_data;
        }
    }
    if !r.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after AUTH"));
    }
    Ok(Packet::Auth { reason, method, data })
}

struct AuthProps<'a> {
    method: Option<&'a str>,
    data: Option<&'a Bytes>,
}

impl PropSet for AuthProps<'_> {
    fn put<S: Sink>(&self, s: &mut S) {
        props::opt_str(s, props::AUTHENTICATION_METHOD, self.method);
        props::opt_bin(s, props::AUTHENTICATION_DATA, self.data.map(|d| &d[..]));
    }
}

pub(crate) fn put_auth<S: Sink>(reason: ReasonCode, method: Option<&str>, data: Option<&Bytes>, s: &mut S) {
    if reason == ReasonCode::SUCCESS && method.is_none() && data.is_none() {
        return;
    }
    s.put_u8(reason.0);
    props::write(s, &AuthProps { method, data });
}

//! SASL responses of Connection.Start-Ok: PLAIN (`authzid \0 user \0 password`),
//! AMQPLAIN (a field table with `LOGIN` and `PASSWORD`, sent without the table's length
//! prefix by py-amqp/kombu, lapin and RabbitMQ's own clients), and EXTERNAL where offered
//! (the identity is the TLS client certificate's, outside this crate).

use amq_protocol::types::parsing::parse_field_table;
use amq_protocol::types::AMQPValue;

use crate::guard;

/// Mechanisms offered in Connection.Start.
pub(crate) const MECHANISMS: &str = "PLAIN AMQPLAIN";

/// Mechanisms offered where the client presented a verified certificate.
pub(crate) const MECHANISMS_WITH_EXTERNAL: &str = "PLAIN AMQPLAIN EXTERNAL";

/// Why a Start-Ok response was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SaslError {
    /// A mechanism other than PLAIN or AMQPLAIN.
    UnsupportedMechanism,
    /// The response does not decode for its mechanism.
    Malformed,
}

/// User name and password from a Start-Ok response (EXTERNAL, when `external` offered
/// it: both empty; its response, an optional authorization identity, is not used).
pub(crate) fn credentials(mechanism: &str, response: &[u8], external: bool) -> Result<(String, String), SaslError> {
    match mechanism {
        "PLAIN" => plain(response),
        "AMQPLAIN" => amqplain(response),
        "EXTERNAL" if external => Ok((String::new(), String::new())),
        _ => Err(SaslError::UnsupportedMechanism),
    }
}

fn utf8(b: &[u8]) -> Result<String, SaslError> {
    String::from_utf8(b.to_vec()).map_err(|_| SaslError::Malformed)
}

/// `[authzid] NUL authcid NUL passwd` (RFC 4616); the authorization identity is ignored.
fn plain(response: &[u8]) -> Result<(String, String), SaslError> {
    let mut parts = response.split(|b| *b == 0);
    let (Some(_authzid), Some(user), Some(pass), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(SaslError::Malformed);
    };
    Ok((utf8(user)?, utf8(pass)?))
}

fn amqplain(response: &[u8]) -> Result<(String, String), SaslError> {
    // As sent: the table's entries without the length prefix. Some clients include the
    // prefix; accept that too when it matches.
    let body = if guard::check_table_body(response).is_ok() {
        response
    } else {
        match response {
            [a, b, c, d, rest @ ..] if u32::from_be_bytes([*a, *b, *c, *d]) as usize == rest.len() => rest,
            _ => return Err(SaslError::Malformed),
        }
    };
    guard::check_table_body(body).map_err(|_| SaslError::Malformed)?;
    let len = u32::try_from(body.len()).map_err(|_| SaslError::Malformed)?;
    let mut framed = Vec::with_capacity(body.len() + 4);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(body);
    let table = match parse_field_table(&framed[..]) {
        Ok(([], table)) => table,
        _ => return Err(SaslError::Malformed),
    };
    let field = |name: &str| match table.inner().get(name) {
        Some(AMQPValue::LongString(s)) => utf8(s.as_bytes()),
        Some(AMQPValue::ShortString(s)) => Ok(s.as_str().to_owned()),
        _ => Err(SaslError::Malformed),
    };
    Ok((field("LOGIN")?, field("PASSWORD")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::auth::{Credentials, SASLMechanism};

    #[test]
    fn plain_as_clients_send_it() {
        let c = Credentials::new("guest".into(), "s3cr3t".into());
        let r = c.sasl_auth_string(SASLMechanism::Plain);
        assert_eq!(credentials("PLAIN", r.as_bytes(), false), Ok(("guest".into(), "s3cr3t".into())));
        assert_eq!(credentials("PLAIN", b"authz\0u\0p", false), Ok(("u".into(), "p".into())));
        assert_eq!(credentials("PLAIN", b"\0u\0", false), Ok(("u".into(), String::new())));
        assert_eq!(credentials("PLAIN", b"\0u", false), Err(SaslError::Malformed));
        assert_eq!(credentials("PLAIN", b"\0u\0p\0x", false), Err(SaslError::Malformed));
        assert_eq!(credentials("PLAIN", b"\0u\0\xff", false), Err(SaslError::Malformed));
    }

    #[test]
    fn amqplain_as_clients_send_it() {
        let c = Credentials::new("guest".into(), "pw".into());
        let r = c.sasl_auth_string(SASLMechanism::AMQPlain);
        assert_eq!(credentials("AMQPLAIN", r.as_bytes(), false), Ok(("guest".into(), "pw".into())));
        // py-amqp's bytes: \x05LOGINS<len>guest\x08PASSWORDS<len>pw
        let py = b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x02pw";
        assert_eq!(credentials("AMQPLAIN", py, false), Ok(("guest".into(), "pw".into())));
        // With the length prefix.
        let mut prefixed = (py.len() as u32).to_be_bytes().to_vec();
        prefixed.extend_from_slice(py);
        assert_eq!(credentials("AMQPLAIN", &prefixed, false), Ok(("guest".into(), "pw".into())));
        assert_eq!(credentials("AMQPLAIN", b"\x05LOGINS\x00\x00\x00\x05guest", false), Err(SaslError::Malformed));
        assert_eq!(credentials("AMQPLAIN", b"\x05LOG", false), Err(SaslError::Malformed));
        assert_eq!(credentials("EXTERNAL", b"", false), Err(SaslError::UnsupportedMechanism));
        assert_eq!(credentials("EXTERNAL", b"", true), Ok((String::new(), String::new())));
    }
}

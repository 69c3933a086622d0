//! AMQP 0-9-1 reply codes as RabbitMQ uses them, and RabbitMQ's reply-text convention
//! (`"NOT_FOUND - no queue 'q' in vhost '/'"`: the code's name, a dash, the explanation).

/// 200: normal close.
pub const REPLY_SUCCESS: u16 = 200;
/// 311 (soft, Basic.Return).
pub const CONTENT_TOO_LARGE: u16 = 311;
/// 312 (soft, Basic.Return of a mandatory publish that was not routed).
pub const NO_ROUTE: u16 = 312;
/// 313 (soft, Basic.Return).
pub const NO_CONSUMERS: u16 = 313;
/// 320: the broker closed the connection (shutdown, forced close).
pub const CONNECTION_FORCED: u16 = 320;
/// 402: invalid path (vhost).
pub const INVALID_PATH: u16 = 402;
/// 403 (soft): access refused; also the login refusal.
pub const ACCESS_REFUSED: u16 = 403;
/// 404 (soft): no such exchange/queue.
pub const NOT_FOUND: u16 = 404;
/// 405 (soft): exclusive queue in use by another connection.
pub const RESOURCE_LOCKED: u16 = 405;
/// 406 (soft): precondition failed (inequivalent declare, unknown delivery tag, ...).
pub const PRECONDITION_FAILED: u16 = 406;
/// 501: malformed frame.
pub const FRAME_ERROR: u16 = 501;
/// 502: illegal field values.
pub const SYNTAX_ERROR: u16 = 502;
/// 503: invalid command.
pub const COMMAND_INVALID: u16 = 503;
/// 504: channel not open, or out of range.
pub const CHANNEL_ERROR: u16 = 504;
/// 505: frame not expected now.
pub const UNEXPECTED_FRAME: u16 = 505;
/// 506: resource error.
pub const RESOURCE_ERROR: u16 = 506;
/// 530: not allowed (vhost access, negotiation limits).
pub const NOT_ALLOWED: u16 = 530;
/// 540: not implemented.
pub const NOT_IMPLEMENTED: u16 = 540;
/// 541: internal error.
pub const INTERNAL_ERROR: u16 = 541;

/// RabbitMQ's name of a reply code (`NOT_FOUND`, ...); `None` for 200 and unknown codes.
pub fn name(code: u16) -> Option<&'static str> {
    Some(match code {
        CONTENT_TOO_LARGE => "CONTENT_TOO_LARGE",
        NO_ROUTE => "NO_ROUTE",
        NO_CONSUMERS => "NO_CONSUMERS",
        CONNECTION_FORCED => "CONNECTION_FORCED",
        INVALID_PATH => "INVALID_PATH",
        ACCESS_REFUSED => "ACCESS_REFUSED",
        NOT_FOUND => "NOT_FOUND",
        RESOURCE_LOCKED => "RESOURCE_LOCKED",
        PRECONDITION_FAILED => "PRECONDITION_FAILED",
        FRAME_ERROR => "FRAME_ERROR",
        SYNTAX_ERROR => "SYNTAX_ERROR",
        COMMAND_INVALID => "COMMAND_INVALID",
        CHANNEL_ERROR => "CHANNEL_ERROR",
        UNEXPECTED_FRAME => "UNEXPECTED_FRAME",
        RESOURCE_ERROR => "RESOURCE_ERROR",
        NOT_ALLOWED => "NOT_ALLOWED",
        NOT_IMPLEMENTED => "NOT_IMPLEMENTED",
        INTERNAL_ERROR => "INTERNAL_ERROR",
        _ => return None,
    })
}

/// Reply text the way RabbitMQ writes it: `"NAME - explanation"` (the explanation alone
/// for 200 and unknown codes). Texts longer than 255 bytes are cut when sent.
pub fn text(code: u16, explanation: &str) -> String {
    match name(code) {
        Some(n) => format!("{n} - {explanation}"),
        None => explanation.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_texts() {
        assert_eq!(name(404), Some("NOT_FOUND"));
        assert_eq!(name(200), None);
        assert_eq!(text(406, "x"), "PRECONDITION_FAILED - x");
        assert_eq!(text(200, "bye"), "bye");
        for code in [311, 312, 313, 320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506, 530, 540, 541] {
            assert!(name(code).is_some(), "{code}");
        }
    }
}

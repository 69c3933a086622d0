//! Browser origins as the HTTP API's cross-site check and the MQTT WebSocket listener's
//! origin check compare them: the scheme, host and port of an `Origin` header (or of a
//! configured origin), and the authority a request was sent to (its `Host` header).
//! Browsers set both headers themselves; a page cannot forge them.

use std::fmt;
use std::net::IpAddr;

/// An origin, `scheme://host[:port]`: scheme and host in lower case, the port as written
/// or the scheme's default (`None` for a scheme without one and no port written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `http`, `https`, ...
    pub scheme: String,
    /// A name, an IPv4 address or a bracketed IPv6 address (`[::1]`).
    pub host: String,
    /// The port, explicit or the scheme's default.
    pub port: Option<u16>,
}

/// The port a scheme implies when none is written (`ws`/`wss` as `http`/`https`).
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// `host[:port]` split, the host in lower case (`None` when it is not an authority: empty,
/// user info, a path, a bad port).
pub(crate) fn split_authority(authority: &str) -> Option<(String, Option<u16>)> {
    let a = authority.trim();
    if a.is_empty() || a.contains(['@', '/', '?', '#', ' ']) {
        return None;
    }
    let (host, port) = if a.starts_with('[') {
        let end = a.find(']')?;
        let (host, rest) = a.split_at(end + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match a.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let plain = !host.is_empty() && !host.contains(':');
    (plain || host.starts_with('[')).then_some((host, port))
}

impl Origin {
    /// Parses `scheme://host[:port]`, as an `Origin` header or a configured origin spells it;
    /// `None` for `null` (an opaque origin: a sandboxed frame, a file) and anything else.
    pub fn parse(s: &str) -> Option<Origin> {
        let (scheme, authority) = s.trim().split_once("://")?;
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
        if scheme.is_empty() || !scheme.chars().all(valid) {
            return None;
        }
        let scheme = scheme.to_ascii_lowercase();
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        let (host, port) = split_authority(authority)?;
        let port = port.or_else(|| default_port(&scheme));
        Some(Origin { scheme, host, port })
    }

    /// Whether a request that names `authority` (its `Host`) was sent to this origin's host
    /// and port (a `Host` without a port means this origin scheme's default one).
    pub fn same_authority(&self, authority: &str) -> bool {
        match split_authority(authority) {
            Some((host, port)) => host == self.host && port.or_else(|| default_port(&self.scheme)) == self.port,
            None => false,
        }
    }

    /// Whether `authority` names this origin's host, whatever the port (a listener on
    /// another port of the same host: the dashboard's page and the WebSocket listener).
    pub fn same_host(&self, authority: &str) -> bool {
        split_authority(authority).is_some_and(|(host, _)| host == self.host)
    }
}

impl fmt::Display for Origin {
    /// `scheme://host`, then `:port` unless it is the scheme's default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        match self.port {
            Some(p) if Some(p) != default_port(&self.scheme) => write!(f, ":{p}"),
            _ => Ok(()),
        }
    }
}

/// Whether `host` (lower case, as [`split_authority`] gives it) can only mean this machine:
/// `localhost`, a name under `.localhost`, 127.0.0.0/8 or `[::1]`. A page that reaches a
/// loopback listener under another name got there by DNS rebinding.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_with_their_default_ports() {
        let o = Origin::parse("HTTP://Example.COM").unwrap();
        assert_eq!((o.scheme.as_str(), o.host.as_str(), o.port), ("http", "example.com", Some(80)));
        assert_eq!(o.to_string(), "http://example.com");
        let o = Origin::parse("https://app.example.com:8443").unwrap();
        assert_eq!((o.port, o.to_string().as_str()), (Some(8443), "https://app.example.com:8443"));
        let o = Origin::parse("http://[::1]:15672").unwrap();
        assert_eq!((o.host.as_str(), o.port), ("[::1]", Some(15672)));
        assert_eq!(Origin::parse("chrome-extension://abc").unwrap().port, None);
        for bad in ["null", "", "example.com", "http://", "http://u@h", "http://h:99999", "http://h/p", "ht tp://h"] {
            assert_eq!(Origin::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_origin_is_compared_with_the_host_a_request_names() {
        let o = Origin::parse("http://127.0.0.1:15672").unwrap();
        assert!(o.same_authority("127.0.0.1:15672"));
        assert!(!o.same_authority("127.0.0.1:8083"));
        assert!(o.same_host("127.0.0.1:8083"), "another port of the same host");
        assert!(!o.same_host("localhost:15672"), "another name is another site");
        let d = Origin::parse("https://mq.example.com").unwrap();
        assert!(d.same_authority("MQ.example.com") && d.same_authority("mq.example.com:443"));
        assert!(!d.same_authority("mq.example.com:80"));
        assert!(!d.same_authority("evil.example:443@mq.example.com"));
    }

    #[test]
    fn loopback_hosts_are_the_names_that_can_only_mean_this_machine() {
        for h in ["localhost", "app.localhost", "127.0.0.1", "127.1.2.3", "[::1]"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["example.com", "10.0.0.1", "[::2]", "localhost.example.com"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}

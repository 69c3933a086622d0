//! Mosquitto's `acl_file`, read as it is: `topic [read|write|readwrite|deny] TOPIC` lines
//! (before any `user` line they apply to anonymous clients, after `user NAME` to that
//! user), and `pattern [...] TOPIC` lines for every client, with `%u` / `%c`. As in
//! Mosquitto 2.0, `deny` lines are decided before the lines that grant access, what no
//! line grants is refused, and a SUBSCRIBE is always granted: what the client may not
//! read is filtered at delivery (checked against Mosquitto 2.0.11, which answers every
//! subscription with the QoS asked for under an `acl_file`).

use std::path::Path;

use super::rules::{check_filter, Actions, Permit, Rule, TopicPattern, Who};
use crate::access::auth::FileError;

/// Parses an ACL file's text (`path` names it in errors); any bad line fails the whole
/// file.
pub(crate) fn parse(path: &str, text: &str) -> Result<Vec<Rule>, FileError> {
    let mut denies = Vec::new();
    let mut grants = Vec::new();
    let mut user: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |problem: String| FileError::Line { path: path.to_owned(), line: i + 1, problem };
        let (keyword, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        match keyword {
            "user" => {
                if rest.is_empty() {
                    return Err(bad("`user` needs a user name".into()));
                }
                user = Some(rest.to_owned());
            }
            "topic" | "pattern" => {
                let (access, topic) = match rest.split_once(char::is_whitespace) {
                    Some((a @ ("read" | "write" | "readwrite" | "deny"), t)) => (a, t.trim()),
                    _ => ("readwrite", rest),
                };
                if topic.is_empty() {
                    return Err(bad(format!("`{keyword}` needs a topic")));
                }
                check_filter(topic).map_err(bad)?;
                let who = match (keyword, &user) {
                    ("pattern", _) => Who::All,
                    (_, Some(u)) => Who::User(u.clone()),
                    (_, None) => Who::Anonymous,
                };
                let receive_publish = Actions::RECEIVE.with(Actions::PUBLISH);
                let (permit, actions) = match access {
                    "read" => (Permit::Allow, Actions::RECEIVE),
                    "write" => (Permit::Allow, Actions::PUBLISH),
                    "readwrite" => (Permit::Allow, receive_publish),
                    _ => (Permit::Deny, receive_publish),
                };
                let rule = Rule { permit, who, actions, topics: vec![TopicPattern::Filter(topic.to_owned())] };
                if permit == Permit::Deny {
                    denies.push(rule);
                } else {
                    grants.push(rule);
                }
            }
            other => return Err(bad(format!("`{other}` is not `user`, `topic` or `pattern`"))),
        }
    }
    denies.extend(grants);
    Ok(denies)
}

/// Mosquitto 2.0's answer to every SUBSCRIBE under an `acl_file`: granted (what may not be
/// read is filtered at delivery). Subscribing only, not receiving, so it grants an AMQP
/// binding nothing.
pub(crate) fn every_subscription() -> Rule {
    Rule { permit: Permit::Allow, who: Who::All, actions: Actions::SUBSCRIBE, topics: vec![TopicPattern::Any] }
}

/// Reads and parses an ACL file.
pub(crate) fn read(path: &Path) -> Result<Vec<Rule>, FileError> {
    let (shown, text) = crate::access::auth::read_file(path)?;
    parse(&shown, &text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::authz::rules::{decide, Request};
    use crate::access::authz::Identity;

    const ACL: &str = "\
# anonymous clients
topic read public/#

user alice
topic readwrite alice/#
topic deny alice/secret
topic write  metrics/with space

pattern write devices/%u/%c/#
pattern read $SYS/#
";

    fn client(user: Option<&str>) -> Identity {
        Identity { user: user.map(Into::into), client_id: "c1".into(), ..Identity::default() }
    }

    #[test]
    fn sections_patterns_and_denies() {
        let mut rules = parse("acl", ACL).unwrap();
        rules.push(every_subscription());
        let allowed = |id: &Identity, r| decide(&rules, id, r) == Some(Permit::Allow);
        let (anon, alice, bob) = (client(None), client(Some("alice")), client(Some("bob")));
        assert!(allowed(&anon, Request::Receive("public/news")));
        assert!(!allowed(&anon, Request::Publish("public/news")));
        assert!(!allowed(&alice, Request::Receive("public/news")));
        assert!(allowed(&alice, Request::Publish("alice/x")));
        assert!(!allowed(&alice, Request::Receive("alice/secret")));
        // Every subscription is granted (as Mosquitto 2.0); what may not be read is not
        // delivered.
        assert!(allowed(&alice, Request::Subscribe("alice/#")));
        assert!(allowed(&bob, Request::Subscribe("#")));
        assert!(allowed(&alice, Request::Publish("metrics/with space")));
        assert!(allowed(&bob, Request::Publish("devices/bob/c1/t")));
        assert!(!allowed(&bob, Request::Publish("devices/alice/c1/t")));
        assert!(!allowed(&anon, Request::Publish("devices//c1/t")));
        assert!(allowed(&bob, Request::Receive("$SYS/broker/uptime")));
        assert!(!allowed(&bob, Request::Publish("$SYS/broker/uptime")));
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let e = parse("/etc/acl", "user a\ntopic read a/#/b\n").unwrap_err();
        assert!(e.to_string().starts_with("/etc/acl:2: topic `a/#/b`"), "{e}");
        let e = parse("acl", "\n\ntopics read a\n").unwrap_err();
        assert_eq!(e.to_string(), "acl:3: `topics` is not `user`, `topic` or `pattern`");
        let e = parse("acl", "user\n").unwrap_err();
        assert_eq!(e.to_string(), "acl:1: `user` needs a user name");
        let e = parse("acl", "pattern\n").unwrap_err();
        assert_eq!(e.to_string(), "acl:1: `pattern` needs a topic");
    }
}

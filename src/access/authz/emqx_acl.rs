//! EMQX's `acl.conf`, read as it is: Erlang terms `{allow|deny, Who, Action, Topics}.`
//! and the catch-all `{allow|deny, all}.`, first match wins.
//!
//! - Who: `all`, `{user|username, "u"}`, `{clientid|client, "c"}` (either with
//!   `{re, "..."}` instead of a name), `{ipaddr, "10.0.0.0/8"}`, `{ipaddrs, [...]}`,
//!   `{'and', [...]}`, `{'or', [...]}`.
//! - Action: `publish`, `subscribe` (subscribing and receiving), `all`, or
//!   `{publish|subscribe|all, [Options]}` (the options are not checked).
//! - Topics: filters with `${username}` / `${clientid}` (or `%u` / `%c`), or `{eq, "t"}`
//!   for exactly that string.

use std::path::Path;

use super::rules::{check_filter, Actions, Cidr, Pattern, Permit, Rule, TopicPattern, Who};
use crate::access::auth::FileError;

/// An Erlang term, as much of the syntax as `acl.conf` uses.
#[derive(Debug, Clone, PartialEq)]
enum Term {
    Atom(String),
    Str(String),
    Int(i64),
    Tuple(Vec<Term>),
    List(Vec<Term>),
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
}

impl Lexer<'_> {
    fn skip_blank(&mut self) {
        while let Some(&c) = self.chars.peek() {
            match c {
                '\n' => {
                    self.line += 1;
                    self.chars.next();
                }
                '%' => {
                    while self.chars.peek().is_some_and(|&c| c != '\n') {
                        self.chars.next();
                    }
                }
                c if c.is_whitespace() => {
                    self.chars.next();
                }
                _ => return,
            }
        }
    }

    fn expect(&mut self, want: char) -> Result<(), String> {
        self.skip_blank();
        match self.chars.next() {
            Some(c) if c == want => Ok(()),
            Some(c) => Err(format!("expected `{want}`, found `{c}`")),
            None => Err(format!("expected `{want}`, found the end of the file")),
        }
    }

    /// Terms separated by commas up to `close`.
    fn sequence(&mut self, close: char) -> Result<Vec<Term>, String> {
        let mut items = Vec::new();
        self.skip_blank();
        if self.chars.peek() == Some(&close) {
            self.chars.next();
            return Ok(items);
        }
        loop {
            items.push(self.term()?);
            self.skip_blank();
            match self.chars.next() {
                Some(',') => {}
                Some(c) if c == close => return Ok(items),
                Some(c) => return Err(format!("expected `,` or `{close}`, found `{c}`")),
                None => return Err(format!("expected `{close}`, found the end of the file")),
            }
        }
    }

    fn quoted(&mut self, quote: char) -> Result<String, String> {
        let mut s = String::new();
        loop {
            match self.chars.next() {
                Some(c) if c == quote => return Ok(s),
                Some('\\') => match self.chars.next() {
                    Some('n') => s.push('\n'),
                    Some('t') => s.push('\t'),
                    Some(c) => s.push(c),
                    None => break,
                },
                Some(c) => {
                    if c == '\n' {
                        self.line += 1;
                    }
                    s.push(c)
                }
                None => break,
            }
        }
        Err("a quoted string or atom is not closed".into())
    }

    fn term(&mut self) -> Result<Term, String> {
        self.skip_blank();
        match self.chars.next() {
            Some('{') => Ok(Term::Tuple(self.sequence('}')?)),
            Some('[') => Ok(Term::List(self.sequence(']')?)),
            Some('"') => Ok(Term::Str(self.quoted('"')?)),
            Some('\'') => Ok(Term::Atom(self.quoted('\'')?)),
            Some(c) if c.is_ascii_lowercase() => {
                let mut atom = c.to_string();
                while let Some(&c) = self.chars.peek() {
                    if !(c.is_ascii_alphanumeric() || c == '_' || c == '@') {
                        break;
                    }
                    atom.push(c);
                    self.chars.next();
                }
                Ok(Term::Atom(atom))
            }
            Some(c) if c.is_ascii_digit() || c == '-' => {
                let mut digits = c.to_string();
                while let Some(&c) = self.chars.peek().filter(|c| c.is_ascii_digit()) {
                    digits.push(c);
                    self.chars.next();
                }
                digits.parse().map(Term::Int).map_err(|_| format!("`{digits}` is not a number"))
            }
            Some(c) => Err(format!("unexpected `{c}`")),
            None => Err("unexpected end of the file".into()),
        }
    }
}

fn atom(t: &Term) -> Option<&str> {
    match t {
        Term::Atom(a) => Some(a),
        _ => None,
    }
}

fn text(t: &Term) -> Result<&str, String> {
    match t {
        Term::Str(s) => Ok(s),
        other => Err(format!("expected a string, found {}", shown(other))),
    }
}

fn shown(t: &Term) -> String {
    match t {
        Term::Atom(a) => format!("`{a}`"),
        Term::Str(s) => format!("\"{s}\""),
        Term::Int(n) => n.to_string(),
        Term::Tuple(_) => "a tuple".into(),
        Term::List(_) => "a list".into(),
    }
}

fn who(t: &Term) -> Result<Who, String> {
    match t {
        Term::Atom(a) if a == "all" => Ok(Who::All),
        Term::Tuple(pair) if pair.len() == 2 => {
            let (kind, value) = (atom(&pair[0]).unwrap_or_default(), &pair[1]);
            let regex = |v: &Term| -> Result<Option<Pattern>, String> {
                match v {
                    Term::Tuple(re) if re.len() == 2 && atom(&re[0]) == Some("re") => {
                        Ok(Some(Pattern::new(text(&re[1])?)?))
                    }
                    _ => Ok(None),
                }
            };
            let list = |v: &Term| -> Result<Vec<Who>, String> {
                match v {
                    Term::List(items) => items.iter().map(who).collect(),
                    other => Err(format!("expected a list, found {}", shown(other))),
                }
            };
            match kind {
                "user" | "username" => match regex(value)? {
                    Some(p) => Ok(Who::UserMatching(p)),
                    None => Ok(Who::User(text(value)?.to_owned())),
                },
                "client" | "clientid" => match regex(value)? {
                    Some(p) => Ok(Who::ClientIdMatching(p)),
                    // A client id in acl.conf is exact (no glob characters).
                    None => {
                        Ok(Who::ClientIdMatching(Pattern::new(&format!("^{}$", regex_lite::escape(text(value)?)))?))
                    }
                },
                "ipaddr" => cidr(value).map(Who::Source),
                "ipaddrs" => match value {
                    Term::List(items) => {
                        Ok(Who::Or(items.iter().map(|i| cidr(i).map(Who::Source)).collect::<Result<_, _>>()?))
                    }
                    other => Err(format!("expected a list of addresses, found {}", shown(other))),
                },
                "and" => Ok(Who::And(list(value)?)),
                "or" => Ok(Who::Or(list(value)?)),
                other => Err(format!("`{other}` is not all, user, username, clientid, ipaddr, ipaddrs, and, or")),
            }
        }
        other => Err(format!("expected who (all or a tuple), found {}", shown(other))),
    }
}

fn cidr(t: &Term) -> Result<Cidr, String> {
    let s = text(t)?;
    Cidr::parse(s).ok_or_else(|| format!("`{s}` is not an address or address/prefix"))
}

fn actions(t: &Term) -> Result<Actions, String> {
    let name = match t {
        Term::Atom(a) => a.as_str(),
        // {publish, [{qos, 1}, {retain, false}]}: the options are not checked.
        Term::Tuple(pair) if pair.len() == 2 => atom(&pair[0]).unwrap_or_default(),
        other => return Err(format!("expected an action, found {}", shown(other))),
    };
    match name {
        "publish" => Ok(Actions::PUBLISH),
        "subscribe" => Ok(Actions::READ),
        "all" | "pubsub" => Ok(Actions::ALL),
        other => Err(format!("`{other}` is not publish, subscribe or all")),
    }
}

fn topic(t: &Term) -> Result<TopicPattern, String> {
    match t {
        Term::Str(s) => {
            check_filter(s)?;
            Ok(TopicPattern::Filter(s.clone()))
        }
        Term::Tuple(pair) if pair.len() == 2 && atom(&pair[0]) == Some("eq") => {
            Ok(TopicPattern::Eq(text(&pair[1])?.to_owned()))
        }
        other => Err(format!("expected a topic string or {{eq, \"...\"}}, found {}", shown(other))),
    }
}

fn rule(t: &Term) -> Result<Rule, String> {
    let Term::Tuple(parts) = t else { return Err(format!("expected a rule tuple, found {}", shown(t))) };
    let permit = match parts.first().and_then(atom) {
        Some("allow") => Permit::Allow,
        Some("deny") => Permit::Deny,
        _ => return Err("a rule starts with allow or deny".into()),
    };
    match parts.len() {
        2 if atom(&parts[1]) == Some("all") => {
            Ok(Rule { permit, who: Who::All, actions: Actions::ALL, topics: vec![TopicPattern::Any] })
        }
        4 => {
            let topics = match &parts[3] {
                Term::List(items) => items.iter().map(topic).collect::<Result<Vec<_>, _>>()?,
                other => return Err(format!("expected a list of topics, found {}", shown(other))),
            };
            Ok(Rule { permit, who: who(&parts[1])?, actions: actions(&parts[2])?, topics })
        }
        _ => Err("a rule is {allow|deny, Who, Action, Topics} or {allow|deny, all}".into()),
    }
}

/// Parses an `acl.conf` text (`path` names it in errors); any bad rule fails the file.
pub(crate) fn parse(path: &str, text: &str) -> Result<Vec<Rule>, FileError> {
    let mut lexer = Lexer { chars: text.chars().peekable(), line: 1 };
    let mut rules = Vec::new();
    loop {
        lexer.skip_blank();
        if lexer.chars.peek().is_none() {
            return Ok(rules);
        }
        let line = lexer.line;
        let bad = |problem: String| FileError::Line { path: path.to_owned(), line, problem };
        let term = lexer.term().map_err(bad)?;
        lexer.expect('.').map_err(bad)?;
        rules.push(rule(&term).map_err(bad)?);
    }
}

/// Reads and parses an `acl.conf`.
pub(crate) fn read(path: &Path) -> Result<Vec<Rule>, FileError> {
    let (shown, text) = crate::access::auth::read_file(path)?;
    parse(&shown, &text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::authz::rules::{decide, Request};
    use crate::access::authz::Identity;

    // The shape of EMQX's shipped acl.conf, plus the other principal kinds.
    const ACL: &str = r##"
%% dashboard may read $SYS
{allow, {username, {re, "^dashboard$"}}, subscribe, ["$SYS/#"]}.
{allow, {ipaddr, "127.0.0.1"}, all, ["$SYS/#", "#"]}.
{deny, all, subscribe, ["$SYS/#", {eq, "#"}]}.
{allow, {clientid, "sensor-1"}, {publish, [{qos, [0, 1]}]}, ["sensors/${clientid}/#"]}.
{allow, {'and', [{user, "ops"}, {ipaddrs, ["10.0.0.0/8", "192.168.0.0/16"]}]}, publish, ["ops/%u"]}.
{deny, all}.
"##;

    fn client(user: Option<&str>, client_id: &str, ip: &str) -> Identity {
        Identity {
            user: user.map(Into::into),
            client_id: client_id.into(),
            peer: Some(ip.parse().unwrap()),
            ..Identity::default()
        }
    }

    #[test]
    fn emqx_rules() {
        let rules = parse("acl.conf", ACL).unwrap();
        assert_eq!(rules.len(), 6);
        let allowed = |id: &Identity, r| decide(&rules, id, r) == Some(Permit::Allow);
        let dashboard = client(Some("dashboard"), "d", "10.0.0.5");
        let local = client(None, "x", "127.0.0.1");
        let remote = client(None, "x", "10.0.0.5");
        assert!(allowed(&dashboard, Request::Subscribe("$SYS/broker/uptime")));
        assert!(allowed(&local, Request::Subscribe("#")));
        assert!(!allowed(&remote, Request::Subscribe("#")));
        assert!(!allowed(&remote, Request::Subscribe("$SYS/x")));
        let sensor = client(None, "sensor-1", "10.0.0.5");
        assert!(allowed(&sensor, Request::Publish("sensors/sensor-1/t")));
        assert!(!allowed(&client(None, "sensor-2", "10.0.0.5"), Request::Publish("sensors/sensor-2/t")));
        assert!(allowed(&client(Some("ops"), "o", "192.168.1.1"), Request::Publish("ops/ops")));
        assert!(!allowed(&client(Some("ops"), "o", "172.16.0.1"), Request::Publish("ops/ops")));
        // The catch-all deny covers $ topics too.
        assert_eq!(decide(&rules, &remote, Request::Publish("$SYS/x")), Some(Permit::Deny));
    }

    #[test]
    fn bad_terms_name_file_and_line() {
        let e = parse("acl.conf", "{allow, all}.\n\n{allow, all, publish, [\"a/#/b\"]}.\n").unwrap_err();
        assert!(e.to_string().starts_with("acl.conf:3: topic `a/#/b`"), "{e}");
        let e = parse("acl.conf", "{allow, all}\n").unwrap_err();
        assert_eq!(e.to_string(), "acl.conf:1: expected `.`, found the end of the file");
        let e = parse("acl.conf", "{permit, all}.").unwrap_err();
        assert_eq!(e.to_string(), "acl.conf:1: a rule starts with allow or deny");
        let e = parse("acl.conf", "{allow, {peer, \"x\"}, all, [\"#\"]}.").unwrap_err();
        assert!(e.to_string().contains("`peer` is not"), "{e}");
        let e = parse("acl.conf", "{allow, all, publish, [\"a\"}.").unwrap_err();
        assert!(e.to_string().contains("expected `,` or `]`"), "{e}");
    }
}

//! MQTT topic rules: who (a principal) may do what (publish, subscribe, receive) on which
//! topics, first match wins. The model behind `[[auth.rules]]`, Mosquitto's `acl_file` and
//! EMQX's `acl.conf`; topics may name the client (`%u` / `%c` as Mosquitto,
//! `${username}` / `${clientid}` as EMQX).

use std::net::IpAddr;

use super::Identity;
pub(crate) use crate::composition::config::access::{Permit, RuleEntry};

/// The MQTT actions a rule covers (a set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Actions(u8);

impl Actions {
    /// Publishing to a topic (Mosquitto's `write`).
    pub const PUBLISH: Actions = Actions(1);
    /// Subscribing with a filter.
    pub const SUBSCRIBE: Actions = Actions(2);
    /// Receiving a message on a topic (retained ones and `$SYS` included).
    pub const RECEIVE: Actions = Actions(4);
    /// Subscribing and receiving: Mosquitto's `read`, EMQX's `subscribe`.
    pub const READ: Actions = Actions(2 | 4);
    /// Everything.
    pub const ALL: Actions = Actions(1 | 2 | 4);

    /// Parses an action name: `publish`/`write`, `subscribe`/`read` (subscribing and
    /// receiving), `receive`, `all`/`readwrite`/`pubsub`.
    pub fn parse(name: &str) -> Option<Actions> {
        Some(match name {
            "publish" | "write" | "pub" => Actions::PUBLISH,
            "subscribe" | "read" | "sub" => Actions::READ,
            "receive" => Actions::RECEIVE,
            "all" | "readwrite" | "pubsub" => Actions::ALL,
            _ => return None,
        })
    }

    /// Both sets.
    pub const fn with(self, other: Actions) -> Actions {
        Actions(self.0 | other.0)
    }

    /// True when every action of `other` is in `self`.
    pub fn contains(self, other: Actions) -> bool {
        self.0 & other.0 == other.0
    }
}

/// Who a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// Every client.
    All,
    /// Clients that gave no user name.
    Anonymous,
    /// The user of that name.
    User(String),
    /// Users with this tag (a group).
    Group(String),
    /// Client ids matching a glob (`*` any run of characters, `?` one).
    ClientId(String),
    /// User names matching a regular expression (EMQX's `{username, {re, "..."}}`).
    UserMatching(Pattern),
    /// Client ids matching a regular expression.
    ClientIdMatching(Pattern),
    /// Clients connecting from this network.
    Source(Cidr),
    /// Clients whose TLS certificate has this common name.
    CertCn(String),
    /// Every one of these.
    And(Vec<Who>),
    /// Any one of these.
    Or(Vec<Who>),
}

impl Who {
    /// True when the rule applies to `id`.
    pub fn covers(&self, id: &Identity) -> bool {
        match self {
            Who::All => true,
            Who::Anonymous => id.user.is_none(),
            Who::User(u) => id.user.as_deref() == Some(u.as_str()),
            Who::Group(g) => id.groups.iter().any(|t| t == g),
            Who::ClientId(glob) => glob_matches(glob, &id.client_id),
            Who::UserMatching(p) => id.user.as_deref().is_some_and(|u| p.0.is_match(u)),
            Who::ClientIdMatching(p) => p.0.is_match(&id.client_id),
            Who::Source(net) => id.peer.is_some_and(|ip| net.contains(ip)),
            Who::CertCn(cn) => id.cert_cn.as_deref() == Some(cn.as_str()),
            Who::And(all) => all.iter().all(|w| w.covers(id)),
            Who::Or(any) => any.iter().any(|w| w.covers(id)),
        }
    }
}

/// A compiled regular expression, compared by its text.
#[derive(Debug, Clone)]
pub struct Pattern(pub regex_lite::Regex);

impl Pattern {
    /// Compiles `re`; the error says why not.
    pub fn new(re: &str) -> Result<Pattern, String> {
        regex_lite::Regex::new(re).map(Pattern).map_err(|e| format!("invalid regular expression '{re}': {e}"))
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Pattern {}

/// A network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `::1/128` or a bare address (all its bits).
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a.trim().parse::<IpAddr>().ok()?, Some(p.trim().parse::<u8>().ok()?)),
            None => (s.trim().parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    /// True when `ip` is in the network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The topics a rule covers: a topic filter (with placeholders) or one exact string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicPattern {
    /// A filter with `+`/`#`; `%u`, `%c`, `${username}`, `${clientid}` name the client.
    Filter(String),
    /// Exactly this topic or filter string (EMQX's `{eq, "a/#"}`): no wildcards.
    Eq(String),
    /// Every topic, `$` ones included (EMQX's catch-all `{allow|deny, all}`).
    Any,
}

impl TopicPattern {
    /// The filter with the client's placeholders filled in; `None` when it names a user
    /// and the client has none (such a rule never matches, as Mosquitto's `%u` for an
    /// anonymous client).
    fn expand(&self, id: &Identity) -> Option<String> {
        let s = match self {
            TopicPattern::Filter(s) => s,
            // EMQX's `{eq, ...}` is the string as written, placeholders included.
            TopicPattern::Eq(s) => return Some(s.clone()),
            TopicPattern::Any => return Some(String::new()),
        };
        if !s.contains('%') && !s.contains("${") {
            return Some(s.clone());
        }
        let names_user = s.contains("%u") || s.contains("${username}");
        let user = match &id.user {
            Some(u) => u.as_str(),
            None if names_user => return None,
            None => "",
        };
        // One pass over the pattern: an inserted value is never read for placeholders
        // again (a user named `%c`), and must not smuggle wildcards or levels in (`#`).
        let bad = |v: &str| v.contains(['+', '#', '/']);
        let mut out = String::with_capacity(s.len() + 32);
        let mut rest = s.as_str();
        while let Some(at) = rest.find(['%', '$']) {
            out.push_str(&rest[..at]);
            rest = &rest[at..];
            let (value, len) = if rest.starts_with("%u") {
                (Some(user), 2)
            } else if rest.starts_with("${username}") {
                (Some(user), 11)
            } else if rest.starts_with("%c") {
                (Some(id.client_id.as_str()), 2)
            } else if rest.starts_with("${clientid}") {
                (Some(id.client_id.as_str()), 11)
            } else {
                (None, 1)
            };
            match value {
                Some(v) if bad(v) => return None,
                Some(v) => out.push_str(v),
                None => out.push_str(&rest[..len]),
            }
            rest = &rest[len..];
        }
        out.push_str(rest);
        Some(out)
    }

    /// True when a message on `topic` is covered.
    fn covers_topic(&self, id: &Identity, topic: &str) -> bool {
        let Some(p) = self.expand(id) else { return false };
        match self {
            TopicPattern::Eq(_) => p == topic,
            TopicPattern::Any => true,
            TopicPattern::Filter(_) => ferrymq_mqtt::topic::matches(&p, topic),
        }
    }

    /// True when some topic `filter` matches is covered.
    fn overlaps_filter(&self, id: &Identity, filter: &str) -> bool {
        let Some(p) = self.expand(id) else { return false };
        match self {
            TopicPattern::Eq(_) => p == filter,
            TopicPattern::Any => true,
            TopicPattern::Filter(_) => filters_overlap(filter, &p),
        }
    }

    /// True when every topic `filter` matches is covered (a subscription is covered when
    /// it asks for no more than the rule's filter).
    fn covers_filter(&self, id: &Identity, filter: &str) -> bool {
        let Some(p) = self.expand(id) else { return false };
        match self {
            TopicPattern::Eq(_) => p == filter,
            TopicPattern::Any => true,
            TopicPattern::Filter(_) => filter_within(filter, &p),
        }
    }
}

/// True when some topic matches both filters.
pub(crate) fn filters_overlap(a: &str, b: &str) -> bool {
    let wild = |f: &str| f.starts_with(['#', '+']);
    if (a.starts_with('$') && wild(b)) || (b.starts_with('$') && wild(a)) {
        return false;
    }
    let (mut a, mut b) = (a.split('/'), b.split('/'));
    loop {
        match (a.next(), b.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            (Some(x), Some(y)) if x == "+" || y == "+" || x == y => {}
            _ => return false,
        }
    }
}

/// True when every topic `inner` matches is matched by `outer`.
pub(crate) fn filter_within(inner: &str, outer: &str) -> bool {
    // `#` / `+` at the start of `outer` do not reach `$` topics.
    if inner.starts_with('$') && outer.starts_with(['#', '+']) {
        return false;
    }
    let mut inner_levels = inner.split('/');
    for o in outer.split('/') {
        if o == "#" {
            return true;
        }
        match inner_levels.next() {
            Some("#") => return false,
            Some("+") if o == "+" => {}
            Some(i) if i != "+" && (o == "+" || o == i) => {}
            _ => return false,
        }
    }
    inner_levels.next().is_none()
}

/// `*` matches any run of characters, `?` one character.
/// Iterative (the client id is the client's: no recursion, O(glob x id) at worst).
pub(crate) fn glob_matches(glob: &str, s: &str) -> bool {
    let g: Vec<char> = glob.chars().collect();
    let s: Vec<char> = s.chars().collect();
    let (mut gi, mut si) = (0, 0);
    // Where the last `*` was, and the position in `s` it has taken up to.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match g.get(gi) {
            Some('*') => {
                star = Some((gi, si));
                gi += 1;
            }
            Some(&c) if c == '?' || c == s[si] => {
                gi += 1;
                si += 1;
            }
            _ => match star {
                Some((sg, ss)) => {
                    gi = sg + 1;
                    si = ss + 1;
                    star = Some((sg, ss + 1));
                }
                None => return false,
            },
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

/// One MQTT topic rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Allow or deny.
    pub permit: Permit,
    /// Who it applies to.
    pub who: Who,
    /// The actions it covers.
    pub actions: Actions,
    /// The topics it covers (any one).
    pub topics: Vec<TopicPattern>,
}

/// What a client asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Request<'a> {
    /// Publish to a topic.
    Publish(&'a str),
    /// Subscribe with a filter.
    Subscribe(&'a str),
    /// Receive a message on a topic.
    Receive(&'a str),
    /// Bind a queue to the MQTT exchange with a filter (an AMQP subscription): it will
    /// receive every topic the filter matches, unfiltered, so a rule that denies
    /// receiving any of them refuses it, and one that allows receiving all of them grants it.
    Bind(&'a str),
}

impl Rule {
    /// `Some(permit)` when the rule decides `request` for `id`.
    pub fn decide(&self, id: &Identity, request: Request<'_>) -> Option<Permit> {
        let (action, covered) = match request {
            Request::Publish(t) => (Actions::PUBLISH, self.topics.iter().any(|p| p.covers_topic(id, t))),
            Request::Subscribe(f) => (Actions::SUBSCRIBE, self.topics.iter().any(|p| p.covers_filter(id, f))),
            Request::Receive(t) => (Actions::RECEIVE, self.topics.iter().any(|p| p.covers_topic(id, t))),
            Request::Bind(f) => {
                let hit = match self.permit {
                    Permit::Deny => self.topics.iter().any(|p| p.overlaps_filter(id, f)),
                    Permit::Allow => self.topics.iter().any(|p| p.covers_filter(id, f)),
                };
                (Actions::RECEIVE, hit)
            }
        };
        (self.actions.contains(action) && self.who.covers(id) && covered).then_some(self.permit)
    }
}

impl Rule {
    /// How the rule touches the topics of `filter` for an `action` (`PUBLISH` or
    /// `RECEIVE`) of `id`: `None` when it decides none of them, else its permit and
    /// whether it decides all of them.
    pub fn reach(&self, id: &Identity, action: Actions, filter: &str) -> Option<(Permit, bool)> {
        if !self.actions.contains(action) || !self.who.covers(id) {
            return None;
        }
        if !self.topics.iter().any(|p| p.overlaps_filter(id, filter)) {
            return None;
        }
        Some((self.permit, self.topics.iter().any(|p| p.covers_filter(id, filter))))
    }
}

/// First match wins; `None` when no rule matches.
#[cfg(test)]
pub(crate) fn decide(rules: &[Rule], id: &Identity, request: Request<'_>) -> Option<Permit> {
    rules.iter().find_map(|r| r.decide(id, request))
}

impl Rule {
    /// The rule an `[[auth.rules]]` entry (or one of the API's JSON) describes; the error
    /// says what is wrong with it.
    pub fn from_entry(entry: &RuleEntry) -> Result<Rule, String> {
        let actions = Actions::parse(&entry.action)
            .ok_or_else(|| format!("action `{}` is not publish, subscribe, receive or all", entry.action))?;
        let mut who = Vec::new();
        if let Some(u) = &entry.user {
            who.push(Who::User(u.clone()));
        }
        if let Some(g) = &entry.group {
            who.push(Who::Group(g.clone()));
        }
        if let Some(c) = &entry.client_id {
            who.push(Who::ClientId(c.clone()));
        }
        if let Some(s) = &entry.source {
            who.push(Who::Source(Cidr::parse(s).ok_or_else(|| format!("source `{s}` is not an address/prefix"))?));
        }
        if let Some(cn) = &entry.cert_cn {
            who.push(Who::CertCn(cn.clone()));
        }
        if entry.anonymous {
            who.push(Who::Anonymous);
        }
        let who = match who.len() {
            0 => Who::All,
            1 => who.pop().unwrap_or(Who::All),
            _ => Who::And(who),
        };
        if entry.topics.is_empty() {
            return Err("a rule needs at least one topic".into());
        }
        let mut topics = Vec::new();
        for t in &entry.topics {
            check_filter(t)?;
            topics.push(TopicPattern::Filter(t.clone()));
        }
        Ok(Rule { permit: entry.permission, who, actions, topics })
    }
}

/// A rule's topic filter is a well-formed MQTT filter (placeholders aside).
pub(crate) fn check_filter(t: &str) -> Result<(), String> {
    ferrymq_mqtt::topic::parse_filter(t, 0).map(|_| ()).map_err(|e| format!("topic `{t}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(user: Option<&str>, client: &str) -> Identity {
        Identity {
            user: user.map(Into::into),
            client_id: client.into(),
            peer: Some("10.1.2.3".parse().unwrap()),
            ..Identity::default()
        }
    }

    fn rule(permit: Permit, who: Who, actions: Actions, topic: &str) -> Rule {
        Rule { permit, who, actions, topics: vec![TopicPattern::Filter(topic.into())] }
    }

    #[test]
    fn filters_within_filters() {
        assert!(filter_within("a/b", "a/#"));
        assert!(filter_within("a/+/c", "a/#"));
        assert!(filter_within("a/#", "a/#"));
        assert!(filter_within("a/+", "a/+"));
        assert!(filter_within("a/b", "a/+"));
        assert!(!filter_within("a/#", "a/+"));
        assert!(!filter_within("a/+", "a/b"));
        assert!(!filter_within("#", "a/#"));
        assert!(!filter_within("a/b/c", "a/+"));
        assert!(filter_within("test/nosubscribe", "test/nosubscribe"));
        assert!(!filter_within("$SYS/#", "#"));
        assert!(filter_within("$SYS/broker/x", "$SYS/#"));
    }

    #[test]
    fn filters_overlapping_filters() {
        assert!(filters_overlap("sensors/#", "sensors/secret"));
        assert!(filters_overlap("a/+/c", "a/b/+"));
        assert!(filters_overlap("a/#", "a"));
        assert!(!filters_overlap("a/b", "a/c"));
        assert!(!filters_overlap("a/+", "a/b/c"));
        assert!(!filters_overlap("#", "$SYS/x"));
        assert!(filters_overlap("$SYS/#", "$SYS/x"));
    }

    #[test]
    fn globs() {
        assert!(glob_matches("sensor-*", "sensor-17"));
        assert!(glob_matches("*-*-x", "a-b-c-x"));
        assert!(!glob_matches("*-*-x", "a-b-c-y"));
        assert!(glob_matches("a*", "a"));
        // A long client id against stars: no recursion, no time.
        let long = format!("sensor-{}", "a".repeat(60_000));
        assert!(!glob_matches("sensor-*b*c*d", &long));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("a?c", "abc"));
        assert!(!glob_matches("sensor-*", "actuator-1"));
    }

    #[test]
    fn cidrs() {
        let net = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(net.contains("10.200.1.1".parse().unwrap()));
        assert!(net.contains("::ffff:10.0.0.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("1.2.3.4".parse().unwrap()));
        assert_eq!(Cidr::parse("10.0.0.0/33"), None);
    }

    #[test]
    fn placeholders_name_the_client() {
        let r = rule(Permit::Allow, Who::All, Actions::ALL, "devices/%u/${clientid}/#");
        let alice = id(Some("alice"), "c1");
        assert_eq!(r.decide(&alice, Request::Publish("devices/alice/c1/temp")), Some(Permit::Allow));
        assert_eq!(r.decide(&alice, Request::Publish("devices/bob/c1/temp")), None);
        // No user: a rule naming the user never matches.
        assert_eq!(r.decide(&id(None, "c1"), Request::Publish("devices//c1/temp")), None);
        // A user name holding a wildcard does not widen the rule.
        assert_eq!(r.decide(&id(Some("#"), "c1"), Request::Publish("devices/x/c1/t")), None);
        // Nor does one holding a placeholder: it is inserted as it is, never expanded.
        let p = rule(Permit::Allow, Who::All, Actions::ALL, "devices/%u/#");
        assert_eq!(p.decide(&id(Some("%c"), "+"), Request::Publish("devices/bob/t")), None);
        assert_eq!(p.decide(&id(Some("%c"), "+"), Request::Publish("devices/%c/t")), Some(Permit::Allow));
    }

    #[test]
    fn eq_topics_are_taken_literally() {
        let r = Rule {
            permit: Permit::Deny,
            who: Who::All,
            actions: Actions::ALL,
            topics: vec![TopicPattern::Eq("t/%u".into())],
        };
        assert_eq!(r.decide(&id(Some("u"), "c"), Request::Subscribe("t/%u")), Some(Permit::Deny));
        assert_eq!(r.decide(&id(Some("u"), "c"), Request::Subscribe("t/u")), None);
    }

    #[test]
    fn first_match_wins() {
        let rules = vec![
            rule(Permit::Deny, Who::All, Actions::SUBSCRIBE, "test/nosubscribe"),
            rule(Permit::Allow, Who::All, Actions::ALL, "#"),
        ];
        let c = id(None, "x");
        assert_eq!(decide(&rules, &c, Request::Subscribe("test/nosubscribe")), Some(Permit::Deny));
        assert_eq!(decide(&rules, &c, Request::Subscribe("test/#")), Some(Permit::Allow));
        assert_eq!(decide(&rules, &c, Request::Publish("test/nosubscribe")), Some(Permit::Allow));
        assert_eq!(decide(&rules, &c, Request::Receive("$SYS/broker/uptime")), None);
    }

    #[test]
    fn principals() {
        let c = Identity { groups: vec!["ops".into()], cert_cn: Some("dev-1".into()), ..id(Some("u"), "sensor-1") };
        assert!(Who::Group("ops".into()).covers(&c));
        assert!(Who::CertCn("dev-1".into()).covers(&c));
        assert!(Who::ClientId("sensor-*".into()).covers(&c));
        assert!(Who::Source(Cidr::parse("10.1.0.0/16").unwrap()).covers(&c));
        assert!(!Who::Anonymous.covers(&c));
        assert!(Who::And(vec![Who::User("u".into()), Who::Group("ops".into())]).covers(&c));
        assert!(!Who::And(vec![Who::User("u".into()), Who::Group("dev".into())]).covers(&c));
    }

    #[test]
    fn config_entries() {
        let e: RuleEntry = serde_json::from_value(serde_json::json!({
            "permission": "allow", "action": "publish", "topics": ["a/#"], "user": "u", "source": "10.0.0.0/8"
        }))
        .unwrap();
        let r = Rule::from_entry(&e).unwrap();
        assert_eq!(r.actions, Actions::PUBLISH);
        assert!(matches!(r.who, Who::And(ref v) if v.len() == 2));
        let bad = RuleEntry { action: "poke".into(), ..e.clone() };
        assert!(Rule::from_entry(&bad).unwrap_err().contains("poke"));
        let bad = RuleEntry { topics: vec!["a/#/b".into()], ..e };
        assert!(Rule::from_entry(&bad).unwrap_err().contains("a/#/b"));
    }
}

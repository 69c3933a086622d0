//! A bridge's `topic` lines, spelled as Mosquitto's: `pattern [[[out|in|both] qos]
//! local-prefix remote-prefix]`, and how a topic crosses the bridge (one prefix taken
//! off, the other put on).

use ferrymq_mqtt::topic::{matches, parse_filter};
use ferrymq_mqtt::QoS;

/// Which way a topic line carries messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Local publishes go to the remote broker.
    Out,
    /// The remote broker's publishes come here.
    In,
    /// Both ways.
    Both,
}

impl Direction {
    /// Carries local publishes out.
    pub fn out(self) -> bool {
        matches!(self, Direction::Out | Direction::Both)
    }

    /// Carries remote publishes in.
    pub fn inbound(self) -> bool {
        matches!(self, Direction::In | Direction::Both)
    }

    /// As a topic line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Out => "out",
            Direction::In => "in",
            Direction::Both => "both",
        }
    }
}

/// One `topic` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRule {
    /// The filter, without prefixes (may be empty when a prefix names the topic).
    pub pattern: String,
    /// Which way.
    pub direction: Direction,
    /// The subscription's QoS on the side messages come from, and the highest QoS they
    /// are published with on the other.
    pub qos: QoS,
    /// Put before `pattern` on this broker.
    pub local_prefix: String,
    /// Put before `pattern` on the remote broker.
    pub remote_prefix: String,
}

/// Why a `topic` line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic line `{line}`: {why}")]
pub struct TopicLineError {
    /// The line.
    pub line: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl TopicRule {
    /// Parses a line; `""` stands for an empty pattern or prefix, as in mosquitto.conf.
    pub fn parse(line: &str) -> Result<TopicRule, TopicLineError> {
        let err = |why| TopicLineError { line: line.to_owned(), why };
        let words: Vec<&str> = line.split_whitespace().map(|w| if w == "\"\"" { "" } else { w }).collect();
        let (pattern, rest) = words.split_first().ok_or_else(|| err("empty"))?;
        let direction = match rest.first().copied() {
            None | Some("out") => Direction::Out,
            Some("in") => Direction::In,
            Some("both") => Direction::Both,
            Some(_) => return Err(err("the direction is out, in or both")),
        };
        let qos = match rest.get(1).copied() {
            None | Some("0") => QoS::AtMostOnce,
            Some("1") => QoS::AtLeastOnce,
            Some("2") => QoS::ExactlyOnce,
            Some(_) => return Err(err("the QoS is 0, 1 or 2")),
        };
        let (local_prefix, remote_prefix) = match rest.len() {
            0..=2 => ("", ""),
            4 => (rest[2], rest[3]),
            _ => return Err(err("give both prefixes or neither")),
        };
        let rule = TopicRule {
            pattern: pattern.to_string(),
            direction,
            qos,
            local_prefix: local_prefix.to_owned(),
            remote_prefix: remote_prefix.to_owned(),
        };
        if rule.pattern.is_empty() && rule.local_prefix.is_empty() && rule.remote_prefix.is_empty() {
            return Err(err("an empty pattern needs a prefix"));
        }
        for prefix in [&rule.local_prefix, &rule.remote_prefix] {
            if prefix.contains(['+', '#']) {
                return Err(err("a prefix cannot hold wildcards"));
            }
        }
        for filter in [rule.local_filter(), rule.remote_filter()] {
            parse_filter(&filter, usize::MAX).map_err(|_| err("not a valid topic filter"))?;
        }
        Ok(rule)
    }

    /// What is subscribed to on this broker (for `out` and `both`).
    pub fn local_filter(&self) -> String {
        format!("{}{}", self.local_prefix, self.pattern)
    }

    /// What is subscribed to on the remote broker (for `in` and `both`).
    pub fn remote_filter(&self) -> String {
        format!("{}{}", self.remote_prefix, self.pattern)
    }

    /// The remote topic of a local one this rule carries out, if it does.
    pub fn to_remote(&self, local_topic: &str) -> Option<String> {
        let rest = local_topic.strip_prefix(self.local_prefix.as_str())?;
        (self.direction.out() && pattern_matches(&self.pattern, rest)).then(|| format!("{}{rest}", self.remote_prefix))
    }

    /// The local topic of a remote one this rule carries in, if it does.
    pub fn to_local(&self, remote_topic: &str) -> Option<String> {
        let rest = remote_topic.strip_prefix(self.remote_prefix.as_str())?;
        (self.direction.inbound() && pattern_matches(&self.pattern, rest))
            .then(|| format!("{}{rest}", self.local_prefix))
    }
}

/// An empty pattern stands for the prefix alone.
fn pattern_matches(pattern: &str, rest: &str) -> bool {
    match pattern {
        "" => rest.is_empty(),
        p => matches(p, rest),
    }
}

/// The first rule that carries `topic` (local) out, and the remote topic.
pub(crate) fn route_out<'a>(rules: &'a [TopicRule], topic: &str) -> Option<(&'a TopicRule, String)> {
    rules.iter().find_map(|r| r.to_remote(topic).map(|t| (r, t)))
}

/// The first rule that carries `topic` (remote) in, and the local topic.
pub(crate) fn route_in<'a>(rules: &'a [TopicRule], topic: &str) -> Option<(&'a TopicRule, String)> {
    rules.iter().find_map(|r| r.to_local(topic).map(|t| (r, t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_mosquitto_spells_them() {
        let r = TopicRule::parse("sensors/# out 1").unwrap();
        assert_eq!((r.direction, r.qos, r.local_filter()), (Direction::Out, QoS::AtLeastOnce, "sensors/#".into()));
        let r = TopicRule::parse("#").unwrap();
        assert_eq!((r.direction, r.qos), (Direction::Out, QoS::AtMostOnce), "defaults: out, QoS 0");
        let r = TopicRule::parse("cmd/+ in 2 edge/ cloud/site-1/").unwrap();
        assert_eq!(r.remote_filter(), "cloud/site-1/cmd/+");
        assert_eq!(r.to_local("cloud/site-1/cmd/reboot").as_deref(), Some("edge/cmd/reboot"));
        assert_eq!(r.to_local("cloud/site-2/cmd/reboot"), None);
        assert_eq!(r.to_remote("edge/cmd/reboot"), None, "an in rule carries nothing out");
        let r = TopicRule::parse("\"\" both 1 local/status remote/status").unwrap();
        assert_eq!(r.to_remote("local/status").as_deref(), Some("remote/status"));
        assert_eq!(r.to_remote("local/status/x"), None);
        assert_eq!(r.to_local("remote/status").as_deref(), Some("local/status"));
        let r = TopicRule::parse("a/# both 0 \"\" up/").unwrap();
        assert_eq!(r.to_remote("a/b").as_deref(), Some("up/a/b"));
        assert_eq!(r.to_local("up/a/b").as_deref(), Some("a/b"));
    }

    #[test]
    fn bad_lines_are_refused() {
        for line in ["", "a sideways", "a out 3", "a out 1 x/", "\"\"", "a/# out 1 x/+ y/", "a/#/b"] {
            assert!(TopicRule::parse(line).is_err(), "{line:?}");
        }
    }

    #[test]
    fn the_first_rule_that_matches_routes() {
        let rules: Vec<_> =
            ["a/1 out 2", "a/# out 1 \"\" r/", "b/# in 1"].iter().map(|l| TopicRule::parse(l).unwrap()).collect();
        let (r, t) = route_out(&rules, "a/1").unwrap();
        assert_eq!((r.qos, t.as_str()), (QoS::ExactlyOnce, "a/1"));
        let (r, t) = route_out(&rules, "a/2").unwrap();
        assert_eq!((r.qos, t.as_str()), (QoS::AtLeastOnce, "r/a/2"));
        assert!(route_out(&rules, "b/1").is_none());
        assert_eq!(route_in(&rules, "b/1").map(|(_, t)| t).as_deref(), Some("b/1"));
    }
}

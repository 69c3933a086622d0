//! Message tags and server-side tag filters.
//!
//! A message's tag is the AMQP header `x-tag` (MQTT 5 clients set the user property `tag`,
//! which the gateway stores as `x-tag`). A filter expression is `*` (every message, tagged
//! or not) or `TagA || TagB || ...` (exact, case-sensitive; whitespace around `||` is
//! ignored); an untagged message matches only `*`. Filters are used by `queue.bind`
//! (`x-tag-filter`), MQTT 5 SUBSCRIBE (user property `tag-filter`) and stream consumers
//! (`x-tag-filter` consume argument).
//!
//! The tag's [`tag_hash`] is stored in every consume-queue entry, so a reader that filters
//! can skip entries without reading bodies ([`TagFilter::may_match_hash`]) and resolve a
//! hash collision against the stored tag ([`TagFilter::matches`]).

use std::fmt;

use super::stable_hash::hash64;
use super::value::Value;

/// The AMQP header that carries a message's tag.
pub(crate) const TAG_HEADER: &str = "x-tag";
/// The MQTT 5 user property that carries a message's tag.
pub(crate) const MQTT_TAG_PROPERTY: &str = "tag";
/// The `queue.bind` argument holding a filter expression.
pub(crate) const TAG_FILTER_ARGUMENT: &str = "x-tag-filter";
/// The MQTT 5 SUBSCRIBE user property holding a filter expression.
pub(crate) const MQTT_TAG_FILTER_PROPERTY: &str = "tag-filter";
/// The tag hash of an untagged message.
pub(crate) const NO_TAG: u32 = 0;

/// The hash of a tag kept in consume-queue entries: stable across restarts, never
/// [`NO_TAG`].
pub(crate) fn tag_hash(tag: &str) -> u32 {
    let h = hash64(&[tag.as_bytes()]);
    match (h ^ (h >> 32)) as u32 {
        NO_TAG => 1,
        v => v,
    }
}

/// The hash of an optional tag ([`NO_TAG`] for none).
pub(crate) fn tag_hash_of(tag: Option<&str>) -> u32 {
    tag.map_or(NO_TAG, tag_hash)
}

/// Why a filter expression is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagFilterError {
    /// The expression is empty or blank.
    #[error("empty tag filter expression")]
    Empty,
    /// The `x-tag-filter` argument holds a value other than a string.
    #[error("tag filter expression must be a string")]
    NotAString,
    /// An alternative between `||` is empty (`A || || B`, `A ||`).
    #[error("empty alternative in tag filter expression '{0}'")]
    EmptyAlternative(String),
    /// `*` combined with tags (`* || A`).
    #[error("'*' cannot be combined with tags in tag filter expression '{0}'")]
    MixedWildcard(String),
}

/// A parsed filter expression: which tags a binding or consumer lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagFilter {
    /// `*`: every message, tagged or not.
    Any,
    /// One of these tags (with their hashes).
    OneOf(Vec<(u32, Box<str>)>),
}

impl TagFilter {
    /// The filter named by the `x-tag-filter` argument among `args` (a binding's or a
    /// consumer's), if any.
    pub fn from_arguments(args: &[(String, Value)]) -> Result<Option<TagFilter>, TagFilterError> {
        match args.iter().find(|(k, _)| k == TAG_FILTER_ARGUMENT) {
            None => Ok(None),
            Some((_, v)) => TagFilter::parse(v.as_str().ok_or(TagFilterError::NotAString)?).map(Some),
        }
    }

    /// Parses `*` or `TagA || TagB || ...`.
    pub fn parse(expr: &str) -> Result<TagFilter, TagFilterError> {
        let trimmed = expr.trim();
        if trimmed.is_empty() {
            return Err(TagFilterError::Empty);
        }
        if trimmed == "*" {
            return Ok(TagFilter::Any);
        }
        let mut tags = Vec::new();
        for alt in trimmed.split("||") {
            let tag = alt.trim();
            if tag.is_empty() {
                return Err(TagFilterError::EmptyAlternative(expr.to_owned()));
            }
            if tag == "*" {
                return Err(TagFilterError::MixedWildcard(expr.to_owned()));
            }
            if !tags.iter().any(|(_, t): &(u32, Box<str>)| &**t == tag) {
                tags.push((tag_hash(tag), tag.into()));
            }
        }
        Ok(TagFilter::OneOf(tags))
    }

    /// True when both pass the same messages (the same tags, in any order).
    pub fn equivalent(&self, other: &TagFilter) -> bool {
        match (self, other) {
            (TagFilter::Any, TagFilter::Any) => true,
            (TagFilter::OneOf(a), TagFilter::OneOf(b)) => a.len() == b.len() && a.iter().all(|t| b.contains(t)),
            _ => false,
        }
    }

    /// True when a message with `tag` passes.
    pub fn matches(&self, tag: Option<&str>) -> bool {
        match (self, tag) {
            (TagFilter::Any, _) => true,
            (TagFilter::OneOf(_), None) => false,
            (TagFilter::OneOf(tags), Some(tag)) => tags.iter().any(|(_, t)| &**t == tag),
        }
    }

    /// True when an entry with this stored tag hash may pass (a hash hit still needs
    /// [`TagFilter::matches`] on the stored tag, as two tags may share a hash); false
    /// means it certainly does not.
    pub fn may_match_hash(&self, hash: u32) -> bool {
        match self {
            TagFilter::Any => true,
            TagFilter::OneOf(tags) => hash != NO_TAG && tags.iter().any(|(h, _)| *h == hash),
        }
    }
}

impl fmt::Display for TagFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TagFilter::Any => f.write_str("*"),
            TagFilter::OneOf(tags) => {
                for (i, (_, t)) in tags.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" || ")?;
                    }
                    f.write_str(t)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_matches_everything() {
        let f = TagFilter::parse(" * ").unwrap();
        assert!(f.matches(None));
        assert!(f.matches(Some("A")));
        assert!(f.may_match_hash(NO_TAG));
    }

    #[test]
    fn alternatives_are_exact_and_case_sensitive() {
        let f = TagFilter::parse("TagA||TagB ||  TagC").unwrap();
        assert!(f.matches(Some("TagA")));
        assert!(f.matches(Some("TagC")));
        assert!(!f.matches(Some("taga")));
        assert!(!f.matches(Some("TagA ")));
        assert!(!f.matches(Some("Tag")));
        assert!(!f.matches(None), "an untagged message matches only '*'");
        assert!(f.may_match_hash(tag_hash("TagB")));
        assert!(!f.may_match_hash(NO_TAG));
        assert_eq!(f.to_string(), "TagA || TagB || TagC");
        assert!(
            f.equivalent(&TagFilter::parse("TagC || TagA || TagB || TagA").unwrap()),
            "order and repeats do not count"
        );
        assert!(!f.equivalent(&TagFilter::parse("TagA || TagB").unwrap()));
        assert!(!f.equivalent(&TagFilter::Any));
    }

    #[test]
    fn bad_expressions_are_refused() {
        assert_eq!(TagFilter::parse(""), Err(TagFilterError::Empty));
        assert_eq!(TagFilter::parse("   "), Err(TagFilterError::Empty));
        assert!(matches!(TagFilter::parse("A || || B"), Err(TagFilterError::EmptyAlternative(_))));
        assert!(matches!(TagFilter::parse("A ||"), Err(TagFilterError::EmptyAlternative(_))));
        assert!(matches!(TagFilter::parse("|| A"), Err(TagFilterError::EmptyAlternative(_))));
        assert!(matches!(TagFilter::parse("* || A"), Err(TagFilterError::MixedWildcard(_))));
    }

    #[test]
    fn tag_hash_is_stable_and_never_zero() {
        assert_eq!(tag_hash("TagA"), tag_hash("TagA"));
        assert_ne!(tag_hash("TagA"), tag_hash("TagB"));
        assert_ne!(tag_hash(""), NO_TAG);
        assert_eq!(tag_hash_of(None), NO_TAG);
    }
}

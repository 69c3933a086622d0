//! Topic names and filters: validation, matching, shared-subscription parsing.

/// Why a topic name or filter is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// Empty where not allowed.
    #[error("empty topic")]
    Empty,
    /// `+` or `#` in a topic name, or misplaced in a filter.
    #[error("misplaced wildcard")]
    Wildcard,
    /// Contains U+0000.
    #[error("null character in topic")]
    NullChar,
    /// More levels than allowed.
    #[error("too many topic levels")]
    TooManyLevels,
    /// A `$share/` filter without a valid group or filter.
    #[error("invalid shared subscription")]
    InvalidShare,
}

/// A parsed subscription filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter<'a> {
    /// `Some(group)` for `$share/{group}/{filter}`.
    pub share_group: Option<&'a str>,
    /// The topic filter proper.
    pub filter: &'a str,
}

/// Validates a PUBLISH topic name (non-empty, no wildcards, no U+0000, at most
/// `max_levels` levels when non-zero).
pub fn validate_topic_name(topic: &str, max_levels: usize) -> Result<(), TopicError> {
    let _ = (topic, max_levels);
    todo!()
}

/// Validates a SUBSCRIBE/UNSUBSCRIBE filter and splits off a `$share/{group}/` prefix.
pub fn parse_filter(filter: &str, max_levels: usize) -> Result<Filter<'_>, TopicError> {
    let _ = (filter, max_levels);
    todo!()
}

/// True when `topic` matches `filter` (`+`, `#`; a leading wildcard does not match a
/// topic that starts with `$`).
pub fn matches(filter: &str, topic: &str) -> bool {
    let _ = (filter, topic);
    todo!()
}

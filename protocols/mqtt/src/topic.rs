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
    /// The filter matched against topic names: the whole filter, or what follows `$share/{group}/`.
    pub filter: &'a str,
}

/// Validates a PUBLISH topic name (non-empty, no wildcards, no U+0000, at most
/// `max_levels` levels when non-zero).
pub fn validate_topic_name(topic: &str, max_levels: usize) -> Result<(), TopicError> {
    if topic.is_empty() {
        return Err(TopicError::Empty);
    }
    let mut levels = 1usize;
    for b in topic.bytes() {
        match b {
            b'+' | b'#' => return Err(TopicError::Wildcard),
            0 => return Err(TopicError::NullChar),
            b'/' => levels += 1,
            _ => {}
        }
    }
    if max_levels != 0 && levels > max_levels {
        return Err(TopicError::TooManyLevels);
    }
    Ok(())
}

/// Validates a SUBSCRIBE/UNSUBSCRIBE filter and splits off a `$share/{group}/` prefix.
pub fn parse_filter(filter: &str, max_levels: usize) -> Result<Filter<'_>, TopicError> {
    if filter.is_empty() {
        return Err(TopicError::Empty);
    }
    if filter.as_bytes().contains(&0) {
        return Err(TopicError::NullChar);
    }
    let (share_group, proper) = match filter.strip_prefix("$share/") {
        Some(rest) => {
            let (group, proper) = rest.split_once('/').ok_or(TopicError::InvalidShare)?;
            if group.is_empty() || group.contains(['+', '#']) || proper.is_empty() {
                return Err(TopicError::InvalidShare);
            }
            (Some(group), proper)
        }
        None => (None, filter),
    };
    let mut levels = 0usize;
    let mut iter = proper.split('/').peekable();
    while let Some(level) = iter.next() {
        levels += 1;
        if level.contains(['+', '#']) {
            let last = iter.peek().is_none();
            let ok = level == "+" || (level == "#" && last);
            if !ok {
                return Err(TopicError::Wildcard);
            }
        }
    }
    if max_levels != 0 && levels > max_levels {
        return Err(TopicError::TooManyLevels);
    }
    Ok(Filter { share_group, filter: proper })
}

/// True when `topic` matches `filter` (`+`, `#`; a leading wildcard does not match a
/// topic that starts with `$`).
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut topic_levels = topic.split('/');
    for f in filter.split('/') {
        if f == "#" {
            // Matches the parent level too ("a/#" matches "a").
            return true;
        }
        match topic_levels.next() {
            Some(t) if f == "+" || f == t => {}
            _ => return false,
        }
    }
    topic_levels.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert_eq!(validate_topic_name("a/b/c", 0), Ok(()));
        assert_eq!(validate_topic_name("/", 0), Ok(()));
        assert_eq!(validate_topic_name("$SYS/x", 0), Ok(()));
        assert_eq!(validate_topic_name("", 0), Err(TopicError::Empty));
        assert_eq!(validate_topic_name("a/+", 0), Err(TopicError::Wildcard));
        assert_eq!(validate_topic_name("a#", 0), Err(TopicError::Wildcard));
        assert_eq!(validate_topic_name("a\0b", 0), Err(TopicError::NullChar));
        assert_eq!(validate_topic_name("a/b/c", 3), Ok(()));
        assert_eq!(validate_topic_name("a/b/c/d", 3), Err(TopicError::TooManyLevels));
        assert_eq!(validate_topic_name("ü/✓", 2), Ok(()));
    }

    #[test]
    fn filters() {
        let f = parse_filter("a/+/#", 0).unwrap();
        assert_eq!(f, Filter { share_group: None, filter: "a/+/#" });
        assert!(parse_filter("#", 0).is_ok());
        assert!(parse_filter("+", 0).is_ok());
        assert!(parse_filter("+/+", 0).is_ok());
        assert!(parse_filter("/", 0).is_ok());
        assert_eq!(parse_filter("", 0), Err(TopicError::Empty));
        assert_eq!(parse_filter("a/#/b", 0), Err(TopicError::Wildcard));
        assert_eq!(parse_filter("a#", 0), Err(TopicError::Wildcard));
        assert_eq!(parse_filter("a/b+", 0), Err(TopicError::Wildcard));
        assert_eq!(parse_filter("a\0", 0), Err(TopicError::NullChar));
        assert_eq!(parse_filter("a/b/c", 2), Err(TopicError::TooManyLevels));
        let s = parse_filter("$share/g1/a/+", 2).unwrap();
        assert_eq!(s, Filter { share_group: Some("g1"), filter: "a/+" });
        assert_eq!(parse_filter("$share/g1", 0), Err(TopicError::InvalidShare));
        assert_eq!(parse_filter("$share//a", 0), Err(TopicError::InvalidShare));
        assert_eq!(parse_filter("$share/g/", 0), Err(TopicError::InvalidShare));
        assert_eq!(parse_filter("$share/g+/a", 0), Err(TopicError::InvalidShare));
        assert_eq!(parse_filter("$share/g/a#", 0), Err(TopicError::Wildcard));
        // "$shared" is an ordinary filter.
        assert!(parse_filter("$sharedx/a", 0).is_ok());
    }

    #[test]
    fn matching() {
        assert!(matches("a/b", "a/b"));
        assert!(!matches("a/b", "a/c"));
        assert!(matches("a/+", "a/b"));
        assert!(!matches("a/+", "a/b/c"));
        assert!(matches("a/+", "a/"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "a/b"));
        assert!(matches("+/+", "/x"));
        assert!(!matches("+", "a/b"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(!matches("a/b/c", "a/b"));
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(matches("ü/+", "ü/✓"));
        assert!(!matches("ü", "✓"));
    }
}

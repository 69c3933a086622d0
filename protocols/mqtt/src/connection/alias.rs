//! Topic alias tables: inbound (client-chosen, bounded by our Topic Alias Maximum) and
//! outbound (assigned by us to the first distinct topics, bounded by the client's).

use std::collections::HashMap;

use super::idmap::IdMap;

/// Upper bound on outbound aliases kept per connection, whatever the client allows.
pub(crate) const OUTBOUND_ALIAS_CAP: u16 = 1024;

/// Aliases the client set up.
#[derive(Debug, Default)]
pub(crate) struct InboundAliases {
    map: IdMap<String>,
}

impl InboundAliases {
    /// Topic of `alias`; the caller has checked `alias` against the maximum.
    pub(crate) fn get(&self, alias: u16) -> Option<&String> {
        self.map.get(&alias)
    }

    /// Sets (or replaces) `alias`; the caller has checked it against the maximum, so the
    /// table never holds more entries than the maximum.
    pub(crate) fn set(&mut self, alias: u16, topic: &str) {
        match self.map.get_mut(&alias) {
            Some(t) if t == topic => {}
            Some(t) => topic.clone_into(t),
            None => {
                self.map.insert(alias, topic.to_owned());
            }
        }
    }
}

/// Aliases we assigned.
#[derive(Debug, Default)]
pub(crate) struct OutboundAliases {
    max: u16,
    map: HashMap<String, u16>,
}

impl OutboundAliases {
    pub(crate) fn new(max: u16) -> Self {
        OutboundAliases { max: max.min(OUTBOUND_ALIAS_CAP), map: HashMap::new() }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.max > 0
    }

    pub(crate) fn lookup(&self, topic: &str) -> Option<u16> {
        self.map.get(topic).copied()
    }

    /// The alias the next new topic would get, if any is left.
    pub(crate) fn next_free(&self) -> Option<u16> {
        let n = u16::try_from(self.map.len()).ok()?;
        (n < self.max).then_some(n + 1)
    }

    pub(crate) fn insert(&mut self, topic: String, alias: u16) {
        self.map.insert(topic, alias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbound_assigns_first_n() {
        let mut a = OutboundAliases::new(2);
        assert_eq!(a.next_free(), Some(1));
        a.insert("a".into(), 1);
        assert_eq!(a.next_free(), Some(2));
        a.insert("b".into(), 2);
        assert_eq!(a.next_free(), None);
        assert_eq!(a.lookup("a"), Some(1));
        assert_eq!(a.lookup("c"), None);
        assert!(!OutboundAliases::new(0).enabled());
        assert_eq!(OutboundAliases::new(u16::MAX).max, OUTBOUND_ALIAS_CAP);
    }

    #[test]
    fn inbound_replaces() {
        let mut a = InboundAliases::default();
        a.set(1, "x");
        a.set(1, "y");
        assert_eq!(a.get(1).map(String::as_str), Some("y"));
        assert_eq!(a.get(2), None);
    }
}

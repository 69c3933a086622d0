//! Retained messages in memory: a tree of routing-key words (an MQTT topic `a/b` is the
//! key `a.b`), so that a wildcard subscription finds its retained messages by walking its
//! pattern (`*`, `#`), not by scanning every topic. The journal keeps the durable copy
//! (`retained` index into the commit log, by routing key).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use super::message::SharedMessage;

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    msg: Option<SharedMessage>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.msg.is_none()
    }

    fn set(&mut self, levels: &[&str], msg: Option<SharedMessage>) -> (bool, bool) {
        match levels.split_first() {
            None => {
                let had = self.msg.is_some();
                let has = msg.is_some();
                self.msg = msg;
                (had, has)
            }
            Some((level, rest)) => {
                if msg.is_none() {
                    let Some(child) = self.children.get_mut(*level) else { return (false, false) };
                    let r = child.set(rest, None);
                    if child.is_empty() {
                        self.children.remove(*level);
                    }
                    r
                } else {
                    self.children.entry((*level).into()).or_default().set(rest, msg)
                }
            }
        }
    }

    fn collect(&self, filter: &[&str], first: bool, out: &mut Vec<SharedMessage>) {
        let Some((level, rest)) = filter.split_first() else {
            out.extend(self.msg.iter().cloned());
            return;
        };
        match *level {
            "#" => self.all(first, out),
            "*" => {
                for (name, child) in &self.children {
                    if !(first && name.starts_with('$')) {
                        child.collect(rest, false, out);
                    }
                }
            }
            name => {
                if let Some(child) = self.children.get(name) {
                    child.collect(rest, false, out);
                }
            }
        }
    }

    /// This node's message and every descendant's (`#`), skipping `$` topics at the root.
    fn all(&self, first: bool, out: &mut Vec<SharedMessage>) {
        if !first {
            out.extend(self.msg.iter().cloned());
        }
        for (name, child) in &self.children {
            if !(first && name.starts_with('$')) {
                child.all(false, out);
            }
        }
    }
}

/// Every retained message, by topic.
#[derive(Debug, Default)]
pub struct RetainedStore {
    root: RwLock<Node>,
    count: AtomicUsize,
}

impl RetainedStore {
    /// An empty store; start-up fills it from the journal's retained index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (`Some`) or clears (`None`) the retained message of a routing key.
    pub(in crate::core) fn set(&self, key: &str, msg: Option<SharedMessage>) {
        let levels: Vec<&str> = key.split('.').collect();
        let (had, has) = self.root.write().set(&levels, msg);
        match (had, has) {
            (false, true) => {
                self.count.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Retained messages whose routing key matches `pattern` (binding-key syntax; see
    /// `router::mqtt_filter_to_pattern`).
    pub fn matching(&self, pattern: &str) -> Vec<SharedMessage> {
        let levels: Vec<&str> = pattern.split('.').collect();
        let mut out = Vec::new();
        self.root.read().collect(&levels, true, &mut out);
        out
    }

    /// Number of retained messages.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// True when none is retained.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::core::message::{mqtt_to_key, Message, Properties};
    use crate::core::router::mqtt_filter_to_pattern;

    fn m(key: &str) -> SharedMessage {
        Arc::new(Message {
            exchange: "amq.topic".into(),
            routing_key: key.into(),
            payload: Bytes::new(),
            qos: 0,
            retain: true,
            props: Properties::default(),
            timestamp_ms: 0,
        })
    }

    fn topics(s: &RetainedStore, f: &str) -> Vec<String> {
        let mut v: Vec<String> = s.matching(&mqtt_filter_to_pattern(f)).iter().map(|m| m.topic()).collect();
        v.sort();
        v
    }

    #[test]
    fn wildcard_lookup() {
        let s = RetainedStore::new();
        for t in ["a", "a/b", "a/b/c", "a/x", "$SYS/up", "b"] {
            s.set(&mqtt_to_key(t), Some(m(&mqtt_to_key(t))));
        }
        assert_eq!(s.len(), 6);
        assert_eq!(topics(&s, "a/#"), vec!["a", "a/b", "a/b/c", "a/x"]);
        assert_eq!(topics(&s, "a/+"), vec!["a/b", "a/x"]);
        assert_eq!(topics(&s, "#"), vec!["a", "a/b", "a/b/c", "a/x", "b"]);
        assert_eq!(topics(&s, "+"), vec!["a", "b"]);
        assert_eq!(topics(&s, "$SYS/#"), vec!["$SYS/up"]);
        assert_eq!(topics(&s, "a/b"), vec!["a/b"]);
        s.set("a.b", None);
        assert_eq!(topics(&s, "a/#"), vec!["a", "a/b/c", "a/x"]);
        assert_eq!(s.len(), 5);
    }
}

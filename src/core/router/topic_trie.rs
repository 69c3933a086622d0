//! The topic exchange's trie: binding patterns split into words, with `*` and `#` levels.

use std::collections::HashMap;

use super::bindings::{retain_count, upsert};
use super::exchange::Binding;

/// A topic-exchange trie node: one level per word; `*` and `#` children.
#[derive(Debug, Default)]
pub(super) struct Node {
    children: HashMap<Box<str>, Node>,
    star: Option<Box<Node>>,
    hash: Option<Box<Node>>,
    /// Bindings whose pattern ends at this node.
    here: Vec<Binding>,
}

impl Node {
    pub(super) fn is_empty(&self) -> bool {
        self.children.is_empty() && self.star.is_none() && self.hash.is_none() && self.here.is_empty()
    }

    fn child_mut(&mut self, word: &str) -> &mut Node {
        match word {
            "*" => self.star.get_or_insert_with(Default::default),
            "#" => self.hash.get_or_insert_with(Default::default),
            w => self.children.entry(w.into()).or_default(),
        }
    }

    pub(super) fn insert(&mut self, words: &[String], b: Binding) -> bool {
        match words.split_first() {
            None => upsert(&mut self.here, b),
            Some((w, rest)) => self.child_mut(w).insert(rest, b),
        }
    }

    pub(super) fn remove(&mut self, words: &[String], pred: &dyn Fn(&Binding) -> bool) -> usize {
        let Some((w, rest)) = words.split_first() else { return retain_count(&mut self.here, pred) };
        let (n, empty) = match w.as_str() {
            "*" => match self.star.as_mut() {
                Some(c) => (c.remove(rest, pred), c.is_empty()),
                None => (0, false),
            },
            "#" => match self.hash.as_mut() {
                Some(c) => (c.remove(rest, pred), c.is_empty()),
                None => (0, false),
            },
            other => match self.children.get_mut(other) {
                Some(c) => (c.remove(rest, pred), c.is_empty()),
                None => (0, false),
            },
        };
        if empty {
            match w.as_str() {
                "*" => self.star = None,
                "#" => self.hash = None,
                other => {
                    self.children.remove(other);
                }
            }
        }
        n
    }

    pub(super) fn remove_all(&mut self, pred: &dyn Fn(&Binding) -> bool) -> usize {
        let mut n = retain_count(&mut self.here, pred);
        for c in self.children.values_mut() {
            n += c.remove_all(pred);
        }
        self.children.retain(|_, c| !c.is_empty());
        for slot in [&mut self.star, &mut self.hash] {
            if let Some(c) = slot.as_mut() {
                n += c.remove_all(pred);
                if c.is_empty() {
                    *slot = None;
                }
            }
        }
        n
    }

    pub(super) fn all(&self, out: &mut Vec<Binding>) {
        out.extend(self.here.iter().cloned());
        for c in self.children.values() {
            c.all(out);
        }
        for c in [&self.star, &self.hash].into_iter().flatten() {
            c.all(out);
        }
    }

    /// Collects bindings matching `words[idx..]`. `dollar`: the key starts with `$`, which
    /// a wildcard in the first position does not match (MQTT's rule for `$SYS` topics).
    pub(super) fn collect<'a>(&'a self, words: &[&str], idx: usize, dollar: bool, out: &mut Vec<&'a Binding>) {
        let wild_ok = !(idx == 0 && dollar);
        if wild_ok {
            if let Some(hash) = &self.hash {
                // `#` swallows zero or more words.
                for k in idx..=words.len() {
                    hash.collect(words, k, false, out);
                }
            }
        }
        let Some(word) = words.get(idx) else {
            out.extend(self.here.iter());
            return;
        };
        if let Some(child) = self.children.get(*word) {
            child.collect(words, idx + 1, dollar, out);
        }
        if wild_ok {
            if let Some(star) = &self.star {
                star.collect(words, idx + 1, dollar, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrymq_storage::QueueId;

    use crate::core::router::tests::{amqp_hits, declare, mqtt_hits, opts, q};
    use crate::core::router::{Binding, ExchangeKind, Router};

    #[test]
    fn mqtt_wildcards_match_per_spec() {
        let r = Router::new();
        r.subscribe("sport/tennis/player1/#", q(1), opts(0));
        r.subscribe("sport/+", q(2), opts(0));
        r.subscribe("+/+", q(3), opts(0));
        r.subscribe("#", q(4), opts(0));
        r.subscribe("/finance", q(5), opts(0));
        r.subscribe("+", q(6), opts(0));
        assert_eq!(mqtt_hits(&r, "sport/tennis/player1"), vec![1, 4]);
        assert_eq!(mqtt_hits(&r, "sport/tennis/player1/ranking"), vec![1, 4]);
        assert_eq!(mqtt_hits(&r, "sport"), vec![4, 6]);
        assert_eq!(mqtt_hits(&r, "sport/"), vec![2, 3, 4]);
        assert_eq!(mqtt_hits(&r, "/finance"), vec![3, 4, 5]);
        assert_eq!(mqtt_hits(&r, "$SYS/x"), Vec::<u64>::new());
        r.subscribe("$SYS/#", q(7), opts(0));
        assert_eq!(mqtt_hits(&r, "$SYS/x"), vec![7]);
        assert_eq!(r.len(), 7);
        assert!(r.unsubscribe("$SYS/#", &q(7)));
        assert_eq!(r.len(), 6);
    }

    #[test]
    fn amqp_topic_patterns() {
        let r = Router::new();
        declare(&r, "t", ExchangeKind::Topic, false, vec![]);
        for (n, key) in [(1, "a.#.b"), (2, "*.b"), (3, "#"), (4, "a.*"), (5, "a.b.#")] {
            r.bind("/", "t", Binding::queue(QueueId(n), key, vec![])).unwrap();
        }
        assert_eq!(amqp_hits(&r, "t", "a.b", &[]), vec![1, 2, 3, 4, 5]);
        assert_eq!(amqp_hits(&r, "t", "a.x.y.b", &[]), vec![1, 3]);
        assert_eq!(amqp_hits(&r, "t", "a", &[]), vec![3]);
        assert_eq!(amqp_hits(&r, "t", "a.b.c.d", &[]), vec![3, 5]);
    }
}

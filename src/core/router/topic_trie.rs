//! The topic exchange's trie: binding patterns split into words, with `*` and `#` levels.

use std::collections::HashMap;

use super::binding_list::BindingList;
use super::exchange::{Binding, Destination};
use crate::core::blocking::off_worker;
use crate::core::value::Value;

/// A topic-exchange trie node: one level per word; `*` and `#` children.
#[derive(Debug, Default)]
pub(super) struct Node {
    children: HashMap<Box<str>, Node>,
    star: Option<Box<Node>>,
    hash: Option<Box<Node>>,
    /// Bindings whose pattern ends at this node.
    here: BindingList,
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
            None => self.here.upsert(b),
            Some((w, rest)) => self.child_mut(w).insert(rest, b),
        }
    }

    pub(super) fn remove(&mut self, words: &[String], pred: &dyn Fn(&Binding) -> bool) -> usize {
        let Some((w, rest)) = words.split_first() else { return self.here.retain_count(pred) };
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

    /// Removes the binding (dest, key, args) whose pattern is `words`, pruning the nodes it
    /// leaves empty.
    pub(super) fn remove_one(
        &mut self,
        words: &[String],
        dest: &Destination,
        key: &str,
        args: &[(String, Value)],
    ) -> Option<Binding> {
        let Some((w, rest)) = words.split_first() else { return self.here.remove_one(dest, key, args) };
        let child = match w.as_str() {
            "*" => self.star.as_deref_mut(),
            "#" => self.hash.as_deref_mut(),
            other => self.children.get_mut(other),
        }?;
        let removed = child.remove_one(rest, dest, key, args);
        if child.is_empty() {
            match w.as_str() {
                "*" => self.star = None,
                "#" => self.hash = None,
                other => {
                    self.children.remove(other);
                }
            }
        }
        removed
    }

    pub(super) fn remove_all(&mut self, pred: &dyn Fn(&Binding) -> bool) -> usize {
        let mut n = self.here.retain_count(pred);
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

    /// Collects every binding whose pattern matches `words`, each once, in the order of a
    /// depth-first walk. `dollar`: the key starts with `$`, which a wildcard in the first
    /// position does not match (MQTT's rule for `$SYS` topics).
    ///
    /// A `#` swallows zero or more words, so with several `#` in a pattern the same
    /// (node, position) pair is reached along many paths — exponentially many in the number
    /// of `#` (`#.#.#.#.x` against 100 words never finished). The walk explores each pair
    /// once: a node reached without a `#` above it is reached at one position only, and a
    /// `#` node below another one remembers the first position it was explored from (it
    /// was then explored from every later one too). So a route costs at most one step per
    /// (node, position) pair: the exchange's pattern words times the key's words plus one
    /// (and [`stored_words`] keeps runs of wildcards short). The walk keeps its own stack
    /// (no recursion), and one that passes [`INLINE_STEPS`] finishes off the runtime's
    /// workers (see [`off_worker`]).
    pub(super) fn collect<'a>(&'a self, words: &[&str], dollar: bool, out: &mut Vec<&'a Binding>) -> Walked {
        let mut walk = Walk {
            words,
            dollar,
            explored: HashMap::new(),
            out,
            stack: vec![Step::Node(self, 0, false)],
            walked: Walked::default(),
        };
        walk.run();
        walk.walked
    }
}

/// The words a binding key is stored under in the trie: within each run of wildcards its
/// `*` first, then one `#` for any number of them (`#.#` matches what `#` does, `#.*` what
/// `*.#` does, the `$` rule included, as a run that begins the key begins with a wildcard
/// either way), so that a key of many `#` words costs what one costs. The binding keeps the
/// key as given.
pub(super) fn stored_words(key: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut stars, mut hash) = (0, false);
    for word in key.split('.') {
        match word {
            "*" => stars += 1,
            "#" => hash = true,
            other => {
                end_run(&mut out, &mut stars, &mut hash);
                out.push(other.to_owned());
            }
        }
    }
    end_run(&mut out, &mut stars, &mut hash);
    out
}

fn end_run(out: &mut Vec<String>, stars: &mut usize, hash: &mut bool) {
    out.extend(std::iter::repeat_n("*".to_owned(), std::mem::take(stars)));
    if std::mem::take(hash) {
        out.push("#".to_owned());
    }
}

/// Steps a route's walk takes on the runtime worker it was called on; a longer walk (a
/// topic exchange with many bindings of several wildcards, against a long key) goes on off
/// the workers. A binding key alone takes at most 256 x 257 steps, about 2 ms.
pub const INLINE_STEPS: usize = 65_536;

/// What a walk took.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Walked {
    /// Nodes visited.
    pub(super) steps: usize,
    /// It passed [`INLINE_STEPS`] and finished off the runtime's workers.
    pub(super) off_worker: bool,
}

/// What is left to do, in the order of a depth-first walk (last pushed, first done).
enum Step<'a> {
    /// Match the words from a position below a node; `true`: a `#` is on the way to it.
    Node(&'a Node, usize, bool),
    /// A `#` node entered at a position.
    Hash(&'a Node, usize, bool),
    /// The key ends at a node: its bindings match.
    Here(&'a Node),
}

/// One match of a routing key's words against the trie.
struct Walk<'a, 'w, 'o> {
    words: &'w [&'w str],
    dollar: bool,
    /// For each `#` node below another `#`: the first position it was explored from.
    explored: HashMap<*const Node, usize>,
    out: &'o mut Vec<&'a Binding>,
    stack: Vec<Step<'a>>,
    walked: Walked,
}

impl<'a> Walk<'a, '_, '_> {
    fn run(&mut self) {
        while let Some(step) = self.stack.pop() {
            match step {
                Step::Node(node, at, below_hash) => self.node(node, at, below_hash),
                Step::Hash(hash, from, below_hash) => self.hash(hash, from, below_hash),
                Step::Here(node) => self.out.extend(node.here.iter()),
            }
            if self.walked.steps == INLINE_STEPS && !self.walked.off_worker {
                self.walked.off_worker = true;
                return off_worker(|| self.run());
            }
        }
    }

    /// Matches `words[at..]` below `node`: its `#` first, then the word's child and `*`.
    fn node(&mut self, node: &'a Node, at: usize, below_hash: bool) {
        self.walked.steps += 1;
        let wild_ok = !(at == 0 && self.dollar);
        match self.words.get(at) {
            None => self.stack.push(Step::Here(node)),
            Some(word) => {
                if let Some(star) = node.star.as_deref().filter(|_| wild_ok) {
                    self.stack.push(Step::Node(star, at + 1, below_hash));
                }
                if let Some(child) = node.children.get(*word) {
                    self.stack.push(Step::Node(child, at + 1, below_hash));
                }
            }
        }
        if let Some(hash) = node.hash.as_deref().filter(|_| wild_ok) {
            self.stack.push(Step::Hash(hash, at, below_hash));
        }
    }

    /// A `#` entered at `from`: it swallows the words up to each later position.
    fn hash(&mut self, hash: &'a Node, from: usize, below_hash: bool) {
        let mut end = self.words.len() + 1;
        if below_hash {
            // Explored from `first` means explored from every position after it as well
            // (a node's walk from one position ends before it is entered again).
            let first = self.explored.entry(hash as *const Node).or_insert(end);
            end = (*first).max(from);
            *first = (*first).min(from);
        }
        for k in (from..end).rev() {
            self.stack.push(Step::Node(hash, k, true));
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrymq_storage::QueueId;

    use proptest::prelude::*;

    use super::{stored_words, Node, INLINE_STEPS};
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

    fn trie(patterns: &[String]) -> Node {
        let mut root = Node::default();
        for (n, p) in patterns.iter().enumerate() {
            root.insert(&stored_words(p), Binding::queue(QueueId(n as u64), p, vec![]));
        }
        root
    }

    fn key_words(key: &str) -> Vec<&str> {
        if key.is_empty() {
            Vec::new()
        } else {
            key.split('.').collect()
        }
    }

    fn ids(found: &[&Binding]) -> Vec<u64> {
        found
            .iter()
            .map(|b| match &b.dest {
                crate::core::router::Destination::Queue(q) => q.0,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// The definition, by dynamic programming over (pattern word, key word): `*` is one
    /// word, `#` zero or more, any other word itself; the empty key has no words; no
    /// wildcard takes the first word of a key that starts with `$`.
    fn reference(pattern: &str, key: &str) -> bool {
        let p: Vec<&str> = pattern.split('.').collect();
        let k = key_words(key);
        let dollar = key.starts_with('$');
        // m[i][j]: p[i..] matches k[j..].
        let mut m = vec![vec![false; k.len() + 1]; p.len() + 1];
        m[p.len()][k.len()] = true;
        for i in (0..p.len()).rev() {
            for j in (0..=k.len()).rev() {
                let wild_ok = !(j == 0 && dollar);
                m[i][j] = match p[i] {
                    "#" => wild_ok && (m[i + 1][j] || (j < k.len() && m[i][j + 1])),
                    "*" => wild_ok && j < k.len() && m[i + 1][j + 1],
                    w => j < k.len() && k[j] == w && m[i + 1][j + 1],
                };
            }
        }
        m[0][0]
    }

    /// The walk before it remembered what it explored: every path, so a binding comes out
    /// once per path that reaches it (exponentially many with several `#`).
    fn every_path<'a>(node: &'a Node, words: &[&str], idx: usize, dollar: bool, out: &mut Vec<&'a Binding>) {
        let wild_ok = !(idx == 0 && dollar);
        if wild_ok {
            if let Some(hash) = &node.hash {
                for k in idx..=words.len() {
                    every_path(hash, words, k, false, out);
                }
            }
        }
        let Some(word) = words.get(idx) else {
            out.extend(node.here.iter());
            return;
        };
        if let Some(child) = node.children.get(*word) {
            every_path(child, words, idx + 1, dollar, out);
        }
        if wild_ok {
            if let Some(star) = &node.star {
                every_path(star, words, idx + 1, dollar, out);
            }
        }
    }

    fn pattern_word() -> impl Strategy<Value = &'static str> {
        prop_oneof![3 => Just("#"), 2 => Just("*"), 2 => Just("a"), 1 => Just("b"), 1 => Just(""), 1 => Just("$s")]
    }

    fn key_word() -> impl Strategy<Value = &'static str> {
        prop_oneof![4 => Just("a"), 2 => Just("b"), 1 => Just(""), 1 => Just("$s")]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// The trie finds exactly the bindings the definition matches, each once, in the
        /// order the exhaustive walk first found them.
        #[test]
        fn the_trie_matches_as_the_definition(
            patterns in prop::collection::vec(prop::collection::vec(pattern_word(), 1..8), 1..8),
            keys in prop::collection::vec(prop::collection::vec(key_word(), 0..10), 1..6),
        ) {
            let patterns: Vec<String> = patterns.iter().map(|p| p.join(".")).collect();
            let root = trie(&patterns);
            for key in keys.iter().map(|k| k.join(".")) {
                let words = key_words(&key);
                let dollar = key.starts_with('$');
                let mut found = Vec::new();
                root.collect(&words, dollar, &mut found);
                let found = ids(&found);
                let mut expected: Vec<u64> =
                    (0..patterns.len()).filter(|&n| reference(&patterns[n], &key)).map(|n| n as u64).collect();
                let mut sorted = found.clone();
                sorted.sort_unstable();
                expected.sort_unstable();
                prop_assert_eq!(&sorted, &expected, "patterns {:?}, key {:?}", patterns, key);
                let mut before = Vec::new();
                every_path(&root, &words, 0, dollar, &mut before);
                let mut first_seen = Vec::new();
                for n in ids(&before) {
                    if !first_seen.contains(&n) {
                        first_seen.push(n);
                    }
                }
                prop_assert_eq!(found, first_seen, "patterns {:?}, key {:?}", patterns, key);
            }
        }
    }

    /// `#` words over a 127-word key: the walk takes at most one step per (node, position)
    /// pair (the exhaustive walk takes C(127 + n, n) paths: 10^17 for n = 12), whether the
    /// `#` are stored as one or separated by other words.
    #[test]
    fn many_hash_words_take_polynomial_steps() {
        let key: Vec<String> = (0..127).map(|i| format!("w{}", i % 7)).collect();
        let key = key.join(".");
        let words = key_words(&key);
        let spaced = |n: usize, sep: &str| vec!["#"; n].join(&format!(".{sep}."));
        for hashes in [1, 3, 6, 12, 64, 127] {
            for tail in ["x", "w6", "#", "*"] {
                for pattern in [format!("{}.{tail}", vec!["#"; hashes].join(".")), spaced(hashes.min(63), "w1")] {
                    let root = trie(std::slice::from_ref(&pattern));
                    let mut found = Vec::new();
                    let walked = root.collect(&words, false, &mut found);
                    let nodes = stored_words(&pattern).len() + 1;
                    assert!(walked.steps <= nodes * (words.len() + 1), "{pattern}: {walked:?}");
                    assert!(!walked.off_worker, "one binding key walks on its worker: {walked:?}");
                    assert_eq!(found.len(), usize::from(reference(&pattern, &key)), "{pattern}");
                }
            }
        }
    }

    #[test]
    fn wildcard_runs_are_stored_short() {
        let stored = |k: &str| stored_words(k).join(".");
        assert_eq!(stored("#.#.#.x"), "#.x");
        assert_eq!(stored("#.*.#.*"), "*.*.#");
        assert_eq!(stored("a.*.b.#.#"), "a.*.b.#");
        assert_eq!(stored("*.*"), "*.*");
        assert_eq!(stored(""), "");
        assert_eq!(stored("a..#"), "a..#");
    }

    /// Thousands of distinct bindings of many wildcards against a long key: the walk
    /// passes the steps it may take on a worker and ends off the workers, with the same
    /// result.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_walk_finishes_off_the_workers() {
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        let patterns: Vec<String> = (0..600)
            .map(|_| {
                let mut words: Vec<&str> = (0..20)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        ["#", "*", "a", "a"][(seed % 4) as usize]
                    })
                    .collect();
                words.push("x");
                words.join(".")
            })
            .collect();
        let root = trie(&patterns);
        let key = vec!["a"; 127].join(".");
        let mut found = Vec::new();
        let walked = root.collect(&key_words(&key), false, &mut found);
        assert!(walked.steps > INLINE_STEPS && walked.off_worker, "{walked:?}");
        assert!(found.is_empty());
        let key = format!("{}.x", vec!["a"; 126].join("."));
        let mut found = ids(&{
            let mut found = Vec::new();
            root.collect(&key_words(&key), false, &mut found);
            found
        });
        found.sort_unstable();
        let expected: Vec<u64> =
            (0..patterns.len()).filter(|&n| reference(&patterns[n], &key)).map(|n| n as u64).collect();
        assert_eq!(found, expected);
    }
}

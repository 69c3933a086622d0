//! RabbitMQ's permissions: per user and virtual host, `configure` / `write` / `read`
//! regular expressions over resource names, and per topic exchange `write` / `read`
//! expressions over routing keys (`{username}`, `{vhost}`, `{client_id}` expanded). As in
//! RabbitMQ an expression matches anywhere in the name unless anchored, and an empty one
//! matches nothing.

use regex_lite::Regex;

/// What a resource check asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Declare or delete.
    Configure,
    /// Publish to, bind to (a queue), or publish on a routing key.
    Write,
    /// Consume from, bind from (an exchange), or bind with a routing key.
    Read,
}

impl Permission {
    /// RabbitMQ's name (in refusals).
    pub fn name(self) -> &'static str {
        match self {
            Permission::Configure => "configure",
            Permission::Write => "write",
            Permission::Read => "read",
        }
    }
}

/// The kind of resource checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// An exchange.
    Exchange,
    /// A queue.
    Queue,
}

impl ResourceKind {
    /// RabbitMQ's name (in refusals).
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Exchange => "exchange",
            ResourceKind::Queue => "queue",
        }
    }
}

/// An expression as RabbitMQ applies it: empty matches nothing.
fn compile(re: &str) -> Result<Regex, String> {
    let re = if re.is_empty() { "^$" } else { re };
    Regex::new(re).map_err(|e| format!("invalid regular expression '{re}': {e}"))
}

/// A user's permissions in one virtual host.
#[derive(Debug, Clone)]
pub struct VhostPermissions {
    /// The expressions as given (configure, write, read).
    pub source: [String; 3],
    compiled: [Regex; 3],
}

impl VhostPermissions {
    /// Compiles the three expressions; the error names the bad one.
    pub fn new(configure: &str, write: &str, read: &str) -> Result<VhostPermissions, String> {
        Ok(VhostPermissions {
            source: [configure.into(), write.into(), read.into()],
            compiled: [compile(configure)?, compile(write)?, compile(read)?],
        })
    }

    /// True when `perm` on `name` is allowed.
    pub fn allows(&self, perm: Permission, name: &str) -> bool {
        let i = match perm {
            Permission::Configure => 0,
            Permission::Write => 1,
            Permission::Read => 2,
        };
        self.compiled[i].is_match(name)
    }
}

/// A user's topic permissions on one exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPermissions {
    /// Routing keys the user may publish with.
    pub write: String,
    /// Routing keys the user may bind with.
    pub read: String,
    /// The expressions name the client (compiled per check, then cached by the caller).
    templated: bool,
}

impl TopicPermissions {
    /// Checks both expressions compile (placeholders filled with a plain word).
    pub fn new(write: &str, read: &str) -> Result<TopicPermissions, String> {
        let templated = [write, read].iter().any(|r| r.contains('{'));
        for re in [write, read] {
            compile(&expand(re, "u", "v", "c"))?;
        }
        Ok(TopicPermissions { write: write.into(), read: read.into(), templated })
    }

    /// True when `perm` with routing key `key` is allowed for this client.
    pub fn allows(&self, perm: Permission, key: &str, user: &str, vhost: &str, client_id: &str) -> bool {
        let re = if perm == Permission::Write { &self.write } else { &self.read };
        let re = if self.templated { expand(re, user, vhost, client_id) } else { re.clone() };
        compile(&re).is_ok_and(|r| r.is_match(key))
    }
}

/// Fills in `{username}`, `{vhost}`, `{client_id}` (the values escaped: a user named `.*`
/// does not widen the expression).
fn expand(re: &str, user: &str, vhost: &str, client_id: &str) -> String {
    re.replace("{username}", &regex_lite::escape(user))
        .replace("{vhost}", &regex_lite::escape(vhost))
        .replace("{client_id}", &regex_lite::escape(client_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rabbitmq_expressions() {
        let p = VhostPermissions::new(".*", "", "^amq\\.gen").unwrap();
        assert!(p.allows(Permission::Configure, "anything"));
        assert!(!p.allows(Permission::Write, "anything"));
        assert!(p.allows(Permission::Read, "amq.gen-abc"));
        assert!(!p.allows(Permission::Read, "x.amq.gen"));
        // Unanchored, as re:run.
        let p = VhostPermissions::new("app", "app", "app").unwrap();
        assert!(p.allows(Permission::Read, "my-app-queue"));
        assert!(VhostPermissions::new("(", ".*", ".*").unwrap_err().contains("invalid regular expression"));
    }

    #[test]
    fn topic_placeholders() {
        let t = TopicPermissions::new("^devices\\.{username}\\.", "^{vhost}\\.{client_id}$").unwrap();
        assert!(t.allows(Permission::Write, "devices.alice.t", "alice", "/", "c"));
        assert!(!t.allows(Permission::Write, "devices.bob.t", "alice", "/", "c"));
        assert!(!t.allows(Permission::Write, "devices.xx.t", ".*", "/", "c"));
        assert!(t.allows(Permission::Read, "v1.c-1", "u", "v1", "c-1"));
    }
}

//! The compound checks every entry point shares: a binding (AMQP `queue.bind`,
//! `exchange.bind` and their unbinds, the management API's bindings), a route into an
//! exchange (alternate and dead-letter exchanges, exchange bindings), a publish, and the
//! reading of a stored message (the API's retained and key views). AMQP and HTTP call
//! these same functions, so a rule exists once.

use super::{Access, Permission, Refused, ResourceKind, MQTT_VHOST};

/// What a binding leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundTo<'a> {
    /// A queue, by name.
    Queue(&'a str),
    /// An exchange, by name.
    Exchange(&'a str),
}

/// A binding a client makes or removes, as the checks see it.
#[derive(Debug, Clone, Copy)]
pub struct BindingRequest<'a> {
    /// The source exchange.
    pub source: &'a str,
    /// The source is a topic exchange: the binding key is checked too.
    pub topic: bool,
    /// The destination.
    pub destination: BoundTo<'a>,
    /// The binding key.
    pub key: &'a str,
    /// Made (true) or removed (false).
    pub bind: bool,
}

/// Why a route (a binding, an alternate or dead-letter exchange) was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteRefused {
    /// The user's permissions or topic permissions, or the MQTT rules (RabbitMQ's text).
    Permission(Refused),
    /// A route into the MQTT exchange while MQTT authorization is on.
    IntoMqttExchange(String),
}

impl From<Refused> for RouteRefused {
    fn from(r: Refused) -> RouteRefused {
        RouteRefused::Permission(r)
    }
}

impl RouteRefused {
    /// The refusal's text (after `ACCESS_REFUSED - `).
    pub fn text(&self) -> &str {
        match self {
            RouteRefused::Permission(r) => &r.0,
            RouteRefused::IntoMqttExchange(t) => t,
        }
    }
}

impl Access {
    /// A route into `exchange` the client sets up (an exchange binding's destination, an
    /// alternate or dead-letter exchange): write on it, as RabbitMQ checks; and, while MQTT
    /// authorization is on, none into the MQTT exchange, since the MQTT rules are checked
    /// where a message is published, not where it is routed on.
    pub fn route_into(&mut self, exchange: &str) -> Result<(), RouteRefused> {
        self.resource(ResourceKind::Exchange, exchange, Permission::Write)?;
        if self.authz.mqtt && self.vhost == MQTT_VHOST && exchange == self.policy.mqtt_exchange {
            return Err(RouteRefused::IntoMqttExchange(format!(
                "exchange '{exchange}' in vhost '{}' takes MQTT-checked publishes only while MQTT \
                 authorization is on; publish to it directly",
                self.vhost
            )));
        }
        Ok(())
    }

    /// RabbitMQ's checks for a binding: write on the destination, read on the source and,
    /// on a topic source, read on the binding key (topic permissions, and on the MQTT
    /// exchange the MQTT rules that decide the same subscription). Making an exchange
    /// binding is a route into its destination ([`Access::route_into`]); removing one
    /// needs only what RabbitMQ asks.
    pub fn binding(&mut self, b: &BindingRequest<'_>) -> Result<(), RouteRefused> {
        match b.destination {
            BoundTo::Queue(q) => self.resource(ResourceKind::Queue, q, Permission::Write)?,
            BoundTo::Exchange(x) if b.bind => self.route_into(x)?,
            BoundTo::Exchange(x) => self.resource(ResourceKind::Exchange, x, Permission::Write)?,
        }
        self.resource(ResourceKind::Exchange, b.source, Permission::Read)?;
        if b.topic {
            self.topic(b.source, b.key, Permission::Read)?;
        }
        Ok(())
    }

    /// A publish to `exchange` with `key`: write on the exchange and, on a topic exchange,
    /// write on the routing key (topic permissions; the MQTT rules on the MQTT exchange).
    pub fn publish(&mut self, exchange: &str, topic: bool, key: &str) -> Result<(), Refused> {
        self.resource(ResourceKind::Exchange, exchange, Permission::Write)?;
        if topic {
            self.topic(exchange, key, Permission::Write)?;
        }
        Ok(())
    }

    /// Reading a stored message that was published to `exchange` with `key` in this
    /// virtual host (its body shown by the management API): what a client of this user
    /// would need to receive it. On the MQTT exchange while MQTT authorization is on, the
    /// MQTT rules as for a delivery to a subscriber; through the default exchange, read on
    /// the queue the key names (RabbitMQ's `basic.get`); otherwise read on the exchange
    /// and, on a topic exchange, read on the key.
    pub fn read_message(&mut self, exchange: &str, topic: bool, key: &str) -> Result<(), Refused> {
        if self.authz.mqtt && self.vhost == MQTT_VHOST && exchange == self.policy.mqtt_exchange {
            return match self.mqtt_receive(key) {
                true => Ok(()),
                false => Err(Refused(format!(
                    "read access to topic '{key}' in exchange '{exchange}' in vhost '{}' refused for user '{}'",
                    self.vhost,
                    self.user()
                ))),
            };
        }
        if exchange.is_empty() {
            return self.resource(ResourceKind::Queue, key, Permission::Read);
        }
        self.resource(ResourceKind::Exchange, exchange, Permission::Read)?;
        if topic {
            self.topic(exchange, key, Permission::Read)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::rules::{Actions, Rule, TopicPattern, Who};
    use super::super::{Authorizer, Identity, Permit, Policy, TopicPermissions, VhostPermissions};
    use super::*;

    fn policy() -> Policy {
        let mut p = Policy { mqtt_exchange: "amq.topic".into(), permissions_enforced: true, ..Policy::default() };
        p.permissions.insert(
            ("/".into(), "u".into()),
            VhostPermissions::new("", "^(q|amq\\.topic|x)$", "^(q|amq\\.topic|src)$").unwrap(),
        );
        p.topic_permissions
            .insert(("/".into(), "u".into(), "src".into()), TopicPermissions::new("", "^ok\\.").unwrap());
        p.rules.push(Rule {
            permit: Permit::Deny,
            who: Who::All,
            actions: Actions::ALL,
            topics: vec![TopicPattern::Filter("x/#".into())],
        });
        p
    }

    fn user() -> Identity {
        Identity { user: Some("u".into()), ..Identity::default() }
    }

    #[test]
    fn a_binding_needs_write_on_its_destination_read_on_its_source_and_its_key() {
        let a = Authorizer::new(true, true, policy());
        let mut access = a.access(user(), "/");
        let b = |destination, key, bind| BindingRequest { source: "src", topic: true, destination, key, bind };
        assert_eq!(access.binding(&b(BoundTo::Queue("q"), "ok.1", true)), Ok(()));
        let refused = access.binding(&b(BoundTo::Queue("q"), "no.1", true)).unwrap_err();
        assert!(refused.text().starts_with("read access to topic 'no.1' in exchange 'src'"), "{refused:?}");
        let refused = access.binding(&b(BoundTo::Queue("other"), "ok.1", true)).unwrap_err();
        assert!(refused.text().starts_with("write access to queue 'other'"), "{refused:?}");
        // Into the MQTT exchange: refused while MQTT authorization is on, even with write.
        let into = access.binding(&b(BoundTo::Exchange("amq.topic"), "ok.1", true)).unwrap_err();
        assert!(matches!(into, RouteRefused::IntoMqttExchange(_)), "{into:?}");
        assert_eq!(access.binding(&b(BoundTo::Exchange("amq.topic"), "ok.1", false)), Ok(()));
        // From the MQTT exchange: the MQTT rules decide the key as a subscription.
        let from_mqtt = BindingRequest {
            source: "amq.topic",
            topic: true,
            destination: BoundTo::Queue("q"),
            key: "x.#",
            bind: true,
        };
        assert!(access.binding(&from_mqtt).is_err(), "a rule denies x/#");
        assert_eq!(access.binding(&BindingRequest { key: "y.#", ..from_mqtt }), Ok(()));
    }

    #[test]
    fn a_stored_message_is_read_as_a_client_would_receive_it() {
        let a = Authorizer::new(true, true, policy());
        let mut access = a.access(user(), "/");
        assert!(access.read_message("amq.topic", true, "x.secret").is_err(), "the MQTT rules deny x/#");
        assert_eq!(access.read_message("amq.topic", true, "y.public"), Ok(()));
        assert_eq!(access.read_message("", false, "q"), Ok(()), "the default exchange: read on the queue");
        assert!(access.read_message("", false, "other").is_err());
        assert_eq!(access.read_message("src", true, "ok.a"), Ok(()));
        assert!(access.read_message("src", true, "no.a").is_err());
        let mut elsewhere = a.access(user(), "other");
        assert!(elsewhere.read_message("src", false, "k").is_err(), "no permissions in vhost other");
        let off = Authorizer::new(false, false, policy());
        assert_eq!(off.access(user(), "other").read_message("src", false, "k"), Ok(()));
    }
}

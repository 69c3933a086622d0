//! Who may connect and what they may do, checked the same way by every entry point.
//!
//! - [`auth`] — the user store both front-ends and the management API check logins against.
//! - [`authz`] — what a logged-in client may do: RabbitMQ permissions and MQTT topic
//!   rules in one policy, decided per connection with a cache.

pub mod auth;
pub(crate) mod authz;

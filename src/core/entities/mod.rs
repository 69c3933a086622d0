//! Entity management: the queues, exchanges and bindings clients declare, as RabbitMQ
//! defines them. Every entry point that declares or deletes (AMQP methods, the management
//! API, definitions import) goes through here, so a check exists once.
//!
//! - [`registry`] — the queue registry ([`Entities`]): declared queues by virtual host and
//!   name, `max-queues` counting, creation and deletion, reject-publish admission.
//! - [`queue`] — a declared queue ([`QueueEntity`]).
//! - [`restore`] — start-up: durable entities applied, orphaned consume queues deleted.
//! - [`arguments`] — queue arguments checked and turned into a queue configuration.
//! - [`stream_args`] — which declarations make a stream, and its retention arguments.
//! - [`retry_args`] — the queue arguments of delayed retries.
//! - [`declare`] — durable records of exchanges and bindings.

pub mod arguments;
pub mod declare;
pub mod queue;
pub mod registry;
pub mod restore;
pub mod retry_args;
pub mod stream_args;

pub use arguments::{arg_u64, queue_config, ArgumentError};
pub use declare::{forget_exchange, persist_binding, store_exchange};
pub use queue::QueueEntity;
pub use registry::{Entities, QueueSlot, QUEUE_PREFIX};
pub use retry_args::{retry_policy, RETRY_ARGUMENTS};
pub use stream_args::{is_stream, stream_config};

//! Entity management: the queues, exchanges and bindings clients declare, as RabbitMQ
//! defines them. Every entry point that declares, binds or deletes — the AMQP methods, the
//! management API, definitions import — calls [`Entities`], so each check and each
//! durable record exists once; the dead-letter task creates `%DLQ%` queues through it too.
//! Refusals are one typed [`EntityError`] worded as RabbitMQ words them; each front-end
//! maps it to its own answer (an AMQP reply code, an HTTP status).
//!
//! - [`registry`] — the queue registry ([`Entities`]): declared queues by virtual host and
//!   name, `max-queues` counting, creation and deletion, `x-expires`, reject-publish
//!   admission.
//! - [`queue`] — a declared queue ([`QueueEntity`]).
//! - [`declare`] — declare and delete queues and exchanges, bind and unbind (queues and
//!   exchange-to-exchange), and their durable records.
//! - [`equivalence`] — RabbitMQ's equivalence checks on redeclaration.
//! - [`arguments`] — queue arguments checked and turned into a queue configuration
//!   (TTL, limits, overflow, dead-letter exchange, delivery limit, priorities, type).
//! - [`stream_args`] — which declarations make a stream, and its retention arguments.
//! - [`retry_args`] — the queue arguments of delayed retries.
//! - [`dead_letter_queues`] — `%DLQ%{queue}` queues, made on demand for the dead-letter task.
//! - [`restore`] — start-up: durable entities applied, orphaned consume queues deleted.
//! - [`committed`] — what a cluster's metadata group committed, applied to memory.
//! - [`error`] — [`EntityError`].

pub(crate) mod arguments;
pub(crate) mod committed;
pub(crate) mod dead_letter_queues;
pub(crate) mod declare;
pub(crate) mod equivalence;
pub(crate) mod error;
pub(crate) mod queue;
pub(crate) mod registry;
pub(crate) mod restore;
pub(crate) mod retry_args;
pub(crate) mod stream_args;

pub(crate) use equivalence::{check_equivalent_durable_queue, check_equivalent_exchange, check_equivalent_queue};
pub(crate) use error::{EntityError, EntityKind};
pub(crate) use queue::QueueEntity;
pub(crate) use registry::Entities;

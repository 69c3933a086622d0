//! The management API as RabbitMQ clients use it: queues and exchanges, users and permissions, definitions, views, metrics, CSRF.

mod access;
mod api;
mod csrf;
mod permissions;
mod views;

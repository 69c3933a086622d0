//! Compile-time guards, run by `cargo test --doc`: every field of [`Broker`] stays
//! private to the core. Each item below holds a doc test that must fail to
//! compile with E0616 (private field), as it reaches one field from outside the crate.
//!
//! [`Broker`]: super::Broker

/// `Broker::journal` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.journal;
/// }
/// ```
pub struct Journal;

/// `Broker::stores` is private to the core (its reads and command builders are reached
/// through `Broker::stores()`, its state machine only through `Broker::commit`):
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.stores;
/// }
/// ```
pub struct Stores;

/// `Stores::state`, the state machine, is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(stores: &ferrymq::core::store::Stores) {
///     let _ = &stores.state;
/// }
/// ```
pub struct StateMachine;

/// `Broker::router` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.router;
/// }
/// ```
pub struct Router;

/// `Broker::shards` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.shards;
/// }
/// ```
pub struct Shards;

/// `Broker::retained` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.retained;
/// }
/// ```
pub struct Retained;

/// `Broker::stats` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.stats;
/// }
/// ```
pub struct Stats;

/// `Broker::connections` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.connections;
/// }
/// ```
pub struct Connections;

/// `Broker::limits` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.limits;
/// }
/// ```
pub struct Limits;

/// `Broker::started` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.started;
/// }
/// ```
pub struct Started;

/// `Broker::timers_changed` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.timers_changed;
/// }
/// ```
pub struct TimersChanged;

/// `Broker::dead_letter_queues` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.dead_letter_queues;
/// }
/// ```
pub struct DeadLetterQueues;

/// `Broker::assignments` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.assignments;
/// }
/// ```
pub struct Assignments;

/// `Broker::members` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.members;
/// }
/// ```
pub struct Members;

/// `Broker::next_id` is private to the core:
///
/// ```compile_fail,E0616
/// fn reach(broker: &ferrymq::core::broker::Broker) {
///     let _ = &broker.next_id;
/// }
/// ```
pub struct NextId;

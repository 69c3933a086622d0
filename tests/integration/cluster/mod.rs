//! A cluster of three real `ferrymq` processes (`common::cluster`): the metadata group
//! forms and elects a leader, declarations and users made through one member are on every
//! member, a member that was down catches up, a change without a majority is refused, and
//! the peer port refuses whoever does not hold `cluster.secret`, and snapshots bring members
//! back past a purged log.

mod metadata;
mod peers;
mod snapshots;

//! AMQP 0-9-1 clients (lapin, raw frames) against the broker: exchanges, queues, consumers, confirms and transactions, dead letters, delays, retries, streams, partitions, the MQTT gateway.

mod basic;
mod config;
mod confirms_tx;
mod connection;
mod consume;
mod dedup;
mod delayed;
mod dlx_ttl;
mod exchanges;
mod gateway;
mod hash_tags;
mod partitions;
mod queues;
mod restart;
mod retry;
mod stream_groups;
mod streams;

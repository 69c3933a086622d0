//! MQTT clients against the broker: 3.1/3.1.1/5.0 sessions, QoS, retained messages and wills, WebSocket, slow subscribers, bad input, fan-out.

mod bad_input;
mod fanout;
mod misc;
mod pubsub;
mod retained_will;
mod session;
mod slow_consumer;
mod tags;
mod v5;
mod websocket;

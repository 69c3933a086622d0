//! FerryMQ: an MQTT 3.1.1/5.0 and AMQP 0-9-1 broker on one durable core.
#![forbid(unsafe_code)]

//! Links to other brokers: MQTT bridges (with a real Mosquitto) and AMQP shovels.

mod bridge_mqtt;
mod shovel;

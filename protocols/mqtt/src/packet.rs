//! MQTT packets, modelled once for levels 3, 4 and 5 (fields a level lacks stay empty).

use bytes::Bytes;

use crate::reason::ReasonCode;

/// Protocol level from CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolLevel {
    /// MQTT 3.1 (`MQIsdp`, level 3).
    V3_1 = 3,
    /// MQTT 3.1.1 (level 4).
    V3_1_1 = 4,
    /// MQTT 5.0 (level 5).
    V5 = 5,
}

impl ProtocolLevel {
    /// True for MQTT 5.0.
    pub fn is_v5(self) -> bool {
        self == ProtocolLevel::V5
    }
}

/// Quality of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    /// At most once (0).
    AtMostOnce = 0,
    /// At least once (1).
    AtLeastOnce = 1,
    /// Exactly once (2).
    ExactlyOnce = 2,
}

impl QoS {
    /// QoS from its wire value; `None` for 3.
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// A user property (MQTT 5), name and value.
pub type UserProperty = (String, String);

/// Properties of PUBLISH and of a will message (MQTT 5; empty for 3.x).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishProperties {
    /// Payload format indicator (0 bytes, 1 UTF-8).
    pub payload_format_indicator: Option<u8>,
    /// Message expiry interval in seconds.
    pub message_expiry_interval: Option<u32>,
    /// Topic alias as on the wire (inbound: resolved by [`crate::Connection`] before the event).
    pub topic_alias: Option<u16>,
    /// Response Topic (0x08): where the receiver of a request should publish its reply.
    pub response_topic: Option<String>,
    /// Correlation Data (0x09): opaque bytes that let a requester match a reply to its request.
    pub correlation_data: Option<Bytes>,
    /// User properties, in order.
    pub user_properties: Vec<UserProperty>,
    /// Subscription identifiers (server to client only).
    pub subscription_identifiers: Vec<u32>,
    /// Content Type (0x03): application-defined description of the payload (e.g. a MIME type).
    pub content_type: Option<String>,
}

/// PUBLISH: an application message, either direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// DUP: possibly a redelivery of an earlier attempt (never encoded for QoS 0).
    pub dup: bool,
    /// QoS this PUBLISH travels at (a QoS of 3 is refused as malformed).
    pub qos: QoS,
    /// RETAIN flag: from a client, keep the message as the topic's retained message.
    pub retain: bool,
    /// Topic name (after alias resolution on inbound events).
    pub topic: String,
    /// Packet id (0 for QoS 0).
    pub pkid: u16,
    /// Application payload: the bytes after the variable header (a zero-copy slice on decode).
    pub payload: Bytes,
    /// MQTT 5 properties (none are read or written for 3.x).
    pub properties: PublishProperties,
}

/// Will message from CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    /// Will Topic: where the will message is published.
    pub topic: String,
    /// Will Payload: the will message's body.
    pub payload: Bytes,
    /// QoS the will message is published with.
    pub qos: QoS,
    /// Will Retain: publish the will as a retained message.
    pub retain: bool,
    /// Will delay interval in seconds (MQTT 5).
    pub delay_interval: Option<u32>,
    /// Will properties (MQTT 5).
    pub properties: PublishProperties,
}

/// CONNECT properties (MQTT 5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectProperties {
    /// Session expiry interval (seconds).
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum (0x21): QoS 1/2 publishes the client takes unacknowledged (absent: 65535).
    pub receive_maximum: Option<u16>,
    /// Maximum Packet Size (0x27): the server must not send the client larger packets.
    pub maximum_packet_size: Option<u32>,
    /// Topic Alias Maximum (0x22): aliases the server may use towards the client (absent: none).
    pub topic_alias_maximum: Option<u16>,
    /// Request Response Information (0x19): 1 asks for Response Information in CONNACK.
    pub request_response_information: Option<u8>,
    /// Request Problem Information (0x17): 0 keeps reason strings and user properties off acks.
    pub request_problem_information: Option<u8>,
    /// User Properties (0x26): application-defined name/value pairs, in order.
    pub user_properties: Vec<UserProperty>,
    /// Authentication method (enhanced auth).
    pub authentication_method: Option<String>,
    /// Authentication Data (0x16): method-specific bytes for enhanced authentication.
    pub authentication_data: Option<Bytes>,
}

/// CONNECT: the first packet a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Protocol Level byte; fixes how every later packet of the connection is encoded.
    pub level: ProtocolLevel,
    /// Client identifier (may be empty).
    pub client_id: String,
    /// Clean session (3.x) / clean start (5).
    pub clean_start: bool,
    /// Keep alive in seconds (0 = none).
    pub keep_alive: u16,
    /// User Name, present when the User Name Flag is set.
    pub username: Option<String>,
    /// Password (binary data), present when the Password Flag is set.
    pub password: Option<Bytes>,
    /// Will message, present when the Will Flag is set.
    pub will: Option<Will>,
    /// CONNECT properties (MQTT 5; none are read or written for 3.x).
    pub properties: ConnectProperties,
    /// Mosquitto's bridge bit (`try_private`): 0x80 on a 3.x protocol level byte, sent by a
    /// broker bridging in, which asks not to be sent its own publishes back and to see
    /// retain flags as published.
    pub bridge: bool,
}

/// CONNACK properties (MQTT 5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnAckProperties {
    /// Session expiry interval granted.
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum (0x21): QoS 1/2 publishes the server takes unacknowledged.
    pub receive_maximum: Option<u16>,
    /// Maximum QoS (0x24): highest QoS the server accepts (absent: 2).
    pub maximum_qos: Option<u8>,
    /// Retain Available (0x25): `Some(false)` if retained messages are unsupported; absent: available.
    pub retain_available: Option<bool>,
    /// Maximum Packet Size (0x27): the client must not send the server larger packets.
    pub maximum_packet_size: Option<u32>,
    /// Client id assigned by the server.
    pub assigned_client_identifier: Option<String>,
    /// Topic Alias Maximum (0x22): aliases the client may use towards the server.
    pub topic_alias_maximum: Option<u16>,
    /// Reason String (0x1F): human-readable diagnostic, never parsed by clients.
    pub reason_string: Option<String>,
    /// User Properties (0x26), in order.
    pub user_properties: Vec<UserProperty>,
    /// Wildcard Subscription Available (0x28): `Some(false)` if unsupported; absent: available.
    pub wildcard_subscription_available: Option<bool>,
    /// Subscription Identifiers Available (0x29): `Some(false)` if unsupported; absent: available.
    pub subscription_identifiers_available: Option<bool>,
    /// Shared Subscription Available (0x2A): `Some(false)` if unsupported; absent: available.
    pub shared_subscription_available: Option<bool>,
    /// Keep alive imposed by the server.
    pub server_keep_alive: Option<u16>,
    /// Response Information (0x1A): basis for response topics, when the client requested it.
    pub response_information: Option<String>,
    /// Server Reference (0x1C): another server for the client to use.
    pub server_reference: Option<String>,
}

/// One filter of a SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    /// Topic filter as sent (may be `$share/{group}/{filter}`).
    pub filter: String,
    /// Maximum QoS requested.
    pub qos: QoS,
    /// No Local (MQTT 5): do not send the subscriber its own publishes.
    pub no_local: bool,
    /// Retain As Published (MQTT 5): forward the RETAIN flag as published instead of clearing it.
    pub retain_as_published: bool,
    /// Retain Handling (MQTT 5): retained messages at subscribe: 0 always, 1 only if new, 2 never.
    pub retain_handling: u8,
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// Packet Identifier (non-zero), echoed by the SUBACK.
    pub pkid: u16,
    /// Filters in order.
    pub filters: Vec<SubscribeFilter>,
    /// Subscription identifier (MQTT 5).
    pub subscription_identifier: Option<u32>,
    /// User properties (MQTT 5).
    pub user_properties: Vec<UserProperty>,
}

/// UNSUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    /// Packet Identifier (non-zero), echoed by the UNSUBACK.
    pub pkid: u16,
    /// Filters in order.
    pub filters: Vec<String>,
    /// User properties (MQTT 5).
    pub user_properties: Vec<UserProperty>,
}

/// DISCONNECT (either direction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    /// Reason code (3.x: always normal).
    pub reason: ReasonCode,
    /// Session expiry interval update (client to server, MQTT 5).
    pub session_expiry_interval: Option<u32>,
    /// Reason String (0x1F): human-readable diagnostic, never parsed by the receiver.
    pub reason_string: Option<String>,
    /// Server Reference (0x1C), server to client: another server to use.
    pub server_reference: Option<String>,
}

/// Any MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// CONNECT: the first packet a client sends.
    Connect(Box<Connect>),
    /// CONNACK: the server's answer to CONNECT.
    ConnAck {
        /// Session Present: a stored session was resumed (encoded as 0 with a failure code).
        session_present: bool,
        /// Reason code (3.x return codes are mapped to and from it).
        reason: ReasonCode,
        /// CONNACK properties (MQTT 5; none are read or written for 3.x).
        properties: Box<ConnAckProperties>,
    },
    /// PUBLISH: an application message, either direction.
    Publish(Publish),
    /// PUBACK: acknowledges a QoS 1 PUBLISH.
    PubAck {
        /// Packet Identifier of the QoS 1 PUBLISH acknowledged.
        pkid: u16,
        /// Reason Code (MQTT 5; SUCCESS for 3.x, and left off the wire when SUCCESS without properties).
        reason: ReasonCode,
        /// Reason String (0x1F): human-readable; not sent when the client turned problem information off.
        reason_string: Option<String>,
    },
    /// PUBREC: first answer to a QoS 2 PUBLISH.
    PubRec {
        /// Packet Identifier of the QoS 2 PUBLISH received.
        pkid: u16,
        /// Reason Code (MQTT 5; SUCCESS for 3.x, and left off the wire when SUCCESS without properties).
        reason: ReasonCode,
        /// Reason String (0x1F): human-readable; not sent when the client turned problem information off.
        reason_string: Option<String>,
    },
    /// PUBREL: releases a QoS 2 PUBLISH after its PUBREC.
    PubRel {
        /// Packet Identifier of the QoS 2 PUBLISH released.
        pkid: u16,
        /// Reason Code (MQTT 5): SUCCESS or PACKET_IDENTIFIER_NOT_FOUND.
        reason: ReasonCode,
    },
    /// PUBCOMP: completes a QoS 2 exchange, answering PUBREL.
    PubComp {
        /// Packet Identifier of the QoS 2 PUBLISH completed.
        pkid: u16,
        /// Reason Code (MQTT 5): SUCCESS or PACKET_IDENTIFIER_NOT_FOUND.
        reason: ReasonCode,
    },
    /// SUBSCRIBE: client to server.
    Subscribe(Subscribe),
    /// SUBACK: answers SUBSCRIBE, one code per filter.
    SubAck {
        /// Packet Identifier of the SUBSCRIBE answered.
        pkid: u16,
        /// One reason code per filter (3.x: granted QoS or 0x80).
        reasons: Vec<ReasonCode>,
        /// Reason String (0x1F): human-readable; not sent when the client turned problem information off.
        reason_string: Option<String>,
    },
    /// UNSUBSCRIBE: client to server.
    Unsubscribe(Unsubscribe),
    /// UNSUBACK: answers UNSUBSCRIBE.
    UnsubAck {
        /// Packet Identifier of the UNSUBSCRIBE answered.
        pkid: u16,
        /// One reason code per filter (MQTT 5; empty for 3.x).
        reasons: Vec<ReasonCode>,
        /// Reason String (0x1F): human-readable; not sent when the client turned problem information off.
        reason_string: Option<String>,
    },
    /// PINGREQ: client keep-alive probe.
    PingReq,
    /// PINGRESP: the server's answer to PINGREQ.
    PingResp,
    /// DISCONNECT: the sender is closing the connection.
    Disconnect(Disconnect),
    /// AUTH (MQTT 5): enhanced authentication exchange.
    Auth {
        /// Reason Code: SUCCESS, CONTINUE_AUTHENTICATION or REAUTHENTICATE.
        reason: ReasonCode,
        /// Authentication Method (0x15), as named in CONNECT.
        method: Option<String>,
        /// Authentication Data (0x16): method-specific bytes.
        data: Option<Bytes>,
    },
}

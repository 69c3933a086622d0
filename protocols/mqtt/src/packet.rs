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
    /// Response topic.
    pub response_topic: Option<String>,
    /// Correlation data.
    pub correlation_data: Option<Bytes>,
    /// User properties, in order.
    pub user_properties: Vec<UserProperty>,
    /// Subscription identifiers (server to client only).
    pub subscription_identifiers: Vec<u32>,
    /// Content type.
    pub content_type: Option<String>,
}

/// PUBLISH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// DUP flag.
    pub dup: bool,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name (after alias resolution on inbound events).
    pub topic: String,
    /// Packet id (0 for QoS 0).
    pub pkid: u16,
    /// Payload.
    pub payload: Bytes,
    /// MQTT 5 properties.
    pub properties: PublishProperties,
}

/// Will message from CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    /// Will topic.
    pub topic: String,
    /// Will payload.
    pub payload: Bytes,
    /// Will QoS.
    pub qos: QoS,
    /// Will retain flag.
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
    /// Client's receive maximum.
    pub receive_maximum: Option<u16>,
    /// Client's maximum packet size.
    pub maximum_packet_size: Option<u32>,
    /// Client's topic alias maximum.
    pub topic_alias_maximum: Option<u16>,
    /// Request response information.
    pub request_response_information: Option<u8>,
    /// Request problem information.
    pub request_problem_information: Option<u8>,
    /// User properties.
    pub user_properties: Vec<UserProperty>,
    /// Authentication method (enhanced auth).
    pub authentication_method: Option<String>,
    /// Authentication data.
    pub authentication_data: Option<Bytes>,
}

/// CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Protocol level.
    pub level: ProtocolLevel,
    /// Client identifier (may be empty).
    pub client_id: String,
    /// Clean session (3.x) / clean start (5).
    pub clean_start: bool,
    /// Keep alive in seconds (0 = none).
    pub keep_alive: u16,
    /// User name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<Bytes>,
    /// Will message.
    pub will: Option<Will>,
    /// MQTT 5 properties.
    pub properties: ConnectProperties,
}

/// CONNACK properties (MQTT 5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnAckProperties {
    /// Session expiry interval granted.
    pub session_expiry_interval: Option<u32>,
    /// Server receive maximum.
    pub receive_maximum: Option<u16>,
    /// Maximum QoS supported.
    pub maximum_qos: Option<u8>,
    /// Retain available.
    pub retain_available: Option<bool>,
    /// Server maximum packet size.
    pub maximum_packet_size: Option<u32>,
    /// Client id assigned by the server.
    pub assigned_client_identifier: Option<String>,
    /// Server topic alias maximum.
    pub topic_alias_maximum: Option<u16>,
    /// Reason string.
    pub reason_string: Option<String>,
    /// User properties.
    pub user_properties: Vec<UserProperty>,
    /// Wildcard subscriptions available.
    pub wildcard_subscription_available: Option<bool>,
    /// Subscription identifiers available.
    pub subscription_identifiers_available: Option<bool>,
    /// Shared subscriptions available.
    pub shared_subscription_available: Option<bool>,
    /// Keep alive imposed by the server.
    pub server_keep_alive: Option<u16>,
    /// Response information.
    pub response_information: Option<String>,
    /// Server reference.
    pub server_reference: Option<String>,
}

/// One filter of a SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    /// Topic filter as sent (may be `$share/{group}/{filter}`).
    pub filter: String,
    /// Maximum QoS requested.
    pub qos: QoS,
    /// No local (MQTT 5).
    pub no_local: bool,
    /// Retain as published (MQTT 5).
    pub retain_as_published: bool,
    /// Retain handling 0, 1 or 2 (MQTT 5).
    pub retain_handling: u8,
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// Packet id.
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
    /// Packet id.
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
    /// Reason string.
    pub reason_string: Option<String>,
    /// Server reference.
    pub server_reference: Option<String>,
}

/// Any MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// CONNECT.
    Connect(Box<Connect>),
    /// CONNACK.
    ConnAck {
        /// Session present flag.
        session_present: bool,
        /// Reason code (3.x return codes are mapped to and from it).
        reason: ReasonCode,
        /// Properties.
        properties: Box<ConnAckProperties>,
    },
    /// PUBLISH.
    Publish(Publish),
    /// PUBACK.
    PubAck {
        /// Packet id.
        pkid: u16,
        /// Reason code.
        reason: ReasonCode,
        /// Reason string.
        reason_string: Option<String>,
    },
    /// PUBREC.
    PubRec {
        /// Packet id.
        pkid: u16,
        /// Reason code.
        reason: ReasonCode,
        /// Reason string.
        reason_string: Option<String>,
    },
    /// PUBREL.
    PubRel {
        /// Packet id.
        pkid: u16,
        /// Reason code.
        reason: ReasonCode,
    },
    /// PUBCOMP.
    PubComp {
        /// Packet id.
        pkid: u16,
        /// Reason code.
        reason: ReasonCode,
    },
    /// SUBSCRIBE.
    Subscribe(Subscribe),
    /// SUBACK.
    SubAck {
        /// Packet id.
        pkid: u16,
        /// One reason code per filter (3.x: granted QoS or 0x80).
        reasons: Vec<ReasonCode>,
        /// Reason string.
        reason_string: Option<String>,
    },
    /// UNSUBSCRIBE.
    Unsubscribe(Unsubscribe),
    /// UNSUBACK.
    UnsubAck {
        /// Packet id.
        pkid: u16,
        /// One reason code per filter (MQTT 5; empty for 3.x).
        reasons: Vec<ReasonCode>,
        /// Reason string.
        reason_string: Option<String>,
    },
    /// PINGREQ.
    PingReq,
    /// PINGRESP.
    PingResp,
    /// DISCONNECT.
    Disconnect(Disconnect),
    /// AUTH (MQTT 5).
    Auth {
        /// Reason code.
        reason: ReasonCode,
        /// Authentication method.
        method: Option<String>,
        /// Authentication data.
        data: Option<Bytes>,
    },
}

//! Codec tests: round trips at every level, framing, limits, each validation rule, and
//! interoperability with `mqttbytes` as an independent implementation.

use bytes::{Bytes, BytesMut};

use super::*;
use crate::packet::*;

const LEVELS: [ProtocolLevel; 3] = [ProtocolLevel::V3_1, ProtocolLevel::V3_1_1, ProtocolLevel::V5];
const MAX: usize = 1 << 20;

fn enc(p: &Packet, level: ProtocolLevel) -> BytesMut {
    let mut b = BytesMut::new();
    let n = encode(p, level, &mut b).unwrap();
    assert_eq!(n, b.len());
    assert_eq!(encoded_len(p, level).unwrap(), n);
    b
}

fn dec(bytes: &[u8], level: Option<ProtocolLevel>) -> Result<Option<Packet>, DecodeError> {
    let mut b = BytesMut::from(bytes);
    decode(&mut b, level, MAX)
}

/// Encodes, decodes byte by byte (every prefix is incomplete), and compares.
fn round_trip(p: &Packet, level: ProtocolLevel) {
    let bytes = enc(p, level);
    let lvl = if matches!(p, Packet::Connect(_)) { None } else { Some(level) };
    for i in 0..bytes.len() {
        assert_eq!(dec(&bytes[..i], lvl), Ok(None), "prefix {i} of {p:?}");
    }
    let mut buf = bytes.clone();
    buf.extend_from_slice(&[0xC0, 0x00]); // a following PINGREQ stays in the buffer
    let got = decode(&mut buf, lvl, MAX).unwrap().unwrap();
    assert_eq!(&got, p, "at {level:?}");
    assert_eq!(&buf[..], &[0xC0, 0x00]);
}

fn s(v: &str) -> String {
    v.to_owned()
}

fn full_publish_props() -> PublishProperties {
    PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(60),
        topic_alias: Some(3),
        response_topic: Some(s("resp/x")),
        correlation_data: Some(Bytes::from_static(b"corr")),
        user_properties: vec![(s("k"), s("v")), (s("k"), s("v2"))],
        subscription_identifiers: vec![1, 268_435_455],
        content_type: Some(s("text/plain")),
    }
}

fn connect(level: ProtocolLevel) -> Connect {
    let v5 = level.is_v5();
    Connect {
        level,
        bridge: false,
        client_id: s("a-client-id-longer-than-23-characters"),
        clean_start: true,
        keep_alive: 30,
        username: Some(s("user")),
        password: Some(Bytes::from_static(&[0, 1, 0xFF])),
        will: Some(Will {
            topic: s("will/t"),
            payload: Bytes::from_static(b"bye"),
            qos: QoS::ExactlyOnce,
            retain: true,
            delay_interval: v5.then_some(5),
            properties: if v5 {
                PublishProperties { topic_alias: None, subscription_identifiers: vec![], ..full_publish_props() }
            } else {
                PublishProperties::default()
            },
        }),
        properties: if v5 {
            ConnectProperties {
                session_expiry_interval: Some(100),
                receive_maximum: Some(10),
                maximum_packet_size: Some(1000),
                topic_alias_maximum: Some(5),
                request_response_information: Some(1),
                request_problem_information: Some(0),
                user_properties: vec![(s("a"), s("b"))],
                authentication_method: Some(s("SCRAM")),
                authentication_data: Some(Bytes::from_static(b"d")),
            }
        } else {
            ConnectProperties::default()
        },
    }
}

fn all_packets(level: ProtocolLevel) -> Vec<Packet> {
    let v5 = level.is_v5();
    let rs = |v: &str| v5.then(|| s(v));
    let mut v = vec![
        Packet::Connect(Box::new(connect(level))),
        Packet::Connect(Box::new(Connect {
            level,
            bridge: false,
            client_id: String::new(),
            clean_start: false,
            keep_alive: 0,
            username: None,
            password: None,
            will: None,
            properties: ConnectProperties::default(),
        })),
        Packet::ConnAck {
            // MQTT 3.1 has no session present flag (its byte is reserved).
            session_present: level != ProtocolLevel::V3_1,
            reason: ReasonCode::SUCCESS,
            properties: Box::new(if v5 {
                ConnAckProperties {
                    session_expiry_interval: Some(1),
                    receive_maximum: Some(2),
                    maximum_qos: Some(1),
                    retain_available: Some(false),
                    maximum_packet_size: Some(3),
                    assigned_client_identifier: Some(s("assigned")),
                    topic_alias_maximum: Some(4),
                    reason_string: Some(s("why")),
                    user_properties: vec![(s("x"), s("y"))],
                    wildcard_subscription_available: Some(true),
                    subscription_identifiers_available: Some(false),
                    shared_subscription_available: Some(true),
                    server_keep_alive: Some(5),
                    response_information: Some(s("ri")),
                    server_reference: Some(s("other")),
                }
            } else {
                ConnAckProperties::default()
            }),
        },
        Packet::ConnAck { session_present: false, reason: ReasonCode::NOT_AUTHORIZED, properties: Box::default() },
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: true,
            topic: s("a/b"),
            pkid: 0,
            payload: Bytes::new(),
            properties: PublishProperties::default(),
        }),
        Packet::Publish(Publish {
            dup: true,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: s("ü/✓"),
            pkid: 65535,
            payload: Bytes::from(vec![7u8; 300]),
            properties: if v5 { full_publish_props() } else { PublishProperties::default() },
        }),
        Packet::PubAck { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None },
        Packet::PubRec { pkid: 2, reason: ReasonCode::SUCCESS, reason_string: None },
        Packet::PubRel { pkid: 3, reason: ReasonCode::SUCCESS },
        Packet::PubComp { pkid: 4, reason: ReasonCode::SUCCESS },
        Packet::Subscribe(Subscribe {
            pkid: 5,
            filters: vec![
                SubscribeFilter {
                    filter: s("a/+/#"),
                    qos: QoS::AtLeastOnce,
                    no_local: v5,
                    retain_as_published: v5,
                    retain_handling: if v5 { 2 } else { 0 },
                },
                SubscribeFilter {
                    filter: s("$share/g/x"),
                    qos: QoS::ExactlyOnce,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                },
            ],
            subscription_identifier: v5.then_some(77),
            user_properties: if v5 { vec![(s("u"), s("p"))] } else { vec![] },
        }),
        Packet::SubAck {
            pkid: 6,
            reasons: vec![ReasonCode::GRANTED_QOS_1, ReasonCode::UNSPECIFIED_ERROR, ReasonCode::GRANTED_QOS_2],
            reason_string: rs("sub"),
        },
        Packet::Unsubscribe(Unsubscribe {
            pkid: 7,
            filters: vec![s("a/b"), s("#")],
            user_properties: if v5 { vec![(s("u"), s("p"))] } else { vec![] },
        }),
        Packet::UnsubAck {
            pkid: 8,
            reasons: if v5 { vec![ReasonCode::SUCCESS, ReasonCode::NO_SUBSCRIPTION_EXISTED] } else { vec![] },
            reason_string: rs("unsub"),
        },
        Packet::PingReq,
        Packet::PingResp,
        Packet::Disconnect(Disconnect {
            reason: ReasonCode::NORMAL_DISCONNECTION,
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        }),
    ];
    if v5 {
        v.extend([
            Packet::PubAck { pkid: 9, reason: ReasonCode::NO_MATCHING_SUBSCRIBERS, reason_string: None },
            Packet::PubAck { pkid: 9, reason: ReasonCode::SUCCESS, reason_string: Some(s("ok")) },
            Packet::PubRec { pkid: 10, reason: ReasonCode::QUOTA_EXCEEDED, reason_string: Some(s("full")) },
            Packet::PubRel { pkid: 11, reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND },
            Packet::PubComp { pkid: 12, reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND },
            Packet::Disconnect(Disconnect {
                reason: ReasonCode::DISCONNECT_WITH_WILL,
                session_expiry_interval: None,
                reason_string: None,
                server_reference: None,
            }),
            Packet::Disconnect(Disconnect {
                reason: ReasonCode::SERVER_MOVED,
                session_expiry_interval: Some(9),
                reason_string: Some(s("bye")),
                server_reference: Some(s("elsewhere")),
            }),
            Packet::Auth { reason: ReasonCode::SUCCESS, method: None, data: None },
            Packet::Auth {
                reason: ReasonCode::CONTINUE_AUTHENTICATION,
                method: Some(s("SCRAM")),
                data: Some(Bytes::from_static(b"nonce")),
            },
        ]);
    }
    v
}

#[test]
fn round_trip_every_packet_every_level() {
    for level in LEVELS {
        for p in all_packets(level) {
            round_trip(&p, level);
        }
    }
}

#[test]
fn level_specific_encodings() {
    let c = connect(ProtocolLevel::V3_1);
    let b = enc(&Packet::Connect(Box::new(c)), ProtocolLevel::V3_1);
    assert_eq!(&b[2..11], b"\x00\x06MQIsdp\x03");
    // Short forms of MQTT 5 acks and DISCONNECT.
    let ack = Packet::PubAck { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None };
    assert_eq!(&enc(&ack, ProtocolLevel::V5)[..], &[0x40, 2, 0, 1]);
    let d = Packet::Disconnect(Disconnect {
        reason: ReasonCode::NORMAL_DISCONNECTION,
        session_expiry_interval: None,
        reason_string: None,
        server_reference: None,
    });
    assert_eq!(&enc(&d, ProtocolLevel::V5)[..], &[0xE0, 0]);
    assert_eq!(
        &enc(&Packet::PubRel { pkid: 1, reason: ReasonCode::SUCCESS }, ProtocolLevel::V3_1_1)[..],
        &[0x62, 2, 0, 1]
    );
    // Properties are dropped for 3.x.
    let p = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: s("t"),
        pkid: 1,
        payload: Bytes::from_static(b"x"),
        properties: full_publish_props(),
    });
    assert_eq!(&enc(&p, ProtocolLevel::V3_1_1)[..], &[0x32, 6, 0, 1, b't', 0, 1, b'x']);
    // AUTH does not exist before MQTT 5.
    let auth = Packet::Auth { reason: ReasonCode::SUCCESS, method: None, data: None };
    assert_eq!(encode(&auth, ProtocolLevel::V3_1_1, &mut BytesMut::new()), Err(EncodeError::WrongLevel));
    assert_eq!(dec(&[0xF0, 0], Some(ProtocolLevel::V3_1_1)), Err(DecodeError::Protocol("AUTH requires MQTT 5")));
    assert_eq!(dec(&[0xF0, 0], Some(ProtocolLevel::V5)).unwrap().unwrap(), auth);
}

#[test]
fn v3_connack_return_codes() {
    let connack = |reason| Packet::ConnAck { session_present: true, reason, properties: Box::default() };
    let cases = [
        (ReasonCode::SUCCESS, 0u8, 1u8),
        (ReasonCode::UNSUPPORTED_PROTOCOL_VERSION, 1, 0),
        (ReasonCode::CLIENT_IDENTIFIER_NOT_VALID, 2, 0),
        (ReasonCode::SERVER_UNAVAILABLE, 3, 0),
        (ReasonCode::SERVER_BUSY, 3, 0),
        (ReasonCode::SERVER_SHUTTING_DOWN, 3, 0),
        (ReasonCode::BAD_USER_NAME_OR_PASSWORD, 4, 0),
        (ReasonCode::NOT_AUTHORIZED, 5, 0),
        (ReasonCode::BAD_AUTHENTICATION_METHOD, 5, 0),
        (ReasonCode::BANNED, 5, 0),
    ];
    for (reason, code, sp) in cases {
        assert_eq!(&enc(&connack(reason), ProtocolLevel::V3_1_1)[..], &[0x20, 2, sp, code], "{reason:?}");
        // 3.1 (MQIsdp) has no session present flag: its byte is reserved, always 0.
        assert_eq!(&enc(&connack(reason), ProtocolLevel::V3_1)[..], &[0x20, 2, 0, code], "3.1 {reason:?}");
    }
    assert_eq!(
        dec(&[0x20, 2, 0, 4], Some(ProtocolLevel::V3_1_1)).unwrap().unwrap(),
        Packet::ConnAck {
            session_present: false,
            reason: ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            properties: Box::default()
        }
    );
    assert!(dec(&[0x20, 2, 0, 6], Some(ProtocolLevel::V3_1_1)).is_err());
    assert!(dec(&[0x20, 2, 2, 0], Some(ProtocolLevel::V3_1_1)).is_err());
}

#[test]
fn v3_suback_codes() {
    let p = Packet::SubAck {
        pkid: 1,
        reasons: vec![ReasonCode(0), ReasonCode(2), ReasonCode::NOT_AUTHORIZED, ReasonCode::QUOTA_EXCEEDED],
        reason_string: None,
    };
    assert_eq!(&enc(&p, ProtocolLevel::V3_1_1)[..], &[0x90, 6, 0, 1, 0, 2, 0x80, 0x80]);
    assert!(dec(&[0x90, 3, 0, 1, 0x03], Some(ProtocolLevel::V3_1_1)).is_err());
}

#[test]
fn size_limit_refused_before_buffering() {
    // Only the fixed header of a 2 MB PUBLISH has arrived.
    let mut b = BytesMut::from(&[0x30u8, 0x80, 0x80, 0x80, 0x01][..]);
    assert_eq!(
        decode(&mut b, Some(ProtocolLevel::V5), 1000),
        Err(DecodeError::TooLarge { size: 2_097_157, max: 1000 })
    );
    // The limit is on the whole packet: 2 + 98 = 100 fits, 2 + 99 does not.
    let mut b = BytesMut::from(&[0x30u8, 98][..]);
    assert_eq!(decode(&mut b, Some(ProtocolLevel::V5), 100), Ok(None));
    let mut b = BytesMut::from(&[0x30u8, 99][..]);
    assert_eq!(decode(&mut b, Some(ProtocolLevel::V5), 100), Err(DecodeError::TooLarge { size: 101, max: 100 }));
    // Also before CONNECT.
    let mut b = BytesMut::from(&[0x10u8, 0xFF, 0x7F][..]);
    assert!(matches!(decode(&mut b, None, 1000), Err(DecodeError::TooLarge { .. })));
}

#[test]
fn remaining_length_over_four_bytes() {
    assert!(matches!(
        dec(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], Some(ProtocolLevel::V5)),
        Err(DecodeError::Malformed(_))
    ));
}

#[test]
fn only_connect_before_connect() {
    assert_eq!(dec(&[0xC0, 0], None), Err(DecodeError::Protocol("first packet must be CONNECT")));
    assert_eq!(dec(&[0x30], None), Ok(None));
}

/// A CONNECT body with the given name, level and flags, empty client id, for 3.x.
fn connect_bytes(name: &[u8], level: u8, flags: u8, tail: &[u8]) -> Vec<u8> {
    let mut body = vec![0, name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(&[level, flags, 0, 10]);
    if level == 5 {
        body.push(0);
    }
    body.extend_from_slice(&[0, 1, b'c']);
    body.extend_from_slice(tail);
    let mut v = vec![0x10, body.len() as u8];
    v.extend(body);
    v
}

#[test]
fn mosquitto_bridges_set_the_top_bit_of_a_3x_level() {
    for (name, level, want) in [(&b"MQTT"[..], 0x84, ProtocolLevel::V3_1_1), (b"MQIsdp", 0x83, ProtocolLevel::V3_1)] {
        let Some(Packet::Connect(c)) = dec(&connect_bytes(name, level, 0x02, &[]), None).unwrap() else { panic!() };
        assert_eq!((c.level, c.bridge), (want, true));
        let mut out = BytesMut::new();
        encode(&Packet::Connect(c.clone()), want, &mut out).unwrap();
        assert_eq!(out[4 + name.len()], level, "written back with the bit");
    }
    assert_eq!(dec(&connect_bytes(b"MQTT", 0x85, 0x02, &[]), None), Err(DecodeError::UnsupportedProtocol), "not on 5");
}

#[test]
fn connect_validation() {
    let ok = connect_bytes(b"MQTT", 4, 0x02, &[]);
    assert!(dec(&ok, None).unwrap().is_some());
    let v31 = connect_bytes(b"MQIsdp", 3, 0x02, &[]);
    let Some(Packet::Connect(c)) = dec(&v31, None).unwrap() else { panic!() };
    assert_eq!(c.level, ProtocolLevel::V3_1);
    // Unknown level / name.
    assert_eq!(dec(&connect_bytes(b"MQTT", 6, 0x02, &[]), None), Err(DecodeError::UnsupportedProtocol));
    assert_eq!(dec(&connect_bytes(b"MQTT", 3, 0x02, &[]), None), Err(DecodeError::UnsupportedProtocol));
    assert_eq!(dec(&connect_bytes(b"MQIsdp", 4, 0x02, &[]), None), Err(DecodeError::UnsupportedProtocol));
    assert_eq!(dec(&connect_bytes(b"HTTP", 4, 0x02, &[]), None), Err(DecodeError::UnsupportedProtocol));
    // Reserved flag.
    assert!(matches!(dec(&connect_bytes(b"MQTT", 4, 0x03, &[]), None), Err(DecodeError::Malformed(_))));
    // Will QoS / retain without will flag; will QoS 3.
    assert!(matches!(dec(&connect_bytes(b"MQTT", 4, 0x08, &[]), None), Err(DecodeError::Protocol(_))));
    assert!(matches!(dec(&connect_bytes(b"MQTT", 4, 0x20, &[]), None), Err(DecodeError::Protocol(_))));
    assert!(matches!(dec(&connect_bytes(b"MQTT", 4, 0x1C, &[]), None), Err(DecodeError::Malformed(_))));
    // Password without user name: refused for 3.x, allowed for 5.
    let pw = [0u8, 1, b'p'];
    assert!(matches!(dec(&connect_bytes(b"MQTT", 4, 0x42, &pw), None), Err(DecodeError::Protocol(_))));
    assert!(matches!(dec(&connect_bytes(b"MQIsdp", 3, 0x42, &pw), None), Err(DecodeError::Protocol(_))));
    assert!(dec(&connect_bytes(b"MQTT", 5, 0x42, &pw), None).unwrap().is_some());
    // Wildcard or empty will topic.
    let will = [0u8, 3, b'a', b'/', b'#', 0, 0];
    assert!(matches!(dec(&connect_bytes(b"MQTT", 4, 0x06, &will), None), Err(DecodeError::Protocol(_))));
    // Trailing bytes.
    assert!(matches!(dec(&connect_bytes(b"MQTT", 4, 0x02, &[1]), None), Err(DecodeError::Malformed(_))));
    // Truncated.
    assert!(matches!(dec(&[0x10, 3, 0, 4, b'M'], None), Err(DecodeError::Malformed(_))));
    // Client id with U+0000 or bad UTF-8.
    let mut bad = connect_bytes(b"MQTT", 4, 0x02, &[]);
    let n = bad.len();
    bad[n - 1] = 0;
    assert!(matches!(dec(&bad, None), Err(DecodeError::Malformed(_))));
    bad[n - 1] = 0xFF;
    assert!(matches!(dec(&bad, None), Err(DecodeError::Malformed(_))));
}

#[test]
fn fixed_header_flags() {
    let v4 = Some(ProtocolLevel::V3_1_1);
    assert!(matches!(dec(&[0x60, 2, 0, 1], v4), Err(DecodeError::Malformed(_)))); // PUBREL 0000
    assert!(matches!(dec(&[0x80, 6, 0, 1, 0, 1, b'a', 0], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0xA0, 5, 0, 1, 0, 1, b'a'], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0x41, 2, 0, 1], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0xC1, 0], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0x00, 0], v4), Err(DecodeError::Protocol(_))));
    assert!(matches!(dec(&[0x36, 5, 0, 1, b'a', 0, 1], v4), Err(DecodeError::Malformed(_)))); // QoS 3
    assert!(matches!(dec(&[0x38, 3, 0, 1, b'a'], v4), Err(DecodeError::Protocol(_))));
    // DUP on QoS 0
}

#[test]
fn publish_validation() {
    let v4 = Some(ProtocolLevel::V3_1_1);
    assert!(matches!(dec(&[0x30, 5, 0, 3, b'a', b'/', b'+'], v4), Err(DecodeError::TopicName(_))));
    assert!(matches!(dec(&[0x30, 3, 0, 1, b'#'], v4), Err(DecodeError::TopicName(_))));
    assert!(matches!(dec(&[0x30, 3, 0, 1, 0], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0x30, 4, 0, 2, 0xC3, 0x28], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0x32, 5, 0, 1, b'a', 0, 0], v4), Err(DecodeError::Protocol(_)))); // pkid 0
    assert!(matches!(dec(&[0x32, 4, 0, 1, b'a', 0], v4), Err(DecodeError::Malformed(_)))); // truncated pkid
                                                                                           // MQTT 5: property length past the end.
    assert!(matches!(dec(&[0x30, 4, 0, 1, b'a', 5], Some(ProtocolLevel::V5)), Err(DecodeError::Malformed(_))));
    // Duplicate topic alias.
    assert!(matches!(
        dec(&[0x30, 10, 0, 1, b'a', 6, 35, 0, 1, 35, 0, 2], Some(ProtocolLevel::V5)),
        Err(DecodeError::Protocol(_))
    ));
    // Empty topic is left to the connection (topic alias).
    assert!(dec(&[0x30, 6, 0, 0, 3, 35, 0, 1], Some(ProtocolLevel::V5)).unwrap().is_some());
}

#[test]
fn ack_validation() {
    let v4 = Some(ProtocolLevel::V3_1_1);
    let v5 = Some(ProtocolLevel::V5);
    assert!(matches!(dec(&[0x40, 2, 0, 0], v4), Err(DecodeError::Protocol(_)))); // pkid 0
    assert!(matches!(dec(&[0x40, 3, 0, 1, 0], v4), Err(DecodeError::Malformed(_)))); // 3.x: exactly 2
    assert!(matches!(dec(&[0x40, 1, 0], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0x62, 3, 0, 1, 0x80], v5), Err(DecodeError::Protocol(_)))); // PUBREL reason
    assert!(matches!(dec(&[0x40, 3, 0, 1, 0x05], v5), Err(DecodeError::Protocol(_))));
    assert!(matches!(dec(&[0x40, 4, 0, 1, 0, 0x7F], v5), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0xE0, 1, 0x01], v5), Err(DecodeError::Protocol(_)))); // DISCONNECT reason
    assert!(matches!(dec(&[0xE0, 1, 0x00], v4), Err(DecodeError::Malformed(_)))); // 3.x body
    assert!(matches!(dec(&[0xC0, 1, 0], v4), Err(DecodeError::Malformed(_))));
    assert!(matches!(dec(&[0xF0, 1, 0x01], v5), Err(DecodeError::Protocol(_)))); // AUTH reason
    assert!(matches!(dec(&[0xF0, 5, 0x18, 3, 22, 0, 0], v5), Err(DecodeError::Protocol(_))));
    // data w/o method
}

#[test]
fn subscribe_validation() {
    let v4 = Some(ProtocolLevel::V3_1_1);
    let v5 = Some(ProtocolLevel::V5);
    assert!(matches!(dec(&[0x82, 2, 0, 1], v4), Err(DecodeError::Protocol(_)))); // no filters
    assert!(matches!(dec(&[0x82, 3, 0, 1, 0], v5), Err(DecodeError::Protocol(_))));
    assert!(matches!(dec(&[0x82, 6, 0, 0, 0, 1, b'a', 0], v4), Err(DecodeError::Protocol(_)))); // pkid 0
    assert!(matches!(dec(&[0x82, 6, 0, 1, 0, 1, b'a', 3], v4), Err(DecodeError::Malformed(_)))); // QoS 3
    assert!(matches!(dec(&[0x82, 6, 0, 1, 0, 1, b'a', 4], v4), Err(DecodeError::Malformed(_)))); // 3.x NL bit
    assert!(matches!(dec(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x30], v5), Err(DecodeError::Protocol(_)))); // RH 3
    assert!(matches!(dec(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x40], v5), Err(DecodeError::Malformed(_)))); // reserved
    assert!(matches!(dec(&[0x82, 9, 0, 1, 2, 11, 0, 0, 1, b'a', 0], v5), Err(DecodeError::Protocol(_)))); // sub id 0
    assert!(matches!(dec(&[0x82, 6, 0, 1, 0, 1, 0, 0], v4), Err(DecodeError::Malformed(_)))); // U+0000
    assert!(matches!(dec(&[0x82, 5, 0, 1, 0, 1, b'a'], v4), Err(DecodeError::Malformed(_)))); // no options
    assert!(matches!(dec(&[0xA2, 2, 0, 1], v4), Err(DecodeError::Protocol(_)))); // UNSUBSCRIBE, no filters
    assert!(matches!(dec(&[0xA2, 3, 0, 1, 0], v5), Err(DecodeError::Protocol(_))));
}

#[test]
fn encode_too_large() {
    let p = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: "x".repeat(70_000),
        pkid: 0,
        payload: Bytes::new(),
        properties: PublishProperties::default(),
    });
    let mut b = BytesMut::new();
    assert_eq!(encode(&p, ProtocolLevel::V5, &mut b), Err(EncodeError::TooLarge));
    assert!(b.is_empty());
}

#[test]
fn interop_client_packets_from_mqttbytes() {
    use mqttbytes::{v4, v5, QoS as MQoS};
    let mut b = BytesMut::new();
    let mut c = v4::Connect::new("cid");
    c.set_login("u", "p");
    c.last_will = Some(v4::LastWill::new("w/t", "bye", MQoS::AtLeastOnce, true));
    c.write(&mut b).unwrap();
    let mut p = v4::Publish::new("a/b", MQoS::AtLeastOnce, "hello");
    p.pkid = 3;
    p.write(&mut b).unwrap();
    let mut sub = v4::Subscribe::new("x/#", MQoS::ExactlyOnce);
    sub.pkid = 9;
    sub.write(&mut b).unwrap();
    let Some(Packet::Connect(c)) = decode(&mut b, None, MAX).unwrap() else { panic!() };
    assert_eq!(c.client_id, "cid");
    assert_eq!(c.password.as_deref(), Some(&b"p"[..]));
    assert_eq!(c.will.as_ref().map(|w| (w.qos, w.retain)), Some((QoS::AtLeastOnce, true)));
    let Some(Packet::Publish(p)) = decode(&mut b, Some(ProtocolLevel::V3_1_1), MAX).unwrap() else { panic!() };
    assert_eq!((p.topic.as_str(), p.pkid, &p.payload[..]), ("a/b", 3, &b"hello"[..]));
    let Some(Packet::Subscribe(sub)) = decode(&mut b, Some(ProtocolLevel::V3_1_1), MAX).unwrap() else { panic!() };
    assert_eq!((sub.pkid, sub.filters[0].filter.as_str(), sub.filters[0].qos), (9, "x/#", QoS::ExactlyOnce));
    assert!(b.is_empty());

    let mut b = BytesMut::new();
    let mut p = v5::Publish::new("t", MQoS::ExactlyOnce, "x");
    p.pkid = 4;
    p.properties = Some(v5::PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(3),
        topic_alias: Some(2),
        response_topic: Some("r".into()),
        correlation_data: None,
        user_properties: vec![("k".into(), "v".into())],
        subscription_identifiers: vec![],
        content_type: Some("c".into()),
    });
    p.write(&mut b).unwrap();
    let Some(Packet::Publish(got)) = decode(&mut b, Some(ProtocolLevel::V5), MAX).unwrap() else { panic!() };
    assert_eq!(got.pkid, 4);
    assert_eq!(got.properties.topic_alias, Some(2));
    assert_eq!(got.properties.user_properties, vec![(s("k"), s("v"))]);
}

#[test]
fn interop_server_packets_to_mqttbytes() {
    use mqttbytes::{v4, v5};
    let publish = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: true,
        topic: s("a/b"),
        pkid: 7,
        payload: Bytes::from_static(b"payload"),
        properties: PublishProperties {
            subscription_identifiers: vec![5],
            user_properties: vec![(s("k"), s("v"))],
            ..PublishProperties::default()
        },
    });
    let mut b = enc(&publish, ProtocolLevel::V3_1_1);
    match v4::read(&mut b, MAX).unwrap() {
        v4::Packet::Publish(p) => {
            assert_eq!((p.topic.as_str(), p.pkid, &p.payload[..]), ("a/b", 7, &b"payload"[..]));
        }
        other => panic!("{other:?}"),
    }
    let mut b = enc(&publish, ProtocolLevel::V5);
    match v5::read(&mut b, MAX).unwrap() {
        v5::Packet::Publish(p) => {
            let props = p.properties.unwrap();
            assert_eq!(props.subscription_identifiers, vec![5]);
            assert_eq!(props.user_properties, vec![(s("k"), s("v"))]);
        }
        other => panic!("{other:?}"),
    }
    let connack = Packet::ConnAck {
        session_present: true,
        reason: ReasonCode::SUCCESS,
        properties: Box::new(ConnAckProperties {
            receive_maximum: Some(10),
            topic_alias_maximum: Some(3),
            ..ConnAckProperties::default()
        }),
    };
    let mut b = enc(&connack, ProtocolLevel::V3_1_1);
    assert!(matches!(v4::read(&mut b, MAX).unwrap(), v4::Packet::ConnAck(c) if c.session_present));
    let mut b = enc(&connack, ProtocolLevel::V5);
    match v5::read(&mut b, MAX).unwrap() {
        v5::Packet::ConnAck(c) => assert_eq!(c.properties.unwrap().receive_max, Some(10)),
        other => panic!("{other:?}"),
    }
    let suback = Packet::SubAck {
        pkid: 3,
        reasons: vec![ReasonCode::GRANTED_QOS_1, ReasonCode::NOT_AUTHORIZED],
        reason_string: None,
    };
    let mut b = enc(&suback, ProtocolLevel::V3_1_1);
    assert!(
        matches!(v4::read(&mut b, MAX).unwrap(), v4::Packet::SubAck(s) if s.pkid == 3 && s.return_codes.len() == 2)
    );
}

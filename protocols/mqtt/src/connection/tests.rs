//! Connection tests, driven with client packets encoded by our codec and with
//! `Instant`s passed in (no sleeping).

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::*;
use crate::codec::{decode, encode, encoded_len};

const V3: ProtocolLevel = ProtocolLevel::V3_1;
const V4: ProtocolLevel = ProtocolLevel::V3_1_1;
const V5: ProtocolLevel = ProtocolLevel::V5;

struct Client {
    level: ProtocolLevel,
    conn: Connection,
    t0: Instant,
}

fn connect_packet(level: ProtocolLevel, props: ConnectProperties) -> Packet {
    Packet::Connect(Box::new(Connect {
        level,
        bridge: false,
        client_id: "client".into(),
        clean_start: true,
        keep_alive: 10,
        username: None,
        password: None,
        will: None,
        properties: props,
    }))
}

impl Client {
    fn new(level: ProtocolLevel, config: Config) -> Self {
        let t0 = Instant::now();
        Client { level, conn: Connection::new(config, t0), t0 }
    }

    /// Connected and accepted, output and events drained.
    fn connected(level: ProtocolLevel, config: Config, props: ConnectProperties) -> Self {
        let mut c = Client::new(level, config);
        c.send(&connect_packet(level, props));
        assert!(matches!(c.events().as_slice(), [Event::Connect(_)]));
        c.conn.accept(Accept::default());
        assert!(matches!(c.out().as_slice(), [Packet::ConnAck { reason: ReasonCode::SUCCESS, .. }]));
        c
    }

    fn at(&self, secs: u64) -> Instant {
        self.t0 + Duration::from_secs(secs)
    }

    fn raw(&mut self, bytes: &[u8]) -> BytesMut {
        self.raw_at(bytes, self.t0)
    }

    fn raw_at(&mut self, bytes: &[u8], now: Instant) -> BytesMut {
        let mut b = BytesMut::from(bytes);
        self.conn.handle_input(&mut b, now);
        b
    }

    fn send(&mut self, p: &Packet) {
        self.send_at(p, self.t0);
    }

    fn send_at(&mut self, p: &Packet, now: Instant) {
        let mut b = BytesMut::new();
        encode(p, self.level, &mut b).unwrap();
        let left = self.raw_at(&b, now);
        assert!(left.is_empty() || self.conn.is_closed() || self.conn.state == State::AwaitAccept);
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.conn.poll_event()).collect()
    }

    fn out_bytes(&mut self) -> BytesMut {
        let mut b = BytesMut::new();
        self.conn.poll_transmit(&mut b);
        b
    }

    /// Server output decoded at the client's level.
    fn out(&mut self) -> Vec<Packet> {
        let mut b = self.out_bytes();
        let mut v = Vec::new();
        while let Some(p) = decode(&mut b, Some(self.level), usize::MAX).unwrap() {
            v.push(p);
        }
        assert!(b.is_empty());
        v
    }
}

fn publish(qos: QoS, pkid: u16, topic: &str) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        pkid,
        payload: Bytes::from_static(b"payload"),
        properties: PublishProperties::default(),
    })
}

fn publish_alias(topic: &str, alias: u16) -> Packet {
    let Packet::Publish(mut p) = publish(QoS::AtMostOnce, 0, topic) else { unreachable!() };
    p.properties.topic_alias = Some(alias);
    Packet::Publish(p)
}

fn outgoing(qos: QoS, topic: &str) -> Outgoing {
    Outgoing {
        topic: topic.into(),
        payload: Bytes::from_static(b"data"),
        qos,
        retain: false,
        dup: false,
        pkid: None,
        properties: PublishProperties::default(),
    }
}

fn pubrel(pkid: u16) -> Packet {
    Packet::PubRel { pkid, reason: ReasonCode::SUCCESS }
}

fn disconnect_reason(p: &[Packet]) -> Option<ReasonCode> {
    match p {
        [Packet::Disconnect(d)] => Some(d.reason),
        _ => None,
    }
}

#[test]
fn accept_v3_and_v311() {
    for level in [V3, V4] {
        let mut c = Client::new(level, Config::default());
        c.send(&connect_packet(level, ConnectProperties::default()));
        assert_eq!(c.conn.level(), Some(level));
        assert!(matches!(c.events().as_slice(), [Event::Connect(x)] if x.client_id == "client"));
        assert_eq!(c.conn.pending_output(), 0);
        c.conn.accept(Accept { session_present: true, ..Accept::default() });
        // MQTT 3.1 has no session present flag: the byte is reserved and 0.
        let flags = u8::from(level == V4);
        assert_eq!(&c.out_bytes()[..], &[0x20, 2, flags, 0], "{level:?}");
        assert!(!c.conn.is_closed());
    }
}

#[test]
fn accept_v5_fills_properties() {
    let config = Config {
        receive_maximum: 7,
        max_packet_size: 5000,
        topic_alias_maximum: 9,
        retain_available: false,
        server_keep_alive: Some(20),
        ..Config::default()
    };
    let mut c = Client::new(V5, config);
    c.send(&connect_packet(V5, ConnectProperties::default()));
    c.events();
    assert_eq!(c.conn.keep_alive(), 20);
    c.conn.accept(Accept {
        session_present: false,
        assigned_client_id: Some("gen-1".into()),
        session_expiry_interval: Some(30),
        inbound_qos2: vec![],
        properties: ConnAckProperties {
            user_properties: vec![("k".into(), "v".into())],
            retain_available: Some(true),
            ..ConnAckProperties::default()
        },
    });
    let out = c.out();
    let [Packet::ConnAck { session_present: false, reason: ReasonCode::SUCCESS, properties }] = out.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!(properties.receive_maximum, Some(7));
    assert_eq!(properties.maximum_packet_size, Some(5000));
    assert_eq!(properties.topic_alias_maximum, Some(9));
    assert_eq!(properties.retain_available, Some(false));
    assert_eq!(properties.wildcard_subscription_available, Some(true));
    assert_eq!(properties.subscription_identifiers_available, Some(true));
    assert_eq!(properties.shared_subscription_available, Some(true));
    assert_eq!(properties.server_keep_alive, Some(20));
    assert_eq!(properties.assigned_client_identifier.as_deref(), Some("gen-1"));
    assert_eq!(properties.session_expiry_interval, Some(30));
    assert_eq!(properties.user_properties, vec![("k".to_owned(), "v".to_owned())]);
    // Retain not available: a retained publish is refused with 0x9A.
    let Packet::Publish(mut p) = publish(QoS::AtMostOnce, 0, "t") else { unreachable!() };
    p.retain = true;
    c.send(&Packet::Publish(p));
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::RETAIN_NOT_SUPPORTED));
}

#[test]
fn max_keep_alive_clamps_v5() {
    let config = Config { max_keep_alive: Some(60), ..Config::default() };
    let mut c = Client::new(V5, config.clone());
    let Packet::Connect(mut p) = connect_packet(V5, ConnectProperties::default()) else { unreachable!() };
    p.keep_alive = 0;
    c.send(&Packet::Connect(p));
    assert_eq!(c.conn.keep_alive(), 60);
    c.conn.accept(Accept::default());
    assert!(
        matches!(c.out().as_slice(), [Packet::ConnAck { properties, .. }] if properties.server_keep_alive == Some(60))
    );
    // Within the limit: the client's value, no server keep alive.
    let mut c = Client::new(V5, config.clone());
    c.send(&connect_packet(V5, ConnectProperties::default()));
    assert_eq!(c.conn.keep_alive(), 10);
    c.conn.accept(Accept::default());
    assert!(
        matches!(c.out().as_slice(), [Packet::ConnAck { properties, .. }] if properties.server_keep_alive.is_none())
    );
    // 3.x cannot be told: the client's value stays.
    let mut c = Client::new(V4, config);
    c.send(&connect_packet(V4, ConnectProperties::default()));
    assert_eq!(c.conn.keep_alive(), 10);
}

#[test]
fn v3_1_accepted_or_refused_by_config() {
    let mut c = Client::new(V3, Config::default());
    c.send(&connect_packet(V3, ConnectProperties::default()));
    assert!(matches!(c.events().as_slice(), [Event::Connect(x)] if x.level == V3));
    let mut c = Client::new(V3, Config { allow_v3_1: false, ..Config::default() });
    c.send(&connect_packet(V3, ConnectProperties::default()));
    assert_eq!(&c.out_bytes()[..], &[0x20, 2, 0, 1]);
    assert_eq!(c.events(), vec![Event::Error(ProtocolError::Decode(DecodeError::UnsupportedProtocol))]);
    assert!(c.conn.is_closed());
}

#[test]
fn unsupported_protocol_levels() {
    // MQTT level 6: 3.x style CONNACK 0x01, as Mosquitto answers unknown levels.
    let mut c = Client::new(V5, Config::default());
    c.raw(&[0x10, 10, 0, 4, b'M', b'Q', b'T', b'T', 6, 2, 0, 10]);
    assert_eq!(&c.out_bytes()[..], &[0x20, 2, 0, 1]);
    assert!(c.conn.is_closed());
    // MQTT level 3: 3.x CONNACK 0x01.
    let mut c = Client::new(V4, Config::default());
    c.raw(&[0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 3, 2, 0, 10, 0, 0]);
    assert_eq!(&c.out_bytes()[..], &[0x20, 2, 0, 1]);
    assert!(matches!(c.events().as_slice(), [Event::Error(_)]));
    // Unknown protocol name: closed without answer.
    let mut c = Client::new(V4, Config::default());
    c.raw(&[0x10, 12, 0, 4, b'H', b'T', b'T', b'P', 4, 2, 0, 10, 0, 0]);
    assert_eq!(c.conn.pending_output(), 0);
    assert!(c.conn.is_closed());
}

#[test]
fn malformed_v5_connect_gets_connack() {
    let mut c = Client::new(V5, Config::default());
    // Reserved flag bit set.
    c.raw(&[0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 5, 3, 0, 10, 0, 0, 0]);
    assert_eq!(&c.out_bytes()[..], &[0x20, 3, 0, 0x81, 0]);
    assert!(matches!(c.events().as_slice(), [Event::Error(ProtocolError::Decode(DecodeError::Malformed(_)))]));
    // Same for 3.1.1: just closed.
    let mut c = Client::new(V4, Config::default());
    c.raw(&[0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 4, 3, 0, 10, 0, 0]);
    assert_eq!(c.conn.pending_output(), 0);
    assert!(c.conn.is_closed());
}

#[test]
fn empty_client_id_needs_clean_session_v3() {
    let mut c = Client::new(V4, Config::default());
    let Packet::Connect(mut p) = connect_packet(V4, ConnectProperties::default()) else { unreachable!() };
    p.client_id.clear();
    p.clean_start = false;
    c.send(&Packet::Connect(p.clone()));
    assert_eq!(&c.out_bytes()[..], &[0x20, 2, 0, 2]);
    assert!(c.conn.is_closed());
    // With a clean session it is up to the broker.
    let mut c = Client::new(V4, Config::default());
    p.clean_start = true;
    c.send(&Packet::Connect(p));
    assert!(matches!(c.events().as_slice(), [Event::Connect(_)]));
}

#[test]
fn packet_before_connect() {
    let mut c = Client::new(V4, Config::default());
    let left = c.raw(&[0xC0, 0]);
    assert_eq!(c.events(), vec![Event::Error(ProtocolError::Unexpected("first packet was not CONNECT"))]);
    assert!(c.conn.is_closed());
    assert_eq!(left.len(), 2);
    assert_eq!(c.conn.pending_output(), 0);
    // After close nothing is consumed.
    let left = c.raw(&[0x10, 0]);
    assert_eq!(left.len(), 2);
    assert!(c.events().is_empty());
}

#[test]
fn second_connect_is_an_error() {
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    c.send(&connect_packet(V5, ConnectProperties::default()));
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::PROTOCOL_ERROR));
    assert_eq!(c.events(), vec![Event::Error(ProtocolError::Unexpected("second CONNECT"))]);
    let mut c = Client::connected(V4, Config::default(), ConnectProperties::default());
    c.send(&connect_packet(V4, ConnectProperties::default()));
    assert!(c.out().is_empty());
    assert!(c.conn.is_closed());
}

#[test]
fn connect_timeout() {
    let mut c = Client::new(V4, Config::default());
    assert_eq!(c.conn.poll_timeout(), Some(c.at(10)));
    c.raw_at(&[0x10, 12, 0, 4], c.at(3)); // partial CONNECT does not stop the clock
    c.conn.handle_timeout(c.at(9));
    assert!(!c.conn.is_closed());
    c.conn.handle_timeout(c.at(10));
    assert_eq!(c.events(), vec![Event::Error(ProtocolError::ConnectTimeout)]);
    assert!(c.conn.is_closed());
    assert_eq!(c.conn.poll_timeout(), None);
}

#[test]
fn keep_alive_timeout() {
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    // The clock runs from CONNECT: keep alive 10 s gives a deadline at 15 s; a timer
    // call before it is not traffic and does not move it.
    assert_eq!(c.conn.poll_timeout(), Some(c.at(15)));
    c.conn.handle_timeout(c.at(14));
    assert!(!c.conn.is_closed());
    c.send_at(&Packet::PingReq, c.at(15));
    assert_eq!(c.out(), vec![Packet::PingResp]);
    assert_eq!(c.conn.poll_timeout(), Some(c.at(30)));
    c.conn.handle_timeout(c.at(29));
    assert!(!c.conn.is_closed());
    // A server that stopped reading (flow control) restarts the clock when it resumes.
    c.conn.restart_keep_alive(c.at(20));
    assert_eq!(c.conn.poll_timeout(), Some(c.at(35)));
    c.conn.handle_timeout(c.at(34));
    assert!(!c.conn.is_closed());
    c.conn.handle_timeout(c.at(35));
    assert_eq!(c.events(), vec![Event::Error(ProtocolError::KeepAliveTimeout)]);
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::KEEP_ALIVE_TIMEOUT));
    // Keep alive 0 disables it.
    let mut c = Client::new(V4, Config::default());
    let Packet::Connect(mut p) = connect_packet(V4, ConnectProperties::default()) else { unreachable!() };
    p.keep_alive = 0;
    c.send(&Packet::Connect(p));
    c.conn.accept(Accept::default());
    assert_eq!(c.conn.poll_timeout(), None);
    c.conn.handle_timeout(c.at(100_000));
    assert!(!c.conn.is_closed());
}

#[test]
fn qos1_inbound() {
    for level in [V4, V5] {
        let mut c = Client::connected(level, Config::default(), ConnectProperties::default());
        c.send(&publish(QoS::AtLeastOnce, 7, "a/b"));
        assert!(matches!(c.events().as_slice(), [Event::Publish(p)] if p.pkid == 7 && p.topic == "a/b"));
        assert!(c.out().is_empty());
        c.conn.ack_publish(7, ReasonCode::SUCCESS);
        assert_eq!(&c.out_bytes()[..], &[0x40, 2, 0, 7]);
        c.conn.ack_publish(7, ReasonCode::SUCCESS); // unknown now: ignored
        assert_eq!(c.conn.pending_output(), 0);
    }
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    c.send(&publish(QoS::AtLeastOnce, 7, "a/b"));
    c.conn.ack_publish(7, ReasonCode::NOT_AUTHORIZED);
    assert_eq!(&c.out_bytes()[..], &[0x40, 3, 0, 7, 0x87]);
}

#[test]
fn v3_error_ack_closes() {
    let mut c = Client::connected(V4, Config::default(), ConnectProperties::default());
    c.send(&publish(QoS::AtLeastOnce, 7, "a/b"));
    c.conn.ack_publish(7, ReasonCode::NOT_AUTHORIZED);
    assert!(c.conn.is_closed());
    assert_eq!(c.conn.pending_output(), 0);
}

#[test]
fn qos2_inbound_dedup() {
    for level in [V4, V5] {
        let mut c = Client::connected(level, Config::default(), ConnectProperties::default());
        c.send(&publish(QoS::ExactlyOnce, 5, "t"));
        assert_eq!(c.events().len(), 1);
        // Resent before the broker answered: not reported, no output.
        c.send(&publish(QoS::ExactlyOnce, 5, "t"));
        assert!(c.events().is_empty());
        assert!(c.out().is_empty());
        c.conn.ack_publish(5, ReasonCode::SUCCESS);
        assert!(matches!(c.out().as_slice(), [Packet::PubRec { pkid: 5, reason: ReasonCode::SUCCESS, .. }]));
        // Resent after PUBREC: PUBREC again, not reported.
        c.send(&publish(QoS::ExactlyOnce, 5, "t"));
        assert!(c.events().is_empty());
        assert!(matches!(c.out().as_slice(), [Packet::PubRec { pkid: 5, .. }]));
        c.send(&pubrel(5));
        assert_eq!(c.out(), vec![Packet::PubComp { pkid: 5, reason: ReasonCode::SUCCESS }]);
        assert_eq!(c.events(), vec![Event::PubRel { pkid: 5 }]);
        // Same id again is a new message.
        c.send(&publish(QoS::ExactlyOnce, 5, "t"));
        assert_eq!(c.events().len(), 1);
        // Unknown PUBREL.
        c.send(&pubrel(99));
        let expect = if level.is_v5() { ReasonCode::PACKET_IDENTIFIER_NOT_FOUND } else { ReasonCode::SUCCESS };
        assert_eq!(c.out(), vec![Packet::PubComp { pkid: 99, reason: expect }]);
        assert!(c.events().is_empty());
    }
}

/// MQTT 3.1 retransmissions carry DUP on PUBREL, SUBSCRIBE and UNSUBSCRIBE; they are
/// answered as the first sending would be, not refused as malformed.
#[test]
fn v3_1_retransmissions_with_dup_are_served() {
    let mut c = Client::connected(V3, Config::default(), ConnectProperties::default());
    c.send(&publish(QoS::ExactlyOnce, 1, "t"));
    assert_eq!(c.events().len(), 1);
    c.conn.ack_publish(1, ReasonCode::SUCCESS);
    assert!(matches!(c.out().as_slice(), [Packet::PubRec { pkid: 1, .. }]));
    c.raw(&[0x6A, 0x02, 0x00, 0x01]);
    assert_eq!(c.events(), vec![Event::PubRel { pkid: 1 }]);
    assert_eq!(c.out(), vec![Packet::PubComp { pkid: 1, reason: ReasonCode::SUCCESS }]);
    // The PUBCOMP was lost: the client sends PUBREL again.
    c.raw(&[0x6A, 0x02, 0x00, 0x01]);
    assert_eq!(c.out(), vec![Packet::PubComp { pkid: 1, reason: ReasonCode::SUCCESS }]);
    c.raw(&[0x8A, 0x06, 0x00, 0x02, 0x00, 0x01, b'a', 0x01]);
    assert!(matches!(c.events().as_slice(), [Event::Subscribe(s)] if s.pkid == 2));
    c.conn.ack_subscribe(2, vec![ReasonCode::GRANTED_QOS_1]);
    assert!(matches!(c.out().as_slice(), [Packet::SubAck { pkid: 2, .. }]));
    c.raw(&[0xAA, 0x05, 0x00, 0x03, 0x00, 0x01, b'a']);
    assert!(matches!(c.events().as_slice(), [Event::Unsubscribe(u)] if u.pkid == 3));
    assert!(!c.conn.is_closed());
    // The same bytes on 3.1.1 are malformed.
    let mut c = Client::connected(V4, Config::default(), ConnectProperties::default());
    c.raw(&[0x8A, 0x06, 0x00, 0x02, 0x00, 0x01, b'a', 0x01]);
    assert!(c.conn.is_closed());
}

#[test]
fn qos2_inbound_error_releases_id() {
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    c.send(&publish(QoS::ExactlyOnce, 5, "t"));
    c.events();
    c.conn.ack_publish(5, ReasonCode::QUOTA_EXCEEDED);
    assert!(matches!(c.out().as_slice(), [Packet::PubRec { reason: ReasonCode::QUOTA_EXCEEDED, .. }]));
    c.send(&publish(QoS::ExactlyOnce, 5, "t"));
    assert_eq!(c.events().len(), 1);
}

#[test]
fn resumed_session_inbound_qos2() {
    let mut c = Client::new(V4, Config::default());
    c.send(&connect_packet(V4, ConnectProperties::default()));
    c.events();
    c.conn.accept(Accept { session_present: true, inbound_qos2: vec![3, 4], ..Accept::default() });
    c.out();
    c.send(&publish(QoS::ExactlyOnce, 3, "t"));
    assert!(c.events().is_empty());
    assert!(matches!(c.out().as_slice(), [Packet::PubRec { pkid: 3, .. }]));
    c.send(&pubrel(4));
    assert_eq!(c.out(), vec![Packet::PubComp { pkid: 4, reason: ReasonCode::SUCCESS }]);
    assert_eq!(c.events(), vec![Event::PubRel { pkid: 4 }]);
}

#[test]
fn receive_maximum_inbound() {
    let config = Config { receive_maximum: 2, ..Config::default() };
    let mut c = Client::connected(V5, config.clone(), ConnectProperties::default());
    c.send(&publish(QoS::AtLeastOnce, 1, "t"));
    c.send(&publish(QoS::ExactlyOnce, 2, "t"));
    c.send(&publish(QoS::AtMostOnce, 0, "t")); // QoS 0 does not count
    assert_eq!(c.events().len(), 3);
    c.conn.ack_publish(1, ReasonCode::SUCCESS);
    c.send(&publish(QoS::AtLeastOnce, 3, "t"));
    assert_eq!(c.events().len(), 1);
    c.out();
    c.send(&publish(QoS::AtLeastOnce, 4, "t"));
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED));
    assert_eq!(c.events(), vec![Event::Error(ProtocolError::ReceiveMaximumExceeded)]);
    // 3.x has no receive maximum: bounded by the packet id space only.
    let mut c = Client::connected(V4, config, ConnectProperties::default());
    for id in 1..=10 {
        c.send(&publish(QoS::AtLeastOnce, id, "t"));
    }
    assert_eq!(c.events().len(), 10);
    assert!(!c.conn.is_closed());
}

#[test]
fn inbound_topic_aliases() {
    let config = Config { topic_alias_maximum: 2, ..Config::default() };
    let mut c = Client::connected(V5, config.clone(), ConnectProperties::default());
    c.send(&publish_alias("a/b", 1));
    c.send(&publish_alias("", 1));
    c.send(&publish_alias("c", 1)); // remap
    c.send(&publish_alias("", 1));
    let topics: Vec<_> = c
        .events()
        .into_iter()
        .map(|e| match e {
            Event::Publish(p) => {
                assert_eq!(p.properties.topic_alias, None);
                p.topic
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(topics, ["a/b", "a/b", "c", "c"]);
    for (alias, topic, reason) in [
        (0, "x", ReasonCode::TOPIC_ALIAS_INVALID),
        (3, "x", ReasonCode::TOPIC_ALIAS_INVALID),
        (2, "", ReasonCode::PROTOCOL_ERROR),
    ] {
        let mut c = Client::connected(V5, config.clone(), ConnectProperties::default());
        c.send(&publish_alias(topic, alias));
        assert_eq!(disconnect_reason(&c.out()), Some(reason), "alias {alias}");
        assert!(matches!(c.events().as_slice(), [Event::Error(_)]));
    }
    // Empty topic without alias.
    let mut c = Client::connected(V5, config, ConnectProperties::default());
    c.send(&publish(QoS::AtMostOnce, 0, ""));
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::TOPIC_NAME_INVALID));
}

#[test]
fn topic_levels_limit() {
    let config = Config { max_topic_levels: 2, ..Config::default() };
    let mut c = Client::connected(V4, config, ConnectProperties::default());
    c.send(&publish(QoS::AtMostOnce, 0, "a/b"));
    assert_eq!(c.events().len(), 1);
    c.send(&publish(QoS::AtMostOnce, 0, "a/b/c"));
    assert_eq!(c.events(), vec![Event::Error(ProtocolError::TopicNameInvalid)]);
}

#[test]
fn outbound_qos1_and_qos2() {
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtMostOnce, "t")), Ok(0));
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Ok(1));
    assert_eq!(c.conn.send_publish(outgoing(QoS::ExactlyOnce, "t")), Ok(2));
    let out = c.out();
    assert_eq!(out.len(), 3);
    assert!(matches!(&out[1], Packet::Publish(p) if p.pkid == 1 && p.qos == QoS::AtLeastOnce));
    c.send(&Packet::PubAck { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    assert_eq!(c.events(), vec![Event::PubAck { pkid: 1 }]);
    c.send(&Packet::PubAck { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    assert!(c.events().is_empty());
    c.send(&Packet::PubRec { pkid: 2, reason: ReasonCode::SUCCESS, reason_string: None });
    assert_eq!(c.events(), vec![Event::PubRec { pkid: 2 }]);
    assert_eq!(c.out(), vec![pubrel(2)]);
    c.send(&Packet::PubRec { pkid: 2, reason: ReasonCode::SUCCESS, reason_string: None });
    assert_eq!(c.out(), vec![pubrel(2)]); // duplicate PUBREC: PUBREL again
    assert!(c.events().is_empty());
    c.send(&Packet::PubComp { pkid: 2, reason: ReasonCode::SUCCESS });
    assert_eq!(c.events(), vec![Event::PubComp { pkid: 2 }]);
    // Unknown PUBREC (v5): PUBREL 0x92.
    c.send(&Packet::PubRec { pkid: 40, reason: ReasonCode::SUCCESS, reason_string: None });
    assert_eq!(c.out(), vec![Packet::PubRel { pkid: 40, reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND }]);
    // Error PUBREC ends the flow.
    assert_eq!(c.conn.send_publish(outgoing(QoS::ExactlyOnce, "t")), Ok(3));
    c.out();
    c.send(&Packet::PubRec { pkid: 3, reason: ReasonCode::QUOTA_EXCEEDED, reason_string: None });
    assert_eq!(c.events(), vec![Event::PubComp { pkid: 3 }]);
    assert!(c.out().is_empty());
    // 3.x: unknown PUBREC ignored.
    let mut c = Client::connected(V4, Config::default(), ConnectProperties::default());
    c.send(&Packet::PubRec { pkid: 40, reason: ReasonCode::SUCCESS, reason_string: None });
    assert!(c.out().is_empty());
}

#[test]
fn pubrel_waits_for_the_broker_when_told_to() {
    let mut c = Client::connected(V4, config_released(), ConnectProperties::default());
    assert_eq!(c.conn.send_publish(outgoing(QoS::ExactlyOnce, "t")), Ok(1));
    c.out();
    c.send(&Packet::PubRec { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    assert_eq!(c.events(), vec![Event::PubRec { pkid: 1 }]);
    assert!(c.out().is_empty(), "no PUBREL before the broker releases it");
    c.send(&Packet::PubRec { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    assert!(c.out().is_empty() && c.events().is_empty(), "a second PUBREC waits too");
    c.send(&Packet::PubComp { pkid: 1, reason: ReasonCode::SUCCESS });
    assert!(c.conn.is_closed(), "PUBCOMP before PUBREL is a protocol error");

    let mut c = Client::connected(V4, config_released(), ConnectProperties::default());
    assert_eq!(c.conn.send_publish(outgoing(QoS::ExactlyOnce, "t")), Ok(1));
    c.out();
    c.send(&Packet::PubRec { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    c.events();
    c.conn.release(1);
    assert_eq!(c.out(), vec![pubrel(1)]);
    c.conn.release(1);
    assert!(c.out().is_empty(), "released once");
    c.send(&Packet::PubComp { pkid: 1, reason: ReasonCode::SUCCESS });
    assert_eq!(c.events(), vec![Event::PubComp { pkid: 1 }]);
}

fn config_released() -> Config {
    Config { release_when_told: true, ..Config::default() }
}

#[test]
fn outbound_receive_maximum_and_ids() {
    let props = ConnectProperties { receive_maximum: Some(2), ..ConnectProperties::default() };
    let config = Config { pkid_range: 1..=1000, ..Config::default() };
    let mut c = Client::connected(V5, config, props);
    assert_eq!(c.conn.send_capacity(), 2);
    let mut o = outgoing(QoS::AtLeastOnce, "t");
    o.pkid = Some(5000);
    assert_eq!(c.conn.send_publish(o.clone()), Ok(5000));
    assert_eq!(c.conn.send_publish(o.clone()), Err(SendError::PacketIdInUse));
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Ok(1));
    assert_eq!(c.conn.send_capacity(), 0);
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Err(SendError::WindowFull));
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtMostOnce, "t")), Ok(0)); // QoS 0 unaffected
    c.send(&Packet::PubAck { pkid: 5000, reason: ReasonCode::SUCCESS, reason_string: None });
    assert_eq!(c.conn.send_capacity(), 1);
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Ok(2));
    // 3.x: bounded by the id range.
    let config = Config { pkid_range: 1..=2, ..Config::default() };
    let mut c = Client::connected(V4, config, ConnectProperties::default());
    assert_eq!(c.conn.send_capacity(), 2);
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Ok(1));
    assert_eq!(c.conn.send_publish(outgoing(QoS::ExactlyOnce, "t")), Ok(2));
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Err(SendError::WindowFull));
    c.send(&Packet::PubAck { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Ok(1));
}

#[test]
fn outbound_topic_aliases() {
    let props = ConnectProperties { topic_alias_maximum: Some(1), ..ConnectProperties::default() };
    let mut c = Client::connected(V5, Config::default(), props.clone());
    for topic in ["a/b", "a/b", "c", "a/b"] {
        c.conn.send_publish(outgoing(QoS::AtMostOnce, topic)).unwrap();
    }
    let sent: Vec<_> = c
        .out()
        .into_iter()
        .map(|p| match p {
            Packet::Publish(p) => (p.topic, p.properties.topic_alias),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sent, [("a/b".into(), Some(1)), (String::new(), Some(1)), ("c".into(), None), (String::new(), Some(1))]);
    // Turned off by config.
    let config = Config { outbound_topic_aliases: false, ..Config::default() };
    let mut c = Client::connected(V5, config, props);
    c.conn.send_publish(outgoing(QoS::AtMostOnce, "a")).unwrap();
    assert!(matches!(c.out().as_slice(), [Packet::Publish(p)] if p.properties.topic_alias.is_none()));
}

#[test]
fn client_maximum_packet_size() {
    let props = ConnectProperties { maximum_packet_size: Some(20), ..ConnectProperties::default() };
    let mut c = Client::connected(V5, Config::default(), props);
    let mut big = outgoing(QoS::AtLeastOnce, "t");
    big.payload = Bytes::from(vec![0u8; 100]);
    assert_eq!(c.conn.send_publish(big), Err(SendError::TooLarge));
    assert_eq!(c.conn.pending_output(), 0);
    assert_eq!(c.conn.send_capacity(), 65535); // no slot taken
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Ok(1));
    // A reason string that does not fit is dropped from DISCONNECT.
    c.out();
    c.conn.disconnect(ReasonCode::SERVER_SHUTTING_DOWN, Some(&"x".repeat(100)));
    assert_eq!(
        c.out(),
        vec![Packet::Disconnect(Disconnect {
            reason: ReasonCode::SERVER_SHUTTING_DOWN,
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        })]
    );
}

#[test]
fn a_connack_sheds_optional_properties_to_fit_the_client_maximum_packet_size() {
    for max in [20u32, 12, 6] {
        let mut c = Client::new(V5, Config { topic_alias_maximum: 10, ..Config::default() });
        let props = ConnectProperties { maximum_packet_size: Some(max), ..ConnectProperties::default() };
        c.send(&connect_packet(V5, props));
        assert!(matches!(c.events().as_slice(), [Event::Connect(_)]));
        let accept = Accept {
            assigned_client_id: Some("ferrymq-0123456789abcdef".into()),
            properties: ConnAckProperties { reason_string: Some("welcome".into()), ..ConnAckProperties::default() },
            ..Accept::default()
        };
        c.conn.accept(accept);
        let bytes = c.out_bytes();
        assert!(bytes.len() <= max as usize, "max {max}: {} bytes", bytes.len());
        assert_eq!(&bytes[..4], &[0x20, bytes.len() as u8 - 2, 0, 0][..], "max {max}: a successful CONNACK first");
        assert!(!c.conn.is_closed());
    }
}

/// Trimming drops first what carries no information: a session expiry equal to the
/// client's (0 when its CONNECT had none), a keep alive equal to its own, default limits;
/// the topic alias maximum, which says something, stays.
#[test]
fn a_trimmed_connack_drops_restated_properties_before_informative_ones() {
    let config = Config { topic_alias_maximum: 10, receive_maximum: u16::MAX, ..Config::default() };
    let connack = |max: Option<u32>| {
        let mut c = Client::new(V5, config.clone());
        let props = ConnectProperties { maximum_packet_size: max, ..ConnectProperties::default() };
        c.send(&connect_packet(V5, props));
        c.events();
        c.conn.accept(Accept {
            session_expiry_interval: Some(0),
            properties: ConnAckProperties { server_keep_alive: Some(10), ..ConnAckProperties::default() },
            ..Accept::default()
        });
        c.out()
    };
    let full = connack(None);
    let full_len = encoded_len(&full[0], V5).unwrap();
    // Short by the four "available" flags (2 bytes each, absent means true) and the
    // session expiry interval (1 + 4 bytes).
    let out = connack(Some(full_len as u32 - 8 - 5));
    let [Packet::ConnAck { reason: ReasonCode::SUCCESS, properties, .. }] = out.as_slice() else { panic!("{out:?}") };
    assert_eq!(properties.topic_alias_maximum, Some(10), "informative: kept");
    assert_eq!(properties.maximum_packet_size, Some(Config::default().max_packet_size), "kept");
    assert_eq!(properties.session_expiry_interval, None, "0, as the client asked: dropped");
    assert_eq!(properties.server_keep_alive, None, "the client's own keep alive: dropped");
    assert_eq!(properties.receive_maximum, None, "65,535 is the default: dropped");
}

#[test]
fn a_client_whose_maximum_packet_size_fits_no_connack_is_closed() {
    // Five bytes still hold a bare CONNACK (every property shed); four hold no packet at
    // all, not even the refusal (0x95 Packet too large), so the connection just closes.
    for (max, expect, closed) in [(5u32, vec![0x20, 3, 0, 0, 0], false), (4, vec![], true)] {
        let mut c = Client::new(V5, Config::default());
        let props = ConnectProperties { maximum_packet_size: Some(max), ..ConnectProperties::default() };
        c.send(&connect_packet(V5, props));
        assert!(matches!(c.events().as_slice(), [Event::Connect(_)]));
        c.conn.accept(Accept { assigned_client_id: Some("id".into()), ..Accept::default() });
        assert_eq!(&c.out_bytes()[..], &expect[..], "max {max}");
        assert_eq!(c.conn.is_closed(), closed, "max {max}");
    }
}

#[test]
fn v3_drops_properties() {
    let mut c = Client::connected(V4, Config::default(), ConnectProperties::default());
    let mut o = outgoing(QoS::AtMostOnce, "t");
    o.properties.user_properties.push(("k".into(), "v".into()));
    o.properties.subscription_identifiers.push(3);
    c.conn.send_publish(o).unwrap();
    assert_eq!(&c.out_bytes()[..], &[0x30, 7, 0, 1, b't', b'd', b'a', b't', b'a']);
}

#[test]
fn send_pubrel_resumes_qos2() {
    let props = ConnectProperties { receive_maximum: Some(1), ..ConnectProperties::default() };
    let mut c = Client::connected(V5, Config::default(), props);
    assert_eq!(c.conn.send_pubrel(0), Err(SendError::PacketIdInUse));
    assert_eq!(c.conn.send_pubrel(9), Ok(()));
    assert_eq!(c.out(), vec![pubrel(9)]);
    assert_eq!(c.conn.send_pubrel(9), Err(SendError::PacketIdInUse));
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtLeastOnce, "t")), Err(SendError::WindowFull));
    c.send(&Packet::PubComp { pkid: 9, reason: ReasonCode::SUCCESS });
    assert_eq!(c.events(), vec![Event::PubComp { pkid: 9 }]);
    assert_eq!(c.conn.send_capacity(), 1);
}

#[test]
fn problem_information() {
    // Default: reason string sent with DISCONNECT.
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    c.conn.disconnect(ReasonCode::ADMINISTRATIVE_ACTION, Some("bye"));
    assert!(matches!(c.out().as_slice(), [Packet::Disconnect(d)] if d.reason_string.as_deref() == Some("bye")));
    assert!(c.conn.is_closed());
    // Request Problem Information = 0: none.
    let props = ConnectProperties { request_problem_information: Some(0), ..ConnectProperties::default() };
    let mut c = Client::connected(V5, Config::default(), props);
    c.conn.disconnect(ReasonCode::ADMINISTRATIVE_ACTION, Some("bye"));
    assert!(matches!(c.out().as_slice(), [Packet::Disconnect(d)] if d.reason_string.is_none()));
    // 3.x: nothing is sent.
    let mut c = Client::connected(V4, Config::default(), ConnectProperties::default());
    c.conn.disconnect(ReasonCode::ADMINISTRATIVE_ACTION, Some("bye"));
    assert!(c.out().is_empty());
    assert!(c.conn.is_closed());
}

#[test]
fn client_disconnect() {
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    let d = Disconnect {
        reason: ReasonCode::DISCONNECT_WITH_WILL,
        session_expiry_interval: None,
        reason_string: None,
        server_reference: None,
    };
    c.send(&Packet::Disconnect(d.clone()));
    assert_eq!(c.events(), vec![Event::Disconnect(d.clone())]);
    assert!(c.conn.is_closed());
    // Session expiry on DISCONNECT after 0 in CONNECT.
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    let bad = Disconnect { session_expiry_interval: Some(10), ..d.clone() };
    c.send(&Packet::Disconnect(bad.clone()));
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::PROTOCOL_ERROR));
    assert!(matches!(c.events().as_slice(), [Event::Error(ProtocolError::Violation(ReasonCode::PROTOCOL_ERROR, _))]));
    // Allowed when CONNECT had a non-zero expiry.
    let props = ConnectProperties { session_expiry_interval: Some(5), ..ConnectProperties::default() };
    let mut c = Client::connected(V5, Config::default(), props);
    c.send(&Packet::Disconnect(bad.clone()));
    assert_eq!(c.events(), vec![Event::Disconnect(bad)]);
}

#[test]
fn refuse() {
    let mut c = Client::new(V4, Config::default());
    c.send(&connect_packet(V4, ConnectProperties::default()));
    c.conn.refuse(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    assert_eq!(&c.out_bytes()[..], &[0x20, 2, 0, 4]);
    assert!(c.conn.is_closed());
    let mut c = Client::new(V5, Config::default());
    c.send(&connect_packet(V5, ConnectProperties::default()));
    c.conn.refuse(ReasonCode::NOT_AUTHORIZED);
    assert_eq!(&c.out_bytes()[..], &[0x20, 3, 0, 0x87, 0]);
    assert_eq!(c.conn.send_publish(outgoing(QoS::AtMostOnce, "t")), Err(SendError::NotConnected));
}

#[test]
fn pipelined_packets_wait_for_accept() {
    let mut c = Client::new(V4, Config::default());
    let mut b = BytesMut::new();
    encode(&connect_packet(V4, ConnectProperties::default()), V4, &mut b).unwrap();
    let sub = Subscribe {
        pkid: 1,
        filters: vec![SubscribeFilter {
            filter: "a/#".into(),
            qos: QoS::AtLeastOnce,
            no_local: false,
            retain_as_published: false,
            retain_handling: 0,
        }],
        subscription_identifier: None,
        user_properties: vec![],
    };
    encode(&Packet::Subscribe(sub.clone()), V4, &mut b).unwrap();
    encode(&Packet::PingReq, V4, &mut b).unwrap();
    encode(&publish(QoS::AtMostOnce, 0, "x"), V4, &mut b).unwrap();
    let tail = b.split_off(b.len() - 3); // last PUBLISH incomplete
    c.conn.handle_input(&mut b, c.t0);
    assert!(b.is_empty());
    assert!(matches!(c.events().as_slice(), [Event::Connect(_)]));
    assert_eq!(c.conn.pending_output(), 0);
    c.conn.accept(Accept::default());
    assert_eq!(c.events(), vec![Event::Subscribe(sub)]);
    c.conn.ack_subscribe(1, vec![ReasonCode::GRANTED_QOS_1]);
    let out = c.out();
    assert!(matches!(out.as_slice(), [Packet::ConnAck { .. }, Packet::PingResp, Packet::SubAck { pkid: 1, .. }]));
    let mut rest = BytesMut::from(&tail[..]);
    c.conn.handle_input(&mut rest, c.t0);
    assert!(matches!(c.events().as_slice(), [Event::Publish(p)] if p.topic == "x"));
}

#[test]
fn byte_by_byte_input() {
    let mut c = Client::new(V5, Config::default());
    let mut all = BytesMut::new();
    encode(&connect_packet(V5, ConnectProperties::default()), V5, &mut all).unwrap();
    let mut buf = BytesMut::new();
    for b in all.iter() {
        buf.extend_from_slice(&[*b]);
        c.conn.handle_input(&mut buf, c.t0);
    }
    assert!(matches!(c.events().as_slice(), [Event::Connect(_)]));
    c.conn.accept(Accept::default());
    c.out();
    let mut all = BytesMut::new();
    encode(&publish(QoS::AtLeastOnce, 3, "a/b"), V5, &mut all).unwrap();
    for b in all.iter() {
        buf.extend_from_slice(&[*b]);
        c.conn.handle_input(&mut buf, c.t0);
    }
    assert!(buf.is_empty());
    assert!(matches!(c.events().as_slice(), [Event::Publish(p)] if p.pkid == 3));
}

#[test]
fn too_large_inbound() {
    let config = Config { max_packet_size: 100, ..Config::default() };
    let mut c = Client::connected(V5, config, ConnectProperties::default());
    c.raw(&[0x30, 0xFF, 0x7F]);
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::PACKET_TOO_LARGE));
    assert!(matches!(c.events().as_slice(), [Event::Error(ProtocolError::Decode(DecodeError::TooLarge { .. }))]));
}

#[test]
fn client_sends_server_packets() {
    for p in [Packet::PingResp, Packet::Auth { reason: ReasonCode::SUCCESS, method: None, data: None }] {
        let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
        c.send(&p);
        assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::PROTOCOL_ERROR));
        assert!(c.conn.is_closed());
    }
}

#[test]
fn subscription_identifier_from_client_and_shared_no_local() {
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    let Packet::Publish(mut p) = publish(QoS::AtMostOnce, 0, "t") else { unreachable!() };
    p.properties.subscription_identifiers.push(1);
    c.send(&Packet::Publish(p));
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::PROTOCOL_ERROR));
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    c.send(&Packet::Subscribe(Subscribe {
        pkid: 1,
        filters: vec![SubscribeFilter {
            filter: "$share/g/t".into(),
            qos: QoS::AtMostOnce,
            no_local: true,
            retain_as_published: false,
            retain_handling: 0,
        }],
        subscription_identifier: None,
        user_properties: vec![],
    }));
    assert_eq!(disconnect_reason(&c.out()), Some(ReasonCode::PROTOCOL_ERROR));
}

#[test]
fn an_acknowledgement_of_the_wrong_kind_is_a_protocol_error() {
    let qos1_pubcomp = (QoS::AtLeastOnce, Packet::PubComp { pkid: 1, reason: ReasonCode::SUCCESS });
    let qos1_pubrec = (QoS::AtLeastOnce, Packet::PubRec { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    let qos2_puback = (QoS::ExactlyOnce, Packet::PubAck { pkid: 1, reason: ReasonCode::SUCCESS, reason_string: None });
    let qos2_early_pubcomp = (QoS::ExactlyOnce, Packet::PubComp { pkid: 1, reason: ReasonCode::SUCCESS });
    for (qos, wrong) in [qos1_pubcomp, qos1_pubrec, qos2_puback, qos2_early_pubcomp] {
        for level in [V4, V5] {
            let mut c = Client::connected(level, Config::default(), ConnectProperties::default());
            assert_eq!(c.conn.send_publish(outgoing(qos, "t")), Ok(1));
            c.out();
            c.send(&wrong);
            assert!(c.conn.is_closed(), "{level:?} {qos:?} {wrong:?}");
            let out = c.out();
            if level == V5 {
                assert!(
                    matches!(out.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::PROTOCOL_ERROR),
                    "{wrong:?}: {out:?}"
                );
            } else {
                assert!(out.is_empty(), "3.1.1 closes without a packet: {out:?}");
            }
        }
    }
    // Acknowledgements of unknown packet ids are stale, not errors.
    let mut c = Client::connected(V5, Config::default(), ConnectProperties::default());
    c.send(&Packet::PubAck { pkid: 77, reason: ReasonCode::SUCCESS, reason_string: None });
    c.send(&Packet::PubComp { pkid: 78, reason: ReasonCode::SUCCESS });
    assert!(!c.conn.is_closed());
}

#[test]
fn a_5_0_client_may_resend_a_qos2_publish_after_a_reconnect_not_over_and_over() {
    let resend = || {
        let Packet::Publish(mut p) = publish(QoS::ExactlyOnce, 9, "t") else { unreachable!() };
        p.dup = true;
        Packet::Publish(p)
    };
    for level in [V4, V5] {
        let mut c = Client::new(level, Config::default());
        c.send(&connect_packet(level, ConnectProperties::default()));
        c.events();
        // Restored from the previous connection: one legitimate resend of id 9.
        c.conn.accept(Accept { inbound_qos2: vec![9], ..Accept::default() });
        c.out();
        let mut closed_after = None;
        for n in 1..=QOS2_RESEND_SLACK + 3 {
            c.send(&resend());
            if c.conn.is_closed() {
                closed_after = Some(n);
                break;
            }
            assert!(matches!(c.out().as_slice(), [Packet::PubRec { pkid: 9, .. }]), "{level:?} resend {n}");
        }
        match level {
            V5 => {
                assert_eq!(closed_after, Some(QOS2_RESEND_SLACK + 2), "past the bound");
                assert!(
                    matches!(c.out().as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::PROTOCOL_ERROR)
                );
            }
            _ => assert_eq!(closed_after, None, "3.1.1 allows resends"),
        }
    }
}

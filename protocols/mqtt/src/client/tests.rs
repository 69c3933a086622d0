//! The client against the crate's own server machine: bytes pass between the two as they
//! would over a socket.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::*;
use crate::connection::{Accept, Config, Connection, Event, Outgoing};
use crate::packet::PublishProperties;

struct Pair {
    client: Client,
    server: Connection,
    t0: Instant,
}

fn options(level: ProtocolLevel) -> ClientOptions {
    ClientOptions {
        level,
        client_id: "bridge-1".into(),
        clean_start: false,
        keep_alive: 10,
        username: Some("u".into()),
        password: Some(Bytes::from_static(b"p")),
        session_expiry: Some(3600),
        receive_maximum: 4,
        max_packet_size: 1 << 20,
        bridge: false,
        owner_releases: false,
        will: None,
    }
}

impl Pair {
    /// Connected: the server saw CONNECT and accepted it.
    fn connected(level: ProtocolLevel) -> Pair {
        Pair::connected_with(options(level))
    }

    fn connected_with(opts: ClientOptions) -> Pair {
        let level = opts.level;
        let t0 = Instant::now();
        let client = Client::new(opts, t0).unwrap();
        let server = Connection::new(Config::default(), t0);
        let mut p = Pair { client, server, t0 };
        p.deliver_to_server();
        match p.server.poll_event() {
            Some(Event::Connect(c)) => {
                assert_eq!((c.client_id.as_str(), c.clean_start, c.keep_alive), ("bridge-1", false, 10));
                assert_eq!(c.username.as_deref(), Some("u"));
                if level.is_v5() {
                    assert_eq!(c.properties.session_expiry_interval, Some(3600));
                    assert_eq!(c.properties.receive_maximum, Some(4));
                }
            }
            other => panic!("{other:?}"),
        }
        p.server.accept(Accept { session_present: true, ..Accept::default() });
        p.deliver_to_client();
        assert_eq!(p.client.poll_event(), Some(ClientEvent::Connected { session_present: true }));
        assert!(p.client.is_connected());
        p
    }

    fn deliver_to_server(&mut self) {
        let mut b = BytesMut::new();
        self.client.poll_transmit(&mut b);
        self.server.handle_input(&mut b, self.t0);
        assert!(b.is_empty());
    }

    fn deliver_to_client(&mut self) {
        let mut b = BytesMut::new();
        self.server.poll_transmit(&mut b);
        self.client.handle_input(&mut b, self.t0).unwrap();
        assert!(b.is_empty());
    }

    fn server_events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.server.poll_event()).collect()
    }
}

fn message(qos: QoS, topic: &str) -> Publish {
    Publish {
        dup: true,
        qos,
        retain: false,
        topic: topic.into(),
        pkid: 99,
        payload: Bytes::from_static(b"21.5"),
        properties: PublishProperties::default(),
    }
}

fn outgoing(qos: QoS) -> Outgoing {
    Outgoing {
        topic: "cmd/1".into(),
        payload: Bytes::from_static(b"on"),
        qos,
        retain: false,
        dup: false,
        pkid: None,
        properties: PublishProperties::default(),
    }
}

#[test]
fn qos1_and_qos2_publishes_end_in_delivered() {
    for level in [ProtocolLevel::V3_1_1, ProtocolLevel::V5] {
        let mut p = Pair::connected(level);
        let one = p.client.publish(message(QoS::AtLeastOnce, "a/1"), p.t0).unwrap();
        let two = p.client.publish(message(QoS::ExactlyOnce, "a/2"), p.t0).unwrap();
        assert_ne!(one, two);
        assert_eq!(p.client.in_flight(), 2);
        p.deliver_to_server();
        let events = p.server_events();
        let Event::Publish(first) = &events[0] else { panic!("{events:?}") };
        assert_eq!((first.topic.as_str(), first.dup, first.pkid), ("a/1", false, one), "dup cleared, id assigned");
        p.server.ack_publish(one, ReasonCode::SUCCESS);
        p.server.ack_publish(two, ReasonCode::SUCCESS);
        p.deliver_to_client();
        assert_eq!(p.client.poll_event(), Some(ClientEvent::Delivered { pkid: one, reason: ReasonCode::SUCCESS }));
        assert_eq!(p.client.poll_event(), None, "QoS 2 waits for PUBCOMP");
        p.deliver_to_server(); // PUBREL
        assert!(p.server_events().contains(&Event::PubRel { pkid: two }));
        p.deliver_to_client(); // PUBCOMP
        assert_eq!(p.client.poll_event(), Some(ClientEvent::Delivered { pkid: two, reason: ReasonCode::SUCCESS }));
        assert_eq!(p.client.in_flight(), 0);
    }
}

#[test]
fn inbound_publishes_are_acked_only_when_the_owner_says_so() {
    let mut p = Pair::connected(ProtocolLevel::V5);
    let sub = p.client.subscribe(vec![filter("cmd/#", QoS::ExactlyOnce)], p.t0).unwrap();
    p.deliver_to_server();
    let Some(Event::Subscribe(s)) = p.server.poll_event() else { panic!() };
    assert!(s.filters[0].no_local);
    p.server.ack_subscribe(s.pkid, vec![ReasonCode(2)]);
    p.deliver_to_client();
    assert_eq!(p.client.poll_event(), Some(ClientEvent::SubAck { pkid: sub, reasons: vec![ReasonCode(2)] }));

    let id1 = p.server.send_publish(outgoing(QoS::AtLeastOnce)).unwrap();
    let id2 = p.server.send_publish(outgoing(QoS::ExactlyOnce)).unwrap();
    p.deliver_to_client();
    let got: Vec<_> = std::iter::from_fn(|| p.client.poll_event()).collect();
    assert_eq!(got.len(), 2, "{got:?}");
    p.deliver_to_server();
    assert!(p.server_events().is_empty(), "nothing acked before the owner acks");

    p.client.ack(id1, p.t0).unwrap();
    p.client.ack(id2, p.t0).unwrap();
    p.deliver_to_server();
    assert_eq!(p.server_events(), vec![Event::PubAck { pkid: id1 }, Event::PubRec { pkid: id2 }]);
    p.deliver_to_client(); // PUBREL, answered with PUBCOMP
    p.deliver_to_server();
    assert_eq!(p.server_events(), vec![Event::PubComp { pkid: id2 }]);
}

#[test]
fn a_resent_qos2_publish_is_handed_on_once() {
    let mut p = Pair::connected(ProtocolLevel::V3_1_1);
    let mut m = message(QoS::ExactlyOnce, "a");
    m.pkid = 7;
    m.dup = false;
    let bytes = |m: &Publish| {
        let mut b = BytesMut::new();
        codec::encode(&Packet::Publish(m.clone()), ProtocolLevel::V3_1_1, &mut b).unwrap();
        b
    };
    p.client.handle_input(&mut bytes(&m), p.t0).unwrap();
    assert!(matches!(p.client.poll_event(), Some(ClientEvent::Publish(_))));
    m.dup = true;
    p.client.handle_input(&mut bytes(&m), p.t0).unwrap();
    assert_eq!(p.client.poll_event(), None, "not yet acked: not handed on again");
    p.client.ack(7, p.t0).unwrap();
    p.client.handle_input(&mut bytes(&m), p.t0).unwrap();
    assert_eq!(p.client.poll_event(), None, "PUBREC'd: only the PUBREC is sent again");
    let mut out = BytesMut::new();
    p.client.poll_transmit(&mut out);
    let mut n = 0;
    while let Some(pk) = codec::decode(&mut out, Some(ProtocolLevel::V3_1_1), 1 << 20).unwrap() {
        assert!(matches!(pk, Packet::PubRec { pkid: 7, .. }), "{pk:?}");
        n += 1;
    }
    assert_eq!(n, 2);
}

#[test]
fn the_owner_releases_qos2_hop_by_hop_under_the_previous_hops_id() {
    let opts = ClientOptions { owner_releases: true, ..options(ProtocolLevel::V5) };
    let mut p = Pair::connected_with(opts);
    // Outbound under the id (and DUP flag) the previous hop used.
    let mut m = message(QoS::ExactlyOnce, "a/2");
    m.pkid = 42;
    assert_eq!(p.client.publish_with_id(m.clone(), p.t0), Ok(42));
    assert!(p.client.publish_with_id(m.clone(), p.t0).is_err(), "id 42 is in flight");
    assert!(p.client.publish_with_id(Publish { pkid: 0, ..m.clone() }, p.t0).is_err(), "id 0");
    p.deliver_to_server();
    let events = p.server_events();
    let Event::Publish(seen) = &events[0] else { panic!("{events:?}") };
    assert_eq!((seen.pkid, seen.dup), (42, true));
    p.server.ack_publish(42, ReasonCode::SUCCESS);
    p.deliver_to_client();
    assert_eq!(p.client.poll_event(), Some(ClientEvent::Received { pkid: 42 }));
    p.deliver_to_server();
    assert!(p.server_events().is_empty(), "no PUBREL before the owner releases");
    p.client.release(42, p.t0).unwrap();
    p.deliver_to_server();
    assert_eq!(p.server_events(), vec![Event::PubRel { pkid: 42 }]);
    p.deliver_to_client();
    assert_eq!(p.client.poll_event(), Some(ClientEvent::Delivered { pkid: 42, reason: ReasonCode::SUCCESS }));

    // Inbound: PUBREL is handed to the owner, who completes it.
    let id = p.server.send_publish(outgoing(QoS::ExactlyOnce)).unwrap();
    p.deliver_to_client();
    assert!(matches!(p.client.poll_event(), Some(ClientEvent::Publish(_))));
    p.client.ack(id, p.t0).unwrap();
    p.deliver_to_server();
    assert_eq!(p.server_events(), vec![Event::PubRec { pkid: id }]);
    p.deliver_to_client(); // the server's PUBREL
    assert_eq!(p.client.poll_event(), Some(ClientEvent::Released { pkid: id }));
    p.deliver_to_server();
    assert!(p.server_events().is_empty(), "no PUBCOMP before the owner completes");
    p.client.complete(id, p.t0).unwrap();
    p.deliver_to_server();
    assert_eq!(p.server_events(), vec![Event::PubComp { pkid: id }]);

    // No PUBREL for an id in flight at QoS 1 (or waiting for its PUBREC).
    let one = p.client.publish(message(QoS::AtLeastOnce, "a/1"), p.t0).unwrap();
    assert!(p.client.release(one, p.t0).is_err());

    // A PUBREL of an id from before a reconnect reaches the owner too.
    let mut b = BytesMut::new();
    codec::encode(&Packet::PubRel { pkid: 9, reason: ReasonCode::SUCCESS }, ProtocolLevel::V5, &mut b).unwrap();
    p.client.handle_input(&mut b, p.t0).unwrap();
    assert_eq!(p.client.poll_event(), Some(ClientEvent::Released { pkid: 9 }));
}

#[test]
fn keep_alive_pings_and_fails_without_an_answer() {
    let mut p = Pair::connected(ProtocolLevel::V3_1_1);
    let ten = Duration::from_secs(10);
    assert_eq!(p.client.poll_timeout(), Some(p.t0 + ten));
    p.client.handle_timeout(p.t0 + ten).unwrap();
    let mut out = BytesMut::new();
    assert!(p.client.poll_transmit(&mut out));
    assert_eq!(&out[..], &[0xC0, 0]);
    assert_eq!(p.client.poll_timeout(), Some(p.t0 + ten * 2));
    assert_eq!(p.client.handle_timeout(p.t0 + ten * 2), Err(ClientError::KeepAliveTimeout));
}

#[test]
fn a_refused_connect_and_packets_out_of_place() {
    let t0 = Instant::now();
    let mut c = Client::new(options(ProtocolLevel::V5), t0).unwrap();
    let mut b = BytesMut::new();
    let refused = Packet::ConnAck {
        session_present: false,
        reason: ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        properties: Box::default(),
    };
    codec::encode(&refused, ProtocolLevel::V5, &mut b).unwrap();
    c.handle_input(&mut b, t0).unwrap();
    assert_eq!(c.poll_event(), Some(ClientEvent::Refused(ReasonCode::BAD_USER_NAME_OR_PASSWORD)));

    let mut p = Pair::connected(ProtocolLevel::V5);
    let mut b = BytesMut::new();
    codec::encode(
        &Packet::PubAck { pkid: 5, reason: ReasonCode::SUCCESS, reason_string: None },
        ProtocolLevel::V5,
        &mut b,
    )
    .unwrap();
    assert!(matches!(p.client.handle_input(&mut b, p.t0), Err(ClientError::Protocol(_))), "an ack of nothing");
}

fn filter(f: &str, qos: QoS) -> SubscribeFilter {
    SubscribeFilter { filter: f.into(), qos, no_local: true, retain_as_published: true, retain_handling: 0 }
}

//! Property tests: arbitrary bytes never panic the connection, valid packets round-trip
//! at every level, and random client packet sequences never panic the state machine.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ferrymq_mqtt::codec::{decode, encode};
use ferrymq_mqtt::*;
use proptest::prelude::*;

fn level() -> impl Strategy<Value = ProtocolLevel> {
    prop_oneof![Just(ProtocolLevel::V3_1), Just(ProtocolLevel::V3_1_1), Just(ProtocolLevel::V5)]
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce), Just(QoS::ExactlyOnce)]
}

/// Valid UTF-8 strings without U+0000.
fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9/ü✓ _-]{0,12}"
}

fn topic() -> impl Strategy<Value = String> {
    "[a-z0-9/ü]{1,12}"
}

fn bin() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..16).prop_map(Bytes::from)
}

fn users() -> impl Strategy<Value = Vec<UserProperty>> {
    prop::collection::vec((text(), text()), 0..3)
}

fn publish_props(v5: bool) -> BoxedStrategy<PublishProperties> {
    if !v5 {
        return Just(PublishProperties::default()).boxed();
    }
    (
        prop::option::of(0u8..=1),
        prop::option::of(any::<u32>()),
        prop::option::of(1u16..),
        prop::option::of(topic()),
        prop::option::of(bin()),
        users(),
        prop::collection::vec(1u32..=268_435_455, 0..3),
        prop::option::of(text()),
    )
        .prop_map(|(pfi, mei, ta, rt, cd, up, si, ct)| PublishProperties {
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            topic_alias: ta,
            response_topic: rt,
            correlation_data: cd,
            user_properties: up,
            subscription_identifiers: si,
            content_type: ct,
        })
        .boxed()
}

fn publish(v5: bool) -> impl Strategy<Value = Publish> {
    (qos(), any::<bool>(), any::<bool>(), topic(), 1u16.., bin(), publish_props(v5)).prop_map(
        |(qos, dup, retain, topic, pkid, payload, properties)| {
            let zero = qos == QoS::AtMostOnce;
            Publish { dup: dup && !zero, qos, retain, topic, pkid: if zero { 0 } else { pkid }, payload, properties }
        },
    )
}

fn will(v5: bool) -> impl Strategy<Value = Will> {
    (topic(), bin(), qos(), any::<bool>(), prop::option::of(any::<u32>()), publish_props(v5)).prop_map(
        move |(topic, payload, qos, retain, delay, mut properties)| {
            properties.topic_alias = None;
            properties.subscription_identifiers.clear();
            Will { topic, payload, qos, retain, delay_interval: if v5 { delay } else { None }, properties }
        },
    )
}

fn connect(level: ProtocolLevel) -> impl Strategy<Value = Connect> {
    let v5 = level.is_v5();
    let props = (
        prop::option::of(any::<u32>()),
        prop::option::of(1u16..),
        prop::option::of(1u32..),
        prop::option::of(any::<u16>()),
        prop::option::of(0u8..=1),
        prop::option::of(0u8..=1),
        users(),
        prop::option::of((text(), prop::option::of(bin()))),
    )
        .prop_map(move |(se, rm, mps, tam, rri, rpi, up, auth)| {
            if !v5 {
                return ConnectProperties::default();
            }
            ConnectProperties {
                session_expiry_interval: se,
                receive_maximum: rm,
                maximum_packet_size: mps,
                topic_alias_maximum: tam,
                request_response_information: rri,
                request_problem_information: rpi,
                user_properties: up,
                authentication_method: auth.as_ref().map(|a| a.0.clone()),
                authentication_data: auth.and_then(|a| a.1),
            }
        });
    (
        text(),
        any::<bool>(),
        any::<u16>(),
        prop::option::of(text()),
        prop::option::of(bin()),
        prop::option::of(will(v5)),
        props,
    )
        .prop_map(move |(client_id, clean_start, keep_alive, username, password, will, properties)| {
            // 3.x: a password needs a user name.
            let username = if !v5 && password.is_some() && username.is_none() { Some(String::new()) } else { username };
            Connect {
                level,
                client_id,
                clean_start,
                keep_alive,
                username,
                password,
                will,
                properties,
                bridge: !v5 && keep_alive % 2 == 1,
            }
        })
}

fn reason_string(v5: bool) -> BoxedStrategy<Option<String>> {
    if v5 {
        prop::option::of(text()).boxed()
    } else {
        Just(None).boxed()
    }
}

fn packet(level: ProtocolLevel) -> BoxedStrategy<Packet> {
    let v5 = level.is_v5();
    let code = |codes: &'static [u8]| prop::sample::select(codes).prop_map(ReasonCode);
    let puback_codes: &'static [u8] = if v5 { &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99] } else { &[0] };
    let pubrel_codes: &'static [u8] = if v5 { &[0x00, 0x92] } else { &[0] };
    let connack_codes: &'static [u8] = if v5 {
        &[0x00, 0x80, 0x81, 0x84, 0x85, 0x86, 0x87, 0x88, 0x8A, 0x95, 0x9F]
    } else {
        &[0x00, 0x84, 0x85, 0x88, 0x86, 0x87]
    };
    let suback_codes: &'static [u8] = if v5 { &[0x00, 0x01, 0x02, 0x80, 0x87, 0x8F, 0xA2] } else { &[0, 1, 2, 0x80] };
    let unsuback_codes: &'static [u8] = &[0x00, 0x11, 0x80, 0x87];
    let disconnect_codes: &'static [u8] = if v5 { &[0x00, 0x04, 0x80, 0x8B, 0x8E, 0x9C, 0xA2] } else { &[0] };
    let filter = (topic(), qos(), any::<bool>(), any::<bool>(), 0u8..=2).prop_map(move |(filter, qos, nl, rap, rh)| {
        SubscribeFilter {
            filter,
            qos,
            no_local: nl && v5,
            retain_as_published: rap && v5,
            retain_handling: if v5 { rh } else { 0 },
        }
    });
    let mut options = vec![
        connect(level).prop_map(|c| Packet::Connect(Box::new(c))).boxed(),
        (
            any::<bool>(),
            code(connack_codes),
            prop::option::of(any::<u32>()),
            prop::option::of(text()),
            reason_string(v5),
        )
            .prop_map(move |(sp, reason, se, aci, rs)| Packet::ConnAck {
                // MQTT 3.1 has no session present flag (its byte is reserved).
                session_present: sp && !reason.is_error() && level != ProtocolLevel::V3_1,
                reason,
                properties: Box::new(if v5 {
                    ConnAckProperties {
                        session_expiry_interval: se,
                        assigned_client_identifier: aci,
                        reason_string: rs,
                        retain_available: Some(true),
                        maximum_qos: Some(1),
                        ..ConnAckProperties::default()
                    }
                } else {
                    ConnAckProperties::default()
                }),
            })
            .boxed(),
        publish(v5).prop_map(Packet::Publish).boxed(),
        (1u16.., code(puback_codes), reason_string(v5))
            .prop_map(|(pkid, reason, reason_string)| Packet::PubAck { pkid, reason, reason_string })
            .boxed(),
        (1u16.., code(puback_codes), reason_string(v5))
            .prop_map(|(pkid, reason, reason_string)| Packet::PubRec { pkid, reason, reason_string })
            .boxed(),
        (1u16.., code(pubrel_codes)).prop_map(|(pkid, reason)| Packet::PubRel { pkid, reason }).boxed(),
        (1u16.., code(pubrel_codes)).prop_map(|(pkid, reason)| Packet::PubComp { pkid, reason }).boxed(),
        (1u16.., prop::collection::vec(filter, 1..4), prop::option::of(1u32..=268_435_455), users())
            .prop_map(move |(pkid, filters, sid, up)| {
                Packet::Subscribe(Subscribe {
                    pkid,
                    filters,
                    subscription_identifier: if v5 { sid } else { None },
                    user_properties: if v5 { up } else { vec![] },
                })
            })
            .boxed(),
        (1u16.., prop::collection::vec(code(suback_codes), 1..4), reason_string(v5))
            .prop_map(|(pkid, reasons, reason_string)| Packet::SubAck { pkid, reasons, reason_string })
            .boxed(),
        (1u16.., prop::collection::vec(topic(), 1..4), users())
            .prop_map(move |(pkid, filters, up)| {
                Packet::Unsubscribe(Unsubscribe { pkid, filters, user_properties: if v5 { up } else { vec![] } })
            })
            .boxed(),
        (1u16.., prop::collection::vec(code(unsuback_codes), 1..4), reason_string(v5))
            .prop_map(move |(pkid, reasons, reason_string)| Packet::UnsubAck {
                pkid,
                reasons: if v5 { reasons } else { vec![] },
                reason_string,
            })
            .boxed(),
        Just(Packet::PingReq).boxed(),
        Just(Packet::PingResp).boxed(),
        (code(disconnect_codes), prop::option::of(any::<u32>()), reason_string(v5), reason_string(v5))
            .prop_map(move |(reason, se, rs, sr)| {
                Packet::Disconnect(Disconnect {
                    reason,
                    session_expiry_interval: if v5 { se } else { None },
                    reason_string: rs,
                    server_reference: sr,
                })
            })
            .boxed(),
    ];
    if v5 {
        options.push(
            (code(&[0x00, 0x18, 0x19]), prop::option::of(text()), prop::option::of(bin()))
                .prop_map(|(reason, method, data)| {
                    let data = if method.is_some() { data } else { None };
                    Packet::Auth { reason, method, data }
                })
                .boxed(),
        );
    }
    prop::strategy::Union::new(options).boxed()
}

fn level_and_packet() -> impl Strategy<Value = (ProtocolLevel, Packet)> {
    level().prop_flat_map(|l| (Just(l), packet(l)))
}

/// Splits `bytes` at the given cut points and feeds the pieces one by one.
fn feed(conn: &mut Connection, bytes: &[u8], cuts: &[usize], now: Instant) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.push(bytes.len());
    let mut buf = BytesMut::new();
    let mut start = 0;
    for end in cuts {
        buf.extend_from_slice(&bytes[start..end]);
        start = end;
        conn.handle_input(&mut buf, now);
        drive_broker(conn);
    }
}

/// A minimal broker: accepts, acks everything, sends a publish now and then.
fn drive_broker(conn: &mut Connection) {
    while let Some(ev) = conn.poll_event() {
        match ev {
            Event::Connect(_) => conn.accept(Accept::default()),
            Event::Publish(p) if p.qos != QoS::AtMostOnce => conn.ack_publish(p.pkid, ReasonCode::SUCCESS),
            Event::Subscribe(s) => {
                let n = s.filters.len();
                conn.ack_subscribe(s.pkid, vec![ReasonCode::GRANTED_QOS_1; n]);
                let _ = conn.send_publish(Outgoing {
                    topic: "x/y".into(),
                    payload: Bytes::from_static(b"p"),
                    qos: QoS::ExactlyOnce,
                    retain: false,
                    dup: false,
                    pkid: None,
                    properties: PublishProperties::default(),
                });
            }
            Event::Unsubscribe(u) => conn.ack_unsubscribe(u.pkid, vec![]),
            _ => {}
        }
    }
    let mut out = BytesMut::new();
    conn.poll_transmit(&mut out);
}

fn small_config() -> Config {
    Config { max_packet_size: 4096, receive_maximum: 4, topic_alias_maximum: 4, ..Config::default() }
}

/// 1,024 cases per property by default; `PROPTEST_CASES=N` runs more.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1024)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// (a) Arbitrary bytes in arbitrary chunkings never panic; the connection stays open
    /// or reports an error / client DISCONNECT.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        with_connect in any::<bool>(),
        lvl in level(),
    ) {
        let t0 = Instant::now();
        let mut conn = Connection::new(small_config(), t0);
        let mut all = BytesMut::new();
        if with_connect {
            let c = Connect {
                level: lvl, client_id: "c".into(), clean_start: true, keep_alive: 5,
                username: None, password: None, will: None, bridge: false, properties: ConnectProperties::default(),
            };
            encode(&Packet::Connect(Box::new(c)), lvl, &mut all).unwrap();
        }
        all.extend_from_slice(&bytes);
        let mut events = Vec::new();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (all.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(all.len());
        let mut buf = BytesMut::new();
        let mut start = 0;
        for end in cuts {
            buf.extend_from_slice(&all[start..end]);
            start = end;
            conn.handle_input(&mut buf, t0);
            while let Some(ev) = conn.poll_event() {
                if let Event::Connect(_) = ev { conn.accept(Accept::default()); }
                events.push(ev);
            }
        }
        conn.handle_timeout(t0 + Duration::from_secs(3600));
        while let Some(ev) = conn.poll_event() { events.push(ev); }
        let mut out = BytesMut::new();
        conn.poll_transmit(&mut out);
        if conn.is_closed() {
            prop_assert!(events.iter().any(|e| matches!(e, Event::Error(_) | Event::Disconnect(_))));
        }
    }

    /// (b) Valid packets round-trip at each level.
    #[test]
    fn packets_round_trip((lvl, p) in level_and_packet()) {
        let mut buf = BytesMut::new();
        let n = encode(&p, lvl, &mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        let at = if matches!(p, Packet::Connect(_)) { None } else { Some(lvl) };
        let got = decode(&mut buf, at, usize::MAX).unwrap();
        prop_assert_eq!(got, Some(p));
        prop_assert!(buf.is_empty());
    }

    /// (c) Random client packet sequences (after a valid CONNECT) never panic, in random
    /// chunkings, with a broker that accepts and acks.
    #[test]
    fn random_sequences_never_panic(
        (lvl, packets) in level().prop_flat_map(|l| (Just(l), prop::collection::vec(packet(l), 0..12))),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let t0 = Instant::now();
        let mut conn = Connection::new(small_config(), t0);
        let mut bytes = BytesMut::new();
        let c = Connect {
            level: lvl, client_id: "c".into(), clean_start: true, keep_alive: 5,
            username: None, password: None, will: None, bridge: false, properties: ConnectProperties {
                topic_alias_maximum: if lvl.is_v5() { Some(2) } else { None },
                receive_maximum: if lvl.is_v5() { Some(3) } else { None },
                ..ConnectProperties::default()
            },
        };
        encode(&Packet::Connect(Box::new(c)), lvl, &mut bytes).unwrap();
        for p in &packets {
            encode(p, lvl, &mut bytes).unwrap();
        }
        feed(&mut conn, &bytes, &cuts, t0);
        // The first timer call after accept restarts the keep-alive clock; the second
        // is past 1.5 x 5 s: whatever happened, the connection is closed now.
        conn.handle_timeout(t0 + Duration::from_secs(8));
        conn.handle_timeout(t0 + Duration::from_secs(16));
        drive_broker(&mut conn);
        prop_assert!(conn.is_closed());
    }
}

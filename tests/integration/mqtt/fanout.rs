//! Wide fan-out to persistent sessions as subscribers observe it: every session's copy
//! carries what its own subscription granted, however many sessions a message goes to.

use crate::common::{v4, Broker};

/// Sessions subscribed to one topic, at QoS 0, 1 and 2 in turn.
const SESSIONS: usize = 60;

fn granted(i: usize) -> v4::QoS {
    match i % 3 {
        0 => v4::QoS::AtMostOnce,
        1 => v4::QoS::AtLeastOnce,
        _ => v4::QoS::ExactlyOnce,
    }
}

fn level(q: v4::QoS) -> u8 {
    q as u8
}

#[tokio::test]
async fn every_persistent_session_gets_its_own_granted_qos() {
    let broker = Broker::start();
    let mut subs = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        let mut s = v4::connect_persistent(&broker, &format!("wide-{i}")).await;
        let codes = s.subscribe("wide/t", granted(i)).await;
        assert_eq!(codes, vec![rumqttc::SubscribeReasonCode::Success(granted(i))]);
        subs.push(s);
    }
    // One message at QoS 2 and one at QoS 1 to all of them: each pointer's flags say the
    // QoS its session gets, min(published, granted).
    let mut p = v4::connect(&broker, "wide-publisher").await;
    p.publish_acked("wide/t", v4::QoS::ExactlyOnce, false, b"two".to_vec()).await;
    p.publish_acked("wide/t", v4::QoS::AtLeastOnce, false, b"one".to_vec()).await;
    for (i, s) in subs.iter_mut().enumerate() {
        let g = level(granted(i));
        for (payload, published) in [(&b"two"[..], 2u8), (&b"one"[..], 1u8)] {
            let m = s.next_publish().await;
            assert_eq!(&m.payload[..], payload, "session {i}: messages in publish order");
            assert_eq!(
                level(m.qos),
                published.min(g),
                "session {i} (granted QoS {g}) got {payload:?} at QoS {:?}",
                m.qos
            );
            if m.qos != v4::QoS::AtMostOnce {
                assert!(m.pkid != 0, "session {i}: a QoS 1/2 delivery has a packet id");
            }
        }
    }
}

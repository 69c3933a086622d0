//! The data group: formed with the cluster, it commits through any member (to its own
//! leader, which may be another member than the metadata group's), elects a new leader
//! when its leader is killed, takes the killed member back as a follower, and follows the
//! metadata group's membership when a member joins or is forgotten.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::cluster::Cluster;
use crate::common::{eventually, WAIT};

/// The data group as member `i` reports it.
async fn data_group(c: &Cluster, i: usize) -> Value {
    c.status(i).await["data_groups"][0].clone()
}

/// Waits until every member of `among` reports the same data-group leader, one of
/// `among`, with `voters` as the group's voters; its index.
async fn data_leader(c: &Cluster, among: &[usize], voters: &[&str]) -> usize {
    eventually("one data-group leader every running member agrees on", Duration::from_secs(30), || async {
        let mut seen = None;
        for &i in among {
            let g = data_group(c, i).await;
            let leader = g["leader"].as_str()?.to_owned();
            if g["voters"] != json!(voters) || seen.get_or_insert_with(|| leader.clone()) != &leader {
                return None;
            }
        }
        let leader: usize = seen?.strip_prefix('n')?.parse().ok()?;
        among.contains(&leader).then_some(leader)
    })
    .await
}

/// Commits a probe through the data group via member `i`: the entry's index.
async fn probe(c: &Cluster, i: usize) -> Result<u64, (StatusCode, Value)> {
    let (code, body) = c.api(i).post("/api/ferrymq/cluster/data-groups/probe", json!({})).await;
    match (code, body["index"].as_u64()) {
        (StatusCode::OK, Some(index)) => Ok(index),
        _ => Err((code, body)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_group_commits_through_any_member_and_elects_a_new_leader_when_its_leader_dies() {
    let mut c = Cluster::start(3, "command_timeout_ms = 3000");
    c.leader(&[0, 1, 2]).await;
    let leader = data_leader(&c, &[0, 1, 2], &["n0", "n1", "n2"]).await;
    // A probe through every member commits, each after the one before.
    let mut last = 0;
    for i in 0..3 {
        let index = probe(&c, i).await.unwrap_or_else(|e| panic!("probe through n{i}: {e:?}\n{}", c.logs()));
        assert!(index > last, "n{i} committed at {index} after {last}");
        last = index;
    }
    // Every member applies it; the leader sees none lagging.
    eventually("every member applied the last probe", WAIT, || async {
        for i in 0..3 {
            if data_group(&c, i).await["applied_index"].as_u64()? < last {
                return None;
            }
        }
        Some(())
    })
    .await;
    let g = data_group(&c, leader).await;
    assert_eq!(g["lag"], json!({"n0": 0, "n1": 0, "n2": 0}), "{g}");
    // `ferrymq ctl cluster status` shows the group.
    let out = std::process::Command::new(crate::common::binary())
        .args(["ctl", "--url", &format!("http://{}", c.member(0).http.unwrap()), "cluster", "status"])
        .output()
        .expect("ctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("data group data-0: leader n{leader}, ")), "{text}");
    assert!(text.contains("voters n0, n1, n2"), "{text}");

    // SIGKILL its leader: the two others elect one of them and commit again.
    c.kill(leader);
    let rest: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let killed = Instant::now();
    let index = eventually("a probe commits without the killed leader", Duration::from_secs(30), || async {
        probe(&c, rest[0]).await.ok()
    })
    .await;
    let failed_over = killed.elapsed();
    assert!(index > last, "committed at {index} after {last}");
    let voters = ["n0", "n1", "n2"];
    let new_leader = data_leader(&c, &rest, &voters).await;
    assert_ne!(new_leader, leader);
    assert!(probe(&c, rest[1]).await.is_ok(), "a probe through the other survivor");
    eprintln!("data group: committing again {} ms after its leader was killed", failed_over.as_millis());

    // The killed member comes back as a follower and is sent what it missed.
    c.restart(leader);
    let last = probe(&c, rest[0]).await.expect("a probe");
    eventually("the restarted member follows the new leader and applied the last probe", WAIT, || async {
        let g = data_group(&c, leader).await;
        (g["leader"] == json!(format!("n{new_leader}")) && g["applied_index"].as_u64()? >= last).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_joins_or_is_forgotten_joins_or_leaves_the_data_group_too() {
    let mut c = Cluster::start(3, "command_timeout_ms = 3000");
    c.leader(&[0, 1, 2]).await;
    data_leader(&c, &[0, 1, 2], &["n0", "n1", "n2"]).await;
    // n3 joins the metadata group by itself; the data group's leader adds it too.
    let joined = c.add();
    let leader = data_leader(&c, &[0, 1, 2, joined], &["n0", "n1", "n2", "n3"]).await;
    let last = probe(&c, joined).await.expect("a probe through n3");
    eventually("n3 applied it", WAIT, || async {
        (data_group(&c, joined).await["applied_index"].as_u64()? >= last).then_some(())
    })
    .await;
    // Forget a member that is not the data group's leader: it leaves the data group too,
    // and a majority of the three left commits without it.
    let gone = (0..3).find(|&i| i != leader).expect("a follower");
    c.kill(gone);
    let (code, body) = c.api(leader).delete(&format!("/api/ferrymq/cluster/members/n{gone}")).await;
    assert_eq!(code, StatusCode::NO_CONTENT, "{body}");
    let left: Vec<usize> = (0..4).filter(|&i| i != gone).collect();
    let voters: Vec<String> = left.iter().map(|i| format!("n{i}")).collect();
    let voters: Vec<&str> = voters.iter().map(String::as_str).collect();
    data_leader(&c, &left, &voters).await;
    // Two of the three left suffice.
    let other = *left.iter().find(|&&i| i != leader && i != joined).expect("a third member");
    c.kill(other);
    let survivors: Vec<usize> = left.iter().copied().filter(|&i| i != other).collect();
    eventually("a probe commits with two of the three", Duration::from_secs(30), || async {
        probe(&c, survivors[0]).await.ok()
    })
    .await;
}

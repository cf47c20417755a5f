//! The multi-node harness, `warren dev cluster`: three node daemons, each in a network
//! namespace of its own, and two control-plane replicas on PostgreSQL (SQLite where it is not
//! installed). A node cut off (its link down) and a node killed (SIGKILL) are routed around,
//! their sandboxes listed as `unknown` and never lost; a replica restarted sees everything
//! again; a create retried through the other replica makes no second sandbox.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::dev::DevCluster;
use warren_sdk::{Client, CreateSandbox, ErrorCode, SandboxState};

fn host(task: &str) -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        task: Some(task.into()),
        ..Default::default()
    }
}

/// Each listed sandbox's state, by id; fails on a duplicate.
async fn listed(c: &Client) -> BTreeMap<String, SandboxState> {
    let l = c.list(&Default::default()).await.unwrap();
    let mut out = BTreeMap::new();
    for s in l.items {
        assert!(
            out.insert(s.id.to_string(), s.state).is_none(),
            "{} listed twice",
            s.id
        );
    }
    out
}

async fn wait_reachable(c: &Client, node: &str, want: bool, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let l = c.nodes().await.unwrap();
        if l.items
            .iter()
            .any(|n| n.id.as_str() == node && n.reachable == want)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} not reachable={want} within {within:?}: {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_node_a_killed_node_and_a_restarted_replica_lose_nothing() {
    require_root!();
    let database = if warren_control::local_pg::binaries().is_ok() {
        "postgres"
    } else {
        eprintln!("no PostgreSQL installed: the dev cluster runs on SQLite");
        "sqlite"
    };
    let mut dc = DevCluster::start(&[
        "--nodes",
        "3",
        "--replicas",
        "2",
        "--database",
        database,
        "--node-config",
        "max_sandboxes = 8",
        "--control-config",
        "collect_interval_ms = 500",
    ]);
    let ids: Vec<String> = (0..3).map(|i| dc.node_id(i)).collect();
    let (c0, c1) = (dc.client(0), dc.client(1));

    // Placement spreads creates made through both replicas over the three nodes.
    let mut made = Vec::new();
    for i in 0..9 {
        let c = if i % 2 == 0 { &c0 } else { &c1 };
        made.push(c.create(&host("spread")).await.unwrap().id().to_string());
    }
    // Each replica samples two nodes per create and knows the other's placements only from
    // its next poll, so nine creates split unevenly now and then (2-to-4 each failed about
    // one run in twenty of a simulation); every node getting some is what placement ensures
    // here (a node left out of all nine: about one in a thousand).
    for id in &ids {
        let n = made.iter().filter(|s| s.starts_with(id.as_str())).count();
        assert!((1..=7).contains(&n), "node {id} got {n} of 9: {made:?}");
    }

    // Node 1 cut off: both replicas mark it, creates go elsewhere, its sandboxes are listed
    // as unknown, and an operation on one is a 503 naming it.
    let cut = &ids[1];
    let on_cut: BTreeSet<String> = made
        .iter()
        .filter(|s| s.starts_with(cut.as_str()))
        .cloned()
        .collect();
    // Both views hold node 1's sandboxes before it goes (a poll after the last create).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    dc.ok("cut 1");
    wait_reachable(&c0, cut, false, Duration::from_secs(45)).await;
    wait_reachable(&c1, cut, false, Duration::from_secs(45)).await;
    for _ in 0..3 {
        let id = c0.create(&host("spread")).await.unwrap().id().to_string();
        assert!(
            !id.starts_with(cut.as_str()),
            "{id} placed on the cut-off node"
        );
        made.push(id);
    }
    for c in [&c0, &c1] {
        let l = listed(c).await;
        assert_eq!(
            l.keys().cloned().collect::<BTreeSet<_>>(),
            made.iter().cloned().collect::<BTreeSet<_>>(),
            "every sandbox listed once"
        );
        for (id, st) in &l {
            let want = if on_cut.contains(id) {
                SandboxState::Unknown
            } else {
                SandboxState::Running
            };
            assert_eq!(*st, want, "{id}");
        }
    }
    let sb = c1.sandbox(on_cut.iter().next().unwrap()).unwrap();
    let e = sb.exec(&warren_sdk::shell("true")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
    assert!(e.to_string().contains(cut.as_str()), "{e}");

    // Mended: it answers again, its sandboxes run, none lost or doubled.
    dc.ok("mend 1");
    wait_reachable(&c0, cut, true, Duration::from_secs(30)).await;
    wait_reachable(&c1, cut, true, Duration::from_secs(30)).await;
    let r = sb.exec(&warren_sdk::shell("echo back")).await.unwrap();
    assert_eq!(r.stdout, "back\n");
    let l = listed(&c1).await;
    assert_eq!(l.len(), made.len());
    assert!(l.values().all(|s| *s == SandboxState::Running), "{l:?}");

    // Replica 0 restarted: its view is complete again within a few polls.
    dc.ok("restart-replica 0");
    let started = Instant::now();
    loop {
        let complete = match c0.nodes().await {
            Ok(n) => n.items.len() == 3 && n.items.iter().all(|n| n.reachable),
            Err(_) => false,
        } && c0
            .list(&Default::default())
            .await
            .is_ok_and(|l| l.items.len() == made.len() && l.unreachable.is_empty());
        if complete {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "replica 0's view incomplete 10 s after its restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "replica 0's view complete {:?} after its restart",
        started.elapsed()
    );

    // Node 2 killed: routed around; started again, it re-adopts its sandboxes, which both
    // replicas list and which keep their files.
    let killed = &ids[2];
    let on_killed: Vec<String> = made
        .iter()
        .filter(|s| s.starts_with(killed.as_str()))
        .cloned()
        .collect();
    let sb = c0.sandbox(&on_killed[0]).unwrap();
    sb.exec(&warren_sdk::shell("echo kept > /tmp/mark"))
        .await
        .unwrap();
    dc.ok("kill 2");
    wait_reachable(&c1, killed, false, Duration::from_secs(30)).await;
    let id = c1.create(&host("spread")).await.unwrap().id().to_string();
    assert!(!id.starts_with(killed.as_str()), "{id}");
    made.push(id);
    dc.ok("start 2");
    wait_reachable(&c0, killed, true, Duration::from_secs(60)).await;
    wait_reachable(&c1, killed, true, Duration::from_secs(60)).await;
    let r = sb.exec(&warren_sdk::shell("cat /tmp/mark")).await.unwrap();
    assert_eq!(r.stdout, "kept\n");
    for c in [&c0, &c1] {
        let l = listed(c).await;
        assert_eq!(
            l.keys().cloned().collect::<BTreeSet<_>>(),
            made.iter().cloned().collect::<BTreeSet<_>>()
        );
    }

    // A create retried through the other replica with the same key: one sandbox.
    let a = c0
        .create_idempotent(&host("keyed"), "episode-1")
        .await
        .unwrap();
    let b = c1
        .create_idempotent(&host("keyed"), "episode-1")
        .await
        .unwrap();
    assert_eq!(a.id(), b.id());
    made.push(a.id().to_string());
    assert_eq!(listed(&c1).await.len(), made.len());

    // A bad command is an error, not the end of the harness.
    let a = dc.cmd("cut 9");
    assert!(a["error"].as_str().unwrap().contains("no node 9"), "{a}");
}

//! Many nodes: `warren server` replicas and `warren node` daemons joined over loopback —
//! joining with the cluster token, placement across nodes with refusals retried elsewhere,
//! cordons shared by replicas, a node killed and restarted, a replica restarted, idempotent
//! creates across replicas, and bad registrations refused.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use warren_sdk::{CreateSandbox, ErrorCode, ListFilter, SandboxState};

fn host() -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        ..Default::default()
    }
}

/// How many of `ids` each node holds (by the node id each sandbox id starts with).
fn per_node(ids: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for id in ids {
        *m.entry(id[..6].to_string()).or_insert(0) += 1;
    }
    m
}

/// Nodes of 3 sandboxes at most: 5 creates fill one and spill onto the other (a node's
/// refusal is retried on the next candidate), and the sixth and seventh fit only where there is
/// room; a cordoned node gets nothing, and the cordon holds for every replica, after a
/// restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_spreads_retries_refusals_and_keeps_off_cordoned_nodes() {
    require_root!();
    let mut cl = Cluster::start(2, 2, "max_sandboxes = 3");
    cl.wait_nodes_on(1, 2, Duration::from_secs(15));
    let (a, b) = (cl.node_id(0), cl.node_id(1));
    let c0 = cl.client(0);
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(c0.create(&host()).await.unwrap().id().to_string());
    }
    let m = per_node(&ids);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(m.values().all(|n| *n >= 2), "{m:?}");
    // One place left in all: the sixth takes it, the seventh finds every node full.
    ids.push(c0.create(&host()).await.unwrap().id().to_string());
    let e = c0.create(&host()).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    for id in &ids {
        c0.sandbox(id).unwrap().kill().await.unwrap();
    }

    // Cordon through replica 0; replica 1 learns it from the membership.
    let n = c0.cordon(&a, true).await.unwrap();
    assert!(n.cordoned);
    let c1 = cl.client(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = c1.nodes().await.unwrap();
        if l.items.iter().any(|n| n.id.as_str() == a && n.cordoned) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica 1 never saw the cordon: {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(c1.create(&host()).await.unwrap().id().to_string());
    }
    assert_eq!(per_node(&ids).keys().collect::<Vec<_>>(), vec![&b]);
    // Full but for the cordoned node: refused, naming no cordoned placement.
    let e = c1.create(&host()).await.unwrap_err();
    assert!(matches!(e.code(), Some(ErrorCode::Capacity)), "{e}");
    for id in &ids {
        c1.sandbox(id).unwrap().kill().await.unwrap();
    }
    // A restarted replica still knows the cordon (it is in the database), and both nodes.
    cl.restart_replica(0);
    let l = cl.client(0).nodes().await.unwrap();
    assert_eq!(l.items.len(), 2, "{l:?}");
    assert!(l.items.iter().any(|n| n.id.as_str() == a && n.cordoned));
    cl.client(0).cordon(&a, false).await.unwrap();
    let l = cl.client(0).nodes().await.unwrap();
    assert!(l.items.iter().all(|n| !n.cordoned), "{l:?}");
}

/// A node killed with SIGKILL: listed as unreachable with its last report, its sandboxes
/// answer 503 naming it, lists name it, creates go elsewhere; started again, it re-adopts its
/// sandboxes, joins again, and they answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_routed_around_and_comes_back_with_its_sandboxes() {
    require_root!();
    let mut cl = Cluster::start(1, 2, "max_sandboxes = 4");
    let (a, b) = (cl.node_id(0), cl.node_id(1));
    let c = cl.client(0);
    // Fill node a's share: with 4 places each, 6 creates put at least 2 on each node.
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(c.create(&host()).await.unwrap().id().to_string());
    }
    let on_a: Vec<String> = ids.iter().filter(|i| i.starts_with(&a)).cloned().collect();
    assert!(!on_a.is_empty(), "{:?}", per_node(&ids));
    let sb = c.sandbox(&on_a[0]).unwrap();
    sb.exec(&warren_sdk::shell("echo before > /tmp/mark"))
        .await
        .unwrap();

    // A poll now, so that the last report counts them.
    c.nodes().await.unwrap();
    cl.kill9_node(0);
    // The next poll marks it unreachable; the list keeps it, with its last report.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = c.nodes().await.unwrap();
        let n = l
            .items
            .iter()
            .find(|n| n.id.as_str() == a)
            .expect("node a listed");
        if !n.reachable {
            assert_eq!(
                n.sandboxes as usize,
                on_a.len(),
                "the last report is kept: {n:?}"
            );
            assert!(l.unreachable.iter().any(|u| u.node.as_str() == a));
            break;
        }
        assert!(Instant::now() < deadline, "node a never marked unreachable");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let e = sb.exec(&warren_sdk::shell("true")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
    assert!(e.to_string().contains(&a), "the error names the node: {e}");
    // Its sandboxes are listed as last heard, in state unknown; none is dropped.
    let l = c.list(&Default::default()).await.unwrap();
    assert!(l.unreachable.iter().any(|u| u.node.as_str() == a), "{l:?}");
    let mut unknown: Vec<String> = l
        .items
        .iter()
        .filter(|s| s.node.as_str() == a)
        .inspect(|s| assert_eq!(s.state, SandboxState::Unknown, "{s:?}"))
        .map(|s| s.id.to_string())
        .collect();
    unknown.sort();
    let mut expected = on_a.clone();
    expected.sort();
    assert_eq!(unknown, expected);
    assert!(
        l.items
            .iter()
            .filter(|s| s.node.as_str() == b)
            .all(|s| s.state == SandboxState::Running)
    );
    // Filters apply to them as heard; asked for by state, only they come.
    let only = ListFilter {
        state: Some(SandboxState::Unknown),
        ..Default::default()
    };
    let l = c.list(&only).await.unwrap();
    assert_eq!(l.items.len(), on_a.len(), "{l:?}");
    // Creates go to the node that answers (it has room for 4 − its share).
    let room = 4 - ids.iter().filter(|i| i.starts_with(&b)).count();
    for _ in 0..room {
        let id = c.create(&host()).await.unwrap().id().to_string();
        assert!(id.starts_with(&b), "{id}");
    }

    cl.start_node(0);
    cl.wait_nodes(2, Duration::from_secs(30));
    let r = sb.exec(&warren_sdk::shell("cat /tmp/mark")).await.unwrap();
    assert_eq!(r.stdout, "before\n", "{r:?}");
    let l = c.list(&Default::default()).await.unwrap();
    assert!(l.unreachable.is_empty(), "{l:?}");
    for id in &on_a {
        assert!(
            l.items.iter().any(|s| s.id.as_str() == id),
            "{id} re-adopted and listed"
        );
    }
}

/// The same Idempotency-Key sent to two replicas makes one sandbox; a replica started after
/// the nodes joined (through another) knows them at once; a node removed through one replica
/// is forgotten by both, and joins again when it starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_membership_idempotent_creates_and_removals() {
    require_root!();
    let mut cl = Cluster::start(1, 2, "");
    // The nodes joined through replica 0 only; replica 1 reads the membership at start.
    let r1 = cl.add_replica();
    let l = cl.client(r1).nodes().await.unwrap();
    assert_eq!(l.items.len(), 2, "{l:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cl
        .client(r1)
        .nodes()
        .await
        .unwrap()
        .items
        .iter()
        .all(|n| n.reachable)
    {
        assert!(
            Instant::now() < deadline,
            "replica 1 never reached the nodes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let http = reqwest::Client::new();
    let mut seen = Vec::new();
    for (i, want) in [(0usize, 201u16), (r1, 200)] {
        let r = http
            .post(format!("{}/v1/sandboxes", cl.url(i)))
            .bearer_auth(&cl.key)
            .header("Idempotency-Key", "episode-17")
            .json(&host())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want);
        let v: serde_json::Value = r.json().await.unwrap();
        seen.push(v["id"].as_str().unwrap().to_string());
    }
    assert_eq!(seen[0], seen[1]);
    cl.client(0)
        .sandbox(&seen[0])
        .unwrap()
        .kill()
        .await
        .unwrap();

    // Removing a node: refused while it answers; once it is down, gone from every replica.
    let b = cl.node_id(1);
    let e = cl.client(0).remove_node(&b).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    cl.kill9_node(1);
    cl.client(0).remove_node(&b).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    for r in [0, r1] {
        loop {
            let l = cl.client(r).nodes().await.unwrap();
            if l.items.len() == 1 {
                assert!(l.items.iter().all(|n| n.id.as_str() != b));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica {r} still lists node {b}: {l:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let e = cl.client(0).remove_node(&b).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    // Started again, it joins again.
    cl.start_node(1);
    cl.wait_nodes(2, Duration::from_secs(30));
}

/// Joining needs the cluster token, a URL the control plane reaches where that very node
/// answers, and an id no other answering node holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_registrations_are_refused_with_reasons() {
    require_root!();
    let cl = Cluster::start(1, 2, "");
    let token = std::fs::read_to_string(cl.root.path().join("control/cluster.token"))
        .unwrap()
        .trim()
        .to_string();
    let (a, b) = (cl.node_id(0), cl.node_id(1));
    let url = format!("{}/v1/cluster/nodes", cl.url(0));
    let http = reqwest::Client::new();
    let post = |auth: Option<&str>, body: serde_json::Value| {
        let mut rb = http.post(&url).json(&body);
        if let Some(t) = auth {
            rb = rb.bearer_auth(t);
        }
        rb.send()
    };
    let reg = |id: &str, u: &str| serde_json::json!({"id": id, "url": u, "version": "x"});
    let node_a = format!("http://127.0.0.1:{}", cl.nodes[0].port);
    let node_b = format!("http://127.0.0.1:{}", cl.nodes[1].port);
    // No token, a wrong one, an API key instead.
    for auth in [
        None,
        Some("wct_wrong-token-of-enough-length"),
        Some(cl.key.as_str()),
    ] {
        let r = post(auth, reg(&a, &node_a)).await.unwrap();
        assert_eq!(r.status().as_u16(), 401);
    }
    let check = |r: reqwest::Response, status: u16, says: &'static str| async move {
        assert_eq!(r.status().as_u16(), status);
        let v: serde_json::Value = r.json().await.unwrap();
        let m = v["error"]["message"].as_str().unwrap_or("").to_string();
        assert!(m.contains(says), "{m}");
    };
    // A URL that is not host and port, one where nothing answers, one where another node does.
    let r = post(Some(&token), reg(&a, "http://127.0.0.1:1/x"))
        .await
        .unwrap();
    check(r, 400, "path").await;
    let dead = format!("http://127.0.0.1:{}", common::free_port());
    let r = post(Some(&token), reg("zzzzzz", &dead)).await.unwrap();
    check(r, 400, "could not reach").await;
    let r = post(Some(&token), reg("zzzzzz", &node_b)).await.unwrap();
    check(r, 400, "not node zzzzzz").await;
    // Node a's id claimed from node b's address while node a answers at its own.
    let r = post(Some(&token), reg(&a, &node_b)).await.unwrap();
    check(r, 409, "already answers").await;
    // Malformed bodies.
    let r = post(
        Some(&token),
        serde_json::json!({"id": "BAD!", "url": node_a, "version": "x"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = post(
        Some(&token),
        serde_json::json!({"id": a, "url": node_a, "version": "x", "extra": 1}),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    // A node's heartbeat is answered with the cluster's addresses its sandboxes must never
    // reach: the nodes' here (and the database's, on PostgreSQL).
    let r = post(Some(&token), reg(&a, &node_a)).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["deny"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "127.0.0.1")),
        "{v}"
    );
    // And the node applies it (here a node without a sandbox network: nothing to write).
    let log = cl.root.path().join("node-0.log");
    common::poll_until(
        Duration::from_secs(15),
        "node 0 never applied the cluster's addresses",
        async || match std::fs::read_to_string(&log) {
            Ok(l) if l.contains("the cluster's addresses are denied to sandboxes") => Ok(()),
            Ok(l) if l.contains("denying the cluster's addresses") => {
                panic!("node 0 failed to apply them: {l}")
            }
            _ => Err("not yet".into()),
        },
    )
    .await;
    // Nothing of this changed the cluster: both nodes, where they were, answering.
    let l = cl.client(0).nodes().await.unwrap();
    let addr: BTreeMap<String, Option<String>> = l
        .items
        .iter()
        .map(|n| (n.id.to_string(), n.address.clone()))
        .collect();
    assert_eq!(addr[&a].as_deref(), Some(node_a.as_str()));
    assert_eq!(addr[&b].as_deref(), Some(node_b.as_str()));
    assert!(l.items.iter().all(|n| n.reachable));
    // The node API itself refuses calls without the cluster token.
    let r = http.get(format!("{node_a}/v1/node")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

/// On PostgreSQL: two replicas share the membership (a node joined through one is known to
/// the other, a cordon through one holds for both); the database going away for a while
/// leaves sandboxes and creates working, membership changes answer 503 naming the database,
/// and everything resumes when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_replicas_share_membership_and_ride_out_a_database_outage() {
    require_root!();
    if let Err(why) = warren_control::local_pg::binaries() {
        eprintln!(
            "SKIP on_postgres_replicas_share_membership_and_ride_out_a_database_outage: {why}"
        );
        return;
    }
    let pgdir = tempfile::Builder::new()
        .prefix("warren-pg-")
        .tempdir()
        .unwrap();
    let pg = warren_control::local_pg::LocalPostgres::start(pgdir.path()).unwrap();
    let cl = Cluster::start_on(2, 2, "", Some(&pg.url));
    let (a, b) = (cl.node_id(0), cl.node_id(1));
    let (c0, c1) = (cl.client(0), cl.client(1));
    // The nodes joined through replica 0; replica 1 reads them from the database.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c1.nodes().await.unwrap().items.len() != 2 {
        assert!(
            Instant::now() < deadline,
            "replica 1 never read the membership"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c0.cordon(&a, true).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c1
        .nodes()
        .await
        .unwrap()
        .items
        .iter()
        .any(|n| n.id.as_str() == a && n.cordoned)
    {
        assert!(Instant::now() < deadline, "replica 1 never saw the cordon");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sb = c1.create(&host()).await.unwrap();
    assert!(sb.id().as_str().starts_with(&b));

    pg.stop();
    // Sandboxes and placement need no database.
    let r = sb.exec(&warren_sdk::shell("echo up")).await.unwrap();
    assert_eq!(r.stdout, "up\n");
    let other = c0.create(&host()).await.unwrap();
    assert!(
        other.id().as_str().starts_with(&b),
        "the cordon is still honoured"
    );
    // A membership change needs it: a clear 503, not a 500.
    let e = c0.cordon(&a, false).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
    assert!(e.to_string().contains("database"), "{e}");
    assert_eq!(c0.nodes().await.unwrap().items.len(), 2);

    pg.restart().unwrap();
    c0.cordon(&a, false).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while c1.nodes().await.unwrap().items.iter().any(|n| n.cordoned) {
        assert!(
            Instant::now() < deadline,
            "replica 1 never saw the uncordon"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sb.kill().await.unwrap();
    other.kill().await.unwrap();
    drop(cl);
    drop(pg);
}

/// Creates with an Idempotency-Key (the Python SDK sends one with every create) are placed by
/// load like any other on several nodes — not by the key's hash — and a retry of one returns
/// the sandbox it made, through either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_creates_follow_load_and_stay_idempotent() {
    require_root!();
    // 8 places each: node a with 6 is more loaded by promise than b will ever be here (5 of
    // 8 at most); measured use, the same host's for both, only ties them.
    let cl = Cluster::start(2, 2, "max_sandboxes = 8");
    cl.wait_nodes_on(1, 2, Duration::from_secs(15));
    let (a, b) = (cl.node_id(0), cl.node_id(1));
    let c = cl.client(0);
    // Node a first gets 6 sandboxes (b cordoned meanwhile).
    c.cordon(&b, true).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(c.create(&host()).await.unwrap().id().to_string());
    }
    assert!(ids.iter().all(|i| i.starts_with(&a)));
    c.cordon(&b, false).await.unwrap();
    // Six keyed creates: k = 2 over two nodes picks the less loaded, b, every time.
    let mut keyed = Vec::new();
    for i in 0..6 {
        let sb = c
            .create_idempotent(&host(), &format!("episode-{i}"))
            .await
            .unwrap();
        keyed.push(sb.id().to_string());
    }
    assert!(
        keyed.iter().all(|i| i.starts_with(&b)),
        "keyed creates followed the key's hash, not load: {:?}",
        per_node(&keyed)
    );
    // Retries, through the other replica too, return the same sandboxes.
    for (i, id) in keyed.iter().enumerate() {
        for r in [0, 1] {
            let again = cl
                .client(r)
                .create_idempotent(&host(), &format!("episode-{i}"))
                .await
                .unwrap();
            assert_eq!(again.id().as_str(), id);
        }
    }
    let l = c.list(&Default::default()).await.unwrap();
    assert_eq!(l.items.len(), 12, "no duplicates: {:?}", l.items.len());
    for id in ids.iter().chain(&keyed) {
        c.sandbox(id).unwrap().kill().await.unwrap();
    }
}

/// A node selector keeps sandboxes to the nodes with its labels (400 when none has them); the
/// burst pool takes an eligible image's sandboxes once the default pool is busy, and an
/// ineligible image's never; the create answer says which pool each went to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_selectors_and_the_burst_pool_decide_where_sandboxes_go() {
    require_root!();
    let mut cl = Cluster::empty(
        None,
        Some("[control]\nburst_images = [\"host\"]\nburst_threshold = 0.5\n"),
    );
    cl.add_replica();
    cl.add_node("max_sandboxes = 4\nlabels = { disk = \"ssd\" }");
    cl.add_node("max_sandboxes = 4\npool = \"burst\"");
    cl.wait_nodes(2, Duration::from_secs(30));
    let (onprem, burst) = (cl.node_id(0), cl.node_id(1));
    let c = cl.client(0);
    let pool_of =
        |sb: &warren_sdk::Sandbox| sb.snapshot().expect("the create's answer").pool.clone();

    // The default pool empty, then at a quarter: the default node, though the burst node is
    // emptier.
    for _ in 0..2 {
        let sb = c.create(&host()).await.unwrap();
        assert!(sb.id().as_str().starts_with(&onprem), "{}", sb.id());
        assert_eq!(pool_of(&sb), "default");
    }
    // At half (the threshold): the burst node, the less loaded of the two.
    let sb = c.create(&host()).await.unwrap();
    assert!(sb.id().as_str().starts_with(&burst), "{}", sb.id());
    assert_eq!(pool_of(&sb), "burst");
    let l = c.nodes().await.unwrap();
    let b = l.items.iter().find(|n| n.id.as_str() == burst).unwrap();
    assert_eq!(b.pool, "burst");

    // A selector only the default node matches.
    let mut ssd = host();
    ssd.node_selector.insert("disk".into(), "ssd".into());
    let sb = c.create(&ssd).await.unwrap();
    assert!(sb.id().as_str().starts_with(&onprem), "{}", sb.id());
    let mut nvme = host();
    nvme.node_selector.insert("disk".into(), "nvme".into());
    let e = c.create(&nvme).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");
    assert!(e.to_string().contains("disk=nvme"), "{e}");

    // The same cluster with no image eligible: the default node fills, then 429; the burst
    // node gets nothing more.
    std::fs::write(
        cl.root.path().join("server.toml"),
        "[control]\nburst_threshold = 0.5\n",
    )
    .unwrap();
    cl.restart_replica(0);
    cl.wait_nodes(2, Duration::from_secs(30));
    let c = cl.client(0);
    let mut full = None;
    for _ in 0..3 {
        match c.create(&host()).await {
            Ok(sb) => assert!(sb.id().as_str().starts_with(&onprem), "{}", sb.id()),
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    let e = full.expect("the default node fills up");
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    let on_burst = c
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| s.node.as_str() == burst)
        .count();
    assert_eq!(on_burst, 1);
}

/// IAM is shared by replicas: a project and a key made through one work through the other, and
/// a key revoked through one is refused by the other within about a second (each replica reads
/// the IAM version every second). On PostgreSQL where it is installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_through_one_replica_is_refused_by_the_other() {
    require_root!();
    let pgdir = tempfile::Builder::new()
        .prefix("warren-pg-")
        .tempdir()
        .unwrap();
    let pg = warren_control::local_pg::binaries()
        .ok()
        .map(|_| warren_control::local_pg::LocalPostgres::start(pgdir.path()).unwrap());
    let cl = Cluster::start_on(2, 1, "", pg.as_ref().map(|p| p.url.as_str()));
    cl.wait_nodes_on(1, 1, Duration::from_secs(30));
    let (c0, c1) = (cl.client(0), cl.client(1));
    c0.create_project("root/job").await.unwrap();
    let key = c0
        .create_key(&warren_sdk::CreateKey {
            name: "job".into(),
            project: Some("root/job".into()),
            role: Some("runner".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let job1 = warren_sdk::Client::new(&cl.url(1), Some(&key.secret)).unwrap();
    // Through replica 1: the project exists there too, the key works.
    let sb = job1
        .create(&CreateSandbox {
            project: Some("root/job".into()),
            ..host()
        })
        .await
        .unwrap();
    assert_eq!(sb.snapshot().unwrap().project, "root/job");
    c0.revoke_key(&key.key.id).await.unwrap();
    let revoked = Instant::now();
    loop {
        match job1.whoami().await {
            Err(e) if e.code() == Some(ErrorCode::Unauthenticated) => break,
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(5),
            "replica 1 still takes a key revoked through replica 0"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "revoked through replica 0, refused by replica 1 after {:?}",
        revoked.elapsed()
    );
    c1.sandbox(sb.id().as_str()).unwrap().kill().await.unwrap();
    drop(cl);
    drop(pg);
}

//! Sandboxes outlive the daemon: kill -9 of `warren up` with 50 running sandboxes, restart,
//! all 50 re-adopted and answering exec; and nothing left behind once they are killed.

mod common;

use common::Platform;
use warren_sdk::{CreateSandbox, ListFilter, argv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_restart_readopts_fifty_sandboxes() {
    require_root!();
    let mut p = Platform::start();
    let c = p.client();
    let creates = (0..50).map(|i| {
        let c = c.clone();
        async move {
            let sb = c
                .create(&CreateSandbox {
                    image: "host".into(),
                    task: Some("survivors".into()),
                    ..Default::default()
                })
                .await
                .unwrap();
            sb.write_file("/tmp/who", format!("{i}")).await.unwrap();
            sb.start_process(&argv(["sleep", "3600"])).await.unwrap();
            (sb.id().to_string(), i)
        }
    });
    let made: Vec<(String, i32)> = futures_util::future::join_all(creates).await;
    // One paused sandbox must come back paused.
    let paused = c.sandbox(&made[0].0).unwrap();
    paused.pause().await.unwrap();

    p.kill9();
    // The sandboxes did not notice.
    let sb_dir = p.state_dir().join("sandboxes");
    assert_eq!(std::fs::read_dir(&sb_dir).unwrap().count(), 50);

    p.start_again();
    assert!(p.log().contains("50 sandboxes re-adopted"), "{}", p.log());
    let c = p.client();
    let listed = c
        .list(&ListFilter::default().task("survivors"))
        .await
        .unwrap();
    assert_eq!(listed.len(), 50);
    assert_eq!(
        listed
            .iter()
            .filter(|s| s.state == warren_sdk::SandboxState::Paused)
            .count(),
        1
    );
    let checks = made.iter().map(|(id, i)| {
        let sb = c.sandbox(id).unwrap();
        let i = *i;
        async move {
            let r = sb.exec(&argv(["cat", "/tmp/who"])).await.unwrap();
            assert_eq!(r.stdout, i.to_string());
            let procs = sb.processes().await.unwrap();
            assert!(
                procs
                    .iter()
                    .any(|p| p.running && p.argv == ["sleep", "3600"]),
                "the background process survived"
            );
        }
    });
    futures_util::future::join_all(checks).await;

    // A clean stop (SIGTERM) also leaves them running.
    p.restart();
    assert!(p.log().contains("50 sandboxes re-adopted"));

    // Kill all: nothing left (directories, sockets, cgroups, mounts).
    let c = p.client();
    let kills = made.iter().map(|(id, _)| {
        let sb = c.sandbox(id).unwrap();
        async move { sb.kill().await.unwrap() }
    });
    futures_util::future::join_all(kills).await;
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_removes_half_made_leftovers() {
    require_root!();
    let mut p = Platform::start();
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let keep = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    p.kill9();
    // Leftovers a crash could leave: a sandbox directory without a state file, a stray socket,
    // a cgroup with no sandbox, and a sandbox whose init is gone. And names no instance has
    // (an empty one would name the parent cgroup and the sandboxes directory): left alone.
    let state = p.state_dir();
    std::fs::write(state.join("sockets/.sock"), "").unwrap();
    std::fs::write(state.join("sockets/Not-Ours.sock"), "").unwrap();
    std::fs::create_dir_all(state.join("sandboxes/abcdef0000000000half/upper")).unwrap();
    std::fs::write(state.join("sockets/abcdef0000000000sock.sock"), "").unwrap();
    let cg = warren_node::container::cgroups::Cgroups::new(&p.cgroup_parent).unwrap();
    let stray = cg.sandbox("abcdef0000000000cgrp");
    stray
        .create(Some(&warren_types::api::Resources {
            cpu: 100,
            memory: warren_sdk::ByteSize(64 << 20),
            pids: 16,
            disk: None,
        }))
        .unwrap();
    let record = warren_node::state::load(&state.join("sandboxes").join(sb.id().as_str())).unwrap();
    // Kill the sandbox's init behind the daemon's back.
    std::process::Command::new("kill")
        .arg("-9")
        .arg(record.pid.to_string())
        .status()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));

    p.start_again();
    let left = p.client().list(&ListFilter::default()).await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id, *keep.id());
    let r = keep.exec(&warren_sdk::argv(["true"])).await.unwrap();
    assert_eq!(
        r.status.exit_code, 0,
        "the live sandbox survived the collection"
    );
    for odd in [".sock", "Not-Ours.sock"] {
        std::fs::remove_file(state.join("sockets").join(odd)).unwrap();
    }
    keep.kill().await.unwrap();
    p.assert_clean();
}

/// A sandbox whose guest agent does not answer when the daemon restarts (here stopped with
/// SIGSTOP from the host, as a sandbox starving its agent would look) is adopted, not torn
/// down: its init is provably the same process. It answers again once it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_guest_is_adopted_not_torn_down() {
    require_root!();
    let mut p = Platform::start();
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    sb.write_file("/tmp/kept", "still here").await.unwrap();
    let record =
        warren_node::state::load(&p.state_dir().join("sandboxes").join(sb.id().as_str())).unwrap();
    p.kill9();
    let signal = |s: &str| {
        std::process::Command::new("kill")
            .arg(s)
            .arg(record.pid.to_string())
            .status()
            .unwrap()
    };
    signal("-STOP");
    p.start_again();
    assert!(p.log().contains("1 sandboxes re-adopted"), "{}", p.log());
    // Still stopped: listed, not torn down.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let c = p.client();
    assert_eq!(c.list(&ListFilter::default()).await.unwrap().len(), 1);
    signal("-CONT");
    let sb = c.sandbox(sb.id().as_str()).unwrap();
    assert_eq!(&sb.read_file("/tmp/kept").await.unwrap()[..], b"still here");
    sb.kill().await.unwrap();
    p.assert_clean();
}

//! Sandboxes outlive the daemon: kill -9 of `warren up` with 50 running sandboxes, restart,
//! all 50 re-adopted and answering exec; and nothing left behind once they are killed. Inits
//! run the node's own copy of the guest binary, so the configured one can be rebuilt meanwhile.

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
            cpu_limit: 100,
            memory: warren_sdk::ByteSize(64 << 20),
            memory_limit: warren_sdk::ByteSize(64 << 20),
            qos: Default::default(),
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

/// The identity (device, inode) of a file, or of what `/proc/<pid>/exe` is.
fn inode(path: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.dev(), m.ino())
}

/// The guest binary `warren up` is configured with is written in place (as `cp` of a rebuild
/// does) while a sandbox and the warm pool's inits run: the write succeeds, because they run the
/// node's own copy, named by digest, and the sandbox keeps working. After a restart the new
/// binary gets a copy of its own, which new sandboxes run, while the adopted sandbox's record
/// still names the old one; the old copy goes at the start after its last sandbox has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_guest_binary_can_be_rewritten_while_sandboxes_run() {
    require_root!();
    let bin = tempfile::tempdir().unwrap();
    let source = bin.path().join("warren-guest");
    std::fs::copy(common::warren_bin().with_file_name("warren-guest"), &source).unwrap();
    let original = std::fs::read(&source).unwrap();
    let config = format!("[node]\nguest_binary = \"{}\"\n", source.display());
    let mut p = Platform::start_with(Some(&config));
    let c = p.client();
    let record_of = |p: &Platform, id: &str| {
        warren_node::state::load(&p.state_dir().join("sandboxes").join(id)).unwrap()
    };
    let copy_of = |p: &Platform, digest: &str| {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        p.state_dir().join("guest").join(hex).join("warren-guest")
    };
    let node_guest = |nodes: warren_sdk::Listing<warren_sdk::NodeInfo>| {
        assert_eq!(nodes.items.len(), 1);
        nodes.items[0]
            .guest
            .clone()
            .expect("the node reports its guest")
    };

    let old = c
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let rec = record_of(&p, old.id().as_str());
    let d1 = rec.guest.clone().expect("the record names its guest");
    assert_eq!(
        old.info().await.unwrap().guest.as_deref(),
        Some(d1.as_str())
    );
    assert_eq!(node_guest(c.nodes().await.unwrap()), d1);
    let copy1 = copy_of(&p, &d1);
    assert_eq!(std::fs::read(&copy1).unwrap(), original);
    let exe = |pid: i32| inode(std::path::Path::new(&format!("/proc/{pid}/exe")));
    assert_eq!(exe(rec.pid), inode(&copy1), "the init runs the node's copy");
    assert_ne!(inode(&copy1), inode(&source));

    // A rebuild's `cp` onto the configured file: opened for writing, truncated, rewritten
    // (here: the same program with bytes appended, which an ELF ignores).
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&source)
            .expect("the configured guest binary is not busy: no init executes it");
        f.write_all(&original).unwrap();
        f.write_all(b"\nrebuilt\n").unwrap();
    }
    assert_eq!(old.exec(&argv(["true"])).await.unwrap().status.exit_code, 0);
    // The kernel names a process after the file it executes: still `warren-guest`.
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", rec.pid)).unwrap();
    assert_eq!(comm.trim(), "warren-guest");

    p.restart();
    assert!(p.log().contains("1 sandboxes re-adopted"), "{}", p.log());
    let c = p.client();
    let d2 = node_guest(c.nodes().await.unwrap());
    assert_ne!(d2, d1, "the changed binary has a new digest");
    let copy2 = copy_of(&p, &d2);
    assert_eq!(
        std::fs::read(&copy2).unwrap(),
        std::fs::read(&source).unwrap()
    );
    let new = c
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let rec2 = record_of(&p, new.id().as_str());
    assert_eq!(rec2.guest.as_deref(), Some(d2.as_str()));
    assert_eq!(
        exe(rec2.pid),
        inode(&copy2),
        "a new sandbox runs the new copy"
    );
    assert_eq!(new.exec(&argv(["true"])).await.unwrap().status.exit_code, 0);
    // The adopted one still names, and runs, the old copy, which is kept for it.
    assert_eq!(record_of(&p, old.id().as_str()).guest, Some(d1.clone()));
    assert_eq!(old.info().await.unwrap().guest, Some(d1.clone()));
    assert_eq!(exe(rec.pid), inode(&copy1));
    assert_eq!(old.exec(&argv(["true"])).await.unwrap().status.exit_code, 0);

    // Its last sandbox gone, the old copy goes at the next start; the current one stays.
    old.kill().await.unwrap();
    p.restart();
    assert!(p.log().contains("1 sandboxes re-adopted"), "{}", p.log());
    assert!(!copy1.exists() && !copy1.parent().unwrap().exists());
    assert!(copy2.exists());
    let c = p.client();
    let new = c.sandbox(new.id().as_str()).unwrap();
    assert_eq!(new.exec(&argv(["true"])).await.unwrap().status.exit_code, 0);
    new.kill().await.unwrap();
    p.assert_clean();
}

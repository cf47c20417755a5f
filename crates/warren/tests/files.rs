//! File operations: read, write (with parent directories), list, stat, mkdir, rename, remove,
//! ownership by the acting user, the upload limit, and atomic replacement.

mod common;

use common::Platform;
use warren_sdk::{CreateSandbox, ErrorCode, FileKind, shell};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_operations() {
    require_root!();
    let p = Platform::start_with(Some("[node]\nmax_upload = 65536\n"));
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    // Write creates parents and belongs to the acting user.
    let e = sb
        .write_file("/home/user/a/b/c.txt", "hello")
        .await
        .unwrap();
    assert_eq!(
        (e.size, e.uid, e.gid, e.kind),
        (5, 1000, 1000, FileKind::File)
    );
    let dir = sb.stat("/home/user/a/b").await.unwrap();
    assert_eq!((dir.kind, dir.uid), (FileKind::Dir, 1000));
    assert_eq!(
        &sb.read_file("a/b/c.txt").await.unwrap()[..],
        b"hello",
        "relative paths start at home"
    );
    let r = sb
        .exec(&shell("stat -c '%U %a' /home/user/a/b/c.txt"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "user 644\n");

    // Binary content and a mode.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(50_000).collect();
    let e = sb
        .write_file_with_mode("/tmp/bin.dat", bytes.clone(), 0o755)
        .await
        .unwrap();
    assert_eq!(e.mode, 0o755);
    assert_eq!(&sb.read_file("/tmp/bin.dat").await.unwrap()[..], &bytes[..]);

    // As root: root-owned files.
    let root = sb.as_user("root");
    let e = root.write_file("/etc/motd", "hi").await.unwrap();
    assert_eq!(e.uid, 0);

    // List, mkdir, rename, remove.
    sb.mkdir("/home/user/x/y").await.unwrap();
    let names: Vec<String> = sb
        .list_dir("/home/user")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["a", "x"]);
    let moved = sb
        .rename("/home/user/a/b/c.txt", "/home/user/x/y/d.txt")
        .await
        .unwrap();
    assert_eq!(moved.path, "/home/user/x/y/d.txt");
    assert_eq!(
        sb.stat("/home/user/a/b/c.txt").await.unwrap_err().code(),
        Some(ErrorCode::FileNotFound)
    );
    let e = sb.remove("/home/user/x", false).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    sb.remove("/home/user/x", true).await.unwrap();
    assert!(sb.stat("/home/user/x").await.is_err());

    // The user's permissions apply: no writing root's files, no reading root's home.
    let e = sb.write_file("/etc/passwd", "x").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e}");
    let e = sb.list_dir("/root").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e}");
    // A symlink planted by the agent does not let the API write where the user cannot.
    sb.exec(&shell(
        "ln -s /etc/shadow-like /home/user/trap; ln -s /etc/passwd /home/user/trap2",
    ))
    .await
    .unwrap();
    let e = sb
        .write_file("/home/user/trap2/../x", "x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument));
    let before = sb.exec(&shell("md5sum /etc/passwd")).await.unwrap().stdout;
    let _ = sb.write_file("/home/user/trap2", "owned").await;
    assert_eq!(
        sb.exec(&shell("md5sum /etc/passwd")).await.unwrap().stdout,
        before,
        "/etc/passwd changed"
    );

    // Uploads over the limit are refused with 413 and change nothing.
    sb.write_file("/tmp/big", "old").await.unwrap();
    let e = sb
        .write_file("/tmp/big", vec![b'x'; 100_000])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PayloadTooLarge), "{e}");
    assert_eq!(&sb.read_file("/tmp/big").await.unwrap()[..], b"old");
    let tmp = sb
        .exec(&shell("ls -a /tmp | grep -c warren-upload || true"))
        .await
        .unwrap();
    assert_eq!(tmp.stdout.trim(), "0", "a partial upload was left behind");

    // Also when the size is not declared up front (a chunked upload).
    let chunks =
        futures_util::stream::iter((0..20).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 10_000])));
    let resp = p
        .http()
        .put(format!(
            "{}/v1/sandboxes/{}/files?path=/tmp/big",
            p.url,
            sb.id()
        ))
        .bearer_auth(&p.key)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    assert_eq!(&sb.read_file("/tmp/big").await.unwrap()[..], b"old");

    // Directories are not files.
    let e = sb.read_file("/tmp").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");
}

/// Whole directories in and out as tar streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_move_as_tar() {
    require_root!();
    let p = Platform::start();
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let url = |q: &str| format!("{}/v1/sandboxes/{}/files/tar?{q}", p.url, sb.id());

    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in [
        ("src/main.py", &b"print(1)\n"[..], 0o644),
        ("run.sh", &b"#!/bin/sh\necho run\n"[..], 0o755),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_cksum();
        b.append_data(&mut h, path, data).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "python", "/usr/bin/python3").unwrap();
    let archive = b.into_inner().unwrap();
    let resp = p
        .http()
        .put(url("path=proj"))
        .bearer_auth(&p.key)
        .body(archive)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "{}",
        resp.text().await.unwrap()
    );
    let r = sb
        .exec(&shell(
            "cd proj && stat -c '%n %U %a' src/main.py run.sh && ./run.sh && readlink python",
        ))
        .await
        .unwrap();
    assert_eq!(
        r.stdout, "src/main.py user 644\nrun.sh user 755\nrun\n/usr/bin/python3\n",
        "{}",
        r.stderr
    );

    // And back out.
    let resp = p
        .http()
        .get(url("path=/home/user/proj"))
        .bearer_auth(&p.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let bytes = resp.bytes().await.unwrap();
    let mut names: Vec<String> = tar::Archive::new(&bytes[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert!(
        names.iter().any(|n| n.ends_with("src/main.py"))
            && names.iter().any(|n| n.ends_with("python")),
        "{names:?}"
    );

    // An entry that climbs out is refused, and nothing lands outside.
    let mut raw = tar::Header::new_old();
    raw.as_old_mut().name[..13].copy_from_slice(b"../escaped.tx");
    raw.set_size(1);
    raw.set_mode(0o644);
    raw.set_cksum();
    let mut evil = raw.as_bytes().to_vec();
    evil.extend_from_slice(b"x");
    evil.resize(512 * 2, 0);
    evil.extend_from_slice(&[0u8; 1024]);
    let resp = p
        .http()
        .put(url("path=/home/user/in"))
        .bearer_auth(&p.key)
        .body(evil)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        400,
        "{}",
        resp.text().await.unwrap()
    );
    let r = sb
        .exec(&shell("ls /home/user/escaped.tx 2>&1 | grep -c 'No such'"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "1\n");
    // Not a tar at all.
    let resp = p
        .http()
        .put(url("path=/home/user/in2"))
        .bearer_auth(&p.key)
        .body(vec![7u8; 700])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    // A file is not a directory to pack.
    let resp = p
        .http()
        .get(url("path=/etc/hostname"))
        .bearer_auth(&p.key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}

/// Everything watch `w` reports until `done` holds of what came (at most 10 s).
async fn watch_until(
    sb: &warren_sdk::Sandbox,
    w: u64,
    done: impl Fn(&[warren_sdk::FsEvent]) -> bool,
) -> Vec<warren_sdk::FsEvent> {
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done(&seen) && std::time::Instant::now() < deadline {
        let got = sb
            .watch_events(w, Some(std::time::Duration::from_millis(500)))
            .await
            .unwrap();
        seen.extend(got.events);
    }
    seen
}

fn has(events: &[warren_sdk::FsEvent], kind: warren_sdk::FsEventKind, path: &str) -> bool {
    events.iter().any(|e| e.kind == kind && e.path == path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_watches() {
    use warren_sdk::FsEventKind::*;
    require_root!();
    let p = Platform::start();
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    sb.exec(&shell("mkdir -p w/sub/deep flat && touch w/sub/deep/old"))
        .await
        .unwrap();
    let deep = sb.watch_dir("w", true).await.unwrap();
    let flat = sb.watch_dir("/home/user/w", false).await.unwrap();
    // Nothing yet: an answer with no events after the wait.
    assert!(sb.watch_events(deep, None).await.unwrap().events.is_empty());
    // A new directory is watched a moment after its creation is seen (what is written in
    // it before then is not reported): the script gives the watch that moment.
    sb.exec(&shell(
        "cd w && echo a > a.txt && mkdir new && sleep 1 && echo b > new/b.txt && \
         echo c > sub/deep/c.txt && mv a.txt c.txt && chmod 600 c.txt && rm -r sub",
    ))
    .await
    .unwrap();
    let want = [
        (Create, "a.txt"),
        (Write, "a.txt"),
        (Create, "new"),
        (Create, "new/b.txt"),
        (Create, "sub/deep/c.txt"),
        (Rename, "a.txt"),
        (Create, "c.txt"),
        (Chmod, "c.txt"),
        (Remove, "sub/deep/old"),
        (Remove, "sub"),
    ];
    let events = watch_until(&sb, deep, |ev| want.iter().all(|(k, p)| has(ev, *k, p))).await;
    for (k, path) in want {
        assert!(has(&events, k, path), "{k:?} {path} not in {events:?}");
    }
    // The flat watch sees its own directory's entries, nothing below them.
    let events = watch_until(&sb, flat, |ev| has(ev, Remove, "sub")).await;
    assert!(
        has(&events, Create, "new") && has(&events, Remove, "sub"),
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e.path.contains('/')), "{events:?}");

    // With entries: each event names its entry as it is when collected (none for what is
    // gone).
    let with = sb
        .watch(&warren_sdk::WatchRequest {
            path: "w".into(),
            recursive: false,
            user: None,
            entries: true,
        })
        .await
        .unwrap();
    sb.exec(&shell("printf 12345 > w/e.txt && rm w/c.txt"))
        .await
        .unwrap();
    let events = watch_until(&sb, with, |ev| has(ev, Remove, "c.txt")).await;
    let created = events
        .iter()
        .find(|e| e.kind == Create && e.path == "e.txt")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(
        created.entry.as_ref().map(|e| e.size),
        Some(5),
        "{created:?}"
    );
    let removed = events.iter().find(|e| e.kind == Remove).unwrap();
    assert!(removed.entry.is_none(), "{removed:?}");
    sb.unwatch(with).await.unwrap();

    // A watch made while the only other one on its directory is removed keeps hearing of it
    // (both get the kernel's one watch of the directory; `solo` has no other watch).
    sb.exec(&shell("mkdir solo")).await.unwrap();
    for i in 0..20 {
        let old = sb.watch_dir("solo", false).await.unwrap();
        let (new, gone) = tokio::join!(sb.watch_dir("solo", false), sb.unwatch(old));
        gone.unwrap();
        let new = new.unwrap();
        let name = format!("race{i}");
        sb.exec(&shell(format!("touch solo/{name}"))).await.unwrap();
        let events = watch_until(&sb, new, |ev| has(ev, Create, &name)).await;
        assert!(has(&events, Create, &name), "round {i}: {events:?}");
        sb.unwatch(new).await.unwrap();
    }

    // Past the bound, a watch says it lost events.
    let many = sb.watch_dir("flat", false).await.unwrap();
    sb.exec(&shell("cd flat && seq 1 6000 | xargs touch"))
        .await
        .unwrap();
    let got = sb.watch_events(many, None).await.unwrap();
    assert!(got.overflowed, "{} events", got.events.len());
    assert_eq!(got.events.len(), 10_000);
    sb.unwatch(many).await.unwrap();

    // Refusals: a file, a missing directory, one the user may not read, an unknown watch.
    let status = |e: warren_sdk::Error| match e {
        warren_sdk::Error::Api { status, .. } => status,
        other => panic!("{other}"),
    };
    assert_eq!(
        status(sb.watch_dir("w/e.txt", false).await.unwrap_err()),
        400
    );
    assert_eq!(
        status(sb.watch_dir("nowhere", false).await.unwrap_err()),
        404
    );
    assert_eq!(status(sb.watch_dir("/root", false).await.unwrap_err()), 403);
    assert_eq!(
        status(sb.watch_dir("../../etc", false).await.unwrap_err()),
        400
    );
    sb.unwatch(deep).await.unwrap();
    assert_eq!(status(sb.unwatch(deep).await.unwrap_err()), 404);
    assert_eq!(status(sb.watch_events(deep, None).await.unwrap_err()), 404);
    // At most 64 watches at once.
    let mut ws = vec![flat];
    while ws.len() < 64 {
        ws.push(sb.watch_dir("w", false).await.unwrap());
    }
    assert_eq!(status(sb.watch_dir("w", false).await.unwrap_err()), 429);
    for w in ws {
        sb.unwatch(w).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_metadata() {
    require_root!();
    let p = Platform::start();
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let meta: std::collections::BTreeMap<String, String> =
        [("Author".to_string(), "agent 7".to_string())].into();
    let e = sb
        .write_file_body_with_metadata("m.txt", &meta, reqwest::Body::from("m"))
        .await
        .unwrap();
    assert_eq!(
        e.metadata.get("author").map(String::as_str),
        Some("agent 7")
    );
    assert_eq!(sb.stat("m.txt").await.unwrap().metadata, e.metadata);
    // The extended attribute is there for programs in the sandbox, under envd's name.
    let r = sb
        .exec(&shell(
            "python3 -c \"import os; print(os.getxattr('m.txt', 'user.e2b.author').decode())\"",
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout, "agent 7\n");
    // Refused before anything is written: keys that are not HTTP tokens, values that are not
    // printable ASCII, too many keys.
    for bad in [
        vec![("a b".to_string(), "v".to_string())],
        vec![("k".to_string(), "tab\there".to_string())],
        (0..65)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect(),
    ] {
        let m: std::collections::BTreeMap<String, String> = bad.into_iter().collect();
        match sb
            .write_file_body_with_metadata("bad.txt", &m, reqwest::Body::from("x"))
            .await
        {
            Err(warren_sdk::Error::Api { status, .. }) => assert_eq!(status, 400),
            other => panic!("{other:?}"),
        }
    }
    assert!(sb.stat("bad.txt").await.is_err());
}

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

//! Layered images: import from a directory, a gzip tarball and an EROFS file; whiteouts and
//! opaque directories; composition of three layers; one shared mount per layer; read-only
//! layers; refusal to remove what is in use; `image build`; bad input; recovery of an
//! interrupted import; layers of adopted sandboxes after a daemon crash.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Platform;
use warren_sdk::{CreateSandbox, ErrorCode, argv};

/// Layers unmount one second after their last sandbox, so tests can see them go.
const CONFIG: &str = "[node]\nlayer_idle_unmount = 1\nwarm_pool = 0\n";

fn busybox() -> PathBuf {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if Path::new(p).is_file() {
            return p.into();
        }
    }
    panic!("busybox is missing: install busybox-static (make test does)");
}

fn write(root: &Path, rel: &str, data: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// Imports a busybox root file system (`base_rootfs`) under `name`; returns its directory.
fn import_base(p: &Platform, work: &Path, name: &str) -> PathBuf {
    let base = work.join("base");
    base_rootfs(&base);
    import(p, &base, name);
    base
}

/// A root file system with a static busybox.
fn base_rootfs(root: &Path) {
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(busybox(), root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    write(root, "etc/marker", "base");
    write(root, "etc/gone", "present in base");
    write(root, "var/lib/stuff/a", "base a");
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cli_ok(p: &Platform, args: &[&str]) -> String {
    let out = p.cli(args);
    assert!(
        out.status.success(),
        "warren {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn create(c: &warren_sdk::Client, image: &str) -> warren_sdk::Sandbox {
    c.create(&CreateSandbox {
        image: image.into(),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// `warren image import PATH --name NAME`.
fn import(p: &Platform, path: &Path, name: &str) {
    cli_ok(
        p,
        &["image", "import", path.to_str().unwrap(), "--name", name],
    );
}

async fn sh(sb: &warren_sdk::Sandbox, cmd: &str) -> (i32, String) {
    let r = sb
        .exec(&argv(["/bin/busybox", "sh", "-c", cmd]))
        .await
        .unwrap();
    (r.status.exit_code, r.stdout)
}

/// erofs mounts of `digest` under the node's layer directory, seen from here.
fn mounts_of(p: &Platform, digest: &str) -> usize {
    let hex = digest.trim_start_matches("sha256:");
    let dir = p.state_dir().join("layers").join(hex);
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap()))
        .count()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_compose_share_and_protect_layers() {
    require_root!();
    let p = Platform::start_with(Some(CONFIG));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();

    // Bottom: a directory.
    import_base(&p, work.path(), "t/base:1");

    // Middle: a gzip tarball with OCI whiteouts: etc/gone deleted, var/lib/stuff opaque.
    let mid = work.path().join("mid");
    write(&mid, "etc/.wh.gone", "");
    write(&mid, "var/lib/stuff/.wh..wh..opq", "");
    write(&mid, "var/lib/stuff/b", "mid b");
    write(&mid, "etc/marker", "mid");
    write(&mid, "etc/mid-only", "mid");
    let tgz = work.path().join("mid.tar.gz");
    run(Command::new("tar")
        .arg("-C")
        .arg(&mid)
        .arg("-czf")
        .arg(&tgz)
        .arg("."));
    import(&p, &tgz, "t/mid");

    // Top: an EROFS file made outside Warren.
    let top = work.path().join("top");
    write(&top, "etc/marker", "top");
    let erofs = work.path().join("top.erofs");
    run(Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg(&erofs)
        .arg(&top));
    let out = cli_ok(
        &p,
        &[
            "image",
            "import",
            erofs.to_str().unwrap(),
            "--name",
            "t/top@v1",
            "--json",
        ],
    );
    let top_detail: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(top_detail["source"], "erofs");

    let images = c.images().await.unwrap();
    let sources: Vec<(&str, &str)> = images
        .iter()
        .map(|i| (i.name.as_str(), i.source.as_str()))
        .collect();
    assert_eq!(
        sources,
        [
            ("t/base:1", "directory"),
            ("t/mid", "tar+gzip"),
            ("t/top@v1", "erofs")
        ]
    );
    let base_digest = images[0].layers[0].clone();

    // Three layers, top wins; whiteout and opaque directory honoured.
    let sb = create(&c, "t/base:1,t/mid,t/top@v1").await;
    assert_eq!(sb.info().await.unwrap().layers.len(), 3);
    assert_eq!(sh(&sb, "cat /etc/marker").await, (0, "top".into()));
    assert_eq!(sh(&sb, "cat /etc/mid-only").await, (0, "mid".into()));
    assert_eq!(sh(&sb, "test -e /etc/gone; echo $?").await.1, "1\n");
    assert_eq!(sh(&sb, "ls /var/lib/stuff").await.1, "b\n");
    assert_eq!(sh(&sb, "id -u").await.1, "1000\n", "commands run as user");

    // A directory import keeps extended attributes: an overlay-style opaque directory.
    let opq = work.path().join("opq");
    write(&opq, "var/lib/stuff/c", "c");
    rustix::fs::setxattr(
        opq.join("var/lib/stuff"),
        "trusted.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    import(&p, &opq, "t/opq");
    let o = create(&c, "t/base:1,t/opq").await;
    assert_eq!(sh(&o, "ls /var/lib/stuff").await.1, "c\n");
    o.kill().await.unwrap();

    // Read-only layers: root in one sandbox changes only its own view; the layer file and
    // other sandboxes are untouched, and mounting is not allowed.
    let other = create(&c, "t/base:1").await;
    let third = create(&c, "t/base:1").await;
    let layer_file = p
        .data
        .path()
        .join("images/layers")
        .join(format!("{}.erofs", base_digest.replace(':', "-")));
    let before = run(Command::new("sha256sum").arg(&layer_file));
    let r = other
        .as_user("root")
        .exec(&argv([
            "/bin/busybox",
            "sh",
            "-c",
            "echo changed > /etc/marker; cat /etc/marker",
        ]))
        .await
        .unwrap();
    assert_eq!(r.stdout, "changed\n");
    assert_eq!(sh(&third, "cat /etc/marker").await.1, "base");
    let r = other
        .as_user("root")
        .exec(&argv(["/bin/busybox", "mount", "-o", "remount,rw", "/"]))
        .await
        .unwrap();
    assert_ne!(r.status.exit_code, 0, "remount must fail: {r:?}");
    assert_eq!(run(Command::new("sha256sum").arg(&layer_file)), before);
    assert_eq!(
        before.split_whitespace().next().unwrap(),
        base_digest.trim_start_matches("sha256:"),
        "the layer file is named by its digest"
    );

    // One mount per layer, however many sandboxes use it.
    assert_eq!(mounts_of(&p, &base_digest), 1);
    let stats = c.image_stats().await.unwrap();
    let s = stats
        .layers
        .iter()
        .find(|l| l.digest == base_digest)
        .unwrap();
    assert_eq!(s.sandboxes, 3);
    assert!(s.read_bytes > 0 && s.read_bytes <= 4 * s.size, "{s:?}");
    assert_eq!(stats.sandboxes.len(), 3);
    assert!(
        stats.sandboxes.iter().all(|x| x.image_size >= s.size),
        "each sandbox's image includes the base layer: {stats:?}"
    );

    // Removal of what is in use is refused, naming the users.
    let e = c.remove_image("t/base:1").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    assert!(e.to_string().contains(other.id().as_str()), "{e}");
    let e = c.remove_image(&base_digest).await.unwrap_err();
    assert!(e.to_string().contains("image t/base:1"), "{e}");
    let out = p.cli(&["image", "rm", "t/base:1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));

    for s in [&sb, &other, &third] {
        s.kill().await.unwrap();
    }
    // Unused layers are unmounted after the idle time; then the name and its layers go.
    wait_for("the base layer to be unmounted", || {
        mounts_of(&p, &base_digest) == 0
    });
    c.remove_image("t/base:1").await.unwrap();
    assert!(
        !layer_file.exists(),
        "an unused layer is deleted with its last name"
    );
    assert_eq!(
        c.image("t/base:1").await.unwrap_err().code(),
        Some(ErrorCode::ImageNotFound)
    );
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_turns_steps_into_a_layer() {
    require_root!();
    let p = Platform::start_with(Some(CONFIG));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();
    import_base(&p, work.path(), "t/base");
    let ctx = work.path().join("ctx");
    write(&ctx, "agent/run.sh", "echo agent");
    let out = cli_ok(
        &p,
        &[
            "image",
            "build",
            "--from",
            "t/base",
            "--run",
            "echo built > /etc/built && rm /etc/gone",
            "--copy",
            ctx.join("agent").to_str().unwrap(),
            "/opt/agent",
            "--run",
            "/bin/busybox ls /opt/agent > /etc/listing",
            "--name",
            "tk/agent:v1",
            "--json",
        ],
    );
    let img: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(img["layers"].as_array().unwrap().len(), 2, "{img}");
    assert_eq!(img["parents"][0], "t/base");
    assert_eq!(img["source"], "build");

    let sb = create(&c, "tk/agent:v1").await;
    assert_eq!(
        sh(&sb, "cat /etc/built /etc/listing /opt/agent/run.sh")
            .await
            .1,
        "built\nrun.sh\necho agent"
    );
    assert_eq!(
        sh(&sb, "test -e /etc/gone; echo $?").await.1,
        "1\n",
        "a deletion is a whiteout"
    );
    assert_eq!(sh(&sb, "cat /etc/marker").await.1, "base");

    // A failing step saves nothing, and the builder sandbox is gone.
    let out = p.cli(&[
        "image", "build", "--from", "t/base", "--run", "exit 3", "--name", "t/broken",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exit code 3"),
        "{out:?}"
    );
    assert!(c.image("t/broken").await.is_err());

    // The SDK builds the same way, and says which step failed with what it printed.
    let spec = warren_sdk::BuildSpec::new("t/sdk:1", ["t/base"])
        .step(warren_sdk::BuildStep::copy(
            ctx.join("agent/run.sh"),
            "/opt/run.sh",
        ))
        .step(warren_sdk::BuildStep::run("echo sdk > /etc/sdk"));
    let img = c.build_image(&spec).await.unwrap();
    assert_eq!(img.layers.len(), 2, "{img:?}");
    let from_sdk = create(&c, "t/sdk:1").await;
    assert_eq!(
        sh(&from_sdk, "cat /etc/sdk /opt/run.sh").await.1,
        "sdk\necho agent"
    );
    from_sdk.kill().await.unwrap();
    let broken = warren_sdk::BuildSpec::new("t/broken", ["t/base"])
        .step(warren_sdk::BuildStep::run("true"))
        .step(warren_sdk::BuildStep::run("echo oops >&2; exit 4"));
    match c.build_image(&broken).await.unwrap_err() {
        warren_sdk::Error::BuildStep {
            step, why, stderr, ..
        } => {
            assert_eq!((step, why.as_str()), (2, "exit code 4"));
            assert_eq!(stderr, b"oops\n");
        }
        e => panic!("expected a failed step, got {e:?}"),
    }
    assert!(c.image("t/broken").await.is_err());
    sb.kill().await.unwrap();
    let left = c.list(&Default::default()).await.unwrap();
    assert!(left.is_empty(), "builder sandboxes left: {left:?}");

    // Committing a sandbox of the host image is refused clearly.
    let host = create(&c, "host").await;
    let e = host.commit("t/host-copy").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");
    host.kill().await.unwrap();
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_are_refused_and_leave_nothing() {
    require_root!();
    let p = Platform::start_with(Some(CONFIG));
    let c = p.client();
    let http = p.http();
    let store = p.data.path().join("images");
    let import = |name: &str, body: Vec<u8>| {
        http.post(format!("{}/v1/images?name={name}", p.url))
            .bearer_auth(&p.key)
            .body(body)
            .send()
    };

    // Not an image at all.
    let r = import("t/x", b"hello, not an image".to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body = r.text().await.unwrap();
    assert!(body.contains("not a tar archive"), "{body}");

    // A tar that climbs out with `..`, and one with a symlink that escapes.
    for (path, kind, link) in [
        ("../../escape", tar::EntryType::Regular, None),
        (
            "etc/link",
            tar::EntryType::Symlink,
            Some("../../../../etc/shadow"),
        ),
    ] {
        // Written into the header directly: the tar crate's builder refuses such paths.
        let mut h = tar::Header::new_ustar();
        let u = h.as_ustar_mut().unwrap();
        u.name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(l) = link {
            u.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o644);
        h.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&h, std::io::empty()).unwrap();
        let r = import("t/x", b.into_inner().unwrap()).await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let body = r.text().await.unwrap();
        assert!(body.contains("outside") || body.contains("`..`"), "{body}");
    }

    // A truncated tarball.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(100_000);
    h.set_mode(0o644);
    b.append_data(&mut h, "big", &vec![1u8; 100_000][..])
        .unwrap();
    let t = b.into_inner().unwrap();
    let r = import("t/x", t[..20_000].to_vec()).await.unwrap();
    assert_eq!(r.status(), 400);

    // A layer may carry device nodes, but they open nothing in a sandbox (the root is nodev).
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Char);
    h.set_device_major(1).unwrap();
    h.set_device_minor(3).unwrap();
    h.set_mode(0o666);
    h.set_size(0);
    b.append_data(&mut h, "opt/null", std::io::empty()).unwrap();
    let dev_layer = work_tar(b.into_inner().unwrap());
    crate::import(&p, dev_layer.path(), "t/dev");
    let work = tempfile::tempdir().unwrap();
    import_base(&p, work.path(), "t/base");
    let sb = create(&c, "t/base,t/dev").await;
    let (code, _) = sh(&sb, "echo x > /opt/null").await;
    assert_ne!(code, 0, "a device node from an image must not open");
    let r = sb
        .exec(&argv(["/bin/busybox", "sh", "-c", "echo x > /opt/null"]))
        .await
        .unwrap();
    assert!(r.stderr.contains("Permission denied"), "{r:?}");
    sb.kill().await.unwrap();
    for n in ["t/base", "t/dev"] {
        c.remove_image(n).await.unwrap();
    }

    // Names, unknown images, and the built-in image.
    let r = import("Bad%20Name", b"x".to_vec()).await.unwrap();
    assert_eq!(r.status(), 400);
    let e = c
        .create(&CreateSandbox {
            image: "no/such:image".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ImageNotFound), "{e}");
    assert!(e.to_string().contains("warren image import"), "{e}");
    let e = c
        .create(&CreateSandbox {
            image: "host,no/such".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");

    // An upload that breaks off midway.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
        Ok(vec![0u8; 512]),
        Err(std::io::Error::other("client gone")),
    ];
    let _ = http
        .post(format!("{}/v1/images?name=t/cut", p.url))
        .bearer_auth(&p.key)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await;

    // Nothing is visible, and no work in progress is left behind.
    assert!(c.images().await.unwrap().is_empty());
    let count = |d: &str| std::fs::read_dir(store.join(d)).unwrap().count();
    wait_for("temporary files to go", || count("tmp") == 0);
    assert_eq!(count("layers"), 0);
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_imports_are_cleaned_and_layers_survive_a_crash() {
    require_root!();
    // The other mount mode: a loop device with direct I/O.
    let mut p = Platform::start_with(Some(&format!("{CONFIG}layer_mount = \"loop\"\n")));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();
    import_base(&p, work.path(), "t/base");
    let sb = create(&c, "t/base").await;
    let digest = sb.info().await.unwrap().layers[0].clone();

    // A crash in the middle of an import leaves a temporary directory of a dead process.
    let host = run(Command::new("uname").arg("-n"))
        .trim()
        .replace(['.', '/'], "_");
    let stale = p
        .data
        .path()
        .join(format!("images/tmp/{host}.{}.crashed", u32::MAX - 7));
    std::fs::create_dir_all(stale.join("root/etc")).unwrap();
    p.kill9();
    p.start_again();
    assert!(
        !stale.exists(),
        "the next start removes interrupted imports"
    );

    // The adopted sandbox still runs from its layer, counted as its user.
    assert_eq!(sh(&sb, "cat /etc/marker").await.1, "base");
    assert_eq!(mounts_of(&p, &digest), 1);
    let stats = c.image_stats().await.unwrap();
    assert_eq!(stats.layers[0].sandboxes, 1, "{stats:?}");
    assert_eq!(stats.layers[0].mode, "loop");
    assert!(stats.layers[0].read_bytes > 0, "{stats:?}");
    let e = c.remove_image("t/base").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict));
    sb.kill().await.unwrap();
    wait_for("the layer to be unmounted", || mounts_of(&p, &digest) == 0);
    p.assert_clean();
}

/// `data` in a temporary file.
fn work_tar(data: Vec<u8>) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), data).unwrap();
    f
}

/// sha256 of `data`, with `sha256sum`.
fn sha256(data: &[u8]) -> String {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), data).unwrap();
    let out = run(Command::new("sha256sum").arg(f.path()));
    format!("sha256:{}", out.split_whitespace().next().unwrap())
}

/// A registry double (no registry is reachable from here): the OCI distribution API's pull
/// routes over plain HTTP on loopback, serving one image.
async fn registry_double(
    manifest: Vec<u8>,
    blobs: std::collections::HashMap<String, Vec<u8>>,
) -> u16 {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let manifest_digest = sha256(&manifest);
    let app = axum::Router::new()
        .route("/v2/", axum::routing::get(|| async { "{}" }))
        .route(
            "/v2/{*rest}",
            axum::routing::get(
                move |axum::extract::Path(rest): axum::extract::Path<String>| {
                    let (manifest, blobs, md) =
                        (manifest.clone(), blobs.clone(), manifest_digest.clone());
                    async move {
                        if rest.contains("/manifests/") {
                            return (
                                StatusCode::OK,
                                [
                                    (
                                        header::CONTENT_TYPE,
                                        "application/vnd.oci.image.manifest.v1+json".to_string(),
                                    ),
                                    (header::HeaderName::from_static("docker-content-digest"), md),
                                ],
                                manifest,
                            )
                                .into_response();
                        }
                        let digest = rest.rsplit('/').next().unwrap_or_default();
                        match blobs.get(digest) {
                            Some(b) => (StatusCode::OK, b.clone()).into_response(),
                            None => StatusCode::NOT_FOUND.into_response(),
                        }
                    }
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_from_a_registry() {
    require_root!();
    // The registry double is on loopback, which pulls reach only by the operator's leave.
    let p = Platform::start_with(Some(&format!("{CONFIG}{LOOPBACK_REGISTRY}")));
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    base_rootfs(&root);
    write(&root, "etc/marker", "pulled");
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", &root).unwrap();
    let layer = b.into_inner().unwrap();
    let config = br#"{"architecture":"amd64","os":"linux","config":{"Env":["FROM_IMAGE=yes"]},"rootfs":{"type":"layers","diff_ids":[]}}"#.to_vec();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(&layer), "size": layer.len()}],
    });
    let (config_again, layer_again, layer_digest) = (config.clone(), layer.clone(), sha256(&layer));
    let blobs = [(sha256(&config), config), (sha256(&layer), layer)].into();
    let port = registry_double(serde_json::to_vec(&manifest).unwrap(), blobs).await;

    let out = cli_ok(
        &p,
        &[
            "image",
            "pull",
            &format!("127.0.0.1:{port}/t/img:1"),
            "--insecure",
            "--json",
        ],
    );
    let d: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["name"], "t/img:1", "{d}");
    assert_eq!(d["env"]["FROM_IMAGE"], "yes");
    let sb = create(&p.client(), "t/img:1").await;
    assert_eq!(
        sh(&sb, "cat /etc/marker; echo \" $FROM_IMAGE\"").await.1,
        "pulled yes\n"
    );
    sb.kill().await.unwrap();

    // A registry that does not answer is a clear error, not a half-made image.
    let out = p.cli(&["image", "pull", "127.0.0.1:1/t/none:1", "--insecure"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("registry"),
        "{out:?}"
    );
    assert_eq!(p.client().images().await.unwrap().len(), 1);

    // A blob longer than its manifest says is cut off and refused (pulled bytes are bounded).
    let mut lying = manifest.clone();
    lying["layers"][0]["size"] = serde_json::json!(100);
    let blobs = [
        (sha256(&config_again), config_again),
        (layer_digest, layer_again),
    ]
    .into();
    let port = registry_double(serde_json::to_vec(&lying).unwrap(), blobs).await;
    let out = p.cli(&[
        "image",
        "pull",
        &format!("127.0.0.1:{port}/t/lying:1"),
        "--insecure",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("larger than"),
        "{out:?}"
    );
    assert_eq!(p.client().images().await.unwrap().len(), 1);
    p.assert_clean();
}

/// The control plane's leave to pull from a registry on 127.0.0.1 (and nowhere else
/// internal).
const LOOPBACK_REGISTRY: &str = "[control]\nregistry_exempt = [\"127.0.0.1/32\"]\n";

/// A server on 127.0.0.2 (outside the exemption) that counts the requests it gets and answers
/// each with a secret: what a pull must never reach or repeat.
async fn witness() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = axum::Router::new().fallback(move || {
        h.fetch_add(1, Ordering::SeqCst);
        async { "SECRET-OF-THE-INTERNAL-SERVICE" }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), hits)
}

/// A registry on 127.0.0.1 whose every answer is `answer` (status, headers, body).
async fn hostile_registry(status: u16, headers: Vec<(&'static str, String)>, body: &str) -> u16 {
    use axum::response::IntoResponse;
    let body = body.to_string();
    let app = axum::Router::new().fallback(move || {
        let (headers, body) = (headers.clone(), body.clone());
        async move {
            let mut r = (axum::http::StatusCode::from_u16(status).unwrap(), body).into_response();
            for (k, v) in headers {
                r.headers_mut().insert(k, v.parse().unwrap());
            }
            r
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

fn pull_req(reference: String, insecure: bool) -> warren_sdk::PullRequest {
    warren_sdk::PullRequest {
        reference,
        name: None,
        insecure,
        username: None,
        password: None,
        project: None,
    }
}

/// Registry pulls are no way into the control plane's networks (security review, issue 29):
/// a registry, token service or redirect at an internal address is refused before any
/// connection, `insecure` is the administrator's alone, and no registry's answer body is
/// repeated in an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_pulls_reach_no_internal_address_and_repeat_no_answer() {
    use std::sync::atomic::Ordering;
    require_root!();
    let (secret_url, hits) = witness().await;
    let empty = [].into();
    let port = registry_double(b"{}".to_vec(), empty).await;

    // Without the operator's leave, loopback is refused, by address or by name, and says why.
    {
        let p = Platform::start_with(Some(CONFIG));
        let c = p.client();
        for reference in [
            format!("127.0.0.1:{port}/t/img:1"),
            format!("localhost:{port}/t/img:1"),
            format!("{}/t/img:1", secret_url.trim_start_matches("http://")),
        ] {
            let e = c
                .pull_image(&pull_req(reference.clone(), true))
                .await
                .unwrap_err();
            assert_eq!(
                e.code(),
                Some(ErrorCode::PermissionDenied),
                "{reference}: {e}"
            );
            let m = e.to_string();
            assert!(
                m.contains("registry_exempt") && m.contains("loopback"),
                "{m}"
            );
        }
    }

    let p = Platform::start_with(Some(&format!("{CONFIG}{LOOPBACK_REGISTRY}")));
    let admin = p.client();
    // `insecure` from a project's builder: 403, whatever the registry.
    admin
        .create_identity(&warren_sdk::CreateIdentity {
            name: "ci".into(),
            kind: None,
            project: Some("root".into()),
        })
        .await
        .unwrap();
    admin.grant("ci", "root", "builder").await.unwrap();
    let k = admin
        .create_key(&warren_sdk::CreateKey {
            name: "ci".into(),
            identity: Some("ci".into()),
            project: Some("root".into()),
            role: Some("builder".into()),
            expires_in: None,
            form: None,
        })
        .await
        .unwrap();
    let builder = warren_sdk::Client::new(&p.url, Some(&k.secret)).unwrap();
    let e = builder
        .pull_image(&pull_req(format!("127.0.0.1:{port}/t/img:1"), true))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e}");
    assert!(e.to_string().contains("administrator"), "{e}");

    // A realm at an internal address: refused, never asked.
    let realm = hostile_registry(
        401,
        vec![(
            "www-authenticate",
            format!("Bearer realm=\"{secret_url}/token\",service=\"r\""),
        )],
        "",
    )
    .await;
    // A redirect to one: refused, never followed.
    let redirect = hostile_registry(
        307,
        vec![("location", format!("{secret_url}/latest/meta-data/"))],
        "",
    )
    .await;
    for (port, what) in [(realm, "realm"), (redirect, "redirect")] {
        let e = admin
            .pull_image(&pull_req(format!("127.0.0.1:{port}/t/img:1"), true))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{what}: {e}");
        let m = e.to_string();
        assert!(
            m.contains("127.0.0.2") && m.contains("registry_exempt"),
            "{what}: {m}"
        );
        assert!(!m.contains("SECRET"), "{what}: {m}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the internal server was reached"
    );

    // A registry's error body is never repeated: its status and what to check instead.
    for status in [404, 500] {
        let port = hostile_registry(status, vec![], "SECRET-FROM-THE-REGISTRY config dump").await;
        let e = admin
            .pull_image(&pull_req(format!("127.0.0.1:{port}/t/img:1"), true))
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(!m.contains("SECRET"), "{m}");
        assert!(
            m.contains(&status.to_string()) && m.contains("check"),
            "{m}"
        );
        assert_ne!(e.code(), Some(ErrorCode::Internal), "{m}");
    }
    // Nor is what a "manifest" holds: a parse error names the place, not the text.
    let port = hostile_registry(
        200,
        vec![(
            "content-type",
            "application/vnd.oci.image.manifest.v1+json".into(),
        )],
        r#"{"schemaVersion": "SECRET-FROM-THE-REGISTRY"}"#,
    )
    .await;
    let e = admin
        .pull_image(&pull_req(format!("127.0.0.1:{port}/t/img:1"), true))
        .await
        .unwrap_err();
    let m = e.to_string();
    assert!(
        !m.contains("SECRET") && m.contains("not a valid image manifest"),
        "{m}"
    );
    assert!(admin.images().await.unwrap().is_empty());
    p.assert_clean();
}

/// A small tmpfs, unmounted when dropped (even when the test fails).
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn new(size: &str) -> SmallFs {
        let d = tempfile::Builder::new()
            .prefix("warren-test-store-")
            .tempdir()
            .unwrap();
        run(Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "warren-test-store",
            ])
            .arg(d.path()));
        SmallFs(d)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_is_a_clear_error_and_leaves_nothing() {
    require_root!();
    let fs = SmallFs::new("1m");
    let p = Platform::start_with(Some(&format!(
        "{CONFIG}[control]\nimage_store = \"{}\"\n",
        fs.0.path().display()
    )));
    // 4 MB of incompressible data cannot fit in 1 MB.
    let mut data = vec![0u8; 4 << 20];
    let mut x: u32 = 12345;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "big", &data[..]).unwrap();
    let r = p
        .http()
        .post(format!("{}/v1/images?name=t/big", p.url))
        .bearer_auth(&p.key)
        .body(b.into_inner().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body = r.text().await.unwrap();
    assert!(body.contains("no space left in the image store"), "{body}");
    assert!(p.client().images().await.unwrap().is_empty());
    for d in ["layers", "tmp"] {
        let n = std::fs::read_dir(fs.0.path().join(d)).unwrap().count();
        assert_eq!(n, 0, "{d} is not empty after a failed import");
    }
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_unmounts_unused_layers_and_keeps_used_ones() {
    require_root!();
    let mut p = Platform::start_with(Some("[node]\nlayer_idle_unmount = 3600\nwarm_pool = 0\n"));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();
    import_base(&p, work.path(), "t/base");
    let top = work.path().join("top");
    write(&top, "etc/marker", "top");
    import(&p, &top, "t/top");
    let used = create(&c, "t/base,t/top").await;
    let gone = create(&c, "t/base").await;
    let layers = used.info().await.unwrap().layers;
    gone.kill().await.unwrap();
    used.kill().await.unwrap();
    let keep = create(&c, "t/base").await;
    assert_eq!(
        mounts_of(&p, &layers[1]),
        1,
        "unused, but within its idle time"
    );

    p.stop();
    assert_eq!(
        mounts_of(&p, &layers[1]),
        0,
        "an unused layer is unmounted at stop"
    );
    assert_eq!(
        mounts_of(&p, &layers[0]),
        1,
        "a running sandbox's layer stays"
    );
    p.start_again();
    assert_eq!(sh(&keep, "cat /etc/marker").await.1, "base");
    keep.kill().await.unwrap();
}

/// The warm pool is keyed by image: after a layered image's first create, the next ones take
/// inits prepared for it, with their own limits and environment. Warm inits keep the layers
/// mounted but are not counted as their users; an image no longer created loses its pool, and
/// its layers are unmounted as they would be without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layered_creates_take_warm_inits_of_their_image() {
    require_root!();
    let p = Platform::start_with(Some(
        // An image's pool lives layer_idle_unmount seconds after its last create: long enough
        // that waiting for its warm inits on a loaded machine does not outlast it.
        "[node]\nlayer_idle_unmount = 10\nwarm_pool = 0\nwarm_images = 1\nwarm_per_image = 2\n",
    ));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();
    import_base(&p, work.path(), "t/base");
    let top = work.path().join("top");
    write(&top, "etc/marker", "top");
    import(&p, &top, "t/top");
    let warm_inits = || {
        std::fs::read_dir(p.state_dir().join("warm"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    // The log's lines, without their colours.
    let plain = || {
        let log = p.log();
        let mut out = String::with_capacity(log.len());
        let mut chars = log.chars();
        while let Some(ch) = chars.next() {
            if ch == '\u{1b}' {
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(ch);
            }
        }
        out
    };
    let created_warm = |id: &str| {
        plain()
            .lines()
            .find(|l| l.contains(id) && l.contains("created"))
            .map(|l| l.contains("warm=true"))
    };

    let first = create(&c, "t/base").await;
    wait_for("the first create's log line", || {
        created_warm(first.id().as_str()).is_some()
    });
    assert_eq!(
        created_warm(first.id().as_str()),
        Some(false),
        "{}",
        p.log()
    );
    wait_for("two warm inits of t/base", || warm_inits() == 2);
    let base = first.info().await.unwrap().layers[0].clone();
    let users = |c: warren_sdk::ImageStats| {
        c.layers
            .iter()
            .find(|l| l.digest == base)
            .map(|l| l.sandboxes)
    };
    assert_eq!(
        users(c.image_stats().await.unwrap().answer),
        Some(1),
        "warm inits are not users"
    );

    let second = c
        .create(&CreateSandbox {
            image: "t/base".into(),
            memory: Some(warren_sdk::ByteSize(200 << 20)),
            env: [("ROLE".to_string(), "second".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_for("the second create's log line", || {
        created_warm(second.id().as_str()).is_some()
    });
    assert_eq!(
        created_warm(second.id().as_str()),
        Some(true),
        "{}",
        p.log()
    );
    assert_eq!(
        sh(&second, "echo $ROLE; cat /etc/marker").await.1,
        "second\nbase"
    );
    assert_eq!(
        second.info().await.unwrap().resources.memory,
        warren_sdk::ByteSize(200 << 20)
    );
    assert_eq!(users(c.image_stats().await.unwrap().answer), Some(2));

    // Another image takes the only pool: t/base's inits go, t/base,t/top's come.
    let other = create(&c, "t/base,t/top").await;
    assert_eq!(sh(&other, "cat /etc/marker").await.1, "top");
    wait_for("t/base's pool to give way", || {
        let links: Vec<PathBuf> = std::fs::read_dir(p.state_dir().join("warm"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path().join("l1")).ok())
            .collect();
        links.len() == 2 && warm_inits() == 2
    });
    for sb in [first, second, other] {
        sb.kill().await.unwrap();
    }
    // No create for layer_idle_unmount seconds: the pool goes, then the layers.
    p.assert_clean_within(Duration::from_secs(60));
    assert_eq!(warm_inits(), 0);
}

/// A root file system like a real distribution's: busybox, and an `/etc/passwd` of `passwd`.
fn distro_rootfs(root: &Path, passwd: &str) {
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(busybox(), root.join("bin/busybox")).unwrap();
    for a in ["sh", "id", "pwd", "touch", "echo", "cat", "grep", "stat"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(a)).unwrap();
    }
    write(root, "etc/passwd", passwd);
    write(root, "etc/group", "root:x:0:\n");
}

/// An image whose `/etc/passwd` has only root gets the default user (uid 1000, home
/// `/home/user`, its working directory, writable) when a sandbox starts; one that has uid 1000
/// under another name keeps it, and `user` means that account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_provides_the_default_user_an_image_lacks() {
    require_root!();
    let p = Platform::start_with(Some(CONFIG));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();

    let plain = work.path().join("plain");
    distro_rootfs(&plain, "root:x:0:0:root:/root:/bin/sh\n");
    import(&p, &plain, "t/plain");
    let sb = create(&c, "t/plain").await;
    let (code, out) = sh(
        &sb,
        "id -u; id -un; echo $HOME; pwd; touch here && echo writable",
    )
    .await;
    assert_eq!(
        (code, out.as_str()),
        (0, "1000\nuser\n/home/user\n/home/user\nwritable\n")
    );
    let (_, passwd) = sh(&sb, "cat /etc/passwd").await;
    assert_eq!(
        passwd,
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:Warren sandbox user:/home/user:/bin/sh\n"
    );
    let (_, group) = sh(&sb, "cat /etc/group").await;
    assert_eq!(group, "root:x:0:\nuser:x:1000:\n");
    let (_, home) = sh(&sb, "stat -c '%u:%g %a' /home/user").await;
    assert_eq!(home, "1000:1000 755\n");
    // A user the image does not have: the error says what was looked up and what to run as.
    let e = sb
        .exec(&warren_sdk::ExecRequest {
            user: Some("bob".into()),
            ..argv(["/bin/busybox", "true"])
        })
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("no account \"bob\""), "{msg}");
    assert!(
        msg.contains("\"root\"") && msg.contains("numeric uid"),
        "{msg}"
    );
    sb.kill().await.unwrap();

    // uid 1000 under another name, whose home the image lacks: kept, and its home made.
    let alice = work.path().join("alice");
    distro_rootfs(
        &alice,
        "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n",
    );
    import(&p, &alice, "t/alice");
    let sb = create(&c, "t/alice").await;
    let (code, out) = sh(&sb, "id -un; echo $HOME; pwd; touch here && echo writable").await;
    assert_eq!(
        (code, out.as_str()),
        (0, "alice\n/home/alice\n/home/alice\nwritable\n")
    );
    let r = sb
        .exec(&warren_sdk::ExecRequest {
            user: Some("user".into()),
            ..argv(["/bin/busybox", "id", "-un"])
        })
        .await
        .unwrap();
    assert_eq!(r.stdout, "alice\n", "{r:?}");
    let (_, passwd) = sh(&sb, "cat /etc/passwd; cat /etc/group").await;
    assert_eq!(
        passwd,
        "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nroot:x:0:\n",
        "nothing is added to an image that has uid 1000"
    );
    sb.kill().await.unwrap();
    for n in ["t/plain", "t/alice"] {
        c.remove_image(n).await.unwrap();
    }
    p.assert_clean();
}

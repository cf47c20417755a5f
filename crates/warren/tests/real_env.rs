//! Real environments: a root file system with every file type imported from a directory
//! (absolute and relative path) and from a tar, round-tripped exactly; `--owner` on import;
//! the same content is one layer; a re-imported name leaves no orphan, and the orphans a
//! running sandbox keeps are listed and pruned once it is gone; read statistics count what
//! sandboxes read, not what the import wrote; `warren cp` of a directory both ways.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Platform;
use warren_sdk::{CreateSandbox, argv};

const CONFIG: &str = "[node]\nlayer_idle_unmount = 1\nwarm_pool = 0\n";

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

/// `warren image import DIR --name NAME` plus `extra` options.
fn import(p: &Platform, dir: &Path, name: &str, extra: &[&str]) {
    let mut args = vec!["image", "import", dir.to_str().unwrap(), "--name", name];
    args.extend_from_slice(extra);
    cli_ok(p, &args);
}

/// A sandbox of `image` with the defaults.
async fn create(c: &warren_sdk::Client, image: &str) -> warren_sdk::Sandbox {
    c.create(&CreateSandbox {
        image: image.into(),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// The layers of image `name`.
fn layers_of(p: &Platform, name: &str) -> Vec<String> {
    let out = cli_ok(p, &["image", "inspect", name, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

fn layer_file(p: &Platform, digest: &str) -> PathBuf {
    p.data.path().join(format!(
        "images/layers/sha256-{}.erofs",
        digest.trim_start_matches("sha256:")
    ))
}

/// A layer file mounted read-only on a loop device here, unmounted when dropped.
struct Mounted(tempfile::TempDir);

impl Mounted {
    fn new(file: &Path) -> Mounted {
        let d = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "erofs", "-o", "ro,loop"])
            .arg(file)
            .arg(d.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mounted(d)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Everything a root file system keeps of each entry, by relative path: type, permission
/// bits, owner, modification time, device number, content, link target, extended attributes
/// (`user.` and `trusted.`), and which entries are hard links of one file.
fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let md = std::fs::symlink_metadata(&path).unwrap();
        let ft = md.file_type();
        use std::os::unix::fs::FileTypeExt;
        let kind = if ft.is_dir() {
            "dir".to_string()
        } else if ft.is_symlink() {
            format!("link->{}", std::fs::read_link(&path).unwrap().display())
        } else if ft.is_file() {
            format!(
                "file:{}",
                String::from_utf8_lossy(&std::fs::read(&path).unwrap())
            )
        } else if ft.is_char_device() {
            format!("char:{:x}", md.rdev())
        } else if ft.is_block_device() {
            format!("block:{:x}", md.rdev())
        } else if ft.is_fifo() {
            "fifo".into()
        } else {
            "socket".into()
        };
        let mut attrs = Vec::new();
        let mut names = vec![0u8; 4096];
        if let Ok(n) = rustix::fs::llistxattr(&path, &mut names) {
            for name in names[..n].split(|b| *b == 0).filter(|s| !s.is_empty()) {
                let name = String::from_utf8_lossy(name).into_owned();
                if !(name.starts_with("user.") || name.starts_with("trusted.")) {
                    continue;
                }
                let mut v = vec![0u8; 4096];
                let k = rustix::fs::lgetxattr(&path, name.as_str(), &mut v).unwrap();
                attrs.push(format!("{name}={}", String::from_utf8_lossy(&v[..k])));
            }
        }
        attrs.sort();
        let link = if !ft.is_dir() && md.nlink() > 1 {
            let first = inodes
                .entry(md.ino())
                .or_insert_with(|| rel.display().to_string());
            format!(" same-as:{first}")
        } else {
            String::new()
        };
        let mode = if ft.is_symlink() {
            0
        } else {
            md.mode() & 0o7777
        };
        let time = if rel.as_os_str().is_empty() {
            0
        } else {
            md.mtime()
        };
        out.insert(
            format!("/{}", rel.display()),
            format!(
                "{kind} {mode:o} {}:{} t={time} [{}]{link}",
                md.uid(),
                md.gid(),
                attrs.join(",")
            ),
        );
        if ft.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for n in names.into_iter().rev() {
                stack.push(rel.join(n));
            }
        }
    }
    out
}

fn set_time(p: &Path, secs: i64) {
    let t = rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        p,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// A root file system with every kind of entry a real one has.
fn every_kind(root: &Path) {
    let mk = |rel: &str| std::fs::create_dir_all(root.join(rel)).unwrap();
    mk("bin");
    mk("etc/ssl");
    mk("devtest");
    mk("run");
    mk("opt/deep/er/still");
    std::fs::write(root.join("bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    std::fs::set_permissions(
        root.join("bin/tool"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    std::fs::write(root.join("etc/shadow"), "root:*:1::::::\n").unwrap();
    std::fs::set_permissions(
        root.join("etc/shadow"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::chown(root.join("etc/shadow"), Some(0), Some(42)).unwrap();
    std::fs::write(root.join("etc/ssl/cert.pem"), "cert").unwrap();
    std::os::unix::fs::chown(root.join("etc/ssl/cert.pem"), Some(1001), Some(127)).unwrap();
    std::fs::hard_link(root.join("etc/ssl/cert.pem"), root.join("etc/ssl/ca.pem")).unwrap();
    std::os::unix::fs::symlink("../bin/tool", root.join("etc/tool-link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/absolute", root.join("etc/dangling")).unwrap();
    std::fs::write(root.join("opt/deep/er/still/f"), "deep").unwrap();
    std::fs::set_permissions(
        root.join("opt/deep"),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();
    rustix::fs::setxattr(
        root.join("opt/deep/er/still/f"),
        "user.origin",
        b"test",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let dev = |rel: &str, kind: rustix::fs::FileType, major: u32, minor: u32| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join(rel),
            kind,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(major, minor),
        )
        .unwrap();
    };
    dev("devtest/null", rustix::fs::FileType::CharacterDevice, 1, 3);
    dev("devtest/loop7", rustix::fs::FileType::BlockDevice, 7, 7);
    dev("devtest/fifo", rustix::fs::FileType::Fifo, 0, 0);
    std::fs::set_permissions(
        root.join("devtest/loop7"),
        std::fs::Permissions::from_mode(0o660),
    )
    .unwrap();
    // A socket: it cannot be archived, so it is left out with a note.
    let _l = std::os::unix::net::UnixListener::bind(root.join("run/app.sock")).unwrap();
    // Fixed times on everything, directories last (writing into them changes theirs).
    let mut all = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
        all.push(p);
    }
    for (i, p) in all.iter().rev().enumerate() {
        set_time(p, 1_600_000_000 + i as i64 * 3600);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_type_of_a_root_file_system_round_trips() {
    require_root!();
    let p = Platform::start_with(Some(CONFIG));
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("rootfs");
    every_kind(&root);
    let mut want = describe(&root);
    assert!(want.remove("/run/app.sock").is_some());
    // The layer's root is its own, not the staging directory's.
    want.insert("/".into(), "dir 755 0:0 t=0 []".into());

    // From an absolute path: a note for the socket, nothing else left out.
    let out = p.cli(&[
        "image",
        "import",
        root.to_str().unwrap(),
        "--name",
        "rt/abs",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("run/app.sock is left out: it is a socket"),
        "{stderr}"
    );
    // From a relative path.
    let out = Command::new(common::warren_bin())
        .args(["image", "import", "rootfs", "--name", "rt/rel"])
        .current_dir(work.path())
        .env("WARREN_URL", &p.url)
        .env("WARREN_API_KEY", &p.key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // From a tar made by GNU tar, extended attributes included.
    let tar = work.path().join("rootfs.tar");
    let out = Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "--numeric-owner", "-C"])
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .args(["--exclude=./run/app.sock", "."])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    import(&p, &tar, "rt/tar", &[]);

    let abs = layers_of(&p, "rt/abs");
    assert_eq!(abs.len(), 1);
    assert_eq!(layers_of(&p, "rt/rel"), abs, "one directory, one layer");
    for name in ["rt/abs", "rt/tar"] {
        let l = layers_of(&p, name);
        let m = Mounted::new(&layer_file(&p, &l[0]));
        let got = describe(m.0.path());
        for (k, v) in &want {
            assert_eq!(got.get(k), Some(v), "{name}: {k}");
        }
        assert_eq!(got.len(), want.len(), "{name}: {got:#?}");
    }

    // And a sandbox sees the device nodes and the FIFO for what they are.
    let c = p.client();
    let busybox = work.path().join("bb");
    std::fs::create_dir_all(busybox.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", busybox.join("bin/busybox")).unwrap();
    import(&p, &busybox, "rt/bb", &[]);
    let sb = create(&c, "rt/abs,rt/bb").await;
    let r = sb
        .as_user("root")
        .exec(&argv([
            "/bin/busybox",
            "stat",
            "-c",
            "%F %t:%T",
            "/devtest/null",
            "/devtest/loop7",
            "/devtest/fifo",
        ]))
        .await
        .unwrap();
    assert_eq!(
        r.stdout, "character special file 1:3\nblock special file 7:7\nfifo 0:0\n",
        "{}",
        r.stderr
    );
    sb.kill().await.unwrap();
}

/// The layer digests in the store.
fn stored(p: &Platform) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p.data.path().join("images/layers"))
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.strip_prefix("sha256-")
                .and_then(|n| n.strip_suffix(".erofs"))
                .map(|h| format!("sha256:{h}"))
        })
        .collect();
    v.sort();
    v
}

fn orphans(p: &Platform) -> Vec<String> {
    let out = cli_ok(p, &["image", "ls", "--orphans", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|u| u["layer"]["digest"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_one_layer_per_content_no_orphans_and_honest_read_statistics() {
    require_root!();
    let p = Platform::start_with(Some(CONFIG));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();

    // A workspace as an sdist unpacks it: owned by someone the sandbox does not know.
    let ws = work.path().join("ws");
    std::fs::create_dir_all(ws.join("work/src")).unwrap();
    std::fs::write(ws.join("work/src/mod.py"), "x = 1\n").unwrap();
    // Incompressible, so the layer is as large as the file and a read of it shows.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let noise: Vec<u8> = (0..8u32 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(ws.join("work/blob"), &noise).unwrap();
    for e in ["work", "work/src", "work/src/mod.py", "work/blob"] {
        std::os::unix::fs::chown(ws.join(e), Some(1001), Some(127)).unwrap();
    }
    let wsp = ws.to_str().unwrap();
    import(&p, &ws, "ws/kept", &[]);
    import(&p, &ws, "ws/user", &["--owner", "user"]);
    import(&p, &ws, "ws/user2", &["--owner", "user"]);
    import(&p, &ws, "ws/num", &["--owner", "4242:77"]);
    let out = p.cli(&[
        "image", "import", wsp, "--name", "ws/bad", "--owner", "nobody",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UID:GID"), "{err}");
    let owner_of = |name: &str| {
        let m = Mounted::new(&layer_file(&p, &layers_of(&p, name)[0]));
        let md = std::fs::metadata(m.0.path().join("work/src/mod.py")).unwrap();
        (md.uid(), md.gid())
    };
    assert_eq!(
        owner_of("ws/kept"),
        (1001, 127),
        "no --owner: the owners stay"
    );
    assert_eq!(owner_of("ws/user"), (1000, 1000));
    assert_eq!(owner_of("ws/num"), (4242, 77));
    // The same content is the same layer, whenever it is imported.
    assert_eq!(layers_of(&p, "ws/user"), layers_of(&p, "ws/user2"));
    assert!(orphans(&p).is_empty());

    // Right after an import, no sandbox has read anything of the layer...
    let user_layer = layers_of(&p, "ws/user")[0].clone();
    let user_size = std::fs::metadata(layer_file(&p, &user_layer))
        .unwrap()
        .len();
    assert!(user_size > 8 << 20, "{user_size}");
    // (No shell in this image: the guest's own file operations read and write.)
    let sb = create(&c, "ws/user").await;
    let share = |stats: warren_sdk::ImageStats| {
        stats
            .layers
            .iter()
            .find(|l| l.digest == user_layer)
            .map(|l| l.read_fraction)
            .unwrap()
    };
    let before = share(c.image_stats().await.unwrap().answer);
    assert!(
        before < 0.5,
        "{:.0}% of the layer counted as read before any sandbox read it",
        before * 100.0
    );
    // ...and a file the sandbox reads shows.
    let data = sb.as_user("root").read_file("/work/blob").await.unwrap();
    assert_eq!(data.len(), noise.len());
    let after = share(c.image_stats().await.unwrap().answer);
    assert!(
        after > 0.9,
        "read {:.0}% after reading it all",
        after * 100.0
    );
    // The default user may write to a workspace imported with --owner user.
    sb.as_user("1000")
        .write_file("/work/src/new.py", "y = 2\n")
        .await
        .unwrap();

    // Importing a name again with other content removes the layer it named before, once no
    // name and no sandbox uses it.
    std::fs::write(ws.join("work/src/mod.py"), "x = 2\n").unwrap();
    import(&p, &ws, "ws/user", &["--owner", "user"]);
    assert!(stored(&p).contains(&user_layer), "ws/user2 still names it");
    import(&p, &ws, "ws/user2", &["--owner", "user"]);
    // The sandbox still runs on it: kept, and listed as an orphan.
    assert!(stored(&p).contains(&user_layer));
    assert_eq!(orphans(&p), vec![user_layer.clone()]);
    let pruned: serde_json::Value =
        serde_json::from_str(&cli_ok(&p, &["image", "prune", "--json"])).unwrap();
    assert_eq!(pruned["removed"].as_array().unwrap().len(), 0);
    assert!(
        pruned["kept"][0]
            .as_str()
            .unwrap()
            .contains(sb.id().as_str()),
        "{pruned}"
    );
    sb.kill().await.unwrap();
    let pruned: serde_json::Value =
        serde_json::from_str(&cli_ok(&p, &["image", "prune", "--json"])).unwrap();
    assert_eq!(
        pruned["removed"][0]["digest"],
        user_layer.as_str(),
        "{pruned}"
    );
    assert_eq!(pruned["freed"].as_u64().unwrap(), user_size);
    assert!(orphans(&p).is_empty());
    assert!(!stored(&p).contains(&user_layer));
    // Every stored layer is named by some image.
    let named: std::collections::BTreeSet<String> = c
        .images()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|i| i.layers)
        .collect();
    assert_eq!(stored(&p), named.into_iter().collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_copies_directories_both_ways() {
    require_root!();
    let p = Platform::start_with(Some(CONFIG));
    let c = p.client();
    let sb = create(&c, "host").await;
    let id = sb.id().to_string();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("proj");
    std::fs::create_dir_all(src.join("pkg/sub")).unwrap();
    std::fs::write(src.join("pkg/sub/f.txt"), "deep\n").unwrap();
    std::fs::write(src.join("run.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("pkg/sub/f.txt", src.join("link")).unwrap();

    // Into a path that does not exist: it becomes the copy.
    cli_ok(
        &p,
        &[
            "cp",
            src.to_str().unwrap(),
            &format!("{id}:/home/user/proj"),
        ],
    );
    let r = sb
        .exec(&argv([
            "sh",
            "-c",
            "cat proj/pkg/sub/f.txt; ./proj/run.sh; readlink proj/link; stat -c %U proj/run.sh",
        ]))
        .await
        .unwrap();
    assert_eq!(r.stdout, "deep\nrun\npkg/sub/f.txt\nuser\n", "{}", r.stderr);
    // Into an existing directory: under its own name.
    cli_ok(&p, &["cp", src.to_str().unwrap(), &format!("{id}:/tmp")]);
    assert_eq!(
        sb.read_file("/tmp/proj/pkg/sub/f.txt").await.unwrap(),
        "deep\n"
    );

    // Out again, to a new path and into an existing directory.
    let out = work.path().join("out");
    cli_ok(
        &p,
        &[
            "cp",
            &format!("{id}:/home/user/proj"),
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(out.join("pkg/sub/f.txt")).unwrap(),
        "deep\n"
    );
    assert_eq!(
        std::fs::metadata(out.join("run.sh")).unwrap().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(out.join("link")).unwrap(),
        Path::new("pkg/sub/f.txt")
    );
    let into = work.path().join("into");
    std::fs::create_dir(&into).unwrap();
    cli_ok(
        &p,
        &[
            "cp",
            &format!("{id}:/home/user/proj"),
            into.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(into.join("proj/pkg/sub/f.txt")).unwrap(),
        "deep\n"
    );

    // A sandbox that plants a link to somewhere outside cannot make the download write there.
    let victim = work.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    sb.exec(&argv([
        "sh",
        "-c",
        &format!("mkdir -p evil && ln -s {} evil/esc", victim.display()),
    ]))
    .await
    .unwrap();
    let got = work.path().join("got");
    cli_ok(
        &p,
        &[
            "cp",
            &format!("{id}:/home/user/evil"),
            got.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::symlink_metadata(got.join("esc"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
    sb.kill().await.unwrap();
}

/// Copies the host's `program` and the shared libraries it loads (as `ldd` lists them) into
/// the root file system `root`, at the same paths.
fn with_program(root: &Path, program: &Path) {
    let out = Command::new("ldd").arg(program).output().unwrap();
    assert!(out.status.success(), "ldd {}", program.display());
    let mut files = vec![program.to_path_buf()];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(PathBuf::from(p));
        }
    }
    for f in files {
        let to = root.join(f.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(std::fs::canonicalize(&f).unwrap(), &to).unwrap();
    }
}

/// The capability sets and `NoNewPrivs` of a command, from its /proc/self/status.
async fn caps(sb: &warren_sdk::Sandbox) -> String {
    let r = sb
        .exec(&argv([
            "/bin/busybox",
            "sh",
            "-c",
            "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status | tr -s '\\t ' ' '",
        ]))
        .await
        .unwrap();
    assert_eq!(r.status.exit_code, 0, "{}", r.stderr);
    r.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_steps_hold_build_capabilities_and_agent_sandboxes_never_do() {
    require_root!();
    // Warm inits of layered images on: a builder must not take one.
    let p = Platform::start_with(Some(
        "[node]\nlayer_idle_unmount = 1\nwarm_pool = 0\nwarm_per_image = 2\n",
    ));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();
    let base = work.path().join("base");
    std::fs::create_dir_all(base.join("bin")).unwrap();
    std::fs::create_dir_all(base.join("etc")).unwrap();
    std::fs::copy("/bin/busybox", base.join("bin/busybox")).unwrap();
    for a in ["sh", "chown", "mkdir", "id", "stat", "ls", "cat", "chmod"] {
        std::os::unix::fs::symlink("busybox", base.join("bin").join(a)).unwrap();
    }
    std::fs::write(base.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(base.join("etc/group"), "root:x:0:\n").unwrap();
    std::fs::write(base.join("etc/shadow"), "root:*:19000:0:99999:7:::\n").unwrap();
    std::fs::set_permissions(
        base.join("etc/shadow"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    with_program(&base, Path::new("/usr/sbin/useradd"));
    std::fs::copy("/etc/login.defs", base.join("etc/login.defs")).unwrap();
    import(&p, &base, "b/base", &[]);

    // An agent sandbox first (it warms the pool for this image): root holds nothing.
    let agent = create(&c, "b/base").await;
    let none = "CapInh: 0000000000000000\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\n\
                CapBnd: 0000000000000000\nCapAmb: 0000000000000000\nNoNewPrivs: 1\n";
    assert_eq!(caps(&agent.as_user("root")).await, none);
    let r = agent
        .as_user("root")
        .exec(&argv(["/bin/busybox", "chown", "1234", "/etc/passwd"]))
        .await
        .unwrap();
    assert_ne!(
        r.status.exit_code, 0,
        "root in an agent sandbox could chown"
    );

    // A builder: root's commands hold the build set, and nothing else; other users nothing.
    let builder = c
        .create(&CreateSandbox {
            image: "b/base".into(),
            builder: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(builder.info().await.unwrap().builder);
    assert_eq!(
        caps(&builder.as_user("root")).await,
        "CapInh: 00000000a00404fb\nCapPrm: 00000000a00404fb\nCapEff: 00000000a00404fb\n\
         CapBnd: 0000000000000000\nCapAmb: 00000000a00404fb\nNoNewPrivs: 1\n"
    );
    assert_eq!(caps(&builder).await, none, "the default user holds nothing");
    // A step that kills the spawner: later commands fail rather than run without the set.
    let _ = builder
        .as_user("root")
        .exec(&argv([
            "/bin/busybox",
            "sh",
            "-c",
            "for p in /proc/[0-9]*; do grep -q '^Name:.warren-spawner' $p/status && kill -9 ${p#/proc/}; done",
        ]))
        .await;
    let r = builder
        .as_user("root")
        .exec(&argv(["/bin/busybox", "true"]))
        .await;
    let refused = match r {
        Ok(r) => format!("{} {}", r.status.exit_code, r.stderr),
        Err(e) => e.to_string(),
    };
    assert!(refused.contains("spawner is gone"), "{refused}");
    builder.kill().await.unwrap();
    // Not over the host's own files.
    let e = c
        .create(&CreateSandbox {
            image: "host".into(),
            builder: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("layered images"), "{e}");

    // `image build`: useradd-style account changes, chown, and --owner on a copy.
    let ws = work.path().join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/a.py"), "a = 1\n").unwrap();
    std::os::unix::fs::chown(ws.join("src/a.py"), Some(1001), Some(127)).unwrap();
    cli_ok(
        &p,
        &[
            "image",
            "build",
            "--from",
            "b/base",
            "--copy",
            ws.to_str().unwrap(),
            "/work",
            "--owner",
            "user",
            "--run",
            "useradd -u 1234 -U alice && mkdir -p /srv/data && chown alice:alice /srv/data && chmod 2775 /srv/data",
            "--name",
            "b/built",
        ],
    );
    let sb = create(&c, "b/built").await;
    let r = sb
        .exec(&argv([
            "/bin/busybox",
            "sh",
            "-c",
            "id -u alice; stat -c '%u:%g %a' /srv/data /work /work/src/a.py; echo more >> /work/src/a.py && echo edited",
        ]))
        .await
        .unwrap();
    assert_eq!(
        r.stdout, "1234\n1234:1234 2775\n1000:1000 755\n1000:1000 644\nedited\n",
        "{}",
        r.stderr
    );
    // The built image's agent sandboxes hold nothing either.
    assert_eq!(caps(&sb.as_user("root")).await, none);
    sb.kill().await.unwrap();
    agent.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_loop_devices_read_ahead_as_configured() {
    require_root!();
    let p = Platform::start_with(Some(
        "[node]\nlayer_idle_unmount = 1\nwarm_pool = 0\nlayer_mount = \"loop\"\nlayer_readahead_kb = 64\n",
    ));
    let c = p.client();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().join("l");
    std::fs::create_dir_all(d.join("etc")).unwrap();
    std::fs::write(d.join("etc/marker"), "x").unwrap();
    import(&p, &d, "ra/one", &[]);
    let digest = layers_of(&p, "ra/one")[0].clone();
    let sb = create(&c, "ra/one").await;
    let point = p
        .state_dir()
        .join("layers")
        .join(digest.trim_start_matches("sha256:"));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let source = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(point.to_str().unwrap()))
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|r| r.split(' ').nth(1))
        .expect("the layer is mounted")
        .to_string();
    let dev = source.trim_start_matches("/dev/");
    assert!(dev.starts_with("loop"), "{source}");
    let ra = std::fs::read_to_string(format!("/sys/block/{dev}/queue/read_ahead_kb")).unwrap();
    assert_eq!(ra.trim(), "64");
    sb.kill().await.unwrap();
}

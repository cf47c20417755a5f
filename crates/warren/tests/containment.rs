//! Containment, tried as an agent would from inside a sandbox: the paper's cheating incidents
//! and the classic escapes, each asserting that it is contained (and, where the platform
//! records it, the incident event).

mod common;

use common::Platform;
use warren_sdk::{CreateSandbox, ExecRequest, Sandbox, argv, shell};

async fn host_sandbox(p: &Platform) -> Sandbox {
    p.client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Runs `cmd` with `sh -c`, as root when `root`; returns (exit code, stdout, stderr).
async fn run(sb: &Sandbox, cmd: &str, root: bool) -> (i32, String, String) {
    let req = ExecRequest {
        user: root.then(|| "root".to_string()),
        ..shell(cmd)
    };
    let r = sb.exec(&req).await.unwrap();
    (r.status.exit_code, r.stdout, r.stderr)
}

/// Root in a sandbox owns the host-wide files of /proc, and some act on the whole host without
/// a capability (`/proc/dynamic_debug/control`, `/proc/pressure/*` triggers): outside the
/// processes' own directories nothing in /proc is writable, at any depth, whatever this
/// kernel has; a process's own files still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_finds_no_writable_host_file_in_proc() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let (code, out, err) = run(
        &sb,
        "find /proc -path /proc/self -prune -o -path /proc/thread-self -prune \
         -o -regex '/proc/[0-9]+' -prune -o -type f -writable -print 2>/dev/null; \
         [ ! -e /proc/pressure/cpu ] || echo 'some 500000 1000000' > /proc/pressure/cpu",
        true,
    )
    .await;
    assert_eq!(
        out, "",
        "root in a sandbox can write these host files:\n{out}"
    );
    if std::path::Path::new("/proc/pressure/cpu").exists() {
        assert_ne!(code, 0, "a PSI trigger was written");
        assert!(err.contains("Read-only"), "{err}");
    }
    // A process's own files are its own: raising its OOM score needs no capability.
    let (code, _, err) = run(&sb, "echo 500 > /proc/self/oom_score_adj", false).await;
    assert_eq!(code, 0, "{err}");
}

/// Root-only host information: root in a sandbox has uid 0 but no capabilities, and owns the
/// files /proc and /sys keep for root, so each must be masked, not merely mode-protected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_only_host_information_is_hidden() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    for root in [false, true] {
        // The paper's incident and its relatives: nothing comes out of them.
        let (_, out, _) = run(
            &sb,
            "for f in /proc/kpageflags /proc/kpagecount /proc/kpagecgroup /proc/slabinfo \
             /proc/kcore /proc/pagetypeinfo /proc/vmallocinfo /proc/timer_list \
             /sys/kernel/mm/page_idle/bitmap /sys/kernel/vmcoreinfo; do \
               n=$(head -c 4096 $f 2>/dev/null | wc -c); echo \"$f $n\"; done",
            root,
        )
        .await;
        for line in out.lines() {
            assert!(line.ends_with(" 0"), "readable (root={root}): {line}");
        }
        // Not even an empty read: opening a masked file fails.
        let (code, _, err) = run(&sb, "head -c 8 /proc/kpageflags", root).await;
        assert_ne!(code, 0, "root={root}: /proc/kpageflags opens");
        assert!(err.contains("Permission denied"), "root={root}: {err}");
        // Whatever this kernel has: no file at the top of /proc or in /sys that only root
        // may read gives root in the sandbox a byte.
        let (_, out, _) = run(
            &sb,
            "for f in $(find /proc -maxdepth 1 -type f ! -perm -o=r; find /sys -xdev -type f ! -perm -o=r -perm -u=r 2>/dev/null); do \
               [ \"$(head -c 1 $f 2>/dev/null | wc -c)\" = 1 ] && echo \"$f\"; done; true",
            root,
        )
        .await;
        assert_eq!(out, "", "root-only files readable (root={root}):\n{out}");
        // DMI serial numbers, firmware tables, slab and module internals: empty.
        let (_, out, _) = run(
            &sb,
            "ls -A /sys/firmware /sys/kernel/slab /sys/module /sys/devices/virtual/dmi 2>/dev/null | grep -v ':$' | grep -v '^$' | wc -l",
            root,
        )
        .await;
        assert_eq!(out.trim(), "0", "masked directories list entries");
    }
    // The host's TLS private keys are not bound in; public certificates are.
    let (_, out, _) = run(
        &sb,
        "ls -A /etc/ssl/private 2>&1 | head -3; test -e /etc/ssl/certs/ca-certificates.crt && echo certs",
        true,
    )
    .await;
    assert!(
        out.contains("No such file") && out.contains("certs"),
        "{out}"
    );
    // Kernel knobs stay read-only for root.
    let (_, out, _) = run(
        &sb,
        "(echo 1 > /proc/sys/vm/drop_caches) 2>&1; (echo c > /proc/sysrq-trigger) 2>&1; echo done",
        true,
    )
    .await;
    assert!(out.ends_with("done\n"), "{out}");
    assert_eq!(out.matches("cannot create").count(), 2, "{out}");
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// Events of `sandbox` of `kind`, waiting (up to 15 s: a loaded machine streams them late)
/// until `ok` holds for them.
async fn events_until(
    p: &Platform,
    sandbox: &str,
    kind: warren_sdk::EventKind,
    ok: impl Fn(&[warren_sdk::Event]) -> bool,
) -> Vec<warren_sdk::Event> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let events = p
            .client()
            .events(&warren_sdk::EventFilter {
                sandbox: Some(sandbox.to_string()),
                kind: Some(kind),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(events.is_complete(), "{events:?}");
        if ok(&events) || std::time::Instant::now() > deadline {
            return events.into_items();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// An exploit-shaped program calls every system call the policy denies, in turn: each fails
/// with EPERM (the new-namespace and too-new ones with ENOSYS, so libc falls back), nothing
/// happens, the sandbox keeps working, and the attempts are events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_system_calls_fail_cleanly_and_are_recorded() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let (_, out, _) = run(
        &sb,
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status",
        false,
    )
    .await;
    assert_eq!(out, "NoNewPrivs:\t1\nSeccomp:\t2\n");
    let denied: Vec<&str> = include_str!("../../warren-guest/seccomp/denied.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(':'))
        .map(|l| l.split(':').next().unwrap().trim())
        .collect();
    let script = format!(
        r##"
import ctypes, os, re
hdr = open("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").read() if os.path.exists("/usr/include/x86_64-linux-gnu/asm/unistd_64.h") else ""
nr = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"#define __NR_(\w+) (\d+)", hdr))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name in {denied:?}:
    if name not in nr: continue
    r = libc.syscall(nr[name], 0, 0, 0, 0, 0, 0)
    print(name, r, ctypes.get_errno())
print("beyond", libc.syscall(470, 0, 0), ctypes.get_errno())
"##
    );
    for root in [false, true] {
        let r = sb
            .exec(&ExecRequest {
                user: root.then(|| "root".into()),
                argv: Some(vec!["python3".into(), "-c".into(), script.clone()]),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(r.status.exit_code, 0, "{}", r.stderr);
        let mut seen = 0;
        for line in r.stdout.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let want = if f[0] == "clone3" || f[0] == "beyond" {
                "38"
            } else {
                "1"
            };
            assert_eq!((f[1], f[2]), ("-1", want), "root={root}: {line}");
            seen += 1;
        }
        assert!(seen > 40, "too few denied calls tried: {}", r.stdout);
    }
    // The classic escapes by name.
    for (cmd, root) in [
        ("unshare -Ur true", false),
        ("unshare -m true", true),
        ("unshare -n true", true),
        ("unshare -p -f true", true),
    ] {
        let (code, _, err) = run(&sb, cmd, root).await;
        assert_ne!(code, 0, "{cmd} (root={root}) succeeded");
        assert!(err.contains("Operation not permitted"), "{cmd}: {err}");
    }
    // Still works.
    assert_eq!(run(&sb, "echo alive", false).await.1, "alive\n");
    // (Records stream to the node as they change: wait for the second run's count and the
    // `unshare` commands' records too.)
    let mounts = |e: &[warren_sdk::Event]| {
        e.iter()
            .filter(|e| e.detail == "mount")
            .map(|e| e.count)
            .sum::<u64>()
    };
    let ev = events_until(&p, sb.id().as_str(), warren_sdk::EventKind::Seccomp, |e| {
        mounts(e) >= 2
            && e.iter().any(|e| e.detail == "bpf")
            && e.iter().any(|e| e.detail == "unshare")
    })
    .await;
    let mount = ev
        .iter()
        .find(|e| e.detail == "mount")
        .expect("mount denial recorded");
    assert!(mounts(&ev) >= 2, "{ev:?}");
    assert_eq!(mount.comm.as_deref(), Some("python3"), "{mount:?}");
    assert!(ev.iter().any(|e| e.detail == "unshare"), "{ev:?}");
    // The CLI shows them too.
    let out = p.cli(&[
        "events",
        "--sandbox",
        sb.id().as_str(),
        "--kind",
        "seccomp",
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.as_array().unwrap().len() >= 10, "{v}");
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// A burst of 100,000 denied calls is one event with its count, and the sandbox answers
/// meanwhile; attempts on PID 1 (the guest agent) are their own kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_one_event_and_attacks_on_the_agent_are_named() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let flood =
        "import ctypes\nl=ctypes.CDLL(None)\nfor i in range(100000): l.syscall(165,0,0,0,0,0)\n";
    let (code, _, err) = run(&sb, &format!("python3 -c '{flood}'"), false).await;
    assert_eq!(code, 0, "{err}");
    let ev = events_until(&p, sb.id().as_str(), warren_sdk::EventKind::Seccomp, |e| {
        e.iter().map(|e| e.count).sum::<u64>() >= 100_000
    })
    .await;
    let mounts: Vec<_> = ev.iter().filter(|e| e.detail == "mount").collect();
    assert!(
        mounts.len() <= 2,
        "a burst spread over {} events",
        mounts.len()
    );
    assert_eq!(mounts.iter().map(|e| e.count).sum::<u64>(), 100_000);
    // Signals, ptrace and limits aimed at the guest agent: refused, recorded as management.
    let (_, out, _) = run(
        &sb,
        "python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); \
         print(l.kill(1, 9), l.ptrace(16, 1, 0, 0), l.syscall(302, 1, 7, 0, 0), ctypes.get_errno())'",
        true,
    )
    .await;
    assert_eq!(out, "-1 -1 -1 1\n");
    let ev = events_until(
        &p,
        sb.id().as_str(),
        warren_sdk::EventKind::Management,
        |e| e.len() >= 3,
    )
    .await;
    let details: Vec<&str> = ev.iter().map(|e| e.detail.as_str()).collect();
    for want in ["kill of PID 1", "ptrace of PID 1", "prlimit64 of PID 1"] {
        assert!(details.iter().any(|d| d.starts_with(want)), "{details:?}");
    }
    assert_eq!(run(&sb, "echo alive", false).await.1, "alive\n");
    sb.kill().await.unwrap();
    // Events outlive their sandbox.
    let after = p
        .client()
        .events(&warren_sdk::EventFilter {
            sandbox: Some(sb.id().to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(after.len() >= 4, "{after:?}");
    p.assert_clean();
}

/// The spawner (the process that starts every agent command, confined once) is out of the
/// agent's reach, root included: no signal, no trace, no limit, none of its /proc files; and
/// if it goes anyway (killed from outside here, as the kernel's OOM killer could), commands
/// still run, still confined, and its loss is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spawner_is_out_of_reach_and_its_loss_is_survived() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let probe = r#"
import ctypes, os, signal
l = ctypes.CDLL(None, use_errno=True)
pid = next(int(d) for d in os.listdir("/proc") if d.isdigit() and open(f"/proc/{d}/comm").read().strip() == "warren-spawner")
out = []
def errno_of(r):
    return "ok" if r == 0 else os.strerror(ctypes.get_errno())
for sig in (signal.SIGKILL, signal.SIGSTOP):
    try:
        os.kill(pid, sig); out.append("kill:ok")
    except OSError as e:
        out.append("kill:" + e.strerror)
out.append("ptrace:" + errno_of(l.ptrace(16, pid, 0, 0)))
out.append("prlimit:" + errno_of(l.syscall(302, pid, 7, 0, 0)))
for f in ("environ", "mem", "fd", "oom_score_adj", "cgroup"):
    path = f"/proc/{pid}/{f}"
    try:
        if f == "fd":
            os.listdir(path)
        elif f == "oom_score_adj":
            open(path, "w").write("1000")
        elif f == "cgroup":
            open("/sys/fs/cgroup/cgroup.procs", "w").write(str(pid))
        else:
            open(path, "rb").read(1)
        out.append(f + ":ok")
    except OSError as e:
        out.append(f + ":" + e.strerror)
print(pid, " ".join(out))
"#;
    for root in [false, true] {
        let (code, out, err) = run(&sb, &format!("python3 -c '{probe}'"), root).await;
        assert_eq!(code, 0, "{err}");
        let mut words = out.split_whitespace();
        assert_eq!(words.next(), Some("2"), "the spawner is PID 2: {out}");
        for w in words {
            assert!(
                !w.ends_with(":ok"),
                "as root={root}, the agent reached the spawner: {out}"
            );
        }
    }
    // Nor may an agent command or file operation take its uid (or the grader's), by number or
    // by a name the agent planted in /etc/passwd.
    let (code, _, err) = run(
        &sb,
        "echo evil:x:61001:61001::/:/bin/sh >> /etc/passwd; echo grader2:x:61000:100::/:/bin/sh >> /etc/passwd",
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    for who in ["61001", "61000", "evil", "grader2"] {
        let r = sb
            .exec(&ExecRequest {
                user: Some(who.into()),
                ..argv(["true"])
            })
            .await;
        let e = r.expect_err(who);
        assert!(e.to_string().contains("reserves"), "{who}: {e}");
    }
    // Its commands run as the user asked, with no capabilities, and cannot gain any.
    let (_, out, _) = run(
        &sb,
        "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t' ' '",
        true,
    )
    .await;
    assert_eq!(
        out,
        "0\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2\n"
    );
    // Killed from outside: found on the host as the guest's child named warren-spawner (the
    // guest found as the parent of a command of this sandbox: commands are the guest's
    // children).
    let marker = "sleep 4242.4242";
    sb.start_process(&argv(["sleep", "4242.4242"]))
        .await
        .unwrap();
    let guest = host_processes()
        .into_iter()
        .find(|(_, _, cmdline, cg)| cmdline == marker && cg.contains(&p.cgroup_parent))
        .map(|(_, ppid, _, _)| ppid)
        .expect("the background command on the host");
    let spawner = host_processes()
        .into_iter()
        .find(|(pid, ppid, _, _)| *ppid == guest && comm(*pid) == "warren-spawner")
        .map(|(pid, ..)| pid)
        .expect("the spawner on the host");
    // It holds nothing of the guest's but its own channel and the standard descriptors (the
    // listener channel and the Landlock ruleset are closed once it is confined).
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{spawner}/fd"))
        .unwrap()
        .flatten()
        .map(|e| {
            format!(
                "{} {}",
                e.file_name().to_string_lossy(),
                std::fs::read_link(e.path()).unwrap().display()
            )
        })
        .collect();
    let sockets = fds.iter().filter(|f| f.contains(" socket:")).count();
    assert!(
        sockets == 1
            && fds.len() <= 5
            && fds.iter().all(|f| f.ends_with("/dev/null")
                || f.ends_with("/guest.log")
                || f.contains(" socket:")),
        "the spawner holds more than it needs: {fds:?}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(spawner).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let ev = events_until(
        &p,
        sb.id().as_str(),
        warren_sdk::EventKind::Management,
        |e| e.iter().any(|e| e.detail.starts_with("the spawner exited")),
    )
    .await;
    assert!(!ev.is_empty());
    for _ in 0..3 {
        let (code, out, _) = run(&sb, "echo alive; grep Seccomp: /proc/self/status", false).await;
        assert_eq!((code, out.as_str()), (0, "alive\nSeccomp:\t2\n"));
    }
    let (code, _, err) = run(&sb, "unshare -U true", false).await;
    assert_ne!(code, 0, "still confined after the fallback: {err}");
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// Every host process: (pid, parent pid, command line with spaces, cgroup file).
fn host_processes() -> Vec<(i32, i32, String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let Some(ppid) = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline)
            .trim_end_matches('\0')
            .replace('\0', " ");
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        out.push((pid, ppid, cmdline, cg));
    }
    out
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Free bytes where the platform's data directory is.
fn free_bytes(p: &Platform) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(p.data.path())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Writing until the disk is full fills the sandbox's quota only: "Disk quota exceeded"
/// inside, the node's disk and a neighbour untouched, the event recorded, and everything
/// given back when the sandbox goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_until_full_stops_at_the_quota_inside_only() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let sb = c
        .create(&CreateSandbox {
            image: "host".into(),
            disk: Some("64Mi".parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        sb.info().await.unwrap().resources.disk,
        Some("64Mi".parse().unwrap())
    );
    let neighbour = host_sandbox(&p).await;
    let before = free_bytes(&p);
    let (_, out, err) = run(
        &sb,
        "dd if=/dev/zero of=$HOME/fill bs=1M count=512 2>&1; (echo x > /tmp/more) 2>&1; df -k / | tail -1",
        false,
    )
    .await;
    assert!(out.contains("Disk quota exceeded"), "{out}{err}");
    let written = before.saturating_sub(free_bytes(&p));
    assert!(
        written < 80 << 20,
        "the node lost {written} bytes to a sandbox with a 64Mi quota"
    );
    // Root in the sandbox is held to it too (no CAP_SYS_RESOURCE).
    let (_, out, _) = run(
        &sb,
        "(dd if=/dev/zero of=/root/more bs=1M count=64) 2>&1 | tail -1",
        true,
    )
    .await;
    assert!(out.contains("Disk quota exceeded"), "{out}");
    // The neighbour writes as usual.
    let (code, _, err) = run(
        &neighbour,
        "dd if=/dev/zero of=$HOME/f bs=1M count=100 2>&1",
        false,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    // Uploads are held to it as well.
    let up = sb.write_file("/home/user/upload", vec![0u8; 8 << 20]).await;
    let e = up
        .expect_err("an upload past the quota succeeded")
        .to_string();
    assert!(e.contains("quota exceeded"), "{e}");
    let ev = events_until(
        &p,
        sb.id().as_str(),
        warren_sdk::EventKind::DiskQuota,
        |e| !e.is_empty(),
    )
    .await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    sb.kill().await.unwrap();
    neighbour.kill().await.unwrap();
    p.assert_clean();
}

/// A static busybox, from the host (Debian's busybox or busybox-static).
fn busybox() -> std::path::PathBuf {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
        .expect("busybox is installed (make test installs busybox-static)")
}

/// Imports a tiny image (busybox as /bin/sh, /usr/bin/python3 a script) named `name`.
fn import_busybox_image(p: &Platform, name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    for dir in ["bin", "usr/bin", "usr/local/bin", "etc", "home/user", "tmp"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::copy(busybox(), root.join("bin/busybox")).unwrap();
    for tool in [
        "sh", "cat", "echo", "id", "ls", "chmod", "cp", "ln", "rm", "grep", "mkdir",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).unwrap();
    }
    std::fs::write(
        root.join("usr/bin/python3"),
        "#!/bin/sh\necho pristine python\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("usr/bin/python3"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(root.join("etc/grader.conf"), "pristine\n").unwrap();
    let out = p.cli(&["image", "import", root.to_str().unwrap(), "--name", name]);
    assert!(out.status.success(), "{out:?}");
    d
}

/// The paper's incident: the agent (even as root) overwrites /bin/sh, plants a python3 earlier
/// in PATH, edits /etc; the grader still runs the pristine programs and reads the pristine
/// /etc, while it sees the workspace the agent left; the agent cannot signal or read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grader_runs_the_pristine_image_and_sees_the_workspace() {
    require_root!();
    let p = Platform::start_with(Some("[node]\nlayer_idle_unmount = 1\n"));
    let _img = import_busybox_image(&p, "t/busybox:1");
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "t/busybox:1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let grade = |cmd: &str| {
        let sb = sb.clone();
        let req = ExecRequest {
            role: Some(warren_sdk::Role::Grader),
            ..shell(cmd)
        };
        async move { sb.exec(&req).await.unwrap() }
    };
    // The agent, as root: a fake shell, a planted python3 first in PATH, edited /etc.
    let (code, _, err) = run(
        &sb,
        "rm /bin/sh && printf '#!/bin/busybox sh\\necho PWNED\\n' > /bin/sh && chmod 755 /bin/sh && \
         printf '#!/bin/busybox sh\\necho planted\\n' > /usr/local/bin/python3 && chmod 755 /usr/local/bin/python3 && \
         echo tampered > /etc/grader.conf && echo 42 > /home/user/answer && \
         /bin/busybox mkdir -p /workspace && echo made-later > /workspace/late",
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(run(&sb, "/bin/sh -c 'echo x'", false).await.1, "PWNED\n");
    // From here on the agent's own shell is busybox's (its /bin/sh is the fake).
    let agent = |cmd: String, root: bool| {
        let sb = sb.clone();
        async move {
            let r = sb
                .exec(&ExecRequest {
                    user: root.then(|| "root".into()),
                    ..warren_sdk::argv(["/bin/busybox", "sh", "-c", &cmd])
                })
                .await
                .unwrap();
            r.stdout
        }
    };
    let r =
        grade("id -u; cat /etc/grader.conf; python3; cat /home/user/answer /workspace/late").await;
    assert_eq!(r.status.exit_code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "61000\npristine\npristine python\n42\nmade-later\n"
    );
    // Its own writes stay in its own layer (the agent's /etc is not changed back).
    grade("echo graded > /etc/grader.conf").await;
    assert_eq!(
        agent("cat /etc/grader.conf".into(), false).await,
        "tampered\n"
    );
    // A link planted where a workspace should be does not choose what the grader sees.
    agent("rm -rf /workspace && ln -s /etc /workspace".into(), true).await;
    let r = grade("cat /workspace/grader.conf").await;
    assert_eq!(
        r.stdout, "",
        "the grader followed the agent's link: {}",
        r.stdout
    );
    // The agent cannot reach the grader's processes: signal, ptrace, or read them.
    let bg = sb
        .start_process(&ExecRequest {
            role: Some(warren_sdk::Role::Grader),
            ..warren_sdk::argv(["/bin/busybox", "sleep", "30"])
        })
        .await
        .unwrap();
    let out = agent(
        format!(
            "kill -9 {pid} 2>&1; cat /proc/{pid}/environ 2>&1; ls /proc/{pid}/fd 2>&1 | head -1; echo done",
            pid = bg.pid
        ),
        true,
    )
    .await;
    assert!(
        out.matches("ermission denied").count() >= 2 || out.matches("not permitted").count() >= 1,
        "{out}"
    );
    assert!(sb.process(bg.process_id).await.unwrap().running, "{out}");
    // Nor enter the pristine layers' directory.
    let out = agent("ls /dev/.warren 2>&1".into(), true).await;
    assert!(out.contains("ermission denied"), "{out}");
    // A grader command takes no user.
    let e = sb
        .exec(&ExecRequest {
            role: Some(warren_sdk::Role::Grader),
            user: Some("root".into()),
            ..shell("true")
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("leave user out"), "{e}");
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// A builder's commit: the sandbox stays frozen for the whole copy (an exec sent meanwhile
/// waits; it cannot thaw it), links the sandbox planted are copied as links (never followed on
/// the host), and the live layer keeps its attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_holds_the_sandbox_frozen_and_follows_no_planted_link() {
    require_root!();
    let p = Platform::start_with(Some("[node]\nlayer_idle_unmount = 1\n"));
    let _img = import_busybox_image(&p, "t/busybox:1");
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "t/busybox:1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let secret = p.data.path().join("host-secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    // Links to host paths (meaningless inside, dangerous if the host followed them), and a
    // directory the overlay marks opaque (it replaced the image's /usr/local).
    let (code, _, err) = run(
        &sb,
        &format!(
            "ln -s {} /home/user/link && ln -s /proc/1/root /home/user/root-link && \
             rm -rf /usr/local && mkdir /usr/local && echo new > /usr/local/conf && echo data > /home/user/file && \
             echo changed >> /etc/grader.conf",
            secret.display()
        ),
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let upper = std::fs::canonicalize(
        p.state_dir()
            .join("sandboxes")
            .join(sb.id().as_str())
            .join("upper"),
    )
    .unwrap();
    let opaque = |dir: &std::path::Path| {
        let mut v = [0u8; 4];
        rustix::fs::lgetxattr(dir, "trusted.overlay.opaque", &mut v).is_ok()
    };
    assert!(
        opaque(&upper.join("usr/local")),
        "the test needs an opaque directory"
    );
    // A copied-up directory carries the overlay's bookkeeping (origin, impure).
    let attrs_before = list_xattrs(&upper.join("etc"));
    assert!(
        attrs_before
            .iter()
            .any(|a| a.starts_with("trusted.overlay.")),
        "the test needs overlay attributes: {attrs_before:?}"
    );

    // A layer big enough that the copy takes a while.
    let (code, _, err) = run(
        &sb,
        "dd if=/dev/urandom of=/home/user/big bs=1M count=8 2>&1 >/dev/null",
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let committer = {
        let sb = sb.clone();
        tokio::spawn(async move {
            let r = sb.commit("t/committed:1").await;
            (r, std::time::Instant::now())
        })
    };
    // Once the commit has frozen it, an exec must wait for the commit to end.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sb.info().await.unwrap().state != warren_sdk::SandboxState::Paused {
        assert!(
            std::time::Instant::now() < deadline,
            "the commit never froze the sandbox"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let r = sb
        .exec(&warren_sdk::argv(["/bin/busybox", "true"]))
        .await
        .unwrap();
    let exec_done = std::time::Instant::now();
    let (committed, commit_done) = committer.await.unwrap();
    committed.unwrap();
    assert_eq!(r.status.exit_code, 0);
    // The node answers the commit just after it thaws the sandbox, so the exec (queued
    // behind it) may be answered a moment sooner; had it run during the copy, it would have
    // been answered seconds sooner.
    assert!(
        exec_done + std::time::Duration::from_millis(250) >= commit_done,
        "an exec ran (thawed the sandbox) while its layer was being copied ({:?} early)",
        commit_done - exec_done
    );
    assert_eq!(
        list_xattrs(&upper.join("etc")),
        attrs_before,
        "the live layer lost attributes"
    );
    // The committed layer holds the links as links, and the replaced /usr/local.
    let c = p
        .client()
        .create(&CreateSandbox {
            image: "t/busybox:1,t/committed:1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let r = c
        .exec(&warren_sdk::argv([
            "/bin/busybox",
            "sh",
            "-c",
            "readlink /home/user/link; cat /home/user/link 2>&1; cat /usr/local/conf /home/user/file; ls /usr/local",
        ]))
        .await
        .unwrap();
    assert!(
        r.stdout.starts_with(&format!("{}\n", secret.display())),
        "{}",
        r.stdout
    );
    assert!(
        !r.stdout.contains("host secret"),
        "a link was followed on the host: {}",
        r.stdout
    );
    assert!(r.stdout.ends_with("new\ndata\nconf\n"), "{}", r.stdout);
    sb.kill().await.unwrap();
    c.kill().await.unwrap();
    p.assert_clean();
}

/// Extended attributes of `path` (not following it), sorted.
fn list_xattrs(path: &std::path::Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(path, &mut buf).unwrap_or(0);
    let mut v: Vec<String> = buf[..n]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    v.sort();
    v
}

/// FIFOs and devices planted where the guest reads (/etc/passwd, a requested file) and links
/// into /proc: refused at once, the guest keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_fifos_devices_and_proc_links_do_not_hang_the_guest() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let (code, _, err) = run(
        &sb,
        "mkfifo /tmp/fifo && ln -s /proc/1/fd/1 /tmp/guest-log && ln -s /proc/1/environ /tmp/env",
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let t = std::time::Instant::now();
    // As root too, whose file operations the guest performs with its own privileges.
    let root = sb.as_user("root");
    for path in [
        "/tmp/fifo",
        "/dev/zero",
        "/tmp/guest-log",
        "/tmp/env",
        "/proc/self/environ",
    ] {
        for who in [&sb, &root] {
            let e = who.read_file(path).await.unwrap_err();
            assert!(
                matches!(
                    e.code(),
                    Some(warren_sdk::ErrorCode::InvalidArgument)
                        | Some(warren_sdk::ErrorCode::PermissionDenied)
                ),
                "{path}: {e}"
            );
        }
        let e = root.read_file(path).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(warren_sdk::ErrorCode::InvalidArgument),
            "{path}: {e}"
        );
    }
    let e = sb.write_file("/tmp/fifo", "x").await.unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
    // The user lookup refuses a FIFO at /etc/passwd (the name is then unknown, and the error
    // says why); a numeric uid still runs.
    run(&sb, "rm /etc/passwd && mkfifo /etc/passwd", true).await;
    let e = sb.exec(&shell("id -u")).await.unwrap_err().to_string();
    assert!(
        e.contains("cannot be read") && e.contains("FIFO") && e.contains("numeric uid"),
        "{e}"
    );
    let r = sb
        .exec(&ExecRequest {
            user: Some("1000".into()),
            ..shell("id -u")
        })
        .await
        .unwrap();
    assert_eq!(r.stdout, "1000\n");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "the guest hung"
    );
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// Trees a sandbox makes deep: 100,000 directories removed by the node's teardown (here
/// without the disk pool, so the node walks the tree itself), 10,000 through the files API,
/// without exhausting descriptors or the stack. (This kernel pays for each directory operation
/// in proportion to the depth, so the deep tree takes tens of seconds to make and to remove.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_100000_directories_deep_is_removed() {
    require_root!();
    let p = Platform::start_with(Some("[node]\ndisk_quota = \"off\"\n"));
    let sb = host_sandbox(&p).await;
    let deep = |top: &str, n: u32| {
        format!(
            "import os\nos.chdir(os.path.expanduser('~'))\nos.mkdir('{top}'); os.chdir('{top}')\nfor i in range({n}):\n    os.mkdir('d'); os.chdir('d')\nprint('deep')\n"
        )
    };
    for (top, n) in [("a", 10_000), ("b", 100_000)] {
        let r = sb
            .exec(&ExecRequest {
                timeout: Some(600.0),
                ..warren_sdk::argv(["python3", "-c", &deep(top, n)])
            })
            .await
            .unwrap();
        assert_eq!(r.stdout, "deep\n", "{}", r.stderr);
    }
    // Through the files API.
    sb.remove("/home/user/a", true).await.unwrap();
    assert!(sb.stat("/home/user/a").await.is_err());
    // The other one is left for the teardown.
    sb.kill().await.unwrap();
    p.assert_clean_within(std::time::Duration::from_secs(180));
    assert!(
        p.log().lines().all(|l| !l.contains("removing")),
        "{}",
        p.log()
    );
}

/// A client that sends its headers slowly (or sends a request and then idles) loses its
/// connection after the header-read timeout instead of pinning it; others are served
/// meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_and_idle_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    require_root!();
    let p = Platform::start();
    let addr = p.url.trim_start_matches("http://").to_string();
    let slow = async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(30), s.read_to_end(&mut buf))
            .await
            .expect("the server kept a connection with unfinished headers")
            .unwrap();
    };
    let idle = async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(30), s.read_to_end(&mut buf))
            .await
            .expect("the server kept an idle keep-alive connection")
            .unwrap();
        assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
    };
    let others = async {
        for _ in 0..5 {
            p.client().health().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    };
    tokio::join!(slow, idle, others);
}

/// A sandbox with small limits, for the exhaustion attacks.
async fn small_sandbox(p: &Platform, memory: u64, pids: u32) -> Sandbox {
    p.client()
        .create(&CreateSandbox {
            image: "host".into(),
            memory_limit: Some(warren_sdk::ByteSize(memory)),
            pids: Some(pids),
            ..Default::default()
        })
        .await
        .unwrap()
}

/// The guest agent of `sb` on the host: the parent of a background command of the sandbox.
async fn guest_pid(p: &Platform, sb: &Sandbox, marker: &str) -> i32 {
    sb.start_process(&argv(["sleep", marker])).await.unwrap();
    let want = format!("sleep {marker}");
    for _ in 0..50 {
        if let Some(ppid) = host_processes()
            .into_iter()
            .find(|(_, _, cmdline, cg)| *cmdline == want && cg.contains(&p.cgroup_parent))
            .map(|(_, ppid, _, _)| ppid)
        {
            return ppid;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the background command {want} is not on the host");
}

/// Resident memory of a host process, KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Events of `kind`, waiting up to 15 s (the kernel counters are read every 2 s).
async fn limit_events(
    p: &Platform,
    sb: &Sandbox,
    kind: warren_sdk::EventKind,
) -> Vec<warren_sdk::Event> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let ev = events_until(p, sb.id().as_str(), kind, |e| !e.is_empty()).await;
        if !ev.is_empty() || std::time::Instant::now() > deadline {
            return ev;
        }
    }
}

/// A fork bomb fills its own sandbox's process limit and nothing else: the host and a
/// neighbour keep forking, the bomb dies with its command, the sandbox answers again, and the
/// refused forks are an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stays_in_its_sandbox_and_is_recorded() {
    require_root!();
    let p = Platform::start();
    let sb = small_sandbox(&p, 256 << 20, 64).await;
    let neighbour = host_sandbox(&p).await;
    let bomb = ExecRequest {
        timeout: Some(4.0),
        ..shell("b() { b | b & }; b; sleep 10")
    };
    let run_bomb = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.exec(&bomb).await })
    };
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    // Meanwhile: the neighbour and the host fork as usual.
    let (code, out, _) = run(
        &neighbour,
        "for i in 1 2 3 4 5 6 7 8; do sh -c 'echo $$' & done | wc -l",
        false,
    )
    .await;
    assert_eq!((code, out.trim()), (0, "8"));
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
    let r = run_bomb.await.unwrap();
    // The command timed out (or failed to fork): either way it is over, and so is the bomb,
    // which shares its process group.
    if let Ok(r) = &r {
        assert_ne!(r.status.exit_code, 0, "{r:?}");
    }
    let mut alive = String::new();
    for _ in 0..40 {
        if let Ok(r) = sb
            .exec(&shell("echo alive; ls /proc | grep -c '^[0-9]'"))
            .await
        {
            alive = r.stdout;
            let n: u32 = alive.lines().nth(1).unwrap_or("99").parse().unwrap_or(99);
            if r.status.exit_code == 0 && n <= 4 {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(
        alive.starts_with("alive\n"),
        "the sandbox did not recover: {alive}"
    );
    let n: u32 = alive.lines().nth(1).unwrap().parse().unwrap();
    assert!(
        n <= 4,
        "bomb processes outlived their command: {n} processes"
    );
    let ev = limit_events(&p, &sb, warren_sdk::EventKind::PidsLimit).await;
    assert!(
        ev.iter()
            .any(|e| e.detail == "pids limit 64" && e.count >= 1),
        "{ev:?}"
    );
    assert!(
        limit_events_now(&p, &neighbour, warren_sdk::EventKind::PidsLimit)
            .await
            .is_empty(),
        "the neighbour was charged"
    );
    sb.kill().await.unwrap();
    neighbour.kill().await.unwrap();
    p.assert_clean();
}

/// Events of `kind` as they are now.
async fn limit_events_now(
    p: &Platform,
    sb: &Sandbox,
    kind: warren_sdk::EventKind,
) -> Vec<warren_sdk::Event> {
    events_until(p, sb.id().as_str(), kind, |_| true).await
}

/// Allocating past the memory limit kills the allocating process, not the sandbox: the guest
/// agent and the spawner survive, the sandbox answers, and the kill is an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_exhaustion_kills_the_hog_not_the_sandbox() {
    require_root!();
    let p = Platform::start();
    let sb = small_sandbox(&p, 96 << 20, 256).await;
    let guest = guest_pid(&p, &sb, "4243.4243").await;
    for root in [false, true] {
        let (code, _, err) = run(
            &sb,
            "python3 -c 'b=[]\nwhile True: b.append(bytearray(8<<20))'",
            root,
        )
        .await;
        assert_eq!(
            code, 137,
            "root={root}: the hog was not killed by the kernel: {err}"
        );
    }
    assert_eq!(comm(guest), "warren-guest", "the guest agent was killed");
    // Nor can root in the sandbox make the guest the OOM killer's first choice.
    // (The files are /dev/null in the sandbox: the writes go nowhere.)
    run(
        &sb,
        "echo 1000 > /proc/1/oom_score_adj; echo 15 > /proc/1/oom_adj",
        true,
    )
    .await;
    let score = std::fs::read_to_string(format!("/proc/{guest}/oom_score_adj")).unwrap();
    assert_eq!(score.trim(), "0");
    let (code, out, _) = run(&sb, "echo alive; grep -c . /proc/2/comm", false).await;
    assert_eq!((code, out.as_str()), (0, "alive\n1\n"));
    let ev = limit_events(&p, &sb, warren_sdk::EventKind::OomKill).await;
    assert!(
        ev.iter()
            .any(|e| e.detail.starts_with("memory limit") && e.count >= 1),
        "{ev:?}"
    );
    // No management event: the spawner was not the one killed.
    let m = limit_events_now(&p, &sb, warren_sdk::EventKind::Management).await;
    assert!(
        !m.iter().any(|e| e.detail.starts_with("the spawner exited")),
        "{m:?}"
    );
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// A command that floods its output is cut at `max_output` with the rest drained, the guest
/// agent's memory stays flat, and the cut is an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_flood_is_cut_and_recorded_and_the_guest_stays_small() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let guest = guest_pid(&p, &sb, "4244.4244").await;
    let before = rss_kib(guest);
    let r = sb
        .exec(&ExecRequest {
            max_output: Some(warren_sdk::ByteSize(1 << 20)),
            ..shell(
                "head -c 300M /dev/zero | tr '\\0' y; head -c 300M /dev/zero >&2; echo done >&2",
            )
        })
        .await
        .unwrap();
    assert_eq!(r.status.exit_code, 0, "{}", r.stderr.len());
    assert_eq!(r.stdout.len(), 1 << 20);
    assert!(
        r.status.stdout_truncated && r.status.stderr_truncated,
        "{:?}",
        r.status
    );
    let after = rss_kib(guest);
    assert!(
        after < before + 16 * 1024,
        "the guest grew from {before} to {after} KiB on a 600 MB flood"
    );
    let ev = events_until(
        &p,
        sb.id().as_str(),
        warren_sdk::EventKind::OutputTruncated,
        |e| e.len() >= 2,
    )
    .await;
    let details: Vec<&str> = ev.iter().map(|e| e.detail.as_str()).collect();
    assert!(
        details.contains(&"stdout cut at max_output")
            && details.contains(&"stderr cut at max_output"),
        "{details:?}"
    );
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// Device nodes, immutable files, terminal injection, the host's binaries and setuid copies:
/// each refused to uid 1000 and to root in the sandbox alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_immutable_files_terminal_injection_and_setuid_are_refused() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let bash_before = std::fs::read("/usr/bin/bash").unwrap();
    for root in [false, true] {
        let who = if root { "root" } else { "user" };
        // A block device onto the host's disk, a character device onto its memory.
        let (code, _, err) = run(&sb, "mknod $HOME/sda b 8 0", root).await;
        assert_ne!(code, 0, "{who}: mknod worked");
        // EPERM (no CAP_MKNOD) or EACCES (Landlock grants no device creation).
        assert!(
            err.contains("Operation not permitted") || err.contains("Permission denied"),
            "{who}: {err}"
        );
        let (code, _, _) = run(&sb, "mknod $HOME/mem c 1 1", root).await;
        assert_ne!(code, 0, "{who}: mknod worked");
        // An immutable or append-only file a grader could then not replace.
        let (code, _, err) = run(&sb, "touch $HOME/answer && chattr +i $HOME/answer", root).await;
        assert_ne!(code, 0, "{who}: chattr +i worked");
        assert!(
            err.contains("Operation not permitted") || err.contains("Inappropriate ioctl"),
            "{who}: {err}"
        );
        let (code, _, _) = run(&sb, "rm -f $HOME/answer", root).await;
        assert_eq!(
            code, 0,
            "{who}: the file chattr was tried on stays removable"
        );
        // Typing into a terminal another process reads.
        let (code, out, err) = run(
            &sb,
            "python3 -c 'import fcntl,os,pty,termios\nm,s=pty.openpty()\ntry:\n fcntl.ioctl(s, termios.TIOCSTI, b\"x\"); print(\"injected\")\nexcept OSError as e: print(e.errno)'",
            root,
        )
        .await;
        assert_eq!((code, out.as_str()), (0, "1\n"), "{who}: TIOCSTI: {err}");
        // Swapping extents with another file, and immutable flags through the xattr interface.
        let (code, out, err) = run(
            &sb,
            "python3 -c 'import fcntl\nf=open(\"/tmp/swap-\" + str(__import__(\"os\").getuid()), \"w\")\nfor req in (0xC0B0586D, 0x401C5820):\n try:\n  fcntl.ioctl(f, req, bytearray(256)); print(\"done\")\n except OSError as e: print(e.errno)'",
            root,
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (0, "1\n1\n"),
            "{who}: SWAPEXT/FSSETXATTR: {err}"
        );
        // Sockets onto the kernel's crypto API and onto the host over vsock.
        let (code, out, err) = run(
            &sb,
            "python3 -c 'import socket\nfor fam in (38, 40):\n try:\n  socket.socket(fam, socket.SOCK_SEQPACKET if fam == 38 else socket.SOCK_STREAM); print(\"opened\")\n except OSError as e: print(e.errno)'",
            root,
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (0, "1\n1\n"),
            "{who}: AF_ALG/AF_VSOCK: {err}"
        );
        // The host's own binaries are read-only, whoever asks.
        let (code, _, _) = run(&sb, "echo pwned > /usr/bin/bash", root).await;
        assert_ne!(code, 0, "{who}: /usr/bin/bash was written");
        let (code, _, _) = run(&sb, "cp /bin/sh /usr/bin/planted", root).await;
        assert_ne!(code, 0, "{who}: a file was planted in the host's /usr");
    }
    // chattr and TIOCSTI met the filter (the ioctl is refused by request number).
    let ev = events_until(&p, sb.id().as_str(), warren_sdk::EventKind::Seccomp, |e| {
        e.iter().any(|e| e.detail == "ioctl" && e.count >= 8)
    })
    .await;
    assert!(
        ev.iter().any(|e| e.detail == "ioctl" && e.count >= 8),
        "{ev:?}"
    );
    assert_eq!(std::fs::read("/usr/bin/bash").unwrap(), bash_before);
    assert!(!std::path::Path::new("/usr/bin/planted").exists());
    // A setuid-root copy made by root in the sandbox gives uid 1000 nothing: no_new_privs.
    let (code, _, err) = run(
        &sb,
        "cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id && ls -ld /tmp",
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&sb, "/tmp/suid-id -u; /tmp/suid-id -ru", false).await;
    assert_eq!((code, out.as_str()), (0, "1000\n1000\n"), "{err}");
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// An agent cannot hold the spawner up (stopping each new command between its change of uid
/// and its exec, when it is the agent's to signal), nor break it with a command line that
/// needs megabytes or an error message longer than an answer: the sandbox keeps answering,
/// the spawner stays, and no command is started twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spawner_cannot_be_held_up_or_broken() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    // Every new pid, signalled as soon as it exists: the kill succeeds from the moment the
    // command is uid 1000's, which (as the agent hopes) is before its exec.
    let stopper = r#"
import os, signal, time
end = time.time() + 60
me = os.getpid()
hits = 0
while time.time() < end and not os.path.exists("/tmp/enough"):
    last = int(open("/proc/sys/kernel/ns_last_pid").read())
    for pid in (last, last + 1):
        if pid > 2 and pid != me:
            try:
                os.kill(pid, signal.SIGSTOP); hits += 1
            except OSError:
                pass
print(hits)
"#;
    let bg = sb
        .start_process(&argv(["python3", "-c", stopper]))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for _ in 0..10 {
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(15),
            sb.exec(&ExecRequest {
                timeout: Some(1.0),
                ..argv(["true"])
            }),
        )
        .await
        .expect("an exec was held up: the guest waits on a stopped child");
        r.unwrap();
        // The sandbox answers meanwhile.
        tokio::time::timeout(
            std::time::Duration::from_secs(15),
            sb.read_file("/etc/hostname"),
        )
        .await
        .expect("the guest stopped answering")
        .unwrap();
    }
    sb.write_file("/tmp/enough", "").await.unwrap();
    let done = sb
        .wait_process(bg.process_id, Some(std::time::Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(!done.running);
    let (code, out, err) = run(&sb, "pkill -CONT -u user; cat /proc/2/comm", false).await;
    let m = limit_events_now(&p, &sb, warren_sdk::EventKind::Management).await;
    assert_eq!((code, out.as_str()), (0, "warren-spawner\n"), "{err} {m:?}");
    // A program name longer than any answer may be: a clear error, the spawner stays.
    let long = format!("/{}", "a".repeat(70_000));
    let r = sb.exec(&argv([long.as_str()])).await.unwrap();
    assert!(
        r.status.exit_code == 126 || r.status.exit_code == 127,
        "{:?}",
        r.status
    );
    assert!(
        r.stderr.contains("too long") && r.stderr.len() < 4096,
        "{}",
        &r.stderr[r.stderr.len().saturating_sub(400)..]
    );
    // A command line of 960 KB whose JSON is 5.8 MB: it runs, through the spawner.
    let mut args = vec![
        "python3".to_string(),
        "-c".into(),
        "import sys; print(sum(map(len, sys.argv[1:])))".into(),
    ];
    args.extend((0..8).map(|_| "\u{1}".repeat(120_000)));
    let r = sb.exec(&argv(args)).await.unwrap();
    assert_eq!(
        (r.status.exit_code, r.stdout.as_str()),
        (0, "960000\n"),
        "{}",
        r.stderr
    );
    let (code, out, _) = run(&sb, "cat /proc/2/comm", false).await;
    assert_eq!((code, out.as_str()), (0, "warren-spawner\n"));
    let m = limit_events_now(&p, &sb, warren_sdk::EventKind::Management).await;
    assert!(
        !m.iter().any(|e| e.detail.starts_with("the spawner exited")),
        "{m:?}"
    );
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// A directory download as root (the guest reads with its own identity, which could read the
/// guest's `/proc` files) packs what the agent planted as what it is: links as links, FIFOs as
/// FIFOs, and a file swapped for a link to `/proc/1/environ` between the look and the read is
/// never read through the link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_download_reads_no_planted_link_or_fifo() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let (code, _, err) = run(
        &sb,
        "mkdir -p /tmp/out && cd /tmp/out && mkfifo fifo && ln -s /proc/1/environ env && \
         for i in $(seq 1 200); do echo x > f$i; done && chmod -R a+rwX /tmp/out",
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    // Each file swapped, over and over, for a link to the guest's environment and back.
    let swapper = r#"
import os, time
os.chdir("/tmp/out")
end = time.time() + 30
while time.time() < end and not os.path.exists("/tmp/enough"):
    for i in range(1, 201):
        try:
            os.symlink("/proc/1/environ", f"l{i}")
            os.rename(f"l{i}", f"f{i}")
            with open(f"n{i}", "w") as f:
                f.write("x\n")
            os.rename(f"n{i}", f"f{i}")
        except OSError:
            pass
"#;
    let bg = sb
        .start_process(&argv(["python3", "-c", swapper]))
        .await
        .unwrap();
    let url = format!(
        "{}/v1/sandboxes/{}/files/tar?path=/tmp/out&user=root",
        p.url,
        sb.id()
    );
    let mut links = 0;
    for _ in 0..20 {
        let resp = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            p.http().get(&url).bearer_auth(&p.key).send(),
        )
        .await
        .expect("the download hung")
        .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let bytes = tokio::time::timeout(std::time::Duration::from_secs(30), resp.bytes())
            .await
            .expect("the download hung")
            .unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            let kind = e.header().entry_type();
            if name.ends_with("fifo") {
                assert_eq!(kind, tar::EntryType::Fifo, "{name}");
            }
            if kind == tar::EntryType::Symlink {
                links += 1;
                continue;
            }
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            assert!(
                data.is_empty() || data == b"x\n",
                "{name} ({kind:?}) was read through a planted link: {:?}",
                String::from_utf8_lossy(&data[..data.len().min(200)])
            );
        }
    }
    assert!(links >= 20, "the planted link was not packed as a link");
    sb.write_file("/tmp/enough", "").await.unwrap();
    let _ = sb
        .wait_process(bg.process_id, Some(std::time::Duration::from_secs(30)))
        .await;
    sb.kill().await.unwrap();
    p.assert_clean();
}

/// Tar uploads whose entries climb out through a link the archive made a moment before, hard
/// links out of the target, or device nodes: each a 400 that names the entry, nothing written
/// outside, and nothing of the failed upload left behind. Uploaded as root too (the guest
/// writes with its own identity then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_uploads_go_through_no_link_and_leave_nothing_when_refused() {
    require_root!();
    let p = Platform::start();
    let sb = host_sandbox(&p).await;
    let (code, _, err) = run(
        &sb,
        "mkdir -p /tmp/victim && echo safe > /tmp/victim/f",
        true,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let file = |b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    let link = |b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, name: &str, to: &str| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        b.append_link(&mut h, name, to).unwrap();
    };
    type Build = Box<dyn Fn(&mut tar::Builder<Vec<u8>>)>;
    let cases: Vec<(&str, Build)> = vec![
        (
            "through a link it made",
            Box::new(move |b| {
                file(b, "ok.txt", b"fine\n");
                link(b, tar::EntryType::Symlink, "out", "/tmp/victim");
                file(b, "out/f", b"pwned\n");
            }),
        ),
        (
            "a hard link out",
            Box::new(move |b| {
                file(b, "ok.txt", b"fine\n");
                link(b, tar::EntryType::Link, "hl", "../../../tmp/victim/f");
            }),
        ),
        (
            "an absolute hard link",
            Box::new(move |b| {
                file(b, "ok.txt", b"fine\n");
                link(b, tar::EntryType::Link, "hl", "/tmp/victim/f");
            }),
        ),
        (
            "a device node",
            Box::new(move |b| {
                file(b, "ok.txt", b"fine\n");
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Block);
                h.set_device_major(8).unwrap();
                h.set_device_minor(0).unwrap();
                h.set_size(0);
                h.set_mode(0o666);
                h.set_cksum();
                b.append_data(&mut h, "sda", &[][..]).unwrap();
            }),
        ),
    ];
    for user in ["user", "root"] {
        for (what, build) in &cases {
            let mut b = tar::Builder::new(Vec::new());
            build(&mut b);
            let archive = b.into_inner().unwrap();
            let url = format!(
                "{}/v1/sandboxes/{}/files/tar?path=/tmp/up-{user}&user={user}",
                p.url,
                sb.id()
            );
            let resp = p
                .http()
                .put(&url)
                .bearer_auth(&p.key)
                .body(archive)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            assert_eq!(status, 400, "{what} as {user}: {text}");
            let (_, out, _) = run(
                &sb,
                &format!("cat /tmp/victim/f; ls -A /tmp/up-{user}"),
                true,
            )
            .await;
            assert_eq!(
                out, "safe\n",
                "{what} as {user}: left behind or written outside"
            );
        }
    }
    // What is allowed still works: a read-only directory with entries, links that point
    // anywhere, hard links inside, FIFOs.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o555);
    h.set_size(0);
    h.set_cksum();
    b.append_data(&mut h, "ro/", &[][..]).unwrap();
    file(&mut b, "ro/f", b"inside\n");
    link(&mut b, tar::EntryType::Symlink, "anywhere", "/etc/hostname");
    link(&mut b, tar::EntryType::Link, "again", "ro/f");
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Fifo);
    h.set_mode(0o644);
    h.set_size(0);
    h.set_cksum();
    b.append_data(&mut h, "pipe", &[][..]).unwrap();
    let url = format!(
        "{}/v1/sandboxes/{}/files/tar?path=/tmp/good",
        p.url,
        sb.id()
    );
    let resp = p
        .http()
        .put(&url)
        .bearer_auth(&p.key)
        .body(b.into_inner().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "{}",
        resp.text().await.unwrap()
    );
    let (_, out, err) = run(
        &sb,
        "cd /tmp/good && stat -c '%n %a %U %F' ro ro/f pipe && cat again && readlink anywhere",
        false,
    )
    .await;
    assert_eq!(
        out,
        "ro 555 user directory\nro/f 644 user regular file\npipe 644 user fifo\ninside\n/etc/hostname\n",
        "{err}"
    );
    sb.kill().await.unwrap();
    p.assert_clean();
}

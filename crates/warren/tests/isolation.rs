//! Isolation as seen from inside a sandbox: no host processes, no mounts, no capabilities, no
//! way to find or reach the guest agent's control socket, masked /proc, loopback-only network.

mod common;

use common::Platform;
use warren_sdk::{CreateSandbox, ExecRequest, shell};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_seen_from_inside() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let sb = c
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let other = c
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    other
        .write_file("/tmp/secret", "other sandbox")
        .await
        .unwrap();
    let run = |cmd: &str, root: bool| {
        let req = ExecRequest {
            user: root.then(|| "root".to_string()),
            ..shell(cmd)
        };
        let sb = sb.clone();
        async move { sb.exec(&req).await.unwrap() }
    };

    // Processes: only the sandbox's own (its PID 1 is the guest agent).
    let r = run("ps -eo pid,comm --no-headers", false).await;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines.len() <= 4, "host processes visible: {}", r.stdout);
    assert!(lines[0].trim().starts_with("1 "), "{}", r.stdout);
    assert!(
        !r.stdout.contains("warren up") && !r.stdout.contains("cargo"),
        "{}",
        r.stdout
    );

    // Agent commands: uid 1000, no capabilities, no_new_privs.
    let r = run(
        "id -u; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status",
        false,
    )
    .await;
    assert_eq!(
        r.stdout,
        "1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\n"
    );

    // Mounting fails, as the user and as root.
    for root in [false, true] {
        let r = run("mount -t tmpfs none /mnt", root).await;
        assert_ne!(r.status.exit_code, 0, "mount succeeded (root={root})");
    }
    // Root without capabilities cannot change the read-only system or load anything.
    let r = run("touch /usr/bin/pwned", true).await;
    assert_ne!(r.status.exit_code, 0);
    let r = run("echo 1 > /proc/sys/kernel/sysrq", true).await;
    assert_ne!(r.status.exit_code, 0);

    // The control socket: not in the file system, not in /proc, not reachable.
    let sock_name = format!("{}.sock", sb.id());
    let r = run(&format!("find / -xdev -name '{sock_name}' 2>/dev/null; find / -type s 2>/dev/null | grep -v '^/proc' ; ls /proc/1/fd 2>&1; cat /proc/1/environ 2>&1; cat /proc/1/maps 2>&1 | head -1; cat /proc/net/unix"), true).await;
    assert!(!r.stdout.contains(&sock_name), "{}", r.stdout);
    assert!(
        r.stdout.contains("Permission denied"),
        "PID 1's fds should be closed to root in the sandbox: {}",
        r.stdout
    );
    assert!(
        !r.stdout.contains(p.data.path().to_str().unwrap()),
        "a host path leaked: {}",
        r.stdout
    );
    let r = run("cat /proc/self/mountinfo", false).await;
    assert!(
        !r.stdout.contains(p.data.path().to_str().unwrap()),
        "mountinfo shows host paths: {}",
        r.stdout
    );
    // Nor can ptrace reach it.
    let r = run(
        "python3 -c 'import ctypes; l=ctypes.CDLL(None); print(l.ptrace(16, 1, 0, 0))'",
        true,
    )
    .await;
    assert_eq!(
        r.stdout.trim(),
        "-1",
        "PTRACE_ATTACH to PID 1 must fail: {}",
        r.stdout
    );

    // Masked /proc entries cannot be opened; masked directories are empty and read-only.
    let r = run(
        "for f in /proc/keys /proc/timer_list /proc/sched_debug /proc/kcore; do [ -e $f ] && cat $f > /dev/null 2>&1 && echo $f; done; \
         ls -A /proc/acpi 2>/dev/null | wc -l; touch /proc/acpi/x 2>&1 | grep -c Read-only",
        true,
    )
    .await;
    assert_eq!(r.stdout, "0\n1\n", "masked entries must not open");

    // Network: loopback only.
    let r = run(
        "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '",
        false,
    )
    .await;
    assert_eq!(r.stdout, "lo\n");
    let r = run("python3 -c \"import socket; s=socket.socket(); s.settimeout(1); s.connect(('127.0.0.1', 1))\" 2>&1 | tail -1", false).await;
    assert!(
        r.stdout.contains("Connection refused"),
        "loopback should answer (refused): {}",
        r.stdout
    );

    // Other sandboxes' files are not visible; host name is the sandbox's own.
    let r = run("cat /tmp/secret 2>&1; hostname", false).await;
    assert!(
        r.stdout.contains("No such file") && r.stdout.ends_with("sandbox\n"),
        "{}",
        r.stdout
    );

    // /usr is read-only even though it is the host's.
    let r = run("touch /usr/x 2>&1", true).await;
    assert!(r.stdout.contains("Read-only file system"), "{}", r.stdout);
}

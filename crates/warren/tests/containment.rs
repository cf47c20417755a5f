//! Containment, tried as an agent would from inside a sandbox: the paper's cheating incidents
//! and the classic escapes, each asserting that it is contained (and, where the platform
//! records it, the incident event).

mod common;

use common::Platform;
use warren_sdk::{CreateSandbox, ExecRequest, Sandbox, shell};

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

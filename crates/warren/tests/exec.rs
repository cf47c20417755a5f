//! Exec semantics: exit codes, signals, timeouts, stdin, env, cwd, user, output caps,
//! streaming, and background processes.

mod common;

use std::collections::BTreeMap;

use common::Platform;
use futures_util::StreamExt;
use warren_sdk::{
    ByteSize, CreateSandbox, ExecEvent, ExecRequest, ExecResultExt, argv, set_stdin, shell,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_semantics() {
    require_root!();
    let p = Platform::start();
    let env: BTreeMap<String, String> = [("SANDBOX_WIDE".to_string(), "yes".to_string())].into();
    let sb = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            env,
            ..Default::default()
        })
        .await
        .unwrap();

    // Exit codes, as a shell would report them.
    assert_eq!(sb.exec(&shell("exit 3")).await.unwrap().status.exit_code, 3);
    assert_eq!(sb.exec(&argv(["true"])).await.unwrap().status.exit_code, 0);
    let r = sb.exec(&argv(["/etc/passwd"])).await.unwrap();
    assert_eq!(r.status.exit_code, 126, "{r:?}");

    // Signals: exit code 128+n and the signal reported.
    let r = sb.exec(&shell("kill -TERM $$")).await.unwrap();
    assert_eq!((r.status.exit_code, r.status.signal), (143, Some(15)));

    // Timeouts kill the whole process group.
    let t0 = std::time::Instant::now();
    let r = sb
        .exec(&ExecRequest {
            timeout: Some(0.5),
            ..shell("sleep 30 & sleep 30; echo never")
        })
        .await
        .unwrap();
    assert!(r.status.timed_out && r.status.signal == Some(9), "{r:?}");
    assert!(t0.elapsed().as_secs() < 10);
    let left = sb
        .exec(&shell("ps -eo comm | grep -c '^sleep$' || true"))
        .await
        .unwrap();
    assert_eq!(left.stdout.trim(), "0", "sleepers survived the timeout");

    // stdin, env (sandbox-wide and per command), cwd.
    let mut req = shell("cat; echo; echo $SANDBOX_WIDE $ONE; pwd");
    req.env.insert("ONE".into(), "1".into());
    req.cwd = Some("/tmp".into());
    set_stdin(&mut req, b"from stdin".to_vec());
    let r = sb.exec(&req).await.unwrap();
    assert_eq!(r.stdout, "from stdin\nyes 1\n/tmp\n");
    let r = sb
        .exec(&ExecRequest {
            cwd: Some("/no/such/dir".into()),
            ..argv(["true"])
        })
        .await;
    assert!(r.is_err(), "a missing cwd is an error");
    // A long command line (800 KB, more than a socket carries by default) runs; one past the
    // node's bound is a 400 that says so, and the sandbox goes on.
    let mut long = vec!["sh".to_string(), "-c".into(), "echo $#".into(), "x".into()];
    long.extend((0..8000).map(|i| format!("{i:0>100}")));
    let r = sb.exec(&argv(long.clone())).await.unwrap();
    assert_eq!(r.stdout, "8000\n", "{r:?}");
    long.extend((0..3000).map(|i| format!("{i:0>100}")));
    let e = sb.exec(&argv(long)).await.unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
    assert_eq!(sb.exec(&argv(["true"])).await.unwrap().status.exit_code, 0);
    // Binary stdin and output round-trip.
    let mut req = argv(["cat"]);
    set_stdin(&mut req, vec![0, 255, 1, 254]);
    let r = sb.exec(&req).await.unwrap();
    assert_eq!(r.stdout_data().unwrap(), vec![0, 255, 1, 254]);

    // Users: default user (uid 1000, home), root on request (without capabilities), numeric uid.
    let r = sb.exec(&shell("id -u; echo $HOME; pwd")).await.unwrap();
    assert_eq!(r.stdout, "1000\n/home/user\n/home/user\n");
    let r = sb
        .exec(&ExecRequest {
            user: Some("root".into()),
            ..shell("id -u; grep CapEff /proc/self/status")
        })
        .await
        .unwrap();
    assert_eq!(r.stdout, "0\nCapEff:\t0000000000000000\n", "{r:?}");
    let r = sb
        .exec(&ExecRequest {
            user: Some("4242".into()),
            ..argv(["id", "-u"])
        })
        .await
        .unwrap();
    assert_eq!(r.stdout, "4242\n");
    assert!(
        sb.exec(&ExecRequest {
            user: Some("nobody-here".into()),
            ..argv(["true"])
        })
        .await
        .is_err()
    );

    // Output cap: kept bytes stop at the cap, the total is counted, truncation reported.
    let r = sb
        .exec(&ExecRequest {
            max_output: Some(ByteSize(1000)),
            ..shell("head -c 100000 /dev/zero | tr '\\0' a; echo err >&2")
        })
        .await
        .unwrap();
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.status.stdout_truncated && !r.status.stderr_truncated);
    assert_eq!(r.status.stdout_bytes, 100000);
    assert_eq!(r.stderr, "err\n");

    // A sandbox killed while a command runs: the command's caller learns it is gone (410).
    let doomed = p
        .client()
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let d2 = doomed.clone();
    let running = tokio::spawn(async move { d2.exec(&argv(["sleep", "30"])).await });
    // Killed once the command runs (before, the exec would find no sandbox: a 404).
    common::poll_until(
        std::time::Duration::from_secs(20),
        "the command never ran",
        async || {
            let ps = doomed.processes().await.unwrap();
            match ps
                .iter()
                .any(|p| p.running && p.argv.first().is_some_and(|a| a == "sleep"))
            {
                true => Ok(()),
                false => Err(format!("{ps:?}")),
            }
        },
    )
    .await;
    doomed.kill().await.unwrap();
    let e = running.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Some(warren_sdk::ErrorCode::SandboxGone), "{e}");

    // Zombies are reaped: orphans of a finished command do not pile up.
    sb.exec(&shell(
        "for i in 1 2 3 4 5; do (sleep 0.01 &) ; done; sleep 0.2",
    ))
    .await
    .unwrap();
    let z = sb
        .exec(&shell("ps -eo stat | grep -c '^Z' || true"))
        .await
        .unwrap();
    assert_eq!(z.stdout.trim(), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_exec_and_background_processes() {
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

    // Streaming: start, output chunks as they come, exit last.
    let mut events = sb
        .exec_stream(&shell("echo one; sleep 0.2; echo two >&2; exit 4"))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        seen.push(ev.unwrap());
    }
    assert!(
        matches!(seen.first(), Some(ExecEvent::Start { .. })),
        "{seen:?}"
    );
    match seen.last() {
        Some(ExecEvent::Exit(s)) => assert_eq!(s.exit_code, 4),
        other => panic!("last event {other:?}"),
    }
    let text: String = seen
        .iter()
        .filter_map(|e| match e {
            ExecEvent::Stdout { data } | ExecEvent::Stderr { data } => {
                Some(String::from_utf8(warren_sdk::decode_data(data).unwrap()).unwrap())
            }
            _ => None,
        })
        .collect();
    assert_eq!(text, "one\ntwo\n");

    // Background: start, list, re-attach to output, signal, wait.
    let bg = sb
        .start_process(&shell("echo started; exec sleep 60"))
        .await
        .unwrap();
    assert!(bg.running);
    let list = sb.processes().await.unwrap();
    assert!(
        list.iter()
            .any(|p| p.process_id == bg.process_id && p.running)
    );
    let waited = sb
        .wait_process(bg.process_id, Some(std::time::Duration::from_millis(200)))
        .await
        .unwrap();
    assert!(waited.running, "still running after a short wait");
    sb.signal_process(bg.process_id, "TERM").await.unwrap();
    let done = sb.wait_process(bg.process_id, None).await.unwrap();
    assert_eq!(done.exit.as_ref().unwrap().signal, Some(15));
    // Its output is still there to read after the fact.
    let mut out = sb.process_output(bg.process_id).await.unwrap();
    let mut got = Vec::new();
    while let Some(ev) = out.next().await {
        if let ExecEvent::Stdout { data } = ev.unwrap() {
            got.extend(warren_sdk::decode_data(&data).unwrap());
        }
    }
    assert_eq!(got, b"started\n");
    sb.forget_process(bg.process_id).await.unwrap();
    assert!(sb.process(bg.process_id).await.is_err());
}

/// The guest agent of `sb` on the host (the parent of a background command of the sandbox).
async fn guest_pid(p: &Platform, sb: &warren_sdk::Sandbox) -> i32 {
    let marker = format!("{}", 7_000_000 + std::process::id());
    sb.start_process(&argv(["sleep", marker.as_str()]))
        .await
        .unwrap();
    let want = format!("sleep\0{marker}\0");
    for _ in 0..100 {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let dir = e.path();
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            let cgroup = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
            if cmdline == want.as_bytes() && cgroup.contains(&p.cgroup_parent) {
                return status_field(&dir.join("status"), "PPid:") as i32;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the background command sleep {marker} is not on the host");
}

/// A number from a /proc status file (the first word after `field`).
fn status_field(path: &std::path::Path, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {}", path.display()))
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Runs `cmd` until it prints `want`, for up to `secs` seconds; returns what it printed last.
async fn until_prints(sb: &warren_sdk::Sandbox, cmd: &str, want: &str, secs: u64) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let r = sb.exec(&shell(cmd)).await.unwrap();
        let out = format!("{}{}", r.stdout, r.stderr);
        if r.stdout.trim() == want || std::time::Instant::now() > deadline {
            return out.trim().to_string();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A server started in the background by one exec keeps answering in later ones: the exec
/// returns as soon as its shell exits, and the pipes the server inherited stay open after it
/// (a server whose log writes fail drops the request: `RemoteDisconnected` in the client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_server_outlives_its_exec() {
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
    // The server never exits: an exec that waited for it would hit its timeout.
    let mut req = shell("python3 -m http.server 8000 --bind 127.0.0.1 &");
    req.timeout = Some(30.0);
    let r = sb.exec(&req).await.unwrap();
    assert_eq!(r.status.exit_code, 0, "{r:?}");
    assert!(
        !r.status.timed_out,
        "the exec waited for its background child"
    );
    let ask = |n: usize| {
        format!(
            "python3 -c '
import urllib.request
ok = 0
for _ in range({n}):
    ok += urllib.request.urlopen(\"http://127.0.0.1:8000/\", timeout=5).status == 200
print(ok)' 2>&1"
        )
    };
    // Up once it answers one request (python takes a moment to start).
    let first = until_prints(&sb, &ask(1), "1", 20).await;
    assert_eq!(first, "1", "the server never answered");
    // Each request is logged to the server's stderr: the pipe of the exec that started it.
    for round in 0..3 {
        let r = sb.exec(&shell(ask(5))).await.unwrap();
        assert_eq!(r.stdout.trim(), "5", "round {round}: {r:?}");
    }
}

/// A background command that writes much after its exec returned keeps running to its end
/// (it is not killed by SIGPIPE), the guest discards that output instead of keeping it, and
/// the pipes are closed once their last writer exits. Past the bound of pipes drained at
/// once, the oldest are closed: the guest's descriptors stay bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_output_after_the_exec_is_drained_within_bounds() {
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
    let guest = guest_pid(&p, &sb).await;
    let fds_before = open_fds(guest);

    // 512 MiB to stdout and 64 MiB to stderr, all after the exec has returned.
    // An exec that waited for its background children would have their output in its own.
    let r = sb
        .exec(&shell(
            "(sleep 1; head -c 536870912 /dev/zero && echo ok > /tmp/out-done) &
             (sleep 1; head -c 67108864 /dev/zero >&2 && echo ok > /tmp/err-done) &
             echo started",
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout, "started\n", "{r:?}");
    assert_eq!(r.stderr, "", "the exec waited for its background children");
    let done = until_prints(
        &sb,
        "cat /tmp/out-done /tmp/err-done 2>/dev/null | tr -d '\\n'",
        "okok",
        120,
    )
    .await;
    assert_eq!(done, "okok", "a background writer did not get to its end");
    let peak_kib = status_field(
        std::path::Path::new(&format!("/proc/{guest}/status")),
        "VmHWM:",
    );
    assert!(
        peak_kib < 64 * 1024,
        "the guest's resident memory peaked at {peak_kib} KiB while 576 MiB passed through"
    );
    // Their pipes are closed once the writers are gone.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while open_fds(guest) > fds_before {
        assert!(
            std::time::Instant::now() < deadline,
            "the guest holds {} descriptors, {fds_before} before the writers",
            open_fds(guest)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // 150 execs that each leave a sleeper holding both pipes: 300 pipes, more than the 256
    // drained at once, so the oldest are closed and the guest's descriptors stay bounded.
    for _ in 0..150 {
        let r = sb.exec(&shell("sleep 600 &")).await.unwrap();
        assert_eq!(r.status.exit_code, 0, "{r:?}");
    }
    let fds = open_fds(guest);
    assert!(
        fds <= fds_before + 256 + 8,
        "the guest holds {fds} descriptors ({fds_before} before): lingering pipes are not bounded"
    );
    assert!(
        fds >= fds_before + 200,
        "the guest holds {fds} descriptors ({fds_before} before): the sleepers' pipes were closed"
    );
    // The sandbox still works.
    assert_eq!(sb.exec(&argv(["true"])).await.unwrap().status.exit_code, 0);
}

/// The output a process kept (stdout and stderr together).
async fn kept_output(sb: &warren_sdk::Sandbox, process_id: u64) -> Vec<u8> {
    let mut out = sb.process_output(process_id).await.unwrap();
    let mut got = Vec::new();
    while let Some(ev) = out.next().await {
        match ev.unwrap() {
            ExecEvent::Stdout { data } | ExecEvent::Stderr { data } => {
                got.extend(warren_sdk::decode_data(&data).unwrap())
            }
            _ => {}
        }
    }
    got
}

/// Waits until a running process has printed `want` (its kept output so far).
async fn until_output(sb: &warren_sdk::Sandbox, process_id: u64, want: &str) {
    for _ in 0..100 {
        let mut out = sb.process_output(process_id).await.unwrap();
        let mut got = Vec::new();
        // What is kept so far: read briefly, the stream follows a running process.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(100), async {
            while let Some(Ok(ev)) = out.next().await {
                if let ExecEvent::Stdout { data } = ev {
                    got.extend(warren_sdk::decode_data(&data).unwrap());
                }
            }
        })
        .await;
        if String::from_utf8_lossy(&got).contains(want) {
            return;
        }
    }
    panic!("process {process_id} never printed {want:?}");
}

fn api_status(e: warren_sdk::Error) -> (u16, String) {
    match e {
        warren_sdk::Error::Api {
            status, message, ..
        } => (status, message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_stdin_and_terminals() {
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

    // An open stdin: first input with the start, more later, then the end of input.
    let mut req = argv(["cat"]);
    req.stdin_open = true;
    set_stdin(&mut req, b"first\n".to_vec());
    let cat = sb.start_process(&req).await.unwrap();
    assert!(cat.stdin_open && !cat.pty, "{cat:?}");
    sb.send_stdin(cat.process_id, b"second\n").await.unwrap();
    sb.send_stdin(cat.process_id, &[0, 255, b'\n'])
        .await
        .unwrap();
    let info = sb.process(cat.process_id).await.unwrap();
    assert!(info.running && info.stdin_open, "{info:?}");
    sb.close_stdin(cat.process_id).await.unwrap();
    let done = sb.wait_process(cat.process_id, None).await.unwrap();
    assert_eq!(done.exit.as_ref().unwrap().exit_code, 0);
    assert!(!done.stdin_open);
    assert_eq!(
        kept_output(&sb, cat.process_id).await,
        b"first\nsecond\n\0\xff\n"
    );

    // Input where none is taken: a clear 400, whatever the reason.
    let (status, msg) = api_status(sb.send_stdin(cat.process_id, b"late").await.unwrap_err());
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("takes no input"), "{msg}");
    let plain = sb.start_process(&shell("sleep 30")).await.unwrap();
    let (status, msg) = api_status(sb.send_stdin(plain.process_id, b"x").await.unwrap_err());
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("stdin_open"), "{msg}");
    let (status, msg) = api_status(sb.resize_pty(plain.process_id, 80, 24).await.unwrap_err());
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("no terminal"), "{msg}");
    sb.signal_process(plain.process_id, "KILL").await.unwrap();
    let (status, _) = api_status(sb.send_stdin(987_654, b"x").await.unwrap_err());
    assert_eq!(status, 404);

    // A terminal: the command owns it (its controlling terminal, /dev/tty works), sees its
    // size, reads lines through its line discipline, and its output is stdout.
    let mut req = shell(
        "stty size; test -t 0 && test -t 1 && echo isatty; echo via > /dev/tty; \
         read line; echo got:$line; read again; stty size",
    );
    req.pty = Some(warren_sdk::PtySize {
        cols: 100,
        rows: 30,
    });
    let term = sb.start_process(&req).await.unwrap();
    assert!(term.pty && !term.stdin_open, "{term:?}");
    until_output(&sb, term.process_id, "via").await;
    sb.send_stdin(term.process_id, b"hello\n").await.unwrap();
    until_output(&sb, term.process_id, "got:hello").await;
    sb.resize_pty(term.process_id, 120, 40).await.unwrap();
    sb.send_stdin(term.process_id, b"\n").await.unwrap();
    let done = sb.wait_process(term.process_id, None).await.unwrap();
    assert_eq!(done.exit.as_ref().unwrap().exit_code, 0, "{done:?}");
    let text = String::from_utf8_lossy(&kept_output(&sb, term.process_id).await).into_owned();
    for want in ["30 100", "isatty", "via", "got:hello", "40 120"] {
        assert!(text.contains(want), "{want:?} not in {text:?}");
    }
    // The terminal echoes input and ends lines with CR LF, as terminals do.
    assert!(text.contains("hello\r\n"), "{text:?}");

    // Ctrl-C on a terminal interrupts its foreground process; Ctrl-D is its end of input.
    let mut req = argv(["sleep", "60"]);
    req.pty = Some(warren_sdk::PtySize { cols: 80, rows: 24 });
    let sleeper = sb.start_process(&req).await.unwrap();
    sb.send_stdin(sleeper.process_id, b"\x03").await.unwrap();
    let done = sb.wait_process(sleeper.process_id, None).await.unwrap();
    assert_eq!(done.exit.as_ref().unwrap().signal, Some(2), "{done:?}");
    let mut req = argv(["cat"]);
    req.pty = Some(warren_sdk::PtySize { cols: 80, rows: 24 });
    let cat = sb.start_process(&req).await.unwrap();
    let (status, msg) = api_status(sb.close_stdin(cat.process_id).await.unwrap_err());
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("end-of-file character"), "{msg}");
    sb.send_stdin(cat.process_id, b"\x04").await.unwrap();
    let done = sb.wait_process(cat.process_id, None).await.unwrap();
    assert_eq!(done.exit.as_ref().unwrap().exit_code, 0, "{done:?}");

    // Sizes out of range are refused before anything starts.
    let mut req = argv(["true"]);
    req.pty = Some(warren_sdk::PtySize { cols: 0, rows: 24 });
    let (status, msg) = api_status(sb.start_process(&req).await.unwrap_err());
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("pty"), "{msg}");

    // A streamed exec on a terminal: its output arrives as stdout events.
    let mut req = shell("echo out; echo err >&2");
    req.pty = Some(warren_sdk::PtySize { cols: 80, rows: 24 });
    let r = sb.exec(&req).await.unwrap();
    assert_eq!(r.status.exit_code, 0);
    assert_eq!(r.stdout, "out\r\nerr\r\n");
    assert_eq!(r.stderr, "");
}

/// Input a process never reads cannot wedge the guest: the write gives up when the process
/// ends, and after 30 s otherwise, and the process takes input (or not) as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_input_is_bounded() {
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
    let big = vec![b'x'; 4 << 20]; // far more than a pipe holds
    let mut req = argv(["sleep", "2"]);
    req.stdin_open = true;
    let short = sb.start_process(&req).await.unwrap();
    let t = std::time::Instant::now();
    let (status, msg) = api_status(sb.send_stdin(short.process_id, &big).await.unwrap_err());
    assert_eq!(status, 400, "{msg}");
    // Whichever comes first: the end of the process, or its stdin's reader gone.
    assert!(
        msg.contains("ended before") || msg.contains("Broken pipe"),
        "{msg}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );

    let mut req = argv(["sleep", "300"]);
    req.stdin_open = true;
    let long = sb.start_process(&req).await.unwrap();
    let (status, msg) = api_status(sb.send_stdin(long.process_id, &big).await.unwrap_err());
    assert_eq!(status, 409, "{msg}");
    assert!(msg.contains("did not take its input"), "{msg}");
    // The sandbox answers meanwhile and after; the process can still be closed and ended.
    assert_eq!(
        sb.exec(&shell("echo alive")).await.unwrap().stdout,
        "alive\n"
    );
    sb.close_stdin(long.process_id).await.unwrap();
    sb.signal_process(long.process_id, "KILL").await.unwrap();
    let done = sb.wait_process(long.process_id, None).await.unwrap();
    assert_eq!(done.exit.unwrap().signal, Some(9));
}

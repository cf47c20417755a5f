//! Function calls through the real platform: each language this machine has a toolchain for,
//! each status, the limits, isolation between consecutive calls on one worker, fetched files,
//! and bad input.

mod common;

use common::Platform;
use warren_sdk::{ByteSize, Client, ErrorCode, FnCallRequest, FnCallResult, FnCallStatus};

const SECS_30: std::time::Duration = std::time::Duration::from_secs(30);

fn req(language: &str, code: &str) -> FnCallRequest {
    FnCallRequest {
        language: language.into(),
        code: code.into(),
        ..Default::default()
    }
}

async fn call(c: &Client, r: FnCallRequest) -> FnCallResult {
    c.fncall(&r).await.unwrap_or_else(|e| panic!("{r:?}: {e}"))
}

fn out(r: &FnCallResult) -> &str {
    r.run.as_ref().map(|s| s.stdout.as_str()).unwrap_or("")
}

/// Whether the host has `program` (the default image is the host's own).
fn has(program: &str) -> bool {
    ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .any(|d| std::path::Path::new(d).join(program).exists())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_language_runs_and_each_status_is_told() {
    require_root!();
    let p = Platform::start();
    let c = p.client();

    // Each language whose toolchain this machine has: read stdin, print, exit 0.
    let programs = [
        ("python", "python3", "print(int(input()) * 2)"),
        ("bash", "bash", "read n; echo $((n * 2))"),
        (
            "c",
            "gcc",
            "#include <stdio.h>\nint main(){int n; scanf(\"%d\",&n); printf(\"%d\\n\", n*2); return 0;}",
        ),
        (
            "cpp",
            "g++",
            "#include <iostream>\nint main(){int n; std::cin>>n; std::cout<<n*2<<std::endl;}",
        ),
        (
            "java",
            "javac",
            "import java.util.*;\npublic class Main { public static void main(String[] a) { Scanner s = new Scanner(System.in); System.out.println(s.nextInt() * 2); } }",
        ),
        (
            "javascript",
            "node",
            "const n = parseInt(require('fs').readFileSync(0, 'utf8')); console.log(n * 2);",
        ),
        (
            "rust",
            "rustc",
            "fn main(){let mut s=String::new(); std::io::stdin().read_line(&mut s).unwrap(); println!(\"{}\", s.trim().parse::<i64>().unwrap()*2);}",
        ),
        (
            "go",
            "go",
            "package main\nimport \"fmt\"\nfunc main(){var n int; fmt.Scan(&n); fmt.Println(n*2)}",
        ),
    ];
    let mut ran = Vec::new();
    for (lang, tool, code) in programs {
        let mut r = req(lang, code);
        r.stdin = Some("21\n".into());
        if !has(tool) {
            // A toolchain the image lacks: a 400 that names it.
            let e = c.fncall(&r).await.unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{lang}: {e}");
            assert!(e.to_string().contains(tool), "{lang}: {e}");
            continue;
        }
        let res = call(&c, r).await;
        assert_eq!(res.status, FnCallStatus::Ok, "{lang}: {res:?}");
        assert_eq!(out(&res), "42\n", "{lang}: {res:?}");
        let run = res.run.as_ref().unwrap();
        assert_eq!(run.exit_code, Some(0));
        assert!(
            run.wall_time > 0.0 && run.peak_memory > 0,
            "{lang}: {run:?}"
        );
        assert_eq!(
            res.compile.is_some(),
            lang != "python" && lang != "bash" && lang != "javascript"
        );
        ran.push(lang);
    }
    assert!(ran.contains(&"python") && ran.contains(&"c"), "{ran:?}");
    eprintln!("languages run here: {ran:?}");

    // Each status.
    let r = call(&c, req("c", "int main( { return 0; }")).await;
    assert_eq!(r.status, FnCallStatus::CompileError, "{r:?}");
    assert!(r.run.is_none());
    assert!(!r.compile.as_ref().unwrap().stderr.is_empty());

    let r = call(
        &c,
        req("python", "import sys\nprint('partial')\nsys.exit(3)"),
    )
    .await;
    assert_eq!(r.status, FnCallStatus::RuntimeError, "{r:?}");
    assert_eq!(r.run.as_ref().unwrap().exit_code, Some(3));
    assert_eq!(out(&r), "partial\n");

    let r = call(
        &c,
        req(
            "c",
            "#include <signal.h>\nint main(){ raise(SIGSEGV); return 0; }",
        ),
    )
    .await;
    assert_eq!(r.status, FnCallStatus::RuntimeError, "{r:?}");
    assert_eq!(r.run.as_ref().unwrap().signal, Some(11), "{r:?}");

    let mut slow = req(
        "python",
        "import time\nprint('started', flush=True)\ntime.sleep(30)",
    );
    // Long enough for Python to start and print on a loaded machine (workers are best-effort).
    slow.timeout = Some(3.0);
    let t = std::time::Instant::now();
    let r = call(&c, slow).await;
    assert_eq!(r.status, FnCallStatus::Timeout, "{r:?}");
    assert!(r.run.as_ref().unwrap().timed_out);
    assert_eq!(out(&r), "started\n", "output before the limit is kept");
    assert!(t.elapsed().as_secs() < 10, "{:?}", t.elapsed());

    let mut loud = req("bash", "yes hello");
    loud.max_output = Some(ByteSize(1 << 20));
    let r = call(&c, loud).await;
    assert_eq!(r.status, FnCallStatus::OutputLimit, "{r:?}");
    assert_eq!(out(&r).len(), 1 << 20);

    let mut hungry = req(
        "python",
        "x = []\nwhile True:\n    x.append(bytearray(16 << 20))",
    );
    hungry.memory = Some(ByteSize(64 << 20));
    let r = call(&c, hungry).await;
    assert_eq!(r.status, FnCallStatus::MemoryLimit, "{r:?}");

    // A fork bomb and a file written forever end with a status; the worker serves the next.
    let mut bomb = req("bash", "f(){ f | f & }; f; sleep 5");
    bomb.timeout = Some(3.0);
    let r = call(&c, bomb).await;
    assert_ne!(r.status, FnCallStatus::Ok, "{r:?}");
    // On the Python zygote too, where the step's processes are ended by uid: the killer
    // does not fork, so a step at its pids limit cannot keep it from working.
    let mut bomb = req(
        "python",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    );
    bomb.timeout = Some(3.0);
    let r = call(&c, bomb).await;
    assert_eq!(r.status, FnCallStatus::Timeout, "{r:?}");
    let r = call(&c, req("python", "print('after the bomb')")).await;
    assert_eq!(out(&r), "after the bomb\n", "{r:?}");
    let mut filler = req("bash", "cat /dev/zero > big");
    filler.memory = Some(ByteSize(64 << 20));
    let r = call(&c, filler).await;
    assert_eq!(r.status, FnCallStatus::RuntimeError, "{r:?}");
    let err = &r.run.as_ref().unwrap().stderr;
    assert!(
        err.contains("No space left") || err.contains("File too large"),
        "{r:?}"
    );
    let r = call(&c, req("python", "print('still fine')")).await;
    assert_eq!((r.status, out(&r)), (FnCallStatus::Ok, "still fine\n"));
}

/// Consecutive calls on one worker: nothing of one is there for the next — files in the
/// working directory, /tmp or /dev/shm, processes, environment, System V shared memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_one_call_reaches_the_next() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let first = "
import os, subprocess, sys
open('left.txt', 'w').write('secret')
open('/tmp/left.txt', 'w').write('secret')
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget(0x5752, 4096, 0o1000 | 0o666) >= 0  # IPC_CREAT: a SysV segment, left
assert libc.mq_open(b'/left', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0  # a message queue
if os.path.isdir('/dev/shm'):
    open('/dev/shm/left', 'w').write('secret')
open('/var/tmp/left', 'w').write('secret')
open('/home/grader/left', 'w').write('secret')
for d in ['/dev/.warren', '/dev', '/', '/usr', '/etc', '/var']:
    try:
        open(d + '/left', 'w').write('secret')
    except OSError:
        pass
subprocess.Popen(['sleep', '300'], start_new_session=True)
os.environ['LEFT'] = 'secret'
print(os.getpid())
";
    let r = call(&c, req("python", first)).await;
    assert_eq!(r.status, FnCallStatus::Ok, "{r:?}");
    let second = "
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
print('shm', libc.shmget(0x5752, 0, 0) >= 0, 'mq', libc.mq_open(b'/left', os.O_RDWR) >= 0)
for p in ['left.txt', '/tmp/left.txt', '/dev/shm/left', '/var/tmp/left', '/home/grader/left']:
    print(p, os.path.exists(p))
print(any(os.path.exists(d + '/left') for d in ['/dev/.warren', '/dev', '', '/usr', '/etc', '/var']))
print('nosuid', all(os.statvfs(d).f_flag & os.ST_NOSUID for d in ['.', '/tmp', '/dev/shm']))
print('LEFT' in os.environ)
ps = [d for d in os.listdir('/proc') if d.isdigit()]
cmds = []
for d in ps:
    try:
        cmds.append(open(f'/proc/{d}/cmdline').read().replace('\\0', ' ').strip())
    except OSError:
        pass
print('sleep' in ' '.join(cmds))
print('others', [d for d in ps if os.stat(f'/proc/{d}').st_uid != os.getuid()])
print(sorted(os.listdir('.')))
";
    for _ in 0..3 {
        let r = call(&c, req("python", second)).await;
        assert_eq!(r.status, FnCallStatus::Ok, "{r:?}");
        assert_eq!(
            out(&r),
            "shm False mq False\nleft.txt False\n/tmp/left.txt False\n/dev/shm/left False\n\
             /var/tmp/left False\n/home/grader/left False\nFalse\nnosuid True\nFalse\nFalse\n\
             others []\n['main.py']\n",
            "{r:?}"
        );
    }
    // A Python call runs as a child of the worker's Python zygote (the host image has
    // python3; a program run fresh has its step's init, pid 1, for parent), which is out of
    // its reach: not in its /proc, its descriptors, memory and environment cannot be opened
    // and it cannot be signalled, so a program can neither forge its report nor leave
    // anything in it for the next call.
    let probe = "import os\np = os.getppid()\nprint(p != 1, os.path.exists(f'/proc/{p}'))\nfor what in ['fd/3', 'mem', 'environ']:\n    try:\n        open(f'/proc/{p}/{what}', 'rb').read(1)\n        print(what, 'open')\n    except OSError:\n        print(what, 'refused')\ntry:\n    os.kill(p, 9)\n    print('killed')\nexcept OSError:\n    print('kill refused')";
    for _ in 0..2 {
        let r = call(&c, req("python", probe)).await;
        assert_eq!(
            out(&r),
            "True False\nfd/3 refused\nmem refused\nenviron refused\nkill refused\n",
            "{r:?}"
        );
    }
    // A program run fresh (bash: under its step's init) likewise sees no process of the
    // worker's: only its own uid's.
    let ps = "for d in /proc/[0-9]*; do [ \"$(stat -c %u $d 2>/dev/null || id -u)\" = \"$(id -u)\" ] || echo other $d; done; echo listed";
    let r = call(&c, req("bash", ps)).await;
    assert_eq!(out(&r), "listed\n", "{r:?}");
    // A call's denied system call is its worker's incident, named by the program that made
    // it: the guest (group 0) still sees the call's processes.
    let r = call(&c, req("bash", "unshare -m true 2>/dev/null; echo $?")).await;
    assert_eq!(out(&r), "1\n", "{r:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let filter = warren_sdk::EventFilter {
            task: Some("warren-fncall".into()),
            kind: Some(warren_sdk::EventKind::Seccomp),
            ..Default::default()
        };
        let ev = c.events(&filter).await.unwrap().into_items();
        if let Some(e) = ev.iter().find(|e| e.detail == "unshare") {
            assert_eq!(e.comm.as_deref(), Some("unshare"), "{e:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no incident: {ev:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The image itself cannot be changed by a call (it is read-only), and no network.
    let r = call(
        &c,
        req(
            "python",
            "import socket\ntry:\n    open('/usr/bin/x', 'w')\n    print('wrote')\nexcept OSError:\n    print('read-only')\ns = socket.socket()\ns.settimeout(1)\ntry:\n    s.connect(('10.0.0.1', 80))\n    print('connected')\nexcept OSError:\n    print('no network')",
        ),
    )
    .await;
    assert_eq!(out(&r), "read-only\nno network\n", "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_go_in_and_come_back_and_bad_input_is_refused() {
    require_root!();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let p = Platform::start();
    let c = p.client();
    let mut r = req(
        "python",
        "import os\ndata = open('in/data.txt').read()\nopen('out.txt', 'w').write(data.upper())\nos.symlink('/etc/passwd', 'link')",
    );
    r.files.insert("in/data.txt".into(), b64.encode("hello"));
    r.fetch_files = vec!["out.txt".into(), "missing.txt".into(), "link".into()];
    let res = call(&c, r).await;
    assert_eq!(res.status, FnCallStatus::Ok, "{res:?}");
    assert_eq!(b64.decode(&res.files["out.txt"]).unwrap(), b"HELLO");
    assert!(res.missing_files.contains_key("missing.txt"), "{res:?}");
    assert!(
        res.missing_files.contains_key("link"),
        "a link is not followed out of the call: {res:?}"
    );

    for (bad, why) in [
        (req("cobol", "x"), "unknown language"),
        (
            FnCallRequest {
                files: [("../x".to_string(), b64.encode("x"))].into(),
                ..req("python", "")
            },
            "relative",
        ),
        (
            FnCallRequest {
                files: [("a".to_string(), "not base64!".to_string())].into(),
                ..req("python", "")
            },
            "base64",
        ),
        (
            FnCallRequest {
                timeout: Some(0.0),
                ..req("python", "")
            },
            "timeout",
        ),
        (
            FnCallRequest {
                memory: Some(ByteSize(1)),
                ..req("python", "")
            },
            "memory",
        ),
    ] {
        let e = c.fncall(&bad).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{why}: {e}");
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
    let huge = req("python", &"#".repeat(5 << 20));
    let e = c.fncall(&huge).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PayloadTooLarge), "{e}");

    // HTTP Basic carries a key to /run_code only: elsewhere it is no key at all.
    let r = reqwest::Client::new()
        .get(format!("{}/v1/sandboxes", p.url))
        .basic_auth("fncall", Some(&p.key))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A key without fncall.run is refused; a runner's works.
    admin_roles(&p, &c).await;

    // The CLI: output as printed, the program's exit code as its own.
    let d = tempfile::tempdir().unwrap();
    let prog = d.path().join("prog.py");
    std::fs::write(
        &prog,
        "import sys\nprint(open('in.txt').read().strip())\nsys.exit(4)",
    )
    .unwrap();
    let input = d.path().join("in.txt");
    std::fs::write(&input, "from a file\n").unwrap();
    let out = p.cli(&[
        "fncall",
        "run",
        "--lang",
        "python",
        prog.to_str().unwrap(),
        "--file",
        input.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from a file\n");
    let out = p.cli(&["fncall", "languages", "--json"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"javascript\""));
}

async fn admin_roles(p: &Platform, admin: &Client) {
    admin.create_project("root/judge").await.unwrap();
    for (role, ok) in [("viewer", false), ("runner", true)] {
        let k = admin
            .create_key(&warren_sdk::CreateKey {
                name: format!("judge-{role}"),
                project: Some("root/judge".into()),
                role: Some(role.into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let key = Client::new(&p.url, Some(&k.secret)).unwrap();
        let r = key.fncall(&req("python", "print(1)")).await;
        match ok {
            true => assert_eq!(r.unwrap().status, FnCallStatus::Ok),
            false => assert_eq!(
                r.unwrap_err().code(),
                Some(ErrorCode::PermissionDenied),
                "{role}"
            ),
        }
        // The nodes' function-call pools name every project's images: a project's key
        // sees the nodes, not the pools; the admin sees both.
        let nodes = key.nodes().await.unwrap();
        assert!(
            !nodes.items.is_empty() && nodes.items.iter().all(|n| n.fncall_pools.is_empty()),
            "{role}: {:?}",
            nodes.items
        );
        let nodes = admin.nodes().await.unwrap();
        assert!(
            nodes.items.iter().any(|n| !n.fncall_pools.is_empty()),
            "{:?}",
            nodes.items
        );
    }
}

/// A batch: compiled once, the cases spread over workers, each judged by its checker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_compiles_once_and_judges_every_case() {
    require_root!();
    use warren_sdk::{Checker, FnCallBatchRequest, TestCase};
    let p = Platform::start();
    let c = p.client();
    let case = |stdin: &str, expected: &str| TestCase {
        stdin: stdin.into(),
        expected: Some(expected.into()),
    };
    // 40 cases (three workers' worth), one wrong answer, one crash, one timeout.
    let mut cases: Vec<TestCase> = (0..40)
        .map(|i| case(&format!("{i}\n"), &format!("{}\n", i * 2)))
        .collect();
    cases[7].expected = Some("wrong\n".into());
    cases[8].stdin = "-1\n".into();
    cases[9].stdin = "-2\n".into();
    let code = "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
        int main(){int n; scanf(\"%d\",&n); if(n==-1) abort(); if(n==-2) sleep(60); \
        printf(\"%d\\n\", n*2); return 0;}";
    let req = FnCallBatchRequest {
        language: "c".into(),
        code: code.into(),
        cases,
        timeout: Some(3.0),
        ..Default::default()
    };
    let r = c.fncall_batch(&req).await.unwrap();
    assert_eq!(r.status, FnCallStatus::Ok, "{r:?}");
    assert!(r.compile.is_some());
    assert_eq!(r.cases.len(), 40);
    assert_eq!(
        r.passed,
        37,
        "{:?}",
        r.cases.iter().map(|c| c.passed).collect::<Vec<_>>()
    );
    assert_eq!(r.cases[7].passed, Some(false));
    assert_eq!(r.cases[7].status, FnCallStatus::Ok);
    assert_eq!(r.cases[8].status, FnCallStatus::RuntimeError);
    assert_eq!(r.cases[8].run.signal, Some(6));
    assert_eq!(r.cases[9].status, FnCallStatus::Timeout);
    assert_eq!(r.cases[39].run.stdout, "78\n");

    // A compile error: no case runs.
    let bad = FnCallBatchRequest {
        code: "int main( {".into(),
        ..req.clone()
    };
    let r = c.fncall_batch(&bad).await.unwrap();
    assert_eq!(r.status, FnCallStatus::CompileError);
    assert!(r.cases.is_empty());

    // The checkers: whitespace, float, and a program of one's own.
    let py = |code: &str, cases: Vec<TestCase>, checker: Checker| FnCallBatchRequest {
        language: "python".into(),
        code: code.into(),
        cases,
        checker: Some(checker),
        ..Default::default()
    };
    let r = c
        .fncall_batch(&py(
            "print(*input().split(), sep='   ')",
            vec![case("a b c", "a b\nc"), case("a b", "a b c")],
            Checker::Whitespace,
        ))
        .await
        .unwrap();
    assert_eq!(
        r.cases.iter().map(|c| c.passed).collect::<Vec<_>>(),
        [Some(true), Some(false)]
    );
    let r = c
        .fncall_batch(&py(
            "print(1/3)",
            vec![case("", "0.3333334"), case("", "0.34")],
            Checker::Float {
                tolerance: Some(1e-6),
            },
        ))
        .await
        .unwrap();
    assert_eq!(
        r.cases.iter().map(|c| c.passed).collect::<Vec<_>>(),
        [Some(true), Some(false)]
    );
    // Accepts any output whose number is even; says why not.
    let checker = "import sys\nn = int(open(sys.argv[2]).read())\n\
        print('odd' if n % 2 else 'even')\nsys.exit(n % 2)";
    let checked = |cases: Vec<TestCase>| {
        let c = c.clone();
        let req = py(
            "print(int(input()) + 1)",
            cases,
            Checker::Custom {
                language: "python".into(),
                code: checker.into(),
            },
        );
        async move { c.fncall_batch(&req).await.unwrap() }
    };
    let r = checked(vec![
        case("1", "ignored"),
        case("2", "ignored"),
        TestCase {
            stdin: "5".into(),
            expected: None,
        },
    ])
    .await;
    let got: Vec<_> = r
        .cases
        .iter()
        .map(|c| (c.passed, c.checker_message.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (Some(true), Some("even\n")),
            (Some(false), Some("odd\n")),
            (None, None)
        ],
        "{r:?}"
    );
    // Over 40 cases the checker runs in three chunks, side by side: each case's verdict is
    // its own.
    let r = checked((0..40).map(|i| case(&i.to_string(), "ignored")).collect()).await;
    let got: Vec<_> = r
        .cases
        .iter()
        .map(|c| (c.passed, c.checker_message.clone()))
        .collect();
    let want: Vec<_> = (0..40)
        .map(|i| {
            let even = (i + 1) % 2 == 0;
            (
                Some(even),
                Some(if even { "even\n" } else { "odd\n" }.to_string()),
            )
        })
        .collect();
    assert_eq!(got, want, "{r:?}");

    // Bounds.
    for (bad, why) in [
        (
            FnCallBatchRequest {
                cases: Vec::new(),
                ..req.clone()
            },
            "cases",
        ),
        (
            FnCallBatchRequest {
                cases: vec![TestCase::default(); 1001],
                ..req.clone()
            },
            "cases",
        ),
        (
            FnCallBatchRequest {
                max_output: Some(ByteSize(64 << 20)),
                ..req.clone()
            },
            "max_output",
        ),
    ] {
        let e = c.fncall_batch(&bad).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{why}: {e}");
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
}

/// The keyless `/run_code` listener: requests without credentials act as the key in its file
/// (read at each request); it serves nothing else; a bad key in the file is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keyless_run_code_listener_acts_as_its_key_and_serves_nothing_else() {
    require_root!();
    let d = tempfile::tempdir().unwrap();
    let key_file = d.path().join("run-code.key");
    std::fs::write(&key_file, "not yet a key").unwrap();
    // Below the ephemeral range, and never handed to another test of this process.
    let port = common::free_port();
    let p = Platform::start_with(Some(&format!(
        "run_code_listen = \"127.0.0.1:{port}\"\nrun_code_key_file = \"{}\"\n",
        key_file.display()
    )));
    let admin = p.client();
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}");
    let body = serde_json::json!({"code": "print(6 * 7)", "language": "python"});
    let post = || http.post(format!("{url}/run_code")).json(&body).send();
    assert_eq!(
        post().await.unwrap().status(),
        401,
        "a file without a valid key"
    );
    admin.create_project("root/verl").await.unwrap();
    let k = admin
        .create_key(&warren_sdk::CreateKey {
            name: "verl".into(),
            project: Some("root/verl".into()),
            role: Some("runner".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    std::fs::write(&key_file, format!("{}\n", k.secret)).unwrap();
    let r = post().await.unwrap();
    assert_eq!(r.status(), 200);
    let j: serde_json::Value = r.json().await.unwrap();
    assert_eq!(j["status"], "Success", "{j}");
    assert_eq!(j["run_result"]["stdout"], "42\n", "{j}");
    // Its own key still counts when a client sends one.
    let r = http
        .post(format!("{url}/run_code"))
        .bearer_auth("wrn_00000000000000000000000000000000")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Nothing but /run_code (and SandboxFusion's ping) is there.
    let r = http
        .get(format!("{url}/v1/sandboxes"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http.get(format!("{url}/v1/ping")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "\"pong\"");
}

/// A worker killed in the middle of a call: the call answers a retryable 503 (never hangs),
/// and the next call gets a new worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_call_is_replaced() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let r = call(&c, req("python", "print('warm')")).await;
    assert_eq!(r.status, FnCallStatus::Ok);
    let mut slow = req(
        "python",
        "import time\nprint('started', flush=True)\ntime.sleep(60)",
    );
    slow.timeout = Some(120.0);
    let c2 = c.clone();
    let running = tokio::spawn(async move { c2.fncall(&slow).await });
    // Once it runs (its pool counts a busy worker, and Python has had a moment to start),
    // every worker goes: the one running it among them.
    common::poll_until(SECS_30, "the call never ran", async || {
        let pools = c.nodes().await.unwrap().items[0].fncall_pools.clone();
        match pools.iter().any(|p| p.busy == 1) {
            true => Ok(()),
            false => Err(format!("{pools:?}")),
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(!running.is_finished(), "the call is still running");
    let workers = c
        .list(&warren_sdk::ListFilter {
            labels: [("warren.fncall.worker".to_string(), "host".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .items;
    assert!(!workers.is_empty());
    for w in &workers {
        let _ = c.sandbox(&w.id.to_string()).unwrap().kill().await;
    }
    let t = std::time::Instant::now();
    let e = tokio::time::timeout(std::time::Duration::from_secs(30), running)
        .await
        .expect("the call answers when its worker is killed")
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
    assert!(e.to_string().contains("send the call again"), "{e}");
    assert!(t.elapsed().as_secs() < 30);
    let r = call(&c, req("python", "print('again')")).await;
    assert_eq!(out(&r), "again\n", "{r:?}");
}

/// A worker whose Python zygote died (here killed from the host; in life, say, chosen by the
/// out-of-memory killer) still answers the call at hand, then is replaced rather than pooled:
/// kept, it would run every Python call without its zygote, at a third of the speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_zygote_is_replaced() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let workers = || async {
        c.list(&warren_sdk::ListFilter::default().task("warren-fncall"))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|s| s.id.to_string())
            .collect::<Vec<_>>()
    };
    let r = call(&c, req("python", "print(1)")).await;
    assert_eq!(out(&r), "1\n", "{r:?}");
    let first = workers().await;
    assert_eq!(first.len(), 1, "{first:?}");
    // The zygote: the worker's python3 started with zygote.py's text as its program.
    let zygote = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cg.contains(&p.cgroup_parent)
                && cg.contains(&first[0])
                && String::from_utf8_lossy(&cmd).contains("The Python zygote of a function-call")
        })
        .expect("the worker's zygote");
    // SAFETY-free: a process of this test's own platform, by pid.
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &zygote.to_string()])
            .status()
            .unwrap()
            .success()
    );
    // Dead (a zombie until its server reaps it): its socket is closed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{zygote}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the zygote did not die"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The call it would have served runs all the same (under an init of its own)...
    let r = call(&c, req("python", "print(2)")).await;
    assert_eq!((r.status, out(&r)), (FnCallStatus::Ok, "2\n"), "{r:?}");
    // ...and its worker goes; the pool has another.
    common::poll_until(
        SECS_30,
        "the worker without its zygote is still pooled",
        async || {
            let now = workers().await;
            match !now.contains(&first[0]) && !now.is_empty() {
                true => Ok(()),
                false => Err(format!("{now:?}")),
            }
        },
    )
    .await;
    let r = call(&c, req("python", "print(3)")).await;
    assert_eq!(out(&r), "3\n", "{r:?}");
}

/// An image whose own links would aim a call's writable places elsewhere (`/tmp` a link to
/// `/dev`, where the worker's device nodes are): its worker's call server refuses to start,
/// and the call is refused with why, rather than mounting through the link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_whose_tmp_is_a_link_cannot_run_calls() {
    require_root!();
    // Layers unmounted soon after their last user, so that the test can end clean.
    let p = Platform::start_with(Some("[node]\nlayer_idle_unmount = 1\n"));
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    busybox_root(
        &root,
        &["bin", "usr/bin", "etc", "var/tmp", "home"],
        &["sh", "bash", "true"],
    );
    std::os::unix::fs::symlink("/dev", root.join("tmp")).unwrap();
    let out = p.cli(&[
        "image",
        "import",
        root.to_str().unwrap(),
        "--name",
        "t/linked-tmp:1",
    ]);
    assert!(out.status.success(), "{out:?}");
    let e = p
        .client()
        .fncall(&FnCallRequest {
            image: Some("t/linked-tmp:1".into()),
            ..req("bash", "true")
        })
        .await
        .unwrap_err();
    let (status, message) = match &e {
        warren_sdk::Error::Api {
            status, message, ..
        } => (*status, message.clone()),
        other => panic!("{other}"),
    };
    assert!(
        (400..500).contains(&status) && message.contains("/tmp"),
        "{status} {message}"
    );
    p.assert_clean_within(std::time::Duration::from_secs(30));
}

/// The zygote never holds a call's data, so the next call's child (a fork of it) cannot find
/// the last call's input in its own memory; and what a call leaves running cannot stop the
/// process that ends it (a loop of `kill(-1, SIGSTOP)` as the grader's uid).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_call_finds_nothing_of_the_last_in_its_memory_and_cannot_stop_the_killer() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    // A secret that the next call's program never spells: it knows a prefix (built at run
    // time) and the secret's hash.
    let secret = format!("QzQz{:032x}", rand::random::<u128>());
    let hash = {
        use std::io::Write;
        let mut h = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        h.stdin
            .take()
            .unwrap()
            .write_all(secret.as_bytes())
            .unwrap();
        let out = h.wait_with_output().unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    };
    let first = "import sys\ndata = sys.stdin.read()\nkept = [data * 1 for _ in range(50)]\nprint(len(data))";
    let r = call(
        &c,
        FnCallRequest {
            stdin: Some(secret.clone()),
            ..req("python", first)
        },
    )
    .await;
    assert_eq!(r.status, FnCallStatus::Ok, "{r:?}");
    let scan = format!(
        "import ctypes, hashlib, re\n\
         prefix = ('Qz' * 2).encode()\n\
         found = regions = 0\n\
         for line in open('/proc/self/maps').read().splitlines():\n\
         \x20   a = line.split()\n\
         \x20   # Anonymous memory, the heap and the stack: where freed data would be.\n\
         \x20   if 'r' not in a[1] or (len(a) > 5 and a[5] not in ('[heap]', '[stack]')):\n\
         \x20       continue\n\
         \x20   lo, hi = (int(x, 16) for x in a[0].split('-'))\n\
         \x20   if hi - lo > (256 << 20):\n\
         \x20       continue\n\
         \x20   regions += 1\n\
         \x20   data = ctypes.string_at(lo, hi - lo)\n\
         \x20   for mt in re.finditer(re.escape(prefix) + rb'[0-9a-f]{{32}}', data):\n\
         \x20       if hashlib.sha256(mt.group()).hexdigest() == '{hash}':\n\
         \x20           found += 1\n\
         print('found', found, regions > 3)\n"
    );
    for _ in 0..3 {
        let r = call(&c, req("python", &scan)).await;
        assert_eq!(out(&r), "found 0 True\n", "{r:?}");
    }
    // A file a program wrote and never closed is whole when the call ends, as an
    // interpreter's exit leaves it; a thread is joined and an atexit handler runs.
    let unclosed = FnCallRequest {
        fetch_files: vec!["out.txt".into()],
        ..req(
            "python",
            "import atexit, threading, time\n\
             f = open('out.txt', 'w')\n\
             f.write('x' * 100000)\n\
             atexit.register(lambda: print('atexit'))\n\
             threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()",
        )
    };
    let r = call(&c, unclosed).await;
    assert_eq!(out(&r), "thread\natexit\n", "{r:?}");
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD
        .decode(&r.files["out.txt"])
        .unwrap();
    assert_eq!(data.len(), 100000);
    // A call that leaves a process stopping everything its uid may signal, in a loop.
    let stopper = "import os, signal, time\n\
                   parent = os.getpid()\n\
                   if os.fork() == 0:\n\
                   \x20   os.setsid()\n\
                   \x20   while os.getppid() == parent:\n\
                   \x20       time.sleep(0.001)\n\
                   \x20   while True:\n\
                   \x20       try:\n\
                   \x20           os.kill(-1, signal.SIGSTOP)\n\
                   \x20       except OSError:\n\
                   \x20           pass\n\
                   print('left')";
    for _ in 0..3 {
        let r = call(&c, req("python", stopper)).await;
        assert_eq!(out(&r), "left\n", "{r:?}");
        let started = std::time::Instant::now();
        let r = call(&c, req("python", "print('next')")).await;
        assert_eq!(out(&r), "next\n", "{r:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}

/// A restarted node daemon puts the workers it re-adopts back in their pools: the next call
/// runs on one of them, warm, instead of starting another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_back_in_their_pools_after_a_node_restart() {
    require_root!();
    let mut p = Platform::start();
    let workers = |c: Client| async move {
        let mut ids: Vec<String> = c
            .list(&warren_sdk::ListFilter::default().task("warren-fncall"))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|s| s.id.to_string())
            .collect();
        ids.sort();
        ids
    };
    let pools = |c: Client| async move {
        let nodes = c.nodes().await.unwrap();
        assert_eq!(nodes.items.len(), 1);
        let pools = nodes.items[0].fncall_pools.clone();
        assert_eq!(pools.len(), 1, "{pools:?}");
        let p = pools[0].clone();
        assert_eq!((p.image.as_str(), p.busy, p.keep), ("host", 0, 8), "{p:?}");
        (p.calls, p.cold_calls, p.workers_started, p.idle)
    };
    let r = call(&p.client(), req("python", "print(1)")).await;
    assert_eq!(out(&r), "1\n");
    let before = workers(p.client()).await;
    assert_eq!(before.len(), 1, "{before:?}");
    // The first call of a pool is cold: it started its worker, now idle.
    assert_eq!(pools(p.client()).await, (1, 1, 1, 1));
    p.restart();
    for i in 0..3 {
        let r = call(&p.client(), req("python", &format!("print({i})"))).await;
        assert_eq!(out(&r), format!("{i}\n"), "{r:?}");
    }
    // The restarted node's pool: three calls, none cold, one worker started in the
    // background, both idle (once that worker has started: a sandbox and its zygote).
    common::poll_until(
        SECS_30,
        "the restarted node's pool",
        async || match pools(p.client()).await {
            (3, 0, 1, 2) => Ok(()),
            now => Err(format!("{now:?}")),
        },
    )
    .await;
    // The first call took the re-adopted worker (and started one more in the background, as
    // for any pool's last idle worker); without it back in the pool, the calls would have
    // started one, and then one more.
    let after = workers(p.client()).await;
    assert!(
        after.contains(&before[0]) && after.len() <= 2,
        "{before:?} then {after:?}"
    );
    let cli = p.cli(&["fncall", "pools"]);
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success() && text.starts_with("NODE") && text.contains(" host "),
        "{cli:?}"
    );
}

/// A project's `max_fncalls` bounds its calls in flight, over it and its subtree: one past it
/// is a 429 with Retry-After that names the quota; other projects are not held up; a batch
/// runs its chunks one at a time within a limit of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projects_fncall_quota_bounds_its_calls_in_flight() {
    require_root!();
    use warren_sdk::{FnCallBatchRequest, ProjectQuota, TestCase};
    let p = Platform::start();
    let c = p.client();
    c.create_project("root/fq/a").await.unwrap();
    c.set_quota(
        "root/fq",
        &ProjectQuota {
            max_fncalls: Some(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let listed = c.projects().await.unwrap();
    let fq = listed.iter().find(|p| p.path == "root/fq").unwrap();
    assert_eq!(fq.max_fncalls, Some(1), "{fq:?}");
    let in_project = |project: &str, code: &str| FnCallRequest {
        project: Some(project.into()),
        ..req("bash", code)
    };

    // A long call in the child holds the parent's one call.
    let long = {
        let c = c.clone();
        tokio::spawn(async move {
            c.fncall(&in_project("root/fq/a", "sleep 4; echo slept"))
                .await
        })
    };
    // While it runs, a call that may wait only briefly for room is refused at its deadline
    // (tried until the long call is seen in flight, however slow the machine).
    let brief = |project: &str, code: &str| FnCallRequest {
        queue_timeout: Some(0.3),
        ..in_project(project, code)
    };
    let mut refused = None;
    while !long.is_finished() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        match c.fncall(&brief("root/fq", "echo hi")).await {
            Ok(r) => assert_eq!(out(&r), "hi\n", "{r:?}"),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let Some(warren_sdk::Error::Api {
        status,
        code,
        message,
        retry_after_secs,
        ..
    }) = refused
    else {
        panic!("no call was refused while the long one ran: {refused:?}");
    };
    assert_eq!((status, code), (429, ErrorCode::Capacity), "{message}");
    assert!(
        message.contains("project root/fq's quota") && message.contains("max_fncalls"),
        "{message}"
    );
    assert_eq!(retry_after_secs, Some(1), "{message}");
    // A batch of the same project is refused too; another project is not held up.
    let case = |i: u32| TestCase {
        stdin: format!("{i}\n"),
        expected: Some(format!("{}\n", i * 2)),
    };
    let batch = FnCallBatchRequest {
        language: "bash".into(),
        code: "read n; echo $((n * 2))".into(),
        cases: (0..40).map(case).collect(),
        project: Some("root/fq/a".into()),
        queue_timeout: Some(0.3),
        ..Default::default()
    };
    let e = c.fncall_batch(&batch).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    let r = call(&c, req("bash", "echo elsewhere")).await;
    assert_eq!(out(&r), "elsewhere\n", "{r:?}");
    // A call with its default deadline (its own timeout, 10 s) waits for the slot, and runs.
    let r = call(&c, in_project("root/fq", "echo waited")).await;
    assert_eq!(out(&r), "waited\n", "{r:?}");

    // Once the long call is done, its slot is free again.
    let r = long.await.unwrap().unwrap();
    assert_eq!(out(&r), "slept\n", "{r:?}");
    let r = call(&c, in_project("root/fq/a", "echo again")).await;
    assert_eq!(out(&r), "again\n", "{r:?}");
    // 40 cases are three workers' worth: within a limit of one they run one chunk at a time,
    // and every case is judged.
    let r = c.fncall_batch(&batch).await.unwrap();
    assert_eq!((r.cases.len(), r.passed), (40, 40), "{r:?}");
    // No limit: calls are not counted against it.
    c.set_quota("root/fq", &ProjectQuota::default())
        .await
        .unwrap();
    let listed = c.projects().await.unwrap();
    let fq = listed.iter().find(|p| p.path == "root/fq").unwrap();
    assert_eq!(fq.max_fncalls, None, "{fq:?}");
}

/// A root file system of busybox at `root`: the directories `dirs`, and `bin/busybox` with
/// links to it named `tools`.
fn busybox_root(root: &std::path::Path, dirs: &[&str], tools: &[&str]) {
    for dir in dirs {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
        .expect("busybox is installed (make test installs busybox-static)");
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    for tool in tools {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).unwrap();
    }
}

/// The processes of `p`'s platform whose command line contains `needle`, by pid.
fn platform_processes(p: &Platform, needle: &[u8]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cg.contains(&p.cgroup_parent) && cmd.windows(needle.len()).any(|w| w == needle)
        })
        .collect()
}

/// A line of `/proc/PID/status` (`Seccomp`, `NoNewPrivs`, ...), its value.
fn status_field(pid: i32, field: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| Some(l.strip_prefix(field)?.strip_prefix(':')?.trim().to_string()))
}

/// The Python zygote is the image's own python3, and everything it imports is the image's
/// code: it runs under the agent's system-call filter and Landlock from its first instruction,
/// isolated and without `site`; the image's `site` (site-packages, `.pth` files) runs in each
/// call's child, confined as the grader. An image whose `python3` is a script gets a filtered
/// process too (before the fix: `Seccomp: 0`, and a user namespace with every capability).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_zygote_runs_confined_from_its_first_instruction() {
    require_root!();
    let p = Platform::start_with(Some("[node]\nlayer_idle_unmount = 1\n"));
    let c = p.client();
    // A program sees the interpreter a fresh `python3 main.py` gives: site-packages on the
    // path and `site`'s builtins (`exit`).
    let r = call(
        &c,
        req(
            "python",
            "import sys\nprint(any(p.endswith(('site-packages', 'dist-packages')) for p in sys.path))\nexit(3)",
        ),
    )
    .await;
    assert_eq!(
        (out(&r), r.run.as_ref().and_then(|s| s.exit_code)),
        ("True\n", Some(3)),
        "{r:?}"
    );
    let zygotes = platform_processes(&p, b"The Python zygote of a function-call");
    assert!(!zygotes.is_empty(), "no zygote found");
    for z in zygotes {
        assert_eq!(
            status_field(z, "Seccomp").as_deref(),
            Some("2"),
            "the zygote {z} runs without the agent filter"
        );
        assert_eq!(status_field(z, "NoNewPrivs").as_deref(), Some("1"));
        // Only CAP_SETUID and CAP_SETGID.
        assert_eq!(
            status_field(z, "CapEff").as_deref(),
            Some("00000000000000c0")
        );
        let cmd = std::fs::read(format!("/proc/{z}/cmdline")).unwrap();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        assert!(
            args.contains(&&b"-I"[..]) && args.contains(&&b"-S"[..]),
            "the zygote's interpreter is not isolated: {:?}",
            String::from_utf8_lossy(&cmd)
        );
    }

    // An image whose python3 is a script: what it runs is filtered too.
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    busybox_root(
        &root,
        &["bin", "usr/bin", "etc", "tmp", "var/tmp", "home", "dev"],
        &["sh", "bash", "true", "sleep"],
    );
    std::fs::write(
        root.join("usr/bin/python3"),
        "#!/bin/sh\nexec /bin/sleep 31\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("usr/bin/python3"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let imported = p.cli(&[
        "image",
        "import",
        root.to_str().unwrap(),
        "--name",
        "t/python-script:1",
    ]);
    assert!(imported.status.success(), "{imported:?}");
    let running = tokio::spawn({
        let c = c.clone();
        async move {
            c.fncall(&FnCallRequest {
                image: Some("t/python-script:1".into()),
                timeout: Some(1.0),
                ..req("python", "print(1)")
            })
            .await
        }
    });
    let mut seen = Vec::new();
    common::poll_until(SECS_30, "the image's python3 never ran", async || {
        seen = platform_processes(&p, b"/bin/sleep\x0031");
        match seen.is_empty() {
            false => Ok(()),
            true => Err("no process yet".to_string()),
        }
    })
    .await;
    for pid in &seen {
        assert_eq!(
            status_field(*pid, "Seccomp").as_deref(),
            Some("2"),
            "the image's python3 ({pid}) runs without the agent filter"
        );
    }
    // Whatever the call's answer (its python3 never serves), it ends.
    let _ = running.await.unwrap();
}

/// The reward path must not starve rollouts. A burst of calls larger than their pool and than
/// the node's FnCall budget is answered `ok`, every call, with no 429 before its deadline
/// (calls past the budget wait for a worker); the workers it leaves hold only what they use
/// idle, and are killed for creates that need their room, so ordinary creates requesting 1/16
/// of the node's admission each, right after the burst, all succeed; a pool shrinks within
/// seconds of its peak passing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_burst_queues_and_leaves_room_for_the_creates_after_it() {
    require_root!();
    use warren_sdk::CreateSandbox;
    // Admission: physical memory × 1, a quarter of it for calls; 24 sandboxes at most.
    let p = Platform::start_with(Some(
        "[node]\nmemory_overcommit = 1.0\nmax_sandboxes = 24\n",
    ));
    let c = p.client();
    let node = c.nodes().await.unwrap().items[0].clone();
    let admits = node.memory_allocatable.0;
    assert_eq!(node.fncall_budget.0, admits / 4, "{node:?}");
    // Calls of about a sixteenth of it each (a power of two): four run at once.
    let big = 1u64 << (63 - (admits / 16).leading_zeros());
    let calls = (0..40).map(|i| {
        let c = c.clone();
        async move {
            let r = c
                .fncall(&FnCallRequest {
                    memory: Some(ByteSize(big)),
                    ..req("bash", &format!("sleep 0.2; echo $(({i} * 2))"))
                })
                .await;
            (i, r)
        }
    });
    for (i, r) in futures_util::future::join_all(calls).await {
        let r = r.unwrap_or_else(|e| panic!("call {i} of the burst: {e}"));
        assert_eq!(
            (r.status, out(&r).to_string()),
            (FnCallStatus::Ok, format!("{}\n", i * 2)),
            "{r:?}"
        );
    }
    let node = c.nodes().await.unwrap().items[0].clone();
    let pool = node
        .fncall_pools
        .iter()
        .find(|p| p.memory.0 == big)
        .unwrap_or_else(|| panic!("{node:?}"))
        .clone();
    assert_eq!((pool.calls, pool.timed_out), (40, 0), "{pool:?}");
    assert!(pool.cold_calls > 0, "40 calls at once queued: {pool:?}");
    assert!(
        pool.idle + pool.starting <= 4 + 4,
        "at most the budget's four are kept, and MAX_STARTING more may be starting: {pool:?}"
    );
    assert_eq!(node.fncall_held.0, 0, "{node:?}");
    // Right after it: 20 creates of a sixteenth each (20 of the 24 sandboxes, 5/4 of what the
    // calls' budget held) all succeed; idle workers go for them.
    let sandbox = CreateSandbox {
        image: "host".into(),
        memory: Some(ByteSize(big)),
        memory_limit: Some(ByteSize(big)),
        task: Some("after-burst".into()),
        ..Default::default()
    };
    let creates = (0..20).map(|_| c.create(&sandbox));
    let made = futures_util::future::join_all(creates).await;
    let failed: Vec<_> = made.iter().filter_map(|r| r.as_ref().err()).collect();
    c.task_action("after-burst", warren_sdk::TaskAction::Stop)
        .await
        .unwrap();
    assert!(failed.is_empty(), "creates after the burst: {failed:?}");

    // A pool of small calls at a peak of 24 in flight grows past its floor, then shrinks back
    // to it (8) within seconds of the peak, not minutes later (the old pools kept a minute's
    // peak).
    let slow = (0..24).map(|_| {
        let c = c.clone();
        async move { c.fncall(&req("bash", "sleep 1; echo ok")).await }
    });
    for r in futures_util::future::join_all(slow).await {
        assert_eq!(out(&r.unwrap()), "ok\n");
    }
    let small = |n: &warren_sdk::NodeInfo| {
        n.fncall_pools
            .iter()
            .find(|p| p.memory.0 == 512 << 20)
            .cloned()
            .unwrap()
    };
    // (Whether more than 8 are still idle when this looks depends on how slow the machine
    // is: the pool may have shrunk already. That it grew past its floor is what counts.)
    let pool = small(&c.nodes().await.unwrap().items[0]);
    assert!(
        pool.workers_started > 8,
        "24 calls of a second at once started more than 8 workers: {pool:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let pool = small(&c.nodes().await.unwrap().items[0]);
        if pool.idle <= 8 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pool still keeps {} idle workers 30 s after its peak: {pool:?}",
            pool.idle
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// A call that waits for a worker past its deadline is answered the way its client handles:
/// `/run_code` 504 (SandboxFusion's clients, verl's among them, retry it; a 429 they would
/// score as a wrong answer), Warren's own API 429 with Retry-After. A call with its own
/// deadline waits and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_is_a_504_on_run_code_and_a_429_on_the_api() {
    require_root!();
    let mem_total: f64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap()
        * 1024.0;
    // A budget of 1.5 GiB: one call of 1 GiB (SandboxFusion's default) at a time.
    let share = 1.5 * (1u64 << 30) as f64 / mem_total;
    let p = Platform::start_with(Some(&format!(
        "[node]\nmemory_overcommit = 1.0\nfncall_memory_share = {share}\n"
    )));
    let c = p.client();
    let budget = c.nodes().await.unwrap().items[0].fncall_budget.0;
    assert!((1 << 30..2 << 30).contains(&budget), "{budget}");
    let http = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        http.post(format!("{}/run_code", p.url))
            .bearer_auth(&p.key)
            .json(&body)
            .send()
    };
    let long = tokio::spawn(post(serde_json::json!({
        "code": "import time; time.sleep(3); print('slept')",
        "language": "python",
        "run_timeout": 20,
    })));
    // Once it holds the budget (however slow the machine is to start its worker):
    let deadline = std::time::Instant::now() + SECS_30;
    while c.nodes().await.unwrap().items[0].fncall_held.0 < 1 << 30 {
        assert!(
            std::time::Instant::now() < deadline,
            "the long call never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // A call whose deadline (its run timeout) passes while it waits: 504 on /run_code...
    let r = post(serde_json::json!({"code": "print(1)", "language": "python", "run_timeout": 0.5}))
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    let j: serde_json::Value = r.json().await.unwrap();
    let why = j["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(why.contains("deadline"), "{j}");
    // ...and 429 with Retry-After on Warren's API.
    let e = c
        .fncall(&FnCallRequest {
            memory: Some(ByteSize(1 << 30)),
            queue_timeout: Some(0.5),
            ..req("python", "print(1)")
        })
        .await
        .unwrap_err();
    let warren_sdk::Error::Api {
        status,
        code,
        retry_after_secs,
        message,
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(
        (*status, *code, *retry_after_secs),
        (429, ErrorCode::Capacity, Some(1)),
        "{message}"
    );
    // A call that may wait its own timeout (10 s) runs once the long one is done.
    let r = post(serde_json::json!({"code": "print(2)", "language": "python"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let j: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (&j["status"], &j["run_result"]["stdout"]),
        (&serde_json::json!("Success"), &serde_json::json!("2\n")),
        "{j}"
    );
    let r = long.await.unwrap().unwrap();
    let j: serde_json::Value = r.json().await.unwrap();
    assert_eq!(j["run_result"]["stdout"], "slept\n", "{j}");
    let pools = c.nodes().await.unwrap().items[0].fncall_pools.clone();
    let timed_out: u64 = pools.iter().map(|p| p.timed_out).sum();
    assert_eq!(timed_out, 2, "{pools:?}");
}

/// A function call does not wait behind the creates queued on its node: a worker it needs
/// starts at once, not after the rollout's creates ahead of it in the create queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_does_not_wait_behind_queued_creates() {
    require_root!();
    use warren_sdk::CreateSandbox;
    // One create at a time: 150 queued take seconds to start.
    let p = Platform::start_with(Some(
        "[node]\nmax_concurrent_creates = 1\ncreate_queue_timeout = 120\nwarm_pool = 0\n",
    ));
    let c = p.client();
    let sandbox = CreateSandbox {
        image: "host".into(),
        task: Some("queued".into()),
        ..Default::default()
    };
    let flood = {
        let (c, sandbox) = (c.clone(), sandbox.clone());
        tokio::spawn(async move {
            let creates = (0..150).map(|_| c.create(&sandbox));
            futures_util::future::join_all(creates).await
        })
    };
    // Once creates wait in the queue, a call whose pool has no worker yet needs one started.
    let deadline = std::time::Instant::now() + SECS_30;
    while c.nodes().await.unwrap().items[0].creates_waiting < 50 {
        assert!(
            std::time::Instant::now() < deadline,
            "the creates never queued"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let r = c
        .fncall(&FnCallRequest {
            queue_timeout: Some(5.0),
            ..req("bash", "echo not starved")
        })
        .await;
    let waiting = c.nodes().await.unwrap().items[0].creates_waiting;
    c.task_action("queued", warren_sdk::TaskAction::Stop)
        .await
        .unwrap();
    let _ = flood.await;
    c.task_action("queued", warren_sdk::TaskAction::Stop)
        .await
        .unwrap();
    let r = r.unwrap_or_else(|e| panic!("with {waiting} creates still queued: {e}"));
    assert_eq!(out(&r), "not starved\n", "{r:?}");
    assert!(
        waiting > 0,
        "the call was answered while creates still waited"
    );
}

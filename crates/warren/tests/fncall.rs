//! Function calls through the real platform: each language this machine has a toolchain for,
//! each status, the limits, isolation between consecutive calls on one worker, fetched files,
//! and bad input.

mod common;

use common::Platform;
use warren_sdk::{ByteSize, Client, ErrorCode, FnCallRequest, FnCallResult, FnCallStatus};

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
    slow.timeout = Some(0.5);
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
if os.path.isdir('/dev/shm'):
    open('/dev/shm/left', 'w').write('secret')
for d in ['/dev/.warren', '/dev', '/home/grader', '/', '/usr']:
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
import os, subprocess
for p in ['left.txt', '/tmp/left.txt', '/dev/shm/left']:
    print(p, os.path.exists(p))
print(any(os.path.exists(d + '/left') for d in ['/dev/.warren', '/dev', '/home/grader', '', '/usr']))
print('LEFT' in os.environ)
ps = [d for d in os.listdir('/proc') if d.isdigit()]
cmds = []
for d in ps:
    try:
        cmds.append(open(f'/proc/{d}/cmdline').read().replace('\\0', ' ').strip())
    except OSError:
        pass
print('sleep' in ' '.join(cmds))
print(sorted(os.listdir('.')))
";
    for _ in 0..3 {
        let r = call(&c, req("python", second)).await;
        assert_eq!(r.status, FnCallStatus::Ok, "{r:?}");
        assert_eq!(
            out(&r),
            "left.txt False\n/tmp/left.txt False\n/dev/shm/left False\nFalse\nFalse\nFalse\n['main.py']\n",
            "{r:?}"
        );
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
    }
}

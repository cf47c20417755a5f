//! The CLI end to end: create, exec (output and exit codes), cp both ways, ls, pause, resume,
//! rm, and JSON output for scripts.

mod common;

use common::Platform;

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cli_lifecycle() {
    require_root!();
    let p = Platform::start();
    let o = p.cli(&[
        "sandbox", "create", "--image", "host", "--task", "cli", "--label", "k=v", "--memory",
        "256Mi", "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["resources"]["memory"], 256u64 << 20);

    let o = p.cli(&["exec", &id, "--", "python3", "-c", "print(6*7)"]);
    assert_eq!(out(&o), "42\n");
    assert!(o.status.success());
    let o = p.cli(&["exec", &id, "--", "sh", "-c", "echo err >&2; exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "err\n");
    let o = p.cli(&["exec", &id, "--", "id", "-u"]);
    assert_eq!(out(&o), "1000\n");

    let local = p.data.path().join("up.txt");
    std::fs::write(&local, "through cp\n").unwrap();
    let o = p.cli(&["cp", local.to_str().unwrap(), &format!("{id}:/tmp/in.txt")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let back = p.data.path().join("down.txt");
    let o = p.cli(&["cp", &format!("{id}:/tmp/in.txt"), back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "through cp\n");

    let o = p.cli(&["sandbox", "ls"]);
    assert!(
        out(&o).contains(&id) && out(&o).contains("running"),
        "{}",
        out(&o)
    );
    let o = p.cli(&["sandbox", "pause", &id]);
    assert!(o.status.success());
    let o = p.cli(&["sandbox", "ls", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["state"], "paused", "{v}");
    let o = p.cli(&["exec", &id, "--", "echo", "resumed"]);
    assert_eq!(out(&o), "resumed\n");
    let o = p.cli(&["sandbox", "get", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["state"], "running");

    let o = p.cli(&["sandbox", "rm", &id]);
    assert!(o.status.success());
    let o = p.cli(&["sandbox", "get", &id]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not found"));
    let o = p.cli(&["sandbox", "create", "--image", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("warren image ls"));
    let o = p.cli(&["--help"]);
    assert!(out(&o).contains("sandbox") && out(&o).contains("exec") && out(&o).contains("cp"));
    p.assert_clean();
}

/// Serves each request that comes with the canned JSON body for its path, until dropped.
fn canned_server(answers: Vec<(&'static str, String)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { break };
            let mut line = String::new();
            let mut r = BufReader::new(conn.try_clone().unwrap());
            if r.read_line(&mut line).is_err() {
                continue;
            }
            // The rest of the head; these requests have no body.
            let mut h = String::new();
            while r.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let path = line.split(' ').nth(1).unwrap_or("").to_string();
            let body = answers
                .iter()
                .find(|(p, _)| path.starts_with(p))
                .map(|(_, b)| b.clone())
                .unwrap_or_else(|| r#"{"error":{"code":"not_found","message":"no"}}"#.into());
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// A node that did not answer is a warning line on stderr naming it; the list printed is
/// what the other nodes hold, and a task operation that could not reach it exits 1. (Against
/// a canned control plane: one machine runs one node, so this cannot be staged for real.)
#[test]
fn nodes_that_did_not_answer_are_named_on_stderr() {
    let down = r#"[{"node":"nodebb","error":{"code":"unavailable","message":"node nodebb (http://10.1.2.3:7701) does not answer: no answer within 30 s"}}]"#;
    let url = canned_server(vec![
        (
            "/v1/sandboxes",
            format!(r#"{{"sandboxes":[],"unreachable":{down}}}"#),
        ),
        (
            "/v1/tasks/t/stop",
            format!(
                r#"{{"task":"t","action":"stop","succeeded":2,"failed":[],"unreachable":{down}}}"#
            ),
        ),
        (
            "/v1/tasks",
            format!(r#"{{"tasks":[],"unreachable":{down}}}"#),
        ),
    ]);
    let run = |args: &[&str]| {
        std::process::Command::new(common::warren_bin())
            .args(args)
            .env("WARREN_URL", &url)
            .env("WARREN_API_KEY", "wk_test")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run warren")
    };
    let warning = "warning: node nodebb did not answer, so its sandboxes";
    for args in [
        &["sandbox", "ls"][..],
        &["sandbox", "ls", "--json"],
        &["task", "ls"],
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(
            err.contains(warning) && err.contains("no answer within 30 s"),
            "{args:?}: {err}"
        );
        assert!(
            !out(&o).contains("nodebb"),
            "{args:?}: the warning is not on stdout"
        );
    }
    let o = run(&["sandbox", "ls", "--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap(),
        serde_json::json!([])
    );
    let o = run(&["task", "stop", "t"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(out(&o), "t stop: 2 sandboxes\n");
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("node nodebb did not answer, so its sandboxes were not reached"),
        "{o:?}"
    );
}

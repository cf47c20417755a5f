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

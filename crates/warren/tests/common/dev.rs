//! `warren dev cluster` driven by a test: started with its stdin and stdout piped, commands
//! written one per line and their JSON answers read back. Dropping it sends `quit` (the
//! harness kills every sandbox and removes what it made) and waits for it to end.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use warren_sdk::Client;

use super::warren_bin;

/// A running `warren dev cluster`.
pub struct DevCluster {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// What its first line said.
    pub ready: serde_json::Value,
    key: String,
    log: std::path::PathBuf,
}

impl DevCluster {
    /// Starts `warren dev cluster` with `args` and waits for its first line.
    pub fn start(args: &[&str]) -> DevCluster {
        let log =
            std::env::temp_dir().join(format!("warren-dev-cluster-{}.log", std::process::id()));
        let mut child = Command::new(warren_bin())
            .args(["dev", "cluster"])
            .args(args)
            .env("WARREN_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn warren dev cluster");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let v: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                let _ = child.wait();
                panic!(
                    "warren dev cluster did not start: {line:?}\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        };
        let ready = v["ready"].clone();
        let key = std::fs::read_to_string(ready["admin_key_file"].as_str().unwrap())
            .unwrap()
            .trim()
            .to_string();
        DevCluster {
            child,
            stdin,
            stdout,
            ready,
            key,
            log,
        }
    }

    /// Sends one command; its answer (`{"ok": ...}` or `{"error": ...}`).
    pub fn cmd(&mut self, line: &str) -> serde_json::Value {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
    }

    /// Sends a command that must succeed.
    pub fn ok(&mut self, line: &str) {
        let a = self.cmd(line);
        assert!(a.get("ok").is_some(), "{line}: {a}");
    }

    /// A client of replica `r` with the admin key.
    pub fn client(&self, r: usize) -> Client {
        Client::new(
            self.ready["replicas"][r]["url"].as_str().unwrap(),
            Some(&self.key),
        )
        .unwrap()
    }

    /// Node `i`'s id.
    pub fn node_id(&self, i: usize) -> String {
        self.ready["nodes"][i]["id"].as_str().unwrap().to_string()
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        // End of input is `quit`.
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                if !st.success() {
                    eprintln!(
                        "warren dev cluster ended with {st}:\n{}",
                        std::fs::read_to_string(&self.log).unwrap_or_default()
                    );
                }
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("warren dev cluster did not stop within 180 s; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

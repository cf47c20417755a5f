//! What the kernel tests share: root or not, and network namespaces of a test's own, deleted
//! when dropped (a failing test's too).

#![allow(dead_code)]

use std::io::Write;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// A network namespace made for a test, with its loopback up; deleted when dropped.
pub struct Ns {
    pub name: String,
}

impl Ns {
    pub fn new(tag: &str) -> Ns {
        let name = format!("wnt-{}-{tag}", std::process::id());
        // One a killed run left behind.
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name}");
        let ns = Ns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n <ns> args`, asserting it succeeded.
    pub fn ip(&self, args: &[&str]) {
        let out = Command::new("ip")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ip -n {} {args:?}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs a shell command in the namespace and returns its stdout.
    pub fn sh(&self, cmd: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "sh", "-c", cmd])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `cmd` in the namespace with `stdin`, and asserts it succeeded.
    pub fn exec(&self, cmd: &[&str], stdin: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(cmd)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn file(&self) -> std::fs::File {
        std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap()
    }

    /// Runs `f` on a thread inside this namespace and waits for it.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.file();
        std::thread::scope(|s| {
            s.spawn(move || {
                enter(&fd);
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// Runs `f` on a thread of its own inside this namespace, for as long as it runs.
    pub fn spawn(&self, f: impl FnOnce() + Send + 'static) {
        let fd = self.file();
        std::thread::spawn(move || {
            enter(&fd);
            f()
        });
    }
}

/// Moves the calling thread into the network namespace of `fd`.
pub fn enter(fd: &std::fs::File) {
    rustix::thread::move_into_link_name_space(
        fd.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .unwrap();
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

//! The trajectory log (the paper's fast-forward): every exec (plain or streaming) and file
//! write of a sandbox that asked for it, as JSON lines in `<sandbox dir>/trajectory.jsonl`, and
//! its replay.
//!
//! Replay: a sandbox created with `replay: [entries]` first re-applies them in order (commands
//! run again, files written again with their recorded content) to rebuild its state. From then
//! on, while the rollout's operations match the log's leading entries (same command, env, cwd,
//! user and stdin; same file path, user, mode and content), it answers each with the recorded
//! result (`replayed: true`) instead of running it: a rollout restarted after preemption sees
//! exactly what it saw before. The first operation that does not match, or the first after
//! the log's last entry, ends the replay (`replay_ended: true`) and everything from there runs
//! live.
//!
//! What re-running cannot restore is said plainly: a command whose effects differ from run to
//! run (`date > f`) leaves the rebuilt state different from the original, though the rollout is
//! shown the original outputs. Background processes and tar uploads are not recorded. The
//! replay position lives in the daemon's memory: a restart of the node daemon ends a replay.

use std::collections::BTreeMap;
use std::io::Write;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use warren_types::api::{ExecResult, TrajectoryEntry};

use crate::node::Sandbox;

/// File name of the log in the sandbox directory.
pub const LOG_FILE: &str = "trajectory.jsonl";

/// A log being replayed, and how far.
#[derive(Debug)]
pub struct Replay {
    entries: Vec<TrajectoryEntry>,
    pos: usize,
}

/// What an operation is, for matching against the log.
pub enum Key<'a> {
    /// A command.
    Exec {
        argv: &'a [String],
        env: &'a BTreeMap<String, String>,
        cwd: Option<&'a str>,
        user: &'a str,
        stdin: Option<&'a [u8]>,
    },
    /// A file write.
    WriteFile {
        path: &'a str,
        user: &'a str,
        mode: Option<u32>,
        content: &'a [u8],
    },
}

/// What the replay says about an operation.
pub enum Outcome {
    /// It matched the next entry: answer with this recorded entry.
    Hit(Box<TrajectoryEntry>),
    /// It did not match: replay is over, run it live.
    Ended,
}

/// SHA-256 of `data`, hex.
pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Key<'_> {
    fn matches(&self, e: &TrajectoryEntry) -> bool {
        match (self, e) {
            (
                Key::Exec {
                    argv,
                    env,
                    cwd,
                    user,
                    stdin,
                },
                TrajectoryEntry::Exec {
                    argv: a,
                    env: en,
                    cwd: c,
                    user: u,
                    stdin_sha256,
                    ..
                },
            ) => {
                *argv == a.as_slice()
                    && *env == en
                    && *cwd == c.as_deref()
                    && user == u
                    && stdin.filter(|s| !s.is_empty()).map(sha256) == *stdin_sha256
            }
            (
                Key::WriteFile {
                    path,
                    user,
                    mode,
                    content,
                },
                TrajectoryEntry::WriteFile {
                    path: p,
                    user: u,
                    mode: m,
                    sha256: h,
                    ..
                },
            ) => path == p && user == u && mode == m && sha256(content) == *h,
            _ => false,
        }
    }

    /// The log entry for this operation with its result.
    pub fn entry(&self, result: Option<&ExecResult>) -> Option<TrajectoryEntry> {
        match self {
            Key::Exec {
                argv,
                env,
                cwd,
                user,
                stdin,
            } => {
                let mut result = result?.clone();
                result.replayed = false;
                result.replay_ended = false;
                let stdin = stdin.filter(|s| !s.is_empty());
                Some(TrajectoryEntry::Exec {
                    argv: argv.to_vec(),
                    env: (*env).clone(),
                    cwd: cwd.map(str::to_string),
                    user: user.to_string(),
                    stdin_sha256: stdin.map(sha256),
                    stdin_b64: stdin.map(|s| B64.encode(s)),
                    result,
                })
            }
            Key::WriteFile {
                path,
                user,
                mode,
                content,
            } => Some(TrajectoryEntry::WriteFile {
                path: path.to_string(),
                user: user.to_string(),
                mode: *mode,
                sha256: sha256(content),
                content_b64: B64.encode(content),
            }),
        }
    }
}

impl Replay {
    /// A replay of `entries` from the start.
    pub fn new(entries: Vec<TrajectoryEntry>) -> Replay {
        Replay { entries, pos: 0 }
    }
}

impl Sandbox {
    /// Checks an operation against the replay, if one runs. `None`: no replay (any more).
    pub(crate) fn replay_step(&self, key: &Key<'_>) -> Option<Outcome> {
        let mut r = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        let replay = r.as_mut()?;
        match replay.entries.get(replay.pos) {
            Some(e) if key.matches(e) => {
                let hit = e.clone();
                replay.pos += 1;
                Some(Outcome::Hit(Box::new(hit)))
            }
            _ => {
                *r = None;
                Some(Outcome::Ended)
            }
        }
    }

    /// Appends an entry to the log, if this sandbox keeps one.
    pub(crate) fn record(&self, entry: Option<TrajectoryEntry>) {
        let (true, Some(entry)) = (self.record.trajectory, entry) else {
            return;
        };
        let Ok(mut line) = serde_json::to_vec(&entry) else {
            return;
        };
        line.push(b'\n');
        let _g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG_FILE))
            .and_then(|mut f| f.write_all(&line));
        if let Err(e) = res {
            tracing::error!(sandbox_id = %self.record.id, "writing the trajectory log: {e}");
        }
    }

    /// The log so far, as JSON lines.
    pub fn trajectory(&self) -> std::io::Result<Vec<u8>> {
        let _g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        match std::fs::read(self.dir.join(LOG_FILE)) {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec_entry(cmd: &str, out: &str) -> TrajectoryEntry {
        let env = BTreeMap::new();
        let argv = vec!["sh".to_string(), "-c".to_string(), cmd.to_string()];
        let key = Key::Exec {
            argv: &argv,
            env: &env,
            cwd: None,
            user: "user",
            stdin: None,
        };
        let r = ExecResult {
            stdout: out.into(),
            ..ExecResult::default()
        };
        key.entry(Some(&r)).unwrap()
    }

    #[test]
    fn matching_is_exact_and_stdin_counts() {
        let env = BTreeMap::new();
        let argv = vec!["sh".to_string(), "-c".to_string(), "date".to_string()];
        let e = exec_entry("date", "t1");
        assert!(
            Key::Exec {
                argv: &argv,
                env: &env,
                cwd: None,
                user: "user",
                stdin: None
            }
            .matches(&e)
        );
        assert!(
            Key::Exec {
                argv: &argv,
                env: &env,
                cwd: None,
                user: "user",
                stdin: Some(b"")
            }
            .matches(&e)
        );
        assert!(
            !Key::Exec {
                argv: &argv,
                env: &env,
                cwd: None,
                user: "root",
                stdin: None
            }
            .matches(&e)
        );
        assert!(
            !Key::Exec {
                argv: &argv,
                env: &env,
                cwd: Some("/tmp"),
                user: "user",
                stdin: None
            }
            .matches(&e)
        );
        assert!(
            !Key::Exec {
                argv: &argv,
                env: &env,
                cwd: None,
                user: "user",
                stdin: Some(b"x")
            }
            .matches(&e)
        );
        let w = Key::WriteFile {
            path: "/f",
            user: "user",
            mode: None,
            content: b"abc",
        };
        let we = w.entry(None).unwrap();
        assert!(w.matches(&we));
        assert!(
            !Key::WriteFile {
                path: "/f",
                user: "user",
                mode: None,
                content: b"abd"
            }
            .matches(&we)
        );
        assert!(!w.matches(&e));
    }

    #[test]
    fn entries_round_trip_through_json_lines() {
        let e = exec_entry("echo hi", "hi\n");
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.contains("\"op\":\"exec\""), "{line}");
        assert_eq!(serde_json::from_str::<TrajectoryEntry>(&line).unwrap(), e);
    }
}

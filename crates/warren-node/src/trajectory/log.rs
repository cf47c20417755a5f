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

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use warren_types::id::SandboxId;

/// File name of the log in the sandbox directory.
pub const LOG_FILE: &str = "trajectory.jsonl";

/// Directory of the log's blobs (payloads over [`INLINE_MAX`], by SHA-256), beside it.
pub const BLOB_DIR: &str = "trajectory.blobs";

/// Payloads (stdin, outputs, file contents) up to this size are kept inline in the log, as
/// base64; larger ones in a blob file, so no line of the log is larger than a few of these.
pub const INLINE_MAX: usize = 256 << 10;

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
    /// A file write (its content by digest: uploads are streamed, never held whole).
    WriteFile {
        path: &'a str,
        user: &'a str,
        mode: Option<u32>,
        sha256: &'a str,
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
                    sha256,
                },
                TrajectoryEntry::WriteFile {
                    path: p,
                    user: u,
                    mode: m,
                    sha256: h,
                    ..
                },
            ) => path == p && user == u && mode == m && sha256 == h,
            _ => false,
        }
    }
}

impl Replay {
    /// A replay of `entries` from the start.
    pub fn new(entries: Vec<TrajectoryEntry>) -> Replay {
        Replay { entries, pos: 0 }
    }
}

/// A sandbox's trajectory: its log (when it keeps one) and the replay it runs (when it does).
pub struct Trajectory {
    id: SandboxId,
    dir: PathBuf,
    /// Whether operations are recorded.
    enabled: bool,
    replay: Mutex<Option<Replay>>,
    /// Serialises appends to the log.
    log: Mutex<()>,
    /// Bytes the log and its blobs hold, and the most they may.
    bytes: AtomicU64,
    budget: u64,
}

impl Trajectory {
    /// The trajectory of sandbox `id` in `dir` (a log already there counts against `budget`).
    pub fn new(id: SandboxId, dir: &Path, enabled: bool, budget: u64) -> Trajectory {
        Trajectory {
            id,
            dir: dir.to_path_buf(),
            enabled,
            replay: Mutex::new(None),
            log: Mutex::new(()),
            bytes: AtomicU64::new(Trajectory::size_on_disk(dir)),
            budget,
        }
    }

    /// Starts replaying `entries`: matching leading operations get their recorded results.
    pub fn start_replay(&self, entries: Vec<TrajectoryEntry>) {
        *self.replay.lock().unwrap_or_else(|p| p.into_inner()) = Some(Replay::new(entries));
    }

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

    /// Records a command and its result, if this sandbox keeps a log. Nothing is copied
    /// whole: outputs larger than [`INLINE_MAX`] go to a blob file by digest.
    pub(crate) fn record_exec(&self, key: &Key<'_>, result: &ExecResult) {
        let Key::Exec {
            argv,
            env,
            cwd,
            user,
            stdin,
        } = key
        else {
            return;
        };
        if !self.enabled {
            return;
        }
        let run = || -> std::io::Result<()> {
            let mut blobs = serde_json::Map::new();
            let stdin = stdin.filter(|s| !s.is_empty());
            let stdin_b64 = match stdin {
                Some(s) if s.len() > INLINE_MAX => {
                    blobs.insert("stdin".into(), self.put_blob(s)?.into());
                    None
                }
                Some(s) => Some(B64.encode(s)),
                None => None,
            };
            let mut out = |name: &str, text: &str| -> std::io::Result<String> {
                if text.len() > INLINE_MAX {
                    blobs.insert(name.into(), self.put_blob(text.as_bytes())?.into());
                    Ok(String::new())
                } else {
                    Ok(text.to_string())
                }
            };
            let stdout = out("stdout", &result.stdout)?;
            let stderr = out("stderr", &result.stderr)?;
            let recorded = ExecResult {
                status: result.status.clone(),
                stdout,
                stderr,
                stdout_encoding: result.stdout_encoding,
                stderr_encoding: result.stderr_encoding,
                replayed: false,
                replay_ended: false,
            };
            let mut v = serde_json::to_value(TrajectoryEntry::Exec {
                argv: argv.to_vec(),
                env: (*env).clone(),
                cwd: cwd.map(str::to_string),
                user: user.to_string(),
                stdin_sha256: stdin.map(sha256),
                stdin_b64,
                result: recorded,
            })
            .map_err(std::io::Error::other)?;
            if !blobs.is_empty() {
                v["blobs"] = serde_json::Value::Object(blobs);
            }
            self.append(&v)
        };
        if let Err(e) = run() {
            tracing::error!(sandbox_id = %self.id, "writing the trajectory log: {e}");
        }
    }

    /// Records a file write whose content was streamed into `content` (a file of the log's
    /// blob directory, from [`Trajectory::blob_file`]): small contents go inline, others stay a
    /// blob named by their digest.
    pub(crate) fn record_write(&self, key: &Key<'_>, content: &std::path::Path, size: u64) {
        let Key::WriteFile {
            path,
            user,
            mode,
            sha256,
        } = key
        else {
            return;
        };
        let run = || -> std::io::Result<()> {
            let mut blobs = serde_json::Map::new();
            let content_b64 = if size as usize > INLINE_MAX {
                let to = self.blob_dir().join(sha256);
                if to.exists() {
                    // The same content again: one blob serves both.
                    let _ = std::fs::remove_file(content);
                } else {
                    self.charge(size)?;
                    std::fs::rename(content, &to)?;
                }
                blobs.insert("content".into(), sha256.to_string().into());
                String::new()
            } else {
                let data = std::fs::read(content)?;
                let _ = std::fs::remove_file(content);
                B64.encode(data)
            };
            let mut v = serde_json::to_value(TrajectoryEntry::WriteFile {
                path: path.to_string(),
                user: user.to_string(),
                mode: *mode,
                sha256: sha256.to_string(),
                content_b64,
            })
            .map_err(std::io::Error::other)?;
            if !blobs.is_empty() {
                v["blobs"] = serde_json::Value::Object(blobs);
            }
            self.append(&v)
        };
        if let Err(e) = run() {
            let _ = std::fs::remove_file(content);
            tracing::error!(sandbox_id = %self.id, "writing the trajectory log: {e}");
        }
    }

    /// Where blobs of the log are kept.
    fn blob_dir(&self) -> std::path::PathBuf {
        self.dir.join(BLOB_DIR)
    }

    /// A new temporary file in the blob directory, for streaming a payload into.
    pub(crate) fn blob_file(&self) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
        std::fs::create_dir_all(self.blob_dir())?;
        let p = self
            .blob_dir()
            .join(format!(".tmp-{}", crate::state::random_name(12)));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)?;
        Ok((p, f))
    }

    /// Stores `data` as a blob; returns its digest.
    fn put_blob(&self, data: &[u8]) -> std::io::Result<String> {
        self.charge(data.len() as u64)?;
        let hex = sha256(data);
        let to = self.blob_dir().join(&hex);
        if !to.exists() {
            let (tmp, mut f) = self.blob_file()?;
            f.write_all(data)?;
            drop(f);
            std::fs::rename(tmp, to)?;
        }
        Ok(hex)
    }

    /// Counts `n` more bytes against the log's budget; past it, nothing more is recorded.
    fn charge(&self, n: u64) -> std::io::Result<()> {
        let used = self.bytes.fetch_add(n, Ordering::Relaxed) + n;
        if used > self.budget {
            return Err(std::io::Error::other(format!(
                "the trajectory log reached max_trajectory ({}); later operations are not recorded",
                warren_types::ByteSize(self.budget)
            )));
        }
        Ok(())
    }

    /// Appends a line to the log.
    fn append(&self, v: &serde_json::Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.charge(line.len() as u64)?;
        let _g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG_FILE))
            .and_then(|mut f| f.write_all(&line))
    }

    /// Bytes the log and its blobs hold on disk (after a restart).
    pub(crate) fn size_on_disk(dir: &std::path::Path) -> u64 {
        let file = std::fs::metadata(dir.join(LOG_FILE)).map_or(0, |m| m.len());
        let blobs: u64 = std::fs::read_dir(dir.join(BLOB_DIR))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum();
        file + blobs
    }

    /// Streams the log as JSON lines into `tx`, one entry at a time, with each blob given
    /// back inline (so the lines are what a replay takes). Blocking.
    pub fn stream_trajectory(&self, tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>) {
        use std::io::BufRead;
        let f = match std::fs::File::open(self.dir.join(LOG_FILE)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        for line in std::io::BufReader::new(f).split(b'\n') {
            let out = line.and_then(|l| self.inline(l));
            let failed = out.is_err();
            if tx.blocking_send(out.map(bytes::Bytes::from)).is_err() || failed {
                return;
            }
        }
    }

    /// A stored line with its blobs put back inline, newline-terminated.
    fn inline(&self, mut line: Vec<u8>) -> std::io::Result<Vec<u8>> {
        if !line.windows(8).any(|w| w == b"\"blobs\":") {
            line.push(b'\n');
            return Ok(line);
        }
        let mut v: serde_json::Value =
            serde_json::from_slice(&line).map_err(std::io::Error::other)?;
        drop(line);
        let blobs = v
            .as_object_mut()
            .and_then(|o| o.remove("blobs"))
            .unwrap_or_default();
        for (field, hex) in blobs.as_object().into_iter().flatten() {
            let hex = hex.as_str().unwrap_or_default();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let data = std::fs::read(self.blob_dir().join(hex))?;
            match field.as_str() {
                "content" => v["content_b64"] = B64.encode(&data).into(),
                "stdin" => v["stdin_b64"] = B64.encode(&data).into(),
                "stdout" | "stderr" => {
                    v["result"][field.as_str()] = String::from_utf8_lossy(&data).into_owned().into()
                }
                _ => {}
            }
        }
        let mut out = serde_json::to_vec(&v).map_err(std::io::Error::other)?;
        out.push(b'\n');
        Ok(out)
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
        let _ = key;
        TrajectoryEntry::Exec {
            argv,
            env,
            cwd: None,
            user: "user".into(),
            stdin_sha256: None,
            stdin_b64: None,
            result: ExecResult {
                stdout: out.into(),
                ..ExecResult::default()
            },
        }
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
        let abc = sha256(b"abc");
        let w = Key::WriteFile {
            path: "/f",
            user: "user",
            mode: None,
            sha256: &abc,
        };
        let we = TrajectoryEntry::WriteFile {
            path: "/f".into(),
            user: "user".into(),
            mode: None,
            sha256: abc.clone(),
            content_b64: B64.encode(b"abc"),
        };
        assert!(w.matches(&we));
        let abd = sha256(b"abd");
        assert!(
            !Key::WriteFile {
                path: "/f",
                user: "user",
                mode: None,
                sha256: &abd,
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

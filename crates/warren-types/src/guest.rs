//! The protocol between a node and the guest agent (PID 1 of every sandbox).
//!
//! Transport: a stream socket reachable from the host only (a unix socket bound before
//! `pivot_root` for containers, vsock or virtio-serial for VMs). One connection carries one
//! operation. Everything on it is a frame:
//!
//! ```text
//! ┌──────────────┬──────┬─────────────────────────┐
//! │ len: u32 BE  │ kind │ payload (len - 1 bytes) │
//! └──────────────┴──────┴─────────────────────────┘
//! ```
//!
//! `kind` says what the payload is: a JSON message ([`FrameKind::Message`]) or raw bytes
//! (output, input, file data). Handshake: the guest speaks first with [`Hello`] carrying its
//! protocol version; the host sends one [`Request`] (which carries the host's version, so the
//! guest can refuse a host it does not understand) without waiting for the hello, then reads
//! replies. Neither side waits for the other's hello to start writing, so the handshake costs
//! no round trip.

use serde::{Deserialize, Serialize};

use crate::api::{ExitStatus, FileEntry, ProcessInfo, Role};
use crate::error::ErrorCode;

/// The protocol version this build speaks. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest data frame payload (output, stdin, file content) either side sends or accepts;
/// longer data goes in several frames.
pub const MAX_FRAME: usize = 1 << 20;

/// Largest message frame payload (one JSON request or reply): an exec's command line is up to
/// 1 MiB and its environment 64 KiB, and JSON may write a byte in six.
pub const MAX_MESSAGE: usize = 16 << 20;

/// Size of a frame header.
pub const HEADER_LEN: usize = 5;

/// What a frame's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A JSON [`Hello`], [`Request`] or [`Reply`].
    Message = 1,
    /// Bytes a command wrote to stdout.
    Stdout = 2,
    /// Bytes a command wrote to stderr.
    Stderr = 3,
    /// Bytes for a command's stdin (empty payload: end of input).
    Stdin = 4,
    /// File content (empty payload: end of file).
    Data = 5,
}

impl FrameKind {
    /// The kind for a header byte.
    pub fn from_u8(b: u8) -> Option<FrameKind> {
        Some(match b {
            1 => FrameKind::Message,
            2 => FrameKind::Stdout,
            3 => FrameKind::Stderr,
            4 => FrameKind::Stdin,
            5 => FrameKind::Data,
            _ => return None,
        })
    }
}

/// Encodes a frame header for a payload of `payload_len` bytes.
pub fn encode_header(kind: FrameKind, payload_len: usize) -> [u8; HEADER_LEN] {
    let len = (payload_len as u32 + 1).to_be_bytes();
    [len[0], len[1], len[2], len[3], kind as u8]
}

/// Decodes a frame header into its kind and payload length.
pub fn decode_header(h: [u8; HEADER_LEN]) -> Result<(FrameKind, usize), String> {
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len == 0 {
        return Err("frame length 0".into());
    }
    let kind = FrameKind::from_u8(h[4]).ok_or_else(|| format!("unknown frame kind {}", h[4]))?;
    let max = match kind {
        FrameKind::Message => MAX_MESSAGE,
        _ => MAX_FRAME,
    };
    if len - 1 > max {
        return Err(format!(
            "frame of {} bytes exceeds the {max}-byte limit",
            len - 1
        ));
    }
    Ok((kind, len - 1))
}

/// A whole frame as bytes: header then payload.
pub fn encode_frame(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&encode_header(kind, payload.len()));
    v.extend_from_slice(payload);
    v
}

/// A JSON message frame.
pub fn encode_message<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising our own plain data types cannot fail.
    let json = serde_json::to_vec(msg).unwrap_or_default();
    encode_frame(FrameKind::Message, &json)
}

/// The guest's first frame on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The guest's protocol version.
    pub protocol: u32,
    /// The guest agent's build version.
    pub agent: String,
}

/// How the guest receives a command's stdin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdinMode {
    /// No input: stdin is /dev/null.
    #[default]
    Null,
    /// Input follows as [`FrameKind::Stdin`] frames, ended by an empty one.
    Frames,
    /// The process table keeps stdin open: input arrives later with [`Op::Input`], until an
    /// input with `close` (or the process's end).
    Open,
}

/// A terminal's size in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// What to run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Program and arguments (a shell command arrives as `["/bin/sh", "-c", cmd]`).
    pub argv: Vec<String>,
    /// Environment added to the sandbox's base environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory; default the user's home.
    #[serde(default)]
    pub cwd: Option<String>,
    /// User name or uid.
    pub user: String,
    /// Kill the process group after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes kept per output stream.
    pub max_output: u64,
    /// Where stdin comes from.
    #[serde(default)]
    pub stdin: StdinMode,
    /// Who runs it (a grader command ignores `user`).
    #[serde(default)]
    pub role: Role,
    /// Run it on a pseudo-terminal of this size: stdin, stdout and stderr are the terminal
    /// (output comes as [`FrameKind::Stdout`] frames), it is its session's controlling
    /// terminal, and input goes in with [`Op::Input`] ([`StdinMode::Open`] is implied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<TermSize>,
}

/// The one request on a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The host's protocol version.
    pub protocol: u32,
    /// What to do.
    pub op: Op,
}

/// Operations the guest performs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Liveness: answers [`Reply::Pong`].
    Ping,
    /// Run a command and stream it: [`Reply::Started`], output frames, then [`Reply::Exit`].
    /// The process outlives the connection; re-attach with [`Op::Attach`].
    Exec(ExecSpec),
    /// Start a background command: [`Reply::Started`], then the connection ends.
    Spawn(ExecSpec),
    /// Stream a process's output from the start (what is kept of it), then follow it until it
    /// exits: output frames then [`Reply::Exit`].
    Attach {
        /// Process id.
        process: u64,
    },
    /// Wait for a process to exit, up to `timeout_ms`: [`Reply::Process`].
    Wait {
        /// Process id.
        process: u64,
        /// Give up after this long (the reply then shows it still running).
        timeout_ms: Option<u64>,
    },
    /// Send a signal to a process's group: [`Reply::Done`].
    Signal {
        /// Process id.
        process: u64,
        /// Signal number.
        signal: i32,
    },
    /// Forget a finished process and its output: [`Reply::Done`].
    Forget {
        /// Process id.
        process: u64,
    },
    /// List processes: [`Reply::Processes`].
    Processes,
    /// Write the [`FrameKind::Stdin`] frames that follow (ended by an empty one) to a
    /// process's kept stdin or terminal, then close it if `close`: [`Reply::Done`] once
    /// written. The process must have been started with [`StdinMode::Open`] or a `pty`.
    Input {
        /// Process id.
        process: u64,
        /// Close stdin after the data (end of input; on a terminal, nothing is closed: send
        /// the terminal's end-of-file character instead).
        close: bool,
    },
    /// Change a process's terminal size: [`Reply::Done`].
    Resize {
        /// Process id.
        process: u64,
        /// The new size.
        size: TermSize,
    },
    /// Read a file: [`Reply::Entry`], [`FrameKind::Data`] frames, an empty data frame.
    ReadFile {
        /// Path (absolute, or relative to the user's home).
        path: String,
        /// Acting user.
        user: String,
    },
    /// Unpack the tar stream in the [`FrameKind::Data`] frames that follow (ended by an empty
    /// one) into directory `path` (made if missing), as the user: [`Reply::Entry`] of the
    /// directory. Entries that would land outside `path` are refused.
    UploadTar {
        /// Directory to unpack into.
        path: String,
        /// Acting user: the files belong to them.
        user: String,
    },
    /// Pack directory `path` (its contents, relative names) as a tar stream:
    /// [`Reply::Entry`] of the directory, [`FrameKind::Data`] frames, an empty data frame.
    /// Symlinks are archived as symlinks.
    DownloadTar {
        /// Directory to pack.
        path: String,
        /// Acting user (reads with their permissions).
        user: String,
    },
    /// Write a file from the [`FrameKind::Data`] frames that follow (ended by an empty one),
    /// creating parent directories: [`Reply::Entry`].
    WriteFile {
        /// Path.
        path: String,
        /// Acting user: the file and new directories belong to them.
        user: String,
        /// Permission bits for a new file (default 0644).
        mode: Option<u32>,
        /// Metadata to set on it (`user.e2b.<key>` extended attributes), checked by the node.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        metadata: std::collections::BTreeMap<String, String>,
    },
    /// List a directory: [`Reply::Entries`].
    List {
        /// Path.
        path: String,
        /// Acting user.
        user: String,
    },
    /// Describe one path: [`Reply::Entry`].
    Stat {
        /// Path.
        path: String,
        /// Acting user.
        user: String,
    },
    /// Remove a file or (with `recursive`) a directory tree: [`Reply::Done`].
    Remove {
        /// Path.
        path: String,
        /// Acting user.
        user: String,
        /// Remove directories and their contents.
        recursive: bool,
    },
    /// Make a directory: [`Reply::Entry`].
    Mkdir {
        /// Path.
        path: String,
        /// Acting user.
        user: String,
        /// Make missing parents too.
        parents: bool,
    },
    /// Rename (move) a path: [`Reply::Entry`] of the new path.
    Rename {
        /// From.
        from: String,
        /// To.
        to: String,
        /// Acting user.
        user: String,
    },
    /// Watch directory `path` (and, `recursive`, those below it) as `user`:
    /// [`Reply::Watch`].
    WatchCreate {
        /// Directory.
        path: String,
        /// Acting user.
        user: String,
        /// Subdirectories too.
        recursive: bool,
        /// Give each event its entry when collected.
        #[serde(default)]
        entries: bool,
    },
    /// A watch's events since the last call, waiting up to `wait_ms` for the first:
    /// [`Reply::FsEvents`].
    WatchEvents {
        /// Watch id.
        watch: u64,
        /// How long to wait for an event when there is none.
        wait_ms: u64,
    },
    /// Stop a watch: [`Reply::Done`].
    WatchRemove {
        /// Watch id.
        watch: u64,
    },
    /// Incidents the guest saw (denied system calls, attempts on the guest itself): a
    /// [`Reply::Incidents`] with every record changed after `after`, then one more each time
    /// records change, for as long as the connection stays open.
    Incidents {
        /// The `seq` of the last reply the host has (0: everything kept).
        after: u64,
    },
    /// Run a function call in a fresh view of the pristine image: [`Reply::Called`].
    Call(CallSpec),
}

/// A function call as the guest runs it: its files are written into a fresh working
/// directory ([`CALL_DIR`]) of a fresh view of the image's pristine layers (a tmpfs of its own
/// for everything written, its own `/dev/shm` and IPC namespace); each step runs as the
/// grader's uid in a PID namespace of its own, so when a step ends nothing of it is left
/// running; when the call ends the view goes, with everything written in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSpec {
    /// Files to write into the working directory.
    pub files: Vec<CallFile>,
    /// Steps, in order (a compile and a run, or a run).
    pub steps: Vec<CallStep>,
    /// Environment of every step (beside `PATH`, `HOME`, `LANG`).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Files to read back from the working directory after the last step.
    #[serde(default)]
    pub fetch: Vec<String>,
    /// Most bytes of all fetched files together.
    #[serde(default)]
    pub max_fetch: u64,
    /// Most processes (threads included) a step may run at once.
    pub pids: u32,
    /// Largest file a step may write, bytes (`RLIMIT_FSIZE`).
    pub file_size: u64,
    /// Size of the call's writable layer (its tmpfs), bytes.
    pub tmp_size: u64,
}

/// The working directory of a function call, inside its view.
pub const CALL_DIR: &str = "/work";

/// A file of a function call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallFile {
    /// Path relative to [`CALL_DIR`] (`main.py`, `data/in.txt`): no `..`, not absolute.
    pub path: String,
    /// Content, base64.
    pub data: String,
    /// Executable.
    #[serde(default)]
    pub executable: bool,
}

/// One step of a function call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallStep {
    /// Program and arguments (the program found on `PATH`, or relative to [`CALL_DIR`]).
    pub argv: Vec<String>,
    /// Standard input, base64 (empty: none).
    #[serde(default)]
    pub stdin: String,
    /// Wall-clock limit, ms.
    pub timeout_ms: u64,
    /// Most bytes kept of stdout and of stderr each: past it the step is killed.
    pub max_output: u64,
    /// Later steps run only if this one exited 0 (a compile).
    #[serde(default)]
    pub required: bool,
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepResult {
    /// Whether it ran (a step after a failed required one does not).
    pub ran: bool,
    /// Exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Killed at its wall-clock limit.
    #[serde(default)]
    pub timed_out: bool,
    /// Killed for printing more than `max_output`.
    #[serde(default)]
    pub output_limit: bool,
    /// Its program could not be started (not found, not executable): why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_started: Option<String>,
    /// Standard output, base64.
    pub stdout: String,
    /// Standard error, base64.
    pub stderr: String,
    /// Wall-clock time, microseconds.
    pub wall_us: u64,
    /// CPU time (user and system), microseconds.
    pub cpu_us: u64,
    /// Peak resident set, bytes.
    pub max_rss: u64,
}

/// What a function call did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallResult {
    /// Each step, in order.
    pub steps: Vec<StepResult>,
    /// Fetched files: path and content (base64), or why not.
    pub files: Vec<FetchedFile>,
    /// The worker lost what it serves calls with (its Python zygote): the node ends it rather
    /// than pool it (absent from an older guest: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retire: bool,
}

/// A file read back after a call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchedFile {
    /// Its path, as asked.
    pub path: String,
    /// Content, base64, when it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Why it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Replies from the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Answer to [`Op::Ping`].
    Pong {
        /// Milliseconds since the guest started.
        uptime_ms: u64,
        /// Processes it tracks.
        processes: u32,
    },
    /// A command started.
    Started {
        /// Process id.
        process: u64,
        /// Its pid in the sandbox.
        pid: i32,
    },
    /// A command ended.
    Exit(ExitStatus),
    /// A process's state.
    Process(ProcessInfo),
    /// The process table.
    Processes {
        /// The processes.
        processes: Vec<ProcessInfo>,
    },
    /// A file system entry.
    Entry(FileEntry),
    /// A directory listing.
    Entries {
        /// The entries.
        entries: Vec<FileEntry>,
    },
    /// Incident records that changed, and the sequence number they bring the host to.
    Incidents {
        /// Records, each whole (an update replaces the record with the same id).
        incidents: Vec<Incident>,
        /// Pass this as `after` to get only later changes.
        seq: u64,
    },
    /// A watch started.
    Watch {
        /// Its id.
        watch: u64,
    },
    /// A watch's events.
    FsEvents {
        /// The changes, oldest first.
        events: Vec<crate::api::FsEvent>,
        /// Some were lost to the bound since the last call.
        overflowed: bool,
    },
    /// Answer to [`Op::Call`].
    Called(CallResult),
    /// The operation succeeded.
    Done,
    /// The operation failed.
    Error {
        /// Stable code.
        code: ErrorCode,
        /// What went wrong, for the user.
        message: String,
    },
}

/// How a container sandbox's init builds its root. The first of two messages on the init's
/// configuration pipe (fd 4), one JSON document a line; never through anything the sandbox can
/// see later.
///
/// An init can build its root before any request names the sandbox (the node's warm pool): it
/// then waits for the second message, [`Activate`], before it answers on its control socket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitConfig {
    /// The init's directory on the host; the init works from there, so that the paths in its
    /// mount options are relative and name nothing of the host. (The node may rename the
    /// directory afterwards; the mounts follow.)
    pub sandbox_dir: String,
    /// Host name inside the sandbox.
    pub hostname: String,
    /// How to build the root file system.
    pub rootfs: RootfsSpec,
    /// Limits for every command.
    #[serde(default)]
    pub limits: GuestLimits,
    /// The grader role.
    #[serde(default)]
    pub grader: GraderSpec,
    /// A builder sandbox (an image build's): commands run as root get the build capabilities
    /// (`warren_sys::creds::build_capabilities`). Never set for an agent's sandbox.
    #[serde(default)]
    pub builder: bool,
    /// A function-call worker: the guest forks its call server at start (see the guest's
    /// `call` module). Never set for an agent's sandbox.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub call_server: bool,
    /// A host file to bind read-only over the sandbox's `/etc/resolv.conf` (naming the
    /// node's DNS proxy), for a sandbox with a network interface. Bound after the root is
    /// pivoted into, so a link at `/etc/resolv.conf` resolves inside the sandbox; skipped
    /// where it is no regular file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolv_conf: Option<String>,
}

/// The uid (and gid) of the guest's spawner, the process that starts every agent command: no
/// agent process has it.
pub const SPAWNER_UID: u32 = 61001;

/// The real and saved uid of a function-call worker's killer (the process that ends what a
/// Python step left running): no process has it, so none can signal the killer, and its
/// `kill(-1)` (as the grader's effective uid) reaches no process of its own uid.
pub const KILLER_UID: u32 = 61002;

/// The grader role (node settings): its uid and the agent's directories it sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraderSpec {
    /// The grader's uid (and gid): no agent process has it.
    pub uid: u32,
    /// The agent's directories the grader sees, where they exist (absolute paths).
    pub workspaces: Vec<String>,
    /// Size of the grader's own writable layer (a tmpfs, fresh for each command), bytes.
    pub tmp_size: u64,
}

impl Default for GraderSpec {
    fn default() -> Self {
        GraderSpec {
            uid: 61000,
            workspaces: vec!["/home/user".into(), "/workspace".into()],
            tmp_size: 256 << 20,
        }
    }
}

/// Limits every command in the sandbox gets (node settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestLimits {
    /// `RLIMIT_NOFILE` soft limit.
    pub open_files: u64,
    /// `RLIMIT_NOFILE` hard limit.
    pub max_open_files: u64,
    /// Whether commands run under the system-call policy (off only to measure its cost).
    #[serde(default = "yes")]
    pub system_call_filter: bool,
}

fn yes() -> bool {
    true
}

impl Default for GuestLimits {
    fn default() -> Self {
        GuestLimits {
            open_files: 4096,
            max_open_files: 65536,
            system_call_filter: true,
        }
    }
}

/// One incident record: occurrences of one kind of attempt, summed over a window (a burst of
/// a million denials is one record with a count).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incident {
    /// Unique within the guest's life.
    pub id: u64,
    /// What happened: `seccomp` (a denied system call) or `management` (an attempt on the
    /// guest agent itself).
    pub kind: String,
    /// Which: the system call and what it targeted.
    pub detail: String,
    /// Occurrences.
    pub count: u64,
    /// First occurrence, ms since the epoch.
    pub first_ms: u64,
    /// Last occurrence, ms since the epoch.
    pub last_ms: u64,
    /// The process of the last occurrence (in the sandbox's pid namespace).
    pub pid: Option<i32>,
    /// Its command name.
    pub comm: Option<String>,
}

/// What makes a ready init a particular sandbox: the second message on the configuration pipe.
/// The init starts answering on its control socket only after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activate {
    /// Environment every command gets (before per-command variables).
    pub env: Vec<(String, String)>,
}

/// A sandbox's root: an overlay of read-only layers and a writable upper directory, plus bind
/// mounts from the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootfsSpec {
    /// Read-only layers, top first, relative to the sandbox directory.
    pub lowers: Vec<String>,
    /// Writable upper directory, relative to the sandbox directory.
    pub upper: String,
    /// Overlay work directory, relative to the sandbox directory.
    pub work: String,
    /// Host paths bound into the root after the overlay is mounted.
    pub binds: Vec<BindMount>,
}

/// A host path bound into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    /// Absolute host path.
    pub source: String,
    /// Absolute path inside the sandbox (must exist in the image).
    pub target: String,
    /// Mount it read-only (and nosuid, nodev).
    pub readonly: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let f = encode_frame(FrameKind::Stdout, b"hello");
        let (kind, len) = decode_header(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(kind, FrameKind::Stdout);
        assert_eq!(len, 5);
        assert_eq!(&f[HEADER_LEN..], b"hello");
    }

    #[test]
    fn bad_headers_are_rejected() {
        assert!(decode_header([0, 0, 0, 0, 1]).is_err());
        assert!(decode_header([0, 0, 0, 2, 99]).is_err());
        assert!(decode_header([0xff, 0, 0, 0, 1]).is_err());
        // Data frames are at most 1 MiB; a message (an exec's escaped command line) up to 16.
        let two_mib = encode_header(FrameKind::Stdout, 2 << 20);
        assert!(decode_header(two_mib).is_err());
        let two_mib = encode_header(FrameKind::Message, 2 << 20);
        assert_eq!(decode_header(two_mib), Ok((FrameKind::Message, 2 << 20)));
        assert!(decode_header(encode_header(FrameKind::Message, (16 << 20) + 1)).is_err());
    }

    #[test]
    fn requests_are_tagged_json() {
        let r = Request {
            protocol: PROTOCOL_VERSION,
            op: Op::Stat {
                path: "/etc".into(),
                user: "user".into(),
            },
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"op\":\"stat\""), "{json}");
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), r);
    }
}

//! The control channel: one operation per connection, dispatched to processes or files.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use warren_types::error::ErrorCode;
use warren_types::guest::{FrameKind, Hello, Op, PROTOCOL_VERSION, Reply, Request};

use crate::files;
use crate::procs::{Proc, Table};
use crate::tarball;
use crate::users;
use crate::wire::{OpError, read_frame, write_frame, write_msg};

const FILE_CHUNK: usize = 256 * 1024;

/// How long one input may wait for its process to read it (and for its turn).
const INPUT_WAIT: Duration = Duration::from_secs(30);
/// How long input already being written may still finish once its process has ended.
const ENDED_GRACE: Duration = Duration::from_millis(500);

/// The guest's state, shared by all connections.
pub struct Guest {
    pub table: Table,
    pub env: Vec<(String, String)>,
    pub started: Instant,
    /// What every command is confined by.
    pub confinement: Arc<warren_sys::confine::Confinement>,
    /// Denied system calls and attempts on the guest.
    pub incidents: Arc<crate::incidents::Incidents>,
    /// The grader role (none in development `serve` mode).
    pub grader: Option<crate::grader::Grader>,
    /// Starts agent commands (none in development `serve` mode).
    pub spawner: Option<crate::spawner::Spawner>,
    /// Runs function calls (only in a function-call worker).
    pub call_server: Option<crate::call::CallServer>,
    /// Directory watches.
    pub watches: Arc<crate::watch::Watches>,
}

/// Accepts connections until the listener fails.
pub async fn serve(listener: UnixListener, guest: Arc<Guest>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(handle(stream, guest.clone()));
            }
            Err(e) => {
                eprintln!("warren-guest: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn handle(stream: UnixStream, g: Arc<Guest>) {
    let (mut r, mut w) = stream.into_split();
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        agent: env!("CARGO_PKG_VERSION").to_string(),
    };
    if write_msg(&mut w, &hello).await.is_err() {
        return;
    }
    let req = match read_frame(&mut r).await {
        Ok(Some((FrameKind::Message, payload))) => serde_json::from_slice::<Request>(&payload)
            .map_err(|e| OpError::invalid(format!("malformed request: {e}"))),
        Ok(Some(_)) => Err(OpError::invalid("expected a request message first")),
        Ok(None) | Err(_) => return,
    };
    let result = match req {
        Ok(req) if req.protocol != PROTOCOL_VERSION => Err(OpError::invalid(format!(
            "host speaks guest protocol {}, this agent speaks {PROTOCOL_VERSION}: upgrade the node or recreate the sandbox",
            req.protocol
        ))),
        Ok(req) => dispatch(req.op, &g, &mut r, &mut w).await,
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        let _ = write_msg(&mut w, &e.reply()).await;
    }
    let _ = w.shutdown().await;
}

async fn dispatch(
    op: Op,
    g: &Guest,
    r: &mut OwnedReadHalf,
    w: &mut OwnedWriteHalf,
) -> Result<(), OpError> {
    let io = |e: std::io::Error| OpError::new(ErrorCode::Unavailable, format!("connection: {e}"));
    match op {
        Op::Ping => {
            let reply = Reply::Pong {
                uptime_ms: g.started.elapsed().as_millis() as u64,
                processes: g.table.len() as u32,
            };
            write_msg(w, &reply).await.map_err(io)
        }
        Op::Exec(spec) => {
            let proc = start(g, &spec, r, w).await?;
            stream_output(w, &proc).await.map_err(io)?;
            // Delivered: nobody needs to re-attach to it.
            g.table.forget(proc.id);
            Ok(())
        }
        Op::Spawn(spec) => start(g, &spec, r, w).await.map(|_| ()),
        Op::Call(spec) => {
            let Some(cs) = g.call_server.as_ref() else {
                return Err(OpError::new(
                    ErrorCode::Unavailable,
                    "function calls run only in a function-call worker, which this sandbox is not",
                ));
            };
            let result = cs.call(&spec).await?;
            write_msg(w, &Reply::Called(result)).await.map_err(io)
        }
        Op::Attach { process } => {
            let proc = g.table.get(process)?;
            stream_output(w, &proc).await.map_err(io)
        }
        Op::Wait {
            process,
            timeout_ms,
        } => {
            let proc = g.table.get(process)?;
            let mut rx = proc.subscribe();
            let wait = async {
                loop {
                    rx.borrow_and_update();
                    if proc.status().is_some() || rx.changed().await.is_err() {
                        break;
                    }
                }
            };
            match timeout_ms {
                Some(ms) => {
                    let _ = tokio::time::timeout(Duration::from_millis(ms), wait).await;
                }
                None => wait.await,
            }
            write_msg(w, &Reply::Process(proc.info())).await.map_err(io)
        }
        Op::Signal { process, signal } => {
            let proc = g.table.get(process)?;
            if proc.status().is_none()
                && proc.pid > 0
                && warren_sys::process::kill_group(proc.pid, signal).is_err()
            {
                warren_sys::process::kill(proc.pid, signal)
                    .map_err(|e| OpError::invalid(format!("signal {signal}: {e}")))?;
            }
            write_msg(w, &Reply::Done).await.map_err(io)
        }
        Op::Forget { process } => {
            g.table.get(process)?;
            g.table.forget(process);
            write_msg(w, &Reply::Done).await.map_err(io)
        }
        Op::Input { process, close } => {
            let proc = g.table.get(process)?;
            let input = proc.input()?;
            let mut ended = proc.ended();
            let work = async {
                let mut held = input.lock().await;
                // Closed, or ended, while this waited for its turn: nothing is written.
                if !proc.is_current_input(&input) {
                    return Err(proc.input().err().unwrap_or_else(|| {
                        OpError::invalid(format!("process {process} takes no input"))
                    }));
                }
                while let Some((FrameKind::Stdin, data)) = read_frame(r).await.map_err(io)? {
                    if data.is_empty() {
                        if close {
                            proc.close_input()?;
                        }
                        return Ok(());
                    }
                    held.write_all(&data).await.map_err(|e| {
                        OpError::new(
                            ErrorCode::InvalidArgument,
                            format!(
                                "writing to process {process}'s input: {e}; it may have closed its stdin"
                            ),
                        )
                    })?;
                }
                Err(OpError::invalid(
                    "input ended early (expected stdin frames ended by an empty one)",
                ))
            };
            // A process that does not read its input (or a client that sends none) holds the
            // input for at most INPUT_WAIT, and never past the process's end.
            let work = tokio::time::timeout(INPUT_WAIT, work);
            tokio::pin!(work);
            let timed_out = || {
                OpError::new(
                    ErrorCode::Conflict,
                    format!(
                        "process {process} did not take its input within {}s (it is not \
                         reading its stdin); what it read was delivered",
                        INPUT_WAIT.as_secs()
                    ),
                )
            };
            tokio::select! {
                r = &mut work => r.map_err(|_| timed_out())??,
                _ = async { ended.wait_for(|e| *e).await.is_ok() } => {
                    // Input it was given before it ended counts as taken (a Ctrl-C that ends
                    // it): the client's closing frame may still be on its way, so the write
                    // is given a moment to finish. Anything written after its end fails.
                    if !matches!(
                        tokio::time::timeout(ENDED_GRACE, &mut work).await,
                        Ok(Ok(Ok(())))
                    ) {
                        return Err(OpError::invalid(format!(
                            "process {process} ended before it took all its input"
                        )));
                    }
                }
            }
            write_msg(w, &Reply::Done).await.map_err(io)
        }
        Op::WatchCreate {
            path,
            user,
            recursive,
            entries,
        } => {
            let watch = g.watches.create(path, user, recursive, entries).await?;
            write_msg(w, &Reply::Watch { watch }).await.map_err(io)
        }
        Op::WatchEvents { watch, wait_ms } => {
            // At most a minute per call: a client that wants longer calls again.
            let wait = Duration::from_millis(wait_ms.min(60_000));
            let (events, overflowed) = g.watches.events(watch, wait).await?;
            write_msg(w, &Reply::FsEvents { events, overflowed })
                .await
                .map_err(io)
        }
        Op::WatchRemove { watch } => {
            g.watches.remove(watch)?;
            write_msg(w, &Reply::Done).await.map_err(io)
        }
        Op::Resize { process, size } => {
            g.table.get(process)?.resize(size.cols, size.rows)?;
            write_msg(w, &Reply::Done).await.map_err(io)
        }
        Op::Processes => {
            let processes = g.table.list();
            write_msg(w, &Reply::Processes { processes })
                .await
                .map_err(io)
        }
        Op::ReadFile { path, user } => {
            let (file, entry) =
                files::as_user(user, move |u| files::open_read(&files::resolve(u, &path)?)).await?;
            write_msg(w, &Reply::Entry(entry)).await.map_err(io)?;
            let mut file = tokio::fs::File::from_std(file);
            let mut buf = vec![0u8; FILE_CHUNK];
            loop {
                let n = file.read(&mut buf).await.map_err(io)?;
                write_frame(w, FrameKind::Data, &buf[..n])
                    .await
                    .map_err(io)?;
                if n == 0 {
                    return Ok(());
                }
            }
        }
        Op::WriteFile {
            path,
            user,
            mode,
            metadata,
        } => write_file(path, user, mode, metadata, r, w).await,
        Op::UploadTar { path, user } => {
            let (tx, reader) = tarball::upload_channel();
            let target = path.clone();
            let unpack = tokio::spawn(files::as_user(user.clone(), move |u| {
                let dir = files::resolve(u, &target)?;
                tarball::unpack(reader, &dir)?;
                files::entry(&dir)
            }));
            let mut complete = false;
            while let Ok(Some((FrameKind::Data, data))) = read_frame(r).await {
                if data.is_empty() {
                    complete = true;
                    break;
                }
                if tx.send(data).await.is_err() {
                    break; // the unpacker stopped: its error says why
                }
            }
            drop(tx);
            let result = unpack
                .await
                .map_err(|e| OpError::new(ErrorCode::Internal, format!("unpack task: {e}")))?;
            let entry = result?;
            if !complete {
                return Err(OpError::new(
                    ErrorCode::Unavailable,
                    format!("the upload into {path} ended early; what arrived was unpacked"),
                ));
            }
            write_msg(w, &Reply::Entry(entry)).await.map_err(io)
        }
        Op::DownloadTar { path, user } => {
            let dir = path.clone();
            let entry = files::as_user(user.clone(), move |u| {
                files::entry(&files::resolve(u, &dir)?)
            })
            .await?;
            if entry.kind != warren_types::api::FileKind::Dir {
                return Err(OpError::invalid(format!("{path} is not a directory")));
            }
            let (writer, mut rx) = tarball::download_channel();
            let pack = tokio::spawn(files::as_user(user, move |u| {
                let dir = files::resolve(u, &path)?;
                tarball::pack(&dir, writer)
            }));
            write_msg(w, &Reply::Entry(entry)).await.map_err(io)?;
            while let Some(chunk) = rx.recv().await {
                write_frame(w, FrameKind::Data, &chunk).await.map_err(io)?;
            }
            match pack.await {
                Ok(Ok(())) => write_frame(w, FrameKind::Data, &[]).await.map_err(io),
                // The stream is cut without its end frame: the reader sees the failure.
                Ok(Err(e)) => Err(e),
                Err(e) => Err(OpError::new(ErrorCode::Internal, format!("pack task: {e}"))),
            }
        }
        Op::List { path, user } => {
            let entries =
                files::as_user(user, move |u| files::list(&files::resolve(u, &path)?)).await?;
            write_msg(w, &Reply::Entries { entries }).await.map_err(io)
        }
        Op::Stat { path, user } => {
            let entry =
                files::as_user(user, move |u| files::entry(&files::resolve(u, &path)?)).await?;
            write_msg(w, &Reply::Entry(entry)).await.map_err(io)
        }
        Op::Remove {
            path,
            user,
            recursive,
        } => {
            files::as_user(user, move |u| {
                files::remove(&files::resolve(u, &path)?, recursive)
            })
            .await?;
            write_msg(w, &Reply::Done).await.map_err(io)
        }
        Op::Mkdir {
            path,
            user,
            parents,
        } => {
            let entry = files::as_user(user, move |u| {
                files::mkdir(&files::resolve(u, &path)?, parents)
            })
            .await?;
            write_msg(w, &Reply::Entry(entry)).await.map_err(io)
        }
        Op::Incidents { after } => incidents(g, after, w).await.map_err(io),
        Op::Rename { from, to, user } => {
            let entry = files::as_user(user, move |u| {
                files::rename(&files::resolve(u, &from)?, &files::resolve(u, &to)?)
            })
            .await?;
            write_msg(w, &Reply::Entry(entry)).await.map_err(io)
        }
    }
}

/// Sends incident records changed after `after`, then every later change (at most a few
/// replies a second), until the host hangs up.
async fn incidents(g: &Guest, mut after: u64, w: &mut OwnedWriteHalf) -> std::io::Result<()> {
    let mut rx = g.incidents.subscribe();
    let mut first = true;
    loop {
        rx.borrow_and_update();
        let (incidents, seq) = g.incidents.since(after);
        if !incidents.is_empty() || first {
            write_msg(w, &Reply::Incidents { incidents, seq }).await?;
            // A flood is reported a few times a second, not per occurrence.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        first = false;
        after = seq;
        if !rx.has_changed().unwrap_or(false) && rx.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Starts a command, answers `Started`, and feeds it the stdin frames that follow.
async fn start(
    g: &Guest,
    spec: &warren_types::guest::ExecSpec,
    r: &mut OwnedReadHalf,
    w: &mut OwnedWriteHalf,
) -> Result<std::sync::Arc<Proc>, OpError> {
    let (user, grader) = match spec.role {
        warren_types::api::Role::Agent => (users::lookup(&spec.user)?, None),
        warren_types::api::Role::Grader => {
            let gr = g.grader.as_ref().ok_or_else(|| {
                OpError::invalid("this guest has no grader role (development mode)")
            })?;
            (gr.user(), Some(gr))
        }
    };
    let (proc, stdin) = g.table.start(
        spec,
        &user,
        &g.env,
        &g.confinement,
        grader,
        g.spawner.as_ref(),
    )?;
    let started = Reply::Started {
        process: proc.id,
        pid: proc.pid,
    };
    write_msg(w, &started)
        .await
        .map_err(|e| OpError::new(ErrorCode::Unavailable, format!("connection: {e}")))?;
    if let Some(stdin) = stdin {
        feed_stdin(r, stdin).await;
    } else if spec.stdin == warren_types::guest::StdinMode::Open || spec.pty.is_some() {
        // First input, if any, then an empty frame; the input stays open. A process that does
        // not read it holds this for at most INPUT_WAIT.
        if let Ok(input) = proc.input() {
            let feed = async {
                let mut input = input.lock().await;
                while let Ok(Some((FrameKind::Stdin, data))) = read_frame(r).await {
                    if data.is_empty() || input.write_all(&data).await.is_err() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(INPUT_WAIT, feed).await;
        }
    }
    Ok(proc)
}

/// Copies stdin frames from the connection into the process until an empty frame or the end
/// of the connection, then closes its stdin.
async fn feed_stdin(r: &mut OwnedReadHalf, mut stdin: tokio::net::unix::pipe::Sender) {
    while let Ok(Some((FrameKind::Stdin, data))) = read_frame(r).await {
        if data.is_empty() || stdin.write_all(&data).await.is_err() {
            break;
        }
    }
}

/// Sends a process's output from the start (what is kept), follows it, and ends with its exit.
async fn stream_output(w: &mut OwnedWriteHalf, proc: &Proc) -> std::io::Result<()> {
    let mut rx = proc.subscribe();
    let mut cursor = 0;
    loop {
        rx.borrow_and_update();
        let (chunks, status) = proc.read_from(cursor);
        cursor += chunks.len();
        for (kind, data) in chunks {
            write_frame(w, kind, &data).await?;
        }
        if let Some(status) = status {
            return write_msg(w, &Reply::Exit(status)).await;
        }
        if rx.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Receives a file into a temporary name beside the target and renames it into place when
/// complete, so an interrupted upload never leaves a half-written file under the real name.
async fn write_file(
    path: String,
    user: String,
    mode: Option<u32>,
    metadata: std::collections::BTreeMap<String, String>,
    r: &mut OwnedReadHalf,
    w: &mut OwnedWriteHalf,
) -> Result<(), OpError> {
    let io = |e: std::io::Error| OpError::new(ErrorCode::Unavailable, format!("connection: {e}"));
    let tmp_suffix = format!(".warren-upload-{}", std::process::id() as u64 ^ nanos());
    let (file, target, tmp) = files::as_user(user.clone(), move |u| {
        let target = files::resolve(u, &path)?;
        files::check_writable(&target)?;
        let existing_mode = std::fs::metadata(&target).ok().map(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & 0o7777
        });
        let tmp = format!("{target}{tmp_suffix}");
        let file = files::open_write(&tmp, mode.or(existing_mode))?;
        Ok((file, target, tmp))
    })
    .await?;
    let mut file = tokio::fs::File::from_std(file);
    let mut complete = false;
    let mut failure = None;
    while let Ok(Some((FrameKind::Data, data))) = read_frame(r).await {
        if data.is_empty() {
            complete = true;
            break;
        }
        if let Err(e) = file.write_all(&data).await {
            failure = Some(OpError::io(&e, "write", &target));
            break;
        }
    }
    if failure.is_none()
        && let Err(e) = file.flush().await
    {
        failure = Some(OpError::io(&e, "write", &target));
    }
    // Metadata by descriptor, on the new file before it takes the name: the file appears with
    // it, or not at all. As the user, as the file was made.
    let f = file.into_std().await;
    if complete && failure.is_none() && !metadata.is_empty() {
        let named = target.clone();
        let set = files::as_user(user.clone(), move |_| {
            use std::os::fd::AsFd;
            for (k, v) in &metadata {
                let name = format!("{}{k}", files::METADATA_PREFIX);
                rustix::fs::fsetxattr(
                    f.as_fd(),
                    name.as_str(),
                    v.as_bytes(),
                    rustix::fs::XattrFlags::empty(),
                )
                .map_err(|e| {
                    OpError::new(
                        ErrorCode::InvalidArgument,
                        format!(
                            "setting metadata {k:?} on {named}: {e} (a read-only mode, or a \
                             file system without user extended attributes)"
                        ),
                    )
                })?;
            }
            Ok(())
        })
        .await;
        if let Err(e) = set {
            failure = Some(e);
        }
    } else {
        drop(f);
    }
    let entry = files::as_user(user, move |_| {
        if !complete || failure.is_some() {
            let _ = std::fs::remove_file(&tmp);
            return Err(failure.unwrap_or_else(|| {
                OpError::new(
                    ErrorCode::Unavailable,
                    format!("upload of {target} ended early; the file was not changed"),
                )
            }));
        }
        std::fs::rename(&tmp, &target).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            OpError::io(&e, "rename into place", &target)
        })?;
        files::entry(&target)
    })
    .await?;
    write_msg(w, &Reply::Entry(entry)).await.map_err(io)
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

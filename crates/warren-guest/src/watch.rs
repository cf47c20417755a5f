//! Directory watches: what changes under a directory (and, recursively, its subdirectories),
//! kept per watcher until a client collects it.
//!
//! One inotify instance per sandbox, made at the first watch; each watched directory is one
//! inotify watch, shared by every watcher that covers it. Watches are added as the watcher's
//! user (their file system identity, so only directories they may read can be watched), never
//! following a final symlink, and only on directories. A recursive watcher adds the
//! directories made (or moved in) under it as they appear.
//!
//! Bounds: at most [`MAX_WATCHERS`] watchers and [`MAX_DIRS`] watched directories per sandbox
//! (inotify's limits are per user, shared by every sandbox of the node), and per watcher
//! [`MAX_QUEUED`] events or [`MAX_QUEUED_BYTES`] of their paths kept until collected (past
//! that the watcher says it overflowed); a watcher nobody asked for events in [`IDLE`] is
//! removed (checked every minute).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use tokio::sync::watch;
use warren_types::api::{FsEvent, FsEventKind};
use warren_types::error::ErrorCode;

use crate::files;
use crate::wire::OpError;

/// Watchers per sandbox.
pub const MAX_WATCHERS: usize = 64;
/// Directories the sandbox's watchers may watch together.
pub const MAX_DIRS: usize = 10_000;
/// Events kept per watcher until collected.
pub const MAX_QUEUED: usize = 10_000;
/// Bytes of event paths kept per watcher until collected (so that one collection fits one
/// message, escaped).
pub const MAX_QUEUED_BYTES: usize = 1 << 20;
/// A watcher not asked for events this long is removed.
pub const IDLE: Duration = Duration::from_secs(600);

/// What is watched on a directory.
fn flags() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::ONLYDIR
}

/// The sandbox's watchers.
#[derive(Default)]
pub struct Watches {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The inotify instance, once made (its reader task runs while it lives).
    inotify: Option<Arc<warren_sys::unix::NonBlocking>>,
    /// Watch descriptor → the directory's path and the watchers that cover it.
    dirs: HashMap<i32, (String, Vec<u64>)>,
    watchers: BTreeMap<u64, Watcher>,
    next_id: u64,
    /// Watches being made (their directories added to the kernel, not yet recorded here).
    creating: usize,
    /// Kernel watches no watcher uses, whose removal waits for the creates in flight: one of
    /// them may have been given the same watch descriptor (the kernel gives one per directory).
    unused: Vec<i32>,
}

struct Watcher {
    root: String,
    recursive: bool,
    entries: bool,
    user: String,
    wds: Vec<i32>,
    events: VecDeque<FsEvent>,
    queued_bytes: usize,
    overflowed: bool,
    polled: Instant,
    changed: watch::Sender<()>,
}

fn not_found(id: u64) -> OpError {
    OpError::new(
        ErrorCode::NotFound,
        format!("watch {id} not found: it was removed, or left unpolled for {IDLE:?}"),
    )
}

impl Watches {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts watching `path` (a directory) as `user`; returns the watch's id.
    pub async fn create(
        self: &Arc<Self>,
        path: String,
        user: String,
        recursive: bool,
        entries: bool,
    ) -> Result<u64, OpError> {
        self.expire();
        let (inotify, room) = {
            let mut st = self.state();
            if st.watchers.len() >= MAX_WATCHERS {
                return Err(too_many_watchers());
            }
            let room = MAX_DIRS.saturating_sub(st.dirs.len());
            let inotify = match &st.inotify {
                Some(i) => i.clone(),
                None => {
                    let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
                        .map_err(|e| limits_error("making an inotify instance", e.into()))?;
                    let i = Arc::new(
                        warren_sys::unix::NonBlocking::new(fd)
                            .map_err(|e| OpError::io(&e, "registering", "the inotify instance"))?,
                    );
                    st.inotify = Some(i.clone());
                    tokio::spawn(read_events(self.clone(), i.clone()));
                    i
                }
            };
            st.creating += 1;
            (inotify, room)
        };
        // The directories, as the user: the root, then (recursive) every directory below it.
        let who = user.clone();
        let ino = inotify.clone();
        let created = files::as_user(who, move |u| {
            let root = files::resolve(u, &path)?;
            let mut added = Vec::new();
            let r = add_tree(ino.fd(), &root, recursive, &mut added, room);
            Ok((root, added, r))
        })
        .await;
        let mut st = self.state();
        st.creating -= 1;
        let (root, added) = match created {
            Ok((root, added, Ok(()))) => (root, added),
            Ok((_, added, Err(e))) => {
                release_unused(&mut st, &added);
                return Err(e);
            }
            Err(e) => {
                release_unused(&mut st, &[]);
                return Err(e);
            }
        };
        // Others may have been made meanwhile.
        if st.watchers.len() >= MAX_WATCHERS {
            release_unused(&mut st, &added);
            return Err(too_many_watchers());
        }
        st.next_id += 1;
        let id = st.next_id;
        let (changed, _) = watch::channel(());
        let wds = added.iter().map(|(wd, _)| *wd).collect();
        for (wd, dir) in added {
            st.dirs
                .entry(wd)
                .or_insert_with(|| (dir, Vec::new()))
                .1
                .push(id);
        }
        st.watchers.insert(
            id,
            Watcher {
                root,
                recursive,
                entries,
                user,
                wds,
                events: VecDeque::new(),
                queued_bytes: 0,
                overflowed: false,
                polled: Instant::now(),
                changed,
            },
        );
        release_unused(&mut st, &[]);
        Ok(id)
    }

    /// The events kept for watch `id` (taken), waiting up to `wait` for the first; and
    /// whether some were lost to the bound since the last call.
    pub async fn events(&self, id: u64, wait: Duration) -> Result<(Vec<FsEvent>, bool), OpError> {
        let mut rx = {
            let mut st = self.state();
            let w = st.watchers.get_mut(&id).ok_or_else(|| not_found(id))?;
            w.polled = Instant::now();
            w.changed.subscribe()
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            rx.borrow_and_update();
            let ready = {
                let mut st = self.state();
                let w = st.watchers.get_mut(&id).ok_or_else(|| not_found(id))?;
                w.polled = Instant::now();
                if !w.events.is_empty() || w.overflowed {
                    let events: Vec<FsEvent> = w.events.drain(..).collect();
                    w.queued_bytes = 0;
                    let overflowed = std::mem::take(&mut w.overflowed);
                    let look =
                        (w.entries && !events.is_empty()).then(|| (w.root.clone(), w.user.clone()));
                    Some((events, overflowed, look))
                } else {
                    None
                }
            };
            if let Some((events, overflowed, look)) = ready {
                let events = match look {
                    Some((root, user)) => with_entries(root, user, events).await,
                    None => events,
                };
                return Ok((events, overflowed));
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                // Removed meanwhile, or the wait is over: nothing.
                Ok(Err(_)) => return Err(not_found(id)),
                Err(_) => return Ok((Vec::new(), false)),
            }
        }
    }

    /// Stops watch `id`.
    pub fn remove(&self, id: u64) -> Result<(), OpError> {
        let mut st = self.state();
        let w = st.watchers.remove(&id).ok_or_else(|| not_found(id))?;
        drop_dirs(&mut st, id, &w.wds);
        Ok(())
    }

    /// Removes the watchers left unpolled past [`IDLE`].
    fn expire(&self) {
        let mut st = self.state();
        let old: Vec<u64> = st
            .watchers
            .iter()
            .filter(|(_, w)| w.polled.elapsed() > IDLE)
            .map(|(id, _)| *id)
            .collect();
        for id in old {
            if let Some(w) = st.watchers.remove(&id) {
                drop_dirs(&mut st, id, &w.wds);
            }
        }
    }

    /// Records one inotify event.
    fn record(&self, wd: i32, mask: ReadFlags, name: Option<&str>) -> Vec<(u64, String, String)> {
        let mut st = self.state();
        let mut new_dirs = Vec::new();
        if mask.contains(ReadFlags::IGNORED) {
            // The kernel dropped the watch (the directory is gone).
            if let Some((_, ids)) = st.dirs.remove(&wd) {
                for id in ids {
                    if let Some(w) = st.watchers.get_mut(&id) {
                        w.wds.retain(|d| *d != wd);
                    }
                }
            }
            return new_dirs;
        }
        let Some((dir, ids)) = st.dirs.get(&wd).cloned() else {
            return new_dirs;
        };
        let full = match name {
            Some(n) => format!("{}/{n}", dir.trim_end_matches('/')),
            None => dir.clone(),
        };
        let kind = if mask.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
            FsEventKind::Create
        } else if mask.contains(ReadFlags::DELETE) {
            FsEventKind::Remove
        } else if mask.contains(ReadFlags::MOVED_FROM) {
            FsEventKind::Rename
        } else if mask.contains(ReadFlags::MODIFY) {
            FsEventKind::Write
        } else if mask.contains(ReadFlags::ATTRIB) {
            FsEventKind::Chmod
        } else {
            return new_dirs;
        };
        let made_dir = mask.contains(ReadFlags::ISDIR) && kind == FsEventKind::Create;
        for id in ids {
            let Some(w) = st.watchers.get_mut(&id) else {
                continue;
            };
            let rel = relative(&w.root, &full);
            if w.events.len() >= MAX_QUEUED || w.queued_bytes + rel.len() > MAX_QUEUED_BYTES {
                w.overflowed = true;
            } else {
                w.queued_bytes += rel.len();
                w.events.push_back(FsEvent {
                    kind,
                    path: rel,
                    entry: None,
                });
            }
            w.changed.send_replace(());
            if made_dir && w.recursive {
                new_dirs.push((id, w.user.clone(), full.clone()));
            }
        }
        new_dirs
    }

    /// Adds the directory trees made under recursive watchers.
    async fn follow_new_dirs(
        &self,
        inotify: &Arc<warren_sys::unix::NonBlocking>,
        new: Vec<(u64, String, String)>,
    ) {
        for (id, user, dir) in new {
            let room = {
                let mut st = self.state();
                if !st.watchers.contains_key(&id) {
                    continue;
                }
                st.creating += 1;
                MAX_DIRS.saturating_sub(st.dirs.len())
            };
            let ino = inotify.clone();
            let added = files::as_user(user, move |_| {
                let mut added = Vec::new();
                // A tree too large stops at the bound: what was added is kept.
                let _ = add_tree(ino.fd(), &dir, true, &mut added, room);
                Ok(added)
            })
            .await
            .unwrap_or_default();
            let mut st = self.state();
            st.creating -= 1;
            if !st.watchers.contains_key(&id) {
                release_unused(&mut st, &added);
                continue;
            }
            for (wd, d) in added {
                let entry = st.dirs.entry(wd).or_insert_with(|| (d, Vec::new()));
                if !entry.1.contains(&id) {
                    entry.1.push(id);
                    if let Some(w) = st.watchers.get_mut(&id) {
                        w.wds.push(wd);
                    }
                }
            }
            release_unused(&mut st, &[]);
        }
    }
}

/// `events` with the entries they name, as they are now, looked at as `user` (what is gone,
/// or not theirs to see, has none).
async fn with_entries(root: String, user: String, mut events: Vec<FsEvent>) -> Vec<FsEvent> {
    let back = events.clone();
    files::as_user(user, move |_| {
        for e in &mut events {
            if matches!(e.kind, FsEventKind::Remove | FsEventKind::Rename) {
                continue;
            }
            let full = if e.path.is_empty() {
                root.clone()
            } else {
                format!("{}/{}", root.trim_end_matches('/'), e.path)
            };
            e.entry = files::entry(&full).ok();
        }
        Ok(events)
    })
    .await
    .unwrap_or(back)
}

fn too_many_watchers() -> OpError {
    OpError::new(
        ErrorCode::Capacity,
        format!("this sandbox has {MAX_WATCHERS} watches already: remove one first"),
    )
}

/// `full` relative to `root` (a path under it, or it).
fn relative(root: &str, full: &str) -> String {
    let root = root.trim_end_matches('/');
    if full == root {
        return String::new();
    }
    match full.strip_prefix(root).and_then(|r| r.strip_prefix('/')) {
        Some(r) => r.to_string(),
        None => full.to_string(),
    }
}

/// Removes the kernel watches (those just `added`, and those left waiting) that no watcher
/// uses, once no create is in flight; until then they wait in `unused`.
fn release_unused(st: &mut State, added: &[(i32, String)]) {
    st.unused.extend(added.iter().map(|(wd, _)| *wd));
    if st.creating > 0 {
        return;
    }
    let waiting = std::mem::take(&mut st.unused);
    for wd in waiting {
        if !st.dirs.contains_key(&wd)
            && let Some(i) = &st.inotify
        {
            let _ = inotify::remove_watch(i.fd(), wd);
        }
    }
}

/// Forgets watcher `id` on each of `wds`; a directory no watcher covers any more stops being
/// watched.
fn drop_dirs(st: &mut State, id: u64, wds: &[i32]) {
    for wd in wds {
        let unused = match st.dirs.get_mut(wd) {
            Some((_, ids)) => {
                ids.retain(|i| *i != id);
                ids.is_empty()
            }
            None => false,
        };
        if unused {
            st.dirs.remove(wd);
            st.unused.push(*wd);
        }
    }
    release_unused(st, &[]);
}

/// The error for a kernel limit met: the node's inotify limits are per user, shared by every
/// sandbox on it.
fn limits_error(what: &str, e: std::io::Error) -> OpError {
    // EMFILE: instances; ENOSPC: watches.
    match e.raw_os_error() {
        Some(24) | Some(28) => OpError::new(
            ErrorCode::Capacity,
            format!(
                "{what}: {e}: the node's inotify limits (fs.inotify.max_user_instances, \
                 max_user_watches, shared by its sandboxes) are reached; try later, or raise them"
            ),
        ),
        _ => OpError::io(&e, what, "watch"),
    }
}

/// Watches `root` and, when `recursive`, every directory below it: at most `max`.
fn add_tree(
    inotify: std::os::fd::BorrowedFd<'_>,
    root: &str,
    recursive: bool,
    added: &mut Vec<(i32, String)>,
    max: usize,
) -> Result<(), OpError> {
    let mut todo = vec![root.to_string()];
    while let Some(dir) = todo.pop() {
        if added.len() >= max {
            return Err(OpError::new(
                ErrorCode::Capacity,
                format!("{root} holds more than {max} directories: watch a smaller tree"),
            ));
        }
        let wd = match inotify::add_watch(inotify, dir.as_str(), flags()) {
            Ok(wd) => wd,
            // Below the root, a directory that went away or is not the user's to read is
            // left out; the root itself must be watchable.
            Err(e) if dir != root => {
                let _ = e;
                continue;
            }
            Err(e) => {
                let e: std::io::Error = e.into();
                return Err(match e.raw_os_error() {
                    Some(20) => OpError::invalid(format!("{root} is not a directory")),
                    Some(24) | Some(28) => limits_error("watching", e),
                    _ => OpError::io(&e, "watch", root),
                });
            }
        };
        added.push((wd, dir.clone()));
        if recursive && let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                // Not followed: a link to a directory is not part of the tree.
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(format!(
                        "{}/{}",
                        dir.trim_end_matches('/'),
                        e.file_name().to_string_lossy()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Reads the instance's events for as long as it lives.
async fn read_events(w: Arc<Watches>, inotify: Arc<warren_sys::unix::NonBlocking>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut sweep = tokio::time::interval(Duration::from_secs(60));
    loop {
        let read = tokio::select! {
            r = inotify.read(&mut buf) => r,
            _ = sweep.tick() => {
                w.expire();
                continue;
            }
        };
        let n = match read {
            Ok(n) if n > 0 => n,
            _ => return,
        };
        let mut new_dirs = Vec::new();
        let mut at = 0;
        // struct inotify_event: wd (i32), mask, cookie, len (u32), then len bytes of name.
        while at + 16 <= n {
            let word = |i: usize| u32::from_ne_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
            let wd = word(at) as i32;
            let mask = ReadFlags::from_bits_retain(word(at + 4));
            let len = word(at + 12) as usize;
            let end = (at + 16 + len).min(n);
            let name = (len > 0).then(|| {
                let raw = &buf[at + 16..end];
                let raw = &raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())];
                String::from_utf8_lossy(raw).into_owned()
            });
            at += 16 + len;
            if mask.contains(ReadFlags::QUEUE_OVERFLOW) {
                let mut st = w.state();
                for watcher in st.watchers.values_mut() {
                    watcher.overflowed = true;
                    watcher.changed.send_replace(());
                }
                continue;
            }
            new_dirs.extend(w.record(wd, mask, name.as_deref()));
        }
        if !new_dirs.is_empty() {
            w.follow_new_dirs(&inotify, new_dirs).await;
        }
    }
}

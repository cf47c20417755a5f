//! Re-adopting sandboxes after a daemon restart, and collecting what a crash left half-made.
//!
//! Sandboxes outlive the daemon: their init is not tied to it (no shared pipes, no parent-death
//! signal, cgroups of their own). On start the node reads each record, checks that the pid
//! still names the same process (pid *and* start time: pids get reused), opens a pidfd to watch
//! it, and asks its guest agent for a ping. Whatever fails the check is torn down, as is every
//! cgroup, socket or directory without a live sandbox.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use warren_types::guest::{Op, Reply};
use warren_types::id::SandboxId;

use crate::guest_client::GuestConn;
use crate::node::{IdemSlot, Node, Phase, Sandbox, blocking, teardown};
use crate::state;

/// What a start found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AdoptReport {
    /// Sandboxes running again under this daemon.
    pub adopted: usize,
    /// Records whose sandbox was dead or half-made, torn down.
    pub removed: usize,
    /// cgroups, sockets and directories without a sandbox, removed.
    pub leftovers: usize,
}

impl Node {
    /// Adopts every live sandbox in the state directory and removes the rest.
    pub async fn adopt(self: &Arc<Self>) -> AdoptReport {
        let mut report = AdoptReport::default();
        let entries: Vec<_> = std::fs::read_dir(&self.dirs.sandboxes)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let checks = entries.into_iter().map(|dir| {
            let node = self.clone();
            async move { (dir.clone(), node.try_adopt(&dir).await) }
        });
        for (dir, result) in futures_util::future::join_all(checks).await {
            match result {
                Ok(sb) => {
                    self.admission
                        .add(crate::admission::Ask::of(&sb.record.resources));
                    if !sb.record.layers.is_empty() {
                        // Its layers are mounted (taken over at start): count it as a user.
                        let layers = sb.record.layers.clone();
                        let node = self.clone();
                        let r = crate::node::blocking(move || {
                            node.layers.acquire(&layers, |d| node.layer_file(d))
                        })
                        .await;
                        if let Err(e) = r {
                            tracing::warn!(sandbox_id = %sb.record.id, "its layers: {e}");
                        }
                    }
                    if let Some(key) = &sb.record.idempotency_key {
                        self.idempotency
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(key.clone(), IdemSlot::Done(sb.record.id.clone()));
                    }
                    self.sandboxes
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(sb.record.id.clone(), sb.clone());
                    self.watch(&sb);
                    report.adopted += 1;
                }
                Err(why) => {
                    tracing::warn!(dir = %dir.display(), "not adopting: {why}; removing it");
                    let name = dir
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let cg = self.cgroups.sandbox(&name);
                    let socket = self.dirs.sockets.join(format!("{name}.sock"));
                    let dirs = self.dirs.clone();
                    let _ = blocking(move || {
                        if cg.exists() {
                            cg.kill_all();
                        }
                        teardown(None, &cg, &dir, &socket, &dirs);
                        Ok(())
                    })
                    .await;
                    report.removed += 1;
                }
            }
        }
        report.leftovers = self.collect_leftovers().await;
        report
    }

    async fn try_adopt(&self, dir: &std::path::Path) -> Result<Arc<Sandbox>, String> {
        let record = state::load(dir).map_err(|e| format!("no readable state.json ({e})"))?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if record.id.as_str() != name {
            return Err(format!(
                "state.json names {} but the directory is {name}",
                record.id
            ));
        }
        if record.id.node() != self.id {
            return Err(format!(
                "sandbox {} belongs to node {}, this is node {}",
                record.id,
                record.id.node(),
                self.id
            ));
        }
        let same_process = |pid| warren_sys::process::start_time(pid) == Some(record.start_time);
        if record.pid <= 0 || !same_process(record.pid) {
            return Err(format!("its init (pid {}) is gone", record.pid));
        }
        let pidfd =
            warren_sys::process::pidfd_open(record.pid).map_err(|e| format!("pidfd_open: {e}"))?;
        // The pid could have been reused between the check and the open: check again.
        if !same_process(record.pid) {
            return Err(format!("its init (pid {}) is gone", record.pid));
        }
        let cgroup = self.cgroups.sandbox(record.id.as_str());
        let socket = self.dirs.sockets.join(format!("{}.sock", record.id));
        if !socket.exists() {
            return Err("its control socket is gone".into());
        }
        // The init is the guest agent: with its identity proven, the sandbox is alive, even
        // when its agent is slow to answer (a sandbox that hogs its CPU, a node under load;
        // a frozen one cannot answer at all). Its ping is checked in the background.
        let phase = if cgroup.is_frozen() {
            Phase::Paused
        } else {
            let id = record.id.clone();
            let socket = socket.clone();
            tokio::spawn(async move {
                for attempt in 0..3u32 {
                    let ping = async {
                        let mut c = GuestConn::open(&socket, Op::Ping).await?;
                        c.reply().await
                    };
                    if let Ok(Ok(Reply::Pong { .. })) =
                        tokio::time::timeout(Duration::from_secs(5), ping).await
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
                tracing::warn!(
                    sandbox_id = %id,
                    "adopted, but its guest agent did not answer 3 pings; operations on it fail until it does"
                );
            });
            Phase::Running
        };
        Ok(Sandbox::new(
            record,
            dir.to_path_buf(),
            socket,
            cgroup,
            pidfd,
            phase,
            self.cfg.max_trajectory.bytes(),
        ))
    }

    /// Removes cgroups, sockets and trash that no live sandbox owns. Returns how many.
    async fn collect_leftovers(&self) -> usize {
        let live: HashSet<String> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .map(SandboxId::to_string)
            .collect();
        let live_dirs: Vec<std::path::PathBuf> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|s| s.dir.clone())
            .collect();
        let cgroups = self.cgroups.clone();
        let dirs = self.dirs.clone();
        blocking(move || {
            let mut n = 0;
            for name in cgroups.existing() {
                if !live.contains(&name) {
                    let cg = cgroups.sandbox(&name);
                    cg.kill_all();
                    match cg.remove(Duration::from_secs(5)) {
                        Ok(()) => n += 1,
                        Err(e) => tracing::error!("leftover cgroup {name}: {e}"),
                    }
                }
            }
            for e in std::fs::read_dir(&dirs.sockets)
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = e.file_name().to_string_lossy().into_owned();
                if !live.contains(name.trim_end_matches(".sock")) {
                    let _ = std::fs::remove_file(e.path());
                    n += 1;
                }
            }
            for e in std::fs::read_dir(&dirs.trash)
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Some(pool) = &dirs.disk {
                    pool.release(&e.path());
                }
                if let Err(e) = warren_fs::remove_path(&e.path()) {
                    tracing::error!("leftover in trash: {e}");
                }
                n += 1;
            }
            // Disk volumes of sandboxes that are gone.
            if let Some(pool) = &dirs.disk {
                let used: HashSet<String> = live_dirs
                    .iter()
                    .filter_map(|d| pool.volume_of(d))
                    .map(|v| v.name)
                    .collect();
                for name in pool.volumes() {
                    if !used.contains(&name) {
                        match pool.delete(&name) {
                            Ok(()) => n += 1,
                            Err(e) => tracing::error!("leftover disk volume: {e}"),
                        }
                    }
                }
                pool.collect_quota_groups();
            }
            Ok(n)
        })
        .await
        .unwrap_or(0)
    }
}

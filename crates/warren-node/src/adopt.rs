//! Re-adopting sandboxes after a daemon restart, and collecting what a crash left half-made.
//!
//! Sandboxes outlive the daemon: nothing of theirs is tied to it. On start the node reads each
//! record and asks the record's backend to take its instance over; the backend proves it is the
//! same one (a container: its init's pid *and* start time, since pids get reused). The node
//! then asks its guest agent for a ping. Whatever fails the check is released, and so is
//! everything of the backend's that no live sandbox owns.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use warren_types::guest::{Op, Reply};
use warren_types::id::SandboxId;

use crate::guest_client::GuestConn;
use crate::node::{IdemSlot, Node, Phase, Sandbox, blocking};
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
                    if let Some(key) = &sb.record.idempotency_key {
                        self.idempotency
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(key.clone(), IdemSlot::Done(sb.record.id.clone()));
                    }
                    self.insert(sb.clone());
                    self.watch(&sb);
                    // A function-call worker goes back to its pool (warm across a restart).
                    if sb.record.fncall_worker {
                        self.readopt_worker(&sb).await;
                    }
                    report.adopted += 1;
                }
                Err(why) => {
                    tracing::warn!(dir = %dir.display(), "not adopting: {why}; removing it");
                    let name = dir
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let backend = self.backend.clone();
                    let _ = blocking(move || {
                        backend.discard(&name, &dir);
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
        if record.backend != self.backend.kind() {
            return Err(format!(
                "it ran in the {} backend, which this node does not have",
                record.backend
            ));
        }
        let backend = self.backend.clone();
        let (rec, d) = (record.clone(), dir.to_path_buf());
        let instance = blocking(move || Ok(backend.adopt(&rec, &d)))
            .await
            .map_err(|e| e.to_string())??;
        let socket = instance.transport().socket().to_path_buf();
        // The init is the guest agent: with its identity proven, the sandbox is alive, even
        // when its agent is slow to answer (a sandbox that hogs its CPU, a node under load;
        // a frozen one cannot answer at all). Its ping is checked in the background.
        let phase = if instance.is_frozen() {
            Phase::Paused
        } else {
            let id = record.id.clone();
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
            instance,
            phase,
            self.cfg.max_trajectory.bytes(),
        ))
    }

    /// Removes what no live sandbox owns (the backend's cgroups, sockets, volumes, warm inits
    /// and trash). Returns how many things.
    async fn collect_leftovers(&self) -> usize {
        let live: HashSet<String> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .map(SandboxId::to_string)
            .collect();
        let backend = self.backend.clone();
        blocking(move || Ok(backend.collect_leftovers(&live)))
            .await
            .unwrap_or(0)
    }
}

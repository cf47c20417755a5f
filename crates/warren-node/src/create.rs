//! Creating a sandbox.
//!
//! The path: idempotency → validate → a start slot (the create gate, in arrival order) →
//! admission → the record → the backend starts the instance (see the `backend` module) → the
//! record saved → the guest agent's hello on its transport → replay's rebuild, if asked → what
//! its task's operations asked meanwhile (a create of a task is in flight for them from before
//! its wait for a slot until it lands: see the `pending` module). Anything that fails on the
//! way is undone: the reservation and the idempotency slot by their guards, the instance by its
//! release.

use std::sync::Arc;
use std::time::Duration;

use warren_types::api::{CreateSandbox, Sandbox as SandboxView, TrajectoryEntry};
use warren_types::guest::{Op, Reply};
use warren_types::id::SandboxId;

use crate::admission::HostLoad;
use crate::error::NodeError;
use crate::guest_client::GuestConn;
use crate::node::{IdemSlot, Node, Phase, Sandbox, blocking};
use crate::pending::{Mark, Ticket};
use crate::phase::Action;
use crate::state::{self, RECORD_VERSION, Record};
use crate::validate::{HostFacts, validate};

/// Idle function-call workers killed at a time for a create that finds no room.
const RECLAIM_BATCH: usize = 8;
/// How long a new sandbox's init may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Releases an admission reservation unless the create went through.
struct Reservation<'a> {
    node: &'a Node,
    ask: crate::admission::Ask,
    kept: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.node.admission.release(self.ask);
        }
    }
}

/// Clears an in-flight idempotency slot if the create fails.
struct IdemGuard<'a> {
    node: &'a Node,
    key: Option<String>,
    notify: Option<Arc<tokio::sync::Notify>>,
}

impl Drop for IdemGuard<'_> {
    fn drop(&mut self) {
        if let Some(key) = &self.key {
            let mut map = self
                .node
                .idempotency
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if matches!(map.get(key), Some(IdemSlot::InFlight(_))) {
                map.remove(key);
            }
        }
        if let Some(n) = &self.notify {
            n.notify_waiters();
        }
    }
}

impl Node {
    /// Creates a sandbox. With an idempotency key, a retry returns the sandbox the first
    /// request made (`created` is then false).
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        idempotency_key: Option<String>,
    ) -> Result<(SandboxView, bool), NodeError> {
        let mut idem = IdemGuard {
            node: self,
            key: None,
            notify: None,
        };
        if let Some(key) = idempotency_key.clone() {
            if key.is_empty() || key.len() > 256 {
                return Err(NodeError::Invalid(
                    "Idempotency-Key must be 1 to 256 characters".into(),
                ));
            }
            loop {
                let wait = {
                    let mut map = self.idempotency.lock().unwrap_or_else(|p| p.into_inner());
                    match map.get(&key) {
                        Some(IdemSlot::Done(id)) => {
                            let id = id.clone();
                            drop(map);
                            if let Ok(sb) = self.get(&id) {
                                return Ok((sb.view(&self.id, &self.cfg.pool), false));
                            }
                            // Killed since: the key is free again.
                            self.idempotency
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .remove(&key);
                            continue;
                        }
                        Some(IdemSlot::InFlight(n)) => n.clone(),
                        None => {
                            let n = Arc::new(tokio::sync::Notify::new());
                            map.insert(key.clone(), IdemSlot::InFlight(n.clone()));
                            idem.key = Some(key.clone());
                            idem.notify = Some(n);
                            break;
                        }
                    }
                };
                let notified = wait.notified();
                // Re-check after registering, so a completion in between is not missed.
                if !matches!(
                    self.idempotency
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&key),
                    Some(IdemSlot::InFlight(_))
                ) {
                    continue;
                }
                notified.await;
            }
        }

        // Checked before waiting for a slot: a bad request is answered at once.
        let load = HostLoad::read().map_err(|e| NodeError::host("reading host load", e))?;
        let facts = HostFacts {
            ncpu: load.cores,
            mem_total: load.mem_total,
            disk_pool: self.dirs.disk.as_ref().map(|p| p.capacity),
        };
        let (resources, timeout) = validate(&self.cfg, facts, &req)?;
        let network = self.network_of(req.network.as_ref())?;
        let backend = req.backend.unwrap_or_default();
        if !self.backends().contains(&backend) {
            return Err(NodeError::Invalid(format!(
                "this node has no {backend} backend: leave backend out for containers"
            )));
        }
        let resolved = self.images.resolve(&req.image, req.resolved.as_ref())?;
        if req.builder && matches!(resolved, crate::images::Resolved::Host(_)) {
            // The host image shows the host's own files: no capability is given over them.
            return Err(NodeError::Invalid(
                "a builder sandbox needs layered images (it cannot use `host`): import a base \
                 image, e.g. `warren image import ./rootfs --name base/debian:12`"
                    .into(),
            ));
        }
        // A create of a task is in flight for the task's operations until it lands (`pending`).
        let project = req
            .project
            .clone()
            .unwrap_or_else(|| warren_types::project::ROOT.to_string());
        let ticket = req
            .task
            .as_deref()
            .map(|task| self.pending.register(task, &project));
        let stopped = |sandbox| NodeError::TaskStopped {
            task: req.task.clone().unwrap_or_default(),
            sandbox,
        };
        let slot = match &ticket {
            // A function-call worker starts at once: calls must not wait behind the creates
            // queued here (its pool bounds how many it starts at a time).
            _ if req.fncall_worker => self.create_gate.bypass(),
            // A stop of its task ends the wait at once.
            Some(t) => tokio::select! {
                slot = self.create_gate.enter() => slot?,
                () = t.stopped() => return Err(stopped(None)),
            },
            None => self.create_gate.enter().await?,
        };
        if ticket.as_ref().is_some_and(|t| t.mark() == Mark::Stop) {
            return Err(stopped(None));
        }
        // The host is read again once a slot is had: the wait may have been long.
        let load = HostLoad::read().map_err(|e| NodeError::host("reading host load", e))?;
        let ask = crate::admission::Ask::of(&resources);
        let disk = self.dirs.disk.as_ref().map(|p| (p.capacity, p.free()));
        let limits = crate::admission::Limits {
            max_sandboxes: self.capacity.max_sandboxes,
        };
        let mut admitted =
            self.admission
                .reserve(&self.cfg, limits, &load, &self.sampler.get(), disk, ask);
        // Idle function-call workers are the first thing given up for room: never is a create
        // refused while some could be killed to admit it.
        while matches!(admitted, Err(NodeError::Capacity { .. }))
            && self.reclaim_workers(RECLAIM_BATCH).await > 0
        {
            let load = HostLoad::read().map_err(|e| NodeError::host("reading host load", e))?;
            admitted = self.admission.reserve(
                &self.cfg,
                limits,
                &load,
                &self.sampler.get(),
                self.dirs.disk.as_ref().map(|p| (p.capacity, p.free())),
                ask,
            );
        }
        admitted?;
        let mut reservation = Reservation {
            node: self,
            ask,
            kept: false,
        };

        let id = SandboxId::new(&self.id, rand::random());
        if self.create_gate.worth_an_event(slot.waited) {
            let gate = self.create_gate.stats();
            self.events.occur(
                &id,
                crate::events::Owner {
                    task: req.task.as_deref(),
                    project: Some(&project),
                },
                warren_types::events::EventKind::CreateQueued,
                format!(
                    "waited {:.1} s for one of the node's {} start slots \
                     (max_concurrent_creates); {} creates wait now",
                    slot.waited.as_secs_f64(),
                    gate.slots,
                    gate.waiting
                ),
                1,
            );
        }
        let now = state::now_ms();
        let image = match resolved {
            crate::images::Resolved::Host(_) => Default::default(),
            crate::images::Resolved::Layered(l) => l,
        };
        // The image's environment under the request's.
        let mut env = image.env.clone();
        env.extend(req.env.clone());
        let record = Record {
            version: RECORD_VERSION,
            id: id.clone(),
            image: req.image.clone(),
            task: req.task.clone(),
            project,
            labels: req.labels.clone(),
            env,
            resources,
            created_ms: now,
            expires_ms: now + timeout * 1000,
            pid: 0,
            start_time: 0,
            idempotency_key: idempotency_key.clone(),
            idle_timeout: req.idle_timeout,
            on_idle: req.on_idle.unwrap_or_default(),
            trajectory: req.trajectory || req.replay.is_some(),
            backend,
            layers: image.layers,
            default_user: image.user,
            default_cwd: image.workdir,
            // Every init of this node, warm or not, runs this copy.
            guest: Some(self.guest.digest.clone()),
            builder: req.builder,
            fncall_worker: req.fncall_worker,
            network,
            net_lease: None,
            host_ports: Default::default(),
        };
        // The launch runs to its end in a task of its own, even when this request is dropped
        // (a client that gives up mid-create): a started sandbox is then registered, with its
        // timers, rebuilt and paused or killed as its task's operations asked, not left
        // running unknown or half-made; the task returns the reservation if it fails.
        reservation.kept = true;
        let node = self.clone();
        let replay = req.replay.clone();
        let launched = tokio::spawn(async move {
            let launch = node.launch(record).await;
            drop(slot);
            match launch {
                Ok(sb) => node.land(sb, ticket, replay).await,
                Err(e) => {
                    node.admission.release(ask);
                    Err(e)
                }
            }
        });
        let sb = launched.await.map_err(|e| {
            NodeError::host("starting the sandbox", std::io::Error::other(e.to_string()))
        })??;
        if let Some(key) = &idempotency_key {
            self.idempotency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), IdemSlot::Done(id.clone()));
        }
        tracing::info!(
            sandbox_id = %id,
            image = %req.image,
            task = ?req.task,
            warm = sb.instance.prepared(),
            "created"
        );
        Ok((sb.view(&self.id, &self.cfg.pool), true))
    }

    /// Puts a started sandbox in the node's set, rebuilds it from `replay` if asked, and then
    /// does what its task's operations asked while it was in flight (its ticket's mark, taken
    /// only now that operations can find it): a pause pauses it, a stop kills it (410).
    async fn land(
        self: &Arc<Self>,
        sb: Arc<Sandbox>,
        ticket: Option<Ticket>,
        replay: Option<Vec<TrajectoryEntry>>,
    ) -> Result<Arc<Sandbox>, NodeError> {
        // Without a rebuild its lock is taken before it can be found, so no operation comes
        // between its mark and what the mark asks. (A rebuild's commands resume it if a pause
        // came meanwhile: its lock is taken after.)
        let held = sb.clone();
        let early = match (&ticket, &replay) {
            (Some(_), None) => Some(held.lifecycle.lock().await),
            _ => None,
        };
        self.insert(sb.clone());
        self.watch(&sb);
        if let Some(entries) = replay {
            if let Err(e) = self.rebuild(&sb, &entries).await {
                let _ = self.kill(&sb.record.id).await;
                return Err(e);
            }
            sb.trajectory.start_replay(entries);
        }
        let Some(ticket) = ticket else {
            return Ok(sb);
        };
        let g = match early {
            Some(g) => g,
            None => held.lifecycle.lock().await,
        };
        let mark = ticket.land();
        let paused = match mark {
            Mark::Run => false,
            Mark::Pause => match self.freeze_locked(&sb, Action::Pause).await {
                Ok(paused) => paused,
                Err(e) => {
                    tracing::error!(sandbox_id = %sb.record.id, "pausing a sandbox whose task was paused as it started: {e}");
                    false
                }
            },
            Mark::Stop => {
                if self.legal(&sb, Action::Kill).is_ok() {
                    sb.set_phase(Phase::Stopping);
                    self.destroy(sb.clone()).await;
                }
                false
            }
        };
        drop(g);
        if mark == Mark::Stop {
            tracing::info!(sandbox_id = %sb.record.id, "killed as it started: its task was stopped");
            return Err(NodeError::TaskStopped {
                task: sb.record.task.clone().unwrap_or_default(),
                sandbox: Some(sb.record.id.clone()),
            });
        }
        if paused && self.cfg.reclaim_on_pause {
            // Nothing waits for it: a new sandbox holds little.
            tokio::spawn(crate::lifecycle::reclaim_paused(
                vec![sb.clone()],
                std::time::Instant::now(),
            ));
        }
        Ok(sb)
    }

    /// Starts the sandbox's instance and waits for its guest agent to answer. On failure,
    /// everything it held is released.
    async fn launch(self: &Arc<Self>, mut record: Record) -> Result<Arc<Sandbox>, NodeError> {
        let dir = self.dirs.sandboxes.join(record.id.as_str());
        let t0 = std::time::Instant::now();
        let backend = self.backend.clone();
        let (rec, d) = (record.clone(), dir.clone());
        let instance = blocking(move || backend.start(&rec, &d))
            .await
            .map_err(|e| NodeError::backend("starting the sandbox", e))?;
        let t_started = t0.elapsed();
        (record.pid, record.start_time) = instance.identity();
        record.net_lease = instance.network().map(|n| (n.index, n.generation));
        let sb = Sandbox::new(
            record,
            dir,
            instance,
            Phase::Running,
            self.cfg.max_trajectory.bytes(),
        );
        let ready = async {
            state::save(&sb.dir, &sb.record)
                .map_err(|e| NodeError::host("saving the sandbox's state", e))?;
            wait_ready(&sb).await
        };
        if let Err(e) = ready.await {
            let log = std::fs::read_to_string(sb.dir.join("guest.log")).unwrap_or_default();
            let sb2 = sb.clone();
            let _ = blocking(move || {
                sb2.instance.release();
                Ok(())
            })
            .await;
            // A guest too slow to greet under load: undone, and retryable as it is.
            if matches!(e, NodeError::Busy { .. }) {
                return Err(e);
            }
            let tail: String = log
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("; ");
            let msg = if tail.is_empty() {
                e.to_string()
            } else {
                format!("{e}; the guest agent said: {tail}")
            };
            return Err(NodeError::host(
                "the sandbox did not start",
                std::io::Error::other(msg),
            ));
        }
        tracing::debug!(
            sandbox_id = %sb.record.id,
            started_us = t_started.as_micros() as u64,
            ready_us = t0.elapsed().as_micros() as u64,
            "launched"
        );
        Ok(sb)
    }
}

/// Waits for the guest's answer on its control socket, or for its init to die.
async fn wait_ready(sb: &Sandbox) -> Result<(), NodeError> {
    let exited = sb.instance.exited();
    let ping = async {
        let mut conn = GuestConn::open(sb.socket(), Op::Ping).await?;
        conn.reply().await
    };
    // A guest that does not answer in time is a node too busy to start it now, not a fault:
    // a retryable 503 (the create is undone), never a 500.
    let busy = |what: &str| NodeError::Busy {
        message: format!(
            "the new sandbox's guest agent did not answer in time ({what}): the node is busy; retry shortly"
        ),
        retry_after: 2,
    };
    tokio::select! {
        r = tokio::time::timeout(READY_TIMEOUT, ping) => match r {
            Ok(Ok(Reply::Pong { .. })) => Ok(()),
            Ok(Ok(other)) => Err(NodeError::host("guest hello", std::io::Error::other(format!("unexpected reply {other:?}")))),
            Ok(Err(e @ crate::guest_client::GuestError::NoHello(_))) => Err(busy(&e.to_string())),
            Ok(Err(e)) => Err(NodeError::host("guest hello", std::io::Error::other(e.to_string()))),
            Err(_) => Err(busy("no answer within 20 s")),
        },
        _ = exited => Err(NodeError::host("guest hello", std::io::Error::other("the sandbox's init exited during set-up"))),
    }
}

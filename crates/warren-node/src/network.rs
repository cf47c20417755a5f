//! Network policies at create and at run time, for one sandbox or a whole task at once, and
//! the refused attempts the backend reports, stored as `network` events (a burst on one
//! destination is one event with the ports it tried).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use warren_types::api::{TaskFailure, TaskNetworkResult};
use warren_types::id::SandboxId;
use warren_types::net::{NetworkMode, NetworkPolicy, NetworkStatus, Policy};

use crate::backend::{NetDenial, PortPermit, PortRefusal};
use crate::error::NodeError;
use crate::events::NetOccurrence;
use crate::node::{Busy, Node, Phase, Sandbox, blocking};
use warren_types::error::ErrorCode;

/// How long refused attempts are gathered before they are stored (one event write per
/// destination per window, however fast a scan goes).
const GATHER: Duration = Duration::from_millis(200);

/// Destinations one sandbox may have per window before its attempts are summarised as one
/// sweep.
const SWEEP: usize = 16;

impl Node {
    /// The policy a create gets: the one asked for, checked, or the node's default.
    pub(crate) fn network_of(
        &self,
        asked: Option<&NetworkPolicy>,
    ) -> Result<NetworkPolicy, NodeError> {
        let has = self.backend.has_network();
        let Some(p) = asked else {
            return Ok(if has {
                NetworkPolicy::default()
            } else {
                NetworkPolicy::none()
            });
        };
        let parsed = self.check_network(p)?;
        if parsed.mode == NetworkMode::Filtered && !has {
            return Err(NodeError::Invalid(
                "this node has no sandbox network ([node.network] enabled = false): create \
                 with network mode none"
                    .into(),
            ));
        }
        Ok(p.clone())
    }

    fn check_network(&self, p: &NetworkPolicy) -> Result<Policy, NodeError> {
        let parsed = p
            .parse()
            .map_err(|e| NodeError::Invalid(format!("network: {e}")))?;
        self.backend
            .check_network(&parsed)
            .map_err(|e| NodeError::Invalid(format!("network: {e}")))?;
        Ok(parsed)
    }

    /// Replaces a sandbox's network policy. Takes effect for new connections at once, for
    /// open ones at their next packet (a connection no longer allowed is reset).
    pub async fn set_network(
        &self,
        id: &SandboxId,
        policy: NetworkPolicy,
    ) -> Result<NetworkStatus, NodeError> {
        let sb = self.get(id)?;
        let parsed = self.check_network(&policy)?;
        let _g = sb.lifecycle.lock().await;
        // Killed while the lock was awaited: its interface may be another sandbox's by now.
        if sb.phase() == Phase::Stopping {
            return Err(NodeError::Gone(id.clone()));
        }
        self.apply(&[(sb.clone(), parsed)], &policy).await?;
        Ok(sb.network_status())
    }

    /// Replaces the network policy of every sandbox of `task` on this node in one change.
    pub async fn set_task_network(
        &self,
        task: &str,
        policy: NetworkPolicy,
        scope: Option<&str>,
    ) -> Result<TaskNetworkResult, NodeError> {
        let parsed = self.check_network(&policy)?;
        let mut all: Vec<Arc<Sandbox>> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| {
                s.record.task.as_deref() == Some(task)
                    && s.phase() != Phase::Stopping
                    && s.in_scope(scope)
            })
            .cloned()
            .collect();
        // One order (by id), so two batches over the same sandboxes cannot deadlock.
        all.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        let locked = all.clone();
        let mut guards = Vec::with_capacity(locked.len());
        for sb in &locked {
            guards.push(sb.lifecycle.lock().await);
        }
        // Those killed while their locks were awaited are left out.
        all.retain(|s| s.phase() != Phase::Stopping);
        // Loopback-only sandboxes take `none` (nothing to change) and nothing else.
        let none = parsed.mode == NetworkMode::None;
        let (with, without): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|s| none || s.instance.network().is_some());
        let mut failed: Vec<TaskFailure> = without
            .iter()
            .map(|s| TaskFailure {
                id: s.record.id.clone(),
                error: no_interface(&s.record.id).to_api(),
            })
            .collect();
        let batch: Vec<(Arc<Sandbox>, Policy)> =
            with.iter().map(|s| (s.clone(), parsed.clone())).collect();
        let n = batch.len() as u32;
        let succeeded = match self.apply(&batch, &policy).await {
            Ok(()) => n,
            Err(e) => {
                failed.extend(with.iter().map(|s| TaskFailure {
                    id: s.record.id.clone(),
                    error: e.to_api(),
                }));
                0
            }
        };
        drop(guards);
        Ok(TaskNetworkResult {
            task: task.to_string(),
            succeeded,
            failed,
        })
    }

    /// Applies one policy change to sandboxes (their lifecycle locks held), all or none, and
    /// saves their records. Each record is saved with the new policy before the firewall
    /// changes (and put back if the change fails): a daemon that crashes in between comes back
    /// with the policy the caller asked for, never silently with the old one.
    async fn apply(
        &self,
        batch: &[(Arc<Sandbox>, Policy)],
        policy: &NetworkPolicy,
    ) -> Result<(), NodeError> {
        let before: Vec<NetworkPolicy> = batch.iter().map(|(sb, _)| sb.network_policy()).collect();
        if let Err(e) = self.save_policies(batch, |_| policy.clone()).await {
            // Nothing changed in the firewall: neither may the policies the API shows.
            for ((sb, _), was) in batch.iter().zip(&before) {
                *sb.network.lock().unwrap_or_else(|p| p.into_inner()) = was.clone();
            }
            return Err(e);
        }
        if let Err(e) = self.change_firewall(batch).await {
            if let Err(e2) = self.save_policies(batch, |i| before[i].clone()).await {
                tracing::error!("putting the sandboxes' records back after a failed change: {e2}");
            }
            return Err(e);
        }
        // Not saved again for the new generations (a restarted daemon gives every adopted
        // sandbox a fresh one anyway), only for the host ports of exposed ports, which the
        // change just bound.
        let exposing: Vec<(Arc<Sandbox>, Policy)> = batch
            .iter()
            .zip(&before)
            .filter(|(_, was)| !(policy.expose.is_empty() && was.expose.is_empty()))
            .map(|((sb, p), _)| (sb.clone(), p.clone()))
            .collect();
        if exposing.is_empty() {
            return Ok(());
        }
        self.save_policies(&exposing, |_| policy.clone()).await
    }

    /// Sets each sandbox's policy (`of(its place in the batch)`) and saves the records, all in
    /// one blocking task (a task's change saves hundreds).
    async fn save_policies(
        &self,
        batch: &[(Arc<Sandbox>, Policy)],
        of: impl Fn(usize) -> NetworkPolicy,
    ) -> Result<(), NodeError> {
        let mut records = Vec::with_capacity(batch.len());
        for (i, (sb, _)) in batch.iter().enumerate() {
            *sb.network.lock().unwrap_or_else(|p| p.into_inner()) = of(i);
            records.push((sb.dir.clone(), sb.current_record()));
        }
        blocking(move || {
            records
                .iter()
                .try_for_each(|(dir, record)| crate::state::save(dir, record))
        })
        .await
        .map_err(|e| NodeError::host("saving the sandboxes' state", e))
    }

    /// The firewall side of [`Node::apply`]: one backend call for the whole batch.
    async fn change_firewall(&self, batch: &[(Arc<Sandbox>, Policy)]) -> Result<(), NodeError> {
        let mut updates = Vec::with_capacity(batch.len());
        for (sb, parsed) in batch {
            if parsed.mode == NetworkMode::None {
                // No interface to take away at run time: `none` denies everything instead.
                if sb.instance.network().is_none() {
                    continue;
                }
            }
            let Some(net) = sb.instance.network() else {
                return Err(no_interface(&sb.record.id));
            };
            let effective = if parsed.mode == NetworkMode::None {
                Policy::default()
            } else {
                parsed.clone()
            };
            updates.push((net.index, effective));
        }
        if !updates.is_empty() {
            let backend = self.backend.clone();
            blocking(move || {
                let refs: Vec<(u32, &Policy)> = updates.iter().map(|(i, p)| (*i, p)).collect();
                backend.set_networks(&refs)
            })
            .await
            .map_err(|e| NodeError::backend("changing the network policy", e))?;
        }
        Ok(())
    }

    /// Stores the backend's refused attempts as events, gathered per sandbox and destination
    /// over a short window. Runs for the node's life.
    pub(crate) fn watch_network_denials(self: &Arc<Self>) {
        let Some(mut rx) = self.backend.take_network_denials() else {
            return;
        };
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(first) = rx.recv().await else { break };
                let mut window = vec![first];
                let until = tokio::time::Instant::now() + GATHER;
                while window.len() < 100_000 {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(d)) => window.push(d),
                        _ => break,
                    }
                }
                let Some(node) = node.upgrade() else { break };
                node.store_denials(window);
            }
        });
    }

    fn store_denials(&self, window: Vec<NetDenial>) {
        // name → (protocol, destination) → (ports, attempts)
        type Dest = (String, String, Option<String>);
        let mut by: HashMap<String, HashMap<Dest, (Vec<u16>, u64)>> = HashMap::new();
        for d in window {
            let dests = by.entry(d.name).or_default();
            let e = dests
                .entry((d.protocol, d.dst.to_string(), d.domain))
                .or_default();
            e.0.extend(d.port);
            e.1 += 1;
        }
        for (name, dests) in by {
            let Ok(id) = name.parse::<SandboxId>() else {
                continue; // a warm init: no one to report
            };
            let (task, project) = self
                .sandboxes
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .map(|s| (s.record.task.clone(), Some(s.record.project.clone())))
                .unwrap_or_default();
            let owner = crate::events::Owner {
                task: task.as_deref(),
                project: project.as_deref(),
            };
            if dests.len() > SWEEP {
                // A sweep across many addresses: one event per protocol.
                let mut per: HashMap<String, (Vec<u16>, u64, usize)> = HashMap::new();
                for ((proto, _, _), (ports, n)) in dests {
                    let e = per.entry(proto).or_default();
                    e.0.extend(ports);
                    e.1 += n;
                    e.2 += 1;
                }
                for (protocol, (ports, n, _)) in per {
                    self.events.occur_network(
                        &id,
                        owner,
                        NetOccurrence {
                            protocol,
                            destination: "many addresses (a sweep)".into(),
                            ports,
                            domain: None,
                        },
                        n,
                    );
                }
                continue;
            }
            for ((protocol, destination, domain), (ports, n)) in dests {
                self.events.occur_network(
                    &id,
                    owner,
                    NetOccurrence {
                        protocol,
                        destination,
                        ports,
                        domain,
                    },
                    n,
                );
            }
        }
    }
}

impl Node {
    /// Opens a connection from the node to exposed port `port` of a sandbox; with `resume`, a
    /// paused sandbox is resumed first (without, it is refused: the unauthenticated
    /// `<port>-<id>` route must not thaw a task its trainer paused). The sandbox counts as busy
    /// while the returned guard lives (an idle timeout does not pause a sandbox that is
    /// serving), and the permit's `stop` fires when the port is unexposed or the sandbox ends.
    pub(crate) async fn connect_port(
        &self,
        id: &SandboxId,
        port: u16,
        resume: bool,
    ) -> Result<(tokio::net::TcpStream, Busy, PortPermit), NodeError> {
        let sb = self.get(id)?;
        let not_exposed = || NodeError::Port {
            code: ErrorCode::NotFound,
            message: format!(
                "port {port} of sandbox {id} is not exposed: add it to the sandbox's network \
                 policy's `expose` (PUT /v1/sandboxes/{id}/network)"
            ),
        };
        let Some(net) = sb.instance.network() else {
            return Err(not_exposed());
        };
        let permit = match sb.instance.permit_port(port) {
            Ok(p) => p,
            Err(PortRefusal::NotExposed) => return Err(not_exposed()),
            Err(PortRefusal::Full(why)) => {
                return Err(NodeError::Capacity {
                    message: format!("port {port} of sandbox {id}: {why}"),
                    retry_after: 1,
                });
            }
        };
        if !resume && sb.phase() == Phase::Paused {
            return Err(NodeError::Port {
                code: ErrorCode::Conflict,
                message: format!(
                    "sandbox {id} is paused: resume it (POST /v1/sandboxes/{id}/resume) to \
                     reach its ports"
                ),
            });
        }
        self.ensure_running(&sb).await?;
        let busy = Busy::new(&sb);
        let target = std::net::SocketAddr::new(std::net::IpAddr::V4(net.v4), port);
        match tokio::time::timeout(
            warren_net::expose::CONNECT_TIMEOUT,
            warren_net::expose::connect(target),
        )
        .await
        {
            // Ended (or unexposed) while connecting: the address may be another's by now.
            Ok(Ok(_)) if permit.stop.is_cancelled() => Err(NodeError::Gone(id.clone())),
            Ok(Ok(s)) => Ok((s, busy, permit)),
            Ok(Err(e)) => Err(NodeError::Port {
                code: ErrorCode::Unavailable,
                message: format!(
                    "nothing accepts connections on port {port} of sandbox {id} ({e}): a \
                     service must listen there on the sandbox's interface (0.0.0.0 or ::), \
                     not only on 127.0.0.1"
                ),
            }),
            Err(_) => Err(NodeError::Port {
                code: ErrorCode::Unavailable,
                message: format!(
                    "port {port} of sandbox {id} did not accept a connection within {} s",
                    warren_net::expose::CONNECT_TIMEOUT.as_secs()
                ),
            }),
        }
    }
}

fn no_interface(id: &SandboxId) -> NodeError {
    NodeError::Invalid(format!(
        "sandbox {id} has no network interface (it was created with network mode none): its \
         policy cannot change; create it with a filtered network"
    ))
}

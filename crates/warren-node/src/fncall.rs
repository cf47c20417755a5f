//! The FnCall backend on a node: warm worker sandboxes, per image and memory size, that run
//! function calls one at a time.
//!
//! A worker is a container sandbox of the image with no network, made by the node itself
//! (label [`WORKER_LABEL`], task [`WORKER_TASK`], project root). A call takes an idle worker
//! (or starts one), and its guest runs the call in a fresh view of the pristine image (see the
//! guest's `call` module): nothing of one call is left for the next. After the call the worker
//! goes back to the idle list, or is killed when that list is full or the call broke the
//! worker (its guest did not answer). A pool whose last idle worker was taken starts one more
//! in the background (one at a time), so the next call finds it warm. Idle workers unused for
//! [`crate::workers::IDLE_TTL`] are killed by the timer sweep.

use std::sync::Arc;

use warren_types::api::CreateSandbox;
use warren_types::fncall::{NodeCall, NodeCallResult};
use warren_types::guest::{Op, Reply};
use warren_types::id::SandboxId;

use crate::error::NodeError;
use crate::node::Node;
use crate::workers::Key;

/// The label that marks a worker, with its image as the value.
pub const WORKER_LABEL: &str = "warren.fncall.worker";
/// The task of every worker (a task operation on it acts on the pools).
pub const WORKER_TASK: &str = "warren-fncall";
/// What a worker holds beyond the call's memory: its guest, the step's init.
const OVERHEAD: u64 = 48 << 20;

/// A worker taken for a call; killed if the call is dropped before it gives the worker back.
struct Taken {
    node: Arc<Node>,
    worker: Option<SandboxId>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(id) = self.worker.take() {
            let node = self.node.clone();
            tokio::spawn(async move {
                let _ = node.kill(&id).await;
            });
        }
    }
}

/// The pool of a call: its image as resolved (its layers, so a name pointed at new layers gets
/// new workers) and its memory.
fn key_of(call: &NodeCall) -> Key {
    let layers = call
        .resolved
        .as_ref()
        .map(|r| r.layers.join(","))
        .unwrap_or_default();
    Key {
        image: format!("{}@{layers}", call.image),
        memory: call.memory.bytes(),
    }
}

impl Node {
    /// Runs a function call on a worker of its image and memory.
    pub async fn fncall(self: &Arc<Self>, call: NodeCall) -> Result<NodeCallResult, NodeError> {
        let key = key_of(&call);
        let _in_flight = self.fncall.enter(&key);
        let mut warm = true;
        let worker = loop {
            match self.fncall.take(&key) {
                Some((id, refill)) => {
                    if refill {
                        self.refill(&call);
                    }
                    if self.get(&id).is_err() {
                        continue; // killed since (its timeout, a task stop)
                    }
                    break id;
                }
                None => {
                    warm = false;
                    self.fncall.cold(&key);
                    let id = self.start_worker(&call).await?;
                    self.fncall.started(&key);
                    break id;
                }
            }
        };
        // Should this request be dropped mid-call (its client gone, a timeout above), the
        // worker goes: it may still be running the call, and no one would give it back.
        let mut guard = Taken {
            node: self.clone(),
            worker: Some(worker.clone()),
        };
        let r = self.call_on(&worker, call.spec).await;
        guard.worker = None;
        match &r {
            Ok((res, _)) if !res.retire && self.fncall.give_back(key, worker.clone()) => {}
            // A full pool, a worker the call broke, or one that asks to go: it goes (the
            // pool refills as it would after any worker's end).
            _ => {
                let _ = self.kill(&worker).await;
            }
        }
        match r {
            Ok((result, memory_limit)) => Ok(NodeCallResult {
                result,
                memory_limit,
                warm,
            }),
            // The worker ended under the call (killed, its init died): a call is stateless,
            // so the caller may simply send it again.
            Err(NodeError::Gone(_) | NodeError::NotFound(_)) => Err(NodeError::Busy {
                message: "the worker running this function call stopped before it finished \
                          (killed, or its node is stopping); send the call again"
                    .into(),
                retry_after: 1,
            }),
            Err(e) => Err(e),
        }
    }

    /// Runs `spec` in `worker`; also says whether its memory limit was hit meanwhile.
    async fn call_on(
        &self,
        worker: &SandboxId,
        spec: warren_types::guest::CallSpec,
    ) -> Result<(warren_types::guest::CallResult, bool), NodeError> {
        let sb = self.get(worker)?;
        let before = sb.instance.counters().oom_kills;
        let (sb, mut conn) = self.open(worker, Op::Call(spec)).await?;
        let reply = conn
            .reply()
            .await
            .map_err(|e| crate::exec::guest_failure(&sb, e))?;
        let after = sb.instance.counters().oom_kills;
        match reply {
            Reply::Called(result) => Ok((result, after > before)),
            other => Err(crate::exec::unexpected(other)),
        }
    }

    /// Starts a worker for `call`'s image and memory.
    async fn start_worker(self: &Arc<Self>, call: &NodeCall) -> Result<SandboxId, NodeError> {
        let memory = warren_types::ByteSize(call.memory.bytes() + OVERHEAD);
        let req = CreateSandbox {
            image: call.image.clone(),
            resolved: call.resolved.clone(),
            task: Some(WORKER_TASK.into()),
            project: Some(warren_types::project::root()),
            memory: Some(memory),
            memory_limit: Some(memory),
            pids: Some(call.spec.pids.saturating_add(64)),
            timeout: Some(24 * 3600),
            labels: [(WORKER_LABEL.to_string(), call.image.clone())].into(),
            network: Some(warren_types::net::NetworkPolicy::none()),
            fncall_worker: true,
            ..CreateSandbox::default()
        };
        match self.create(req, None).await {
            Ok((view, _)) => Ok(view.id),
            Err(e) => {
                // The guest's call server could not build its call root from this image (its
                // own links would aim a call's writable places elsewhere): the image's problem,
                // said as the server said it.
                let text = e.to_string();
                const MARK: &str = "the call server did not start: ";
                match text.find(MARK) {
                    Some(at) => {
                        let why = &text[at + MARK.len()..];
                        let why = why.split("; ").next().unwrap_or(why);
                        Err(NodeError::Invalid(format!(
                            "image {} cannot run function calls: {why}",
                            call.image
                        )))
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// Starts one more worker for `call`'s pool in the background.
    fn refill(self: &Arc<Self>, call: &NodeCall) {
        let node = self.clone();
        let call = NodeCall {
            spec: warren_types::guest::CallSpec {
                pids: call.spec.pids,
                ..Default::default()
            },
            ..call.clone()
        };
        tokio::spawn(async move {
            let key = key_of(&call);
            let started = node.start_worker(&call).await;
            node.fncall.refilled(&key);
            match started {
                Ok(id) => {
                    node.fncall.started(&key);
                    if !node.fncall.give_back(key, id.clone()) {
                        let _ = node.kill(&id).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(image = %call.image, "starting a function-call worker: {e}")
                }
            }
        });
    }

    /// Puts a worker adopted after a restart back in its pool (killed if the pool is full).
    pub(crate) async fn readopt_worker(&self, sb: &crate::node::Sandbox) {
        let key = Key {
            image: format!("{}@{}", sb.record.image, sb.record.layers.join(",")),
            memory: sb.record.resources.memory.bytes().saturating_sub(OVERHEAD),
        };
        if !self.fncall.give_back(key, sb.record.id.clone()) {
            let _ = self.kill(&sb.record.id).await;
        }
    }

    /// Kills idle workers unused for [`crate::workers::IDLE_TTL`] (from the timer sweep).
    pub(crate) async fn expire_workers(&self) {
        for id in self.fncall.expired() {
            let _ = self.kill(&id).await;
        }
    }
}

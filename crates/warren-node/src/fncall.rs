//! The FnCall backend on a node: warm worker sandboxes, per image and memory size, that run
//! function calls one at a time.
//!
//! A worker is a container sandbox of the image with no network, made by the node itself
//! (label [`WORKER_LABEL`], task [`WORKER_TASK`], project root), admitted by what it uses idle
//! (see the `workers` module: the call's memory is held from the node's FnCall budget only
//! while the call runs). A call waits for its grant of memory (in turn with other projects'
//! calls, up to its deadline), then takes an idle worker of its pool or the next one given
//! back or started for it; its guest runs the call in a fresh view of the pristine image (see
//! the guest's `call` module): nothing of one call is left for the next. After the call the
//! worker goes to the next call waiting for one, back to the idle list, or is killed when the
//! pool keeps enough or the call broke the worker (its guest did not answer). The timer sweep
//! trims idle workers past the pool's recent peak, kills those unused for
//! [`crate::workers::IDLE_TTL`], and starts workers for pools with calls waiting.

use std::sync::Arc;
use std::time::Duration;

use warren_types::api::CreateSandbox;
use warren_types::fncall::{NodeCall, NodeCallResult};
use warren_types::guest::{Op, Reply};
use warren_types::id::SandboxId;

use crate::error::NodeError;
use crate::node::Node;
use crate::workers::{Key, Take, Template, WORKER_REQUEST, WaitWorker};

/// The label that marks a worker, with its image as the value.
pub const WORKER_LABEL: &str = "warren.fncall.worker";
/// The task of every worker (a task operation on it acts on the pools).
pub const WORKER_TASK: &str = "warren-fncall";
/// What a worker holds beyond the call's memory: its guest, the step's init.
const OVERHEAD: u64 = 48 << 20;
/// The longest a call waits on a node for memory and a worker.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// A worker taken for a call: counted running until dropped, and killed if the call is
/// dropped before it gives the worker back.
struct Taken {
    node: Arc<Node>,
    key: Key,
    worker: Option<SandboxId>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.node.fncall.finished(&self.key);
        if let Some(id) = self.worker.take() {
            let node = self.node.clone();
            tokio::spawn(async move {
                let _ = node.kill(&id).await;
            });
        }
    }
}

/// A call waiting for a worker: dropped unanswered (its deadline, its client gone), it gives
/// up its place, and a worker handed to it meanwhile goes back.
struct Waiting {
    node: Arc<Node>,
    key: Key,
    w: Option<WaitWorker>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(w) = self.w.take()
            && let Some(id) = self.node.fncall.abandon(&self.key, w)
        {
            self.node.put_back(self.key.clone(), id);
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
        let deadline = tokio::time::Instant::now() + call.wait().min(MAX_WAIT);
        let project = call
            .project
            .clone()
            .unwrap_or_else(warren_types::project::root);
        // What its pool's workers start from: the image and limits, not the call's files.
        let template = Template {
            call: NodeCall {
                image: call.image.clone(),
                resolved: call.resolved.clone(),
                memory: call.memory,
                spec: warren_types::guest::CallSpec {
                    pids: call.spec.pids,
                    ..Default::default()
                },
                project: None,
                wait_ms: None,
            },
        };
        let _in_flight = self.fncall.enter(&key, template.clone());
        let _grant = self
            .fncall
            .grant(&key, &project, &self.admission, deadline)
            .await?;
        let (worker, warm) = self.worker_for(&key, &template, deadline).await?;
        // Should this request be dropped mid-call (its client gone, a timeout above), the
        // worker goes: it may still be running the call, and no one would give it back.
        let mut taken = Taken {
            node: self.clone(),
            key: key.clone(),
            worker: Some(worker.clone()),
        };
        let r = self.call_on(&worker, call.spec).await;
        taken.worker = None;
        drop(taken);
        match &r {
            // A worker the call broke, or one that asks to go, goes (the sweep starts
            // another if calls wait).
            Ok((res, _)) if !res.retire => self.put_back(key, worker),
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

    /// A worker of `key`'s pool for a call holding its grant: an idle one (warm), or the next
    /// one given back or started, until `deadline`.
    async fn worker_for(
        self: &Arc<Self>,
        key: &Key,
        template: &Template,
        deadline: tokio::time::Instant,
    ) -> Result<(SandboxId, bool), NodeError> {
        loop {
            let (got, warm) = match self.fncall.take(key) {
                Take::Idle(id, starts) => {
                    self.start_workers(key, template, starts);
                    (id, true)
                }
                Take::Wait(w, starts) => {
                    self.start_workers(key, template, starts);
                    let mut waiting = Waiting {
                        node: self.clone(),
                        key: key.clone(),
                        w: Some(w),
                    };
                    let rx = &mut waiting.w.as_mut().expect("set above").rx;
                    match tokio::time::timeout_at(deadline, rx).await {
                        Ok(Ok(Ok(id))) => {
                            waiting.w = None;
                            self.fncall.got(key);
                            (id, false)
                        }
                        Ok(Ok(Err(e))) => {
                            waiting.w = None;
                            return Err(e);
                        }
                        Ok(Err(_)) => {
                            waiting.w = None;
                            return Err(NodeError::Busy {
                                message: "this node stopped its function-call pool while the \
                                          call waited; send the call again"
                                    .into(),
                                retry_after: 1,
                            });
                        }
                        Err(_) => {
                            drop(waiting);
                            return Err(self.fncall.timed_out(key));
                        }
                    }
                }
            };
            if self.get(&got).is_ok() {
                return Ok((got, warm));
            }
            // Killed since (its timeout, a task stop): the next one.
            self.fncall.finished(key);
        }
    }

    /// Gives a worker back to its pool (to a call waiting for one, or idle); killed when the
    /// pool keeps enough.
    fn put_back(self: &Arc<Self>, key: Key, id: SandboxId) {
        if let Err(id) = self.fncall.give_back(key, id) {
            let node = self.clone();
            tokio::spawn(async move {
                let _ = node.kill(&id).await;
            });
        }
    }

    /// Starts `n` workers for `key`'s pool in the background.
    fn start_workers(self: &Arc<Self>, key: &Key, template: &Template, n: usize) {
        for _ in 0..n {
            let (node, key, call) = (self.clone(), key.clone(), template.call.clone());
            tokio::spawn(async move {
                let started = node.start_worker(&call).await;
                if let Err(e) = &started
                    && !matches!(e, NodeError::Capacity { .. } | NodeError::Busy { .. })
                {
                    tracing::warn!(image = %call.image, "starting a function-call worker: {e}");
                }
                if let Some(id) = node.fncall.start_done(&key, started) {
                    let _ = node.kill(&id).await;
                }
            });
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
        let limit = warren_types::ByteSize(call.memory.bytes() + OVERHEAD);
        let req = CreateSandbox {
            image: call.image.clone(),
            resolved: call.resolved.clone(),
            task: Some(WORKER_TASK.into()),
            project: Some(warren_types::project::root()),
            // Admitted by what it uses idle: the call's memory is held only while it runs.
            memory: Some(warren_types::ByteSize(WORKER_REQUEST)),
            memory_limit: Some(limit),
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

    /// Puts a worker adopted after a restart back in its pool (killed if the pool is full).
    pub(crate) async fn readopt_worker(&self, sb: &crate::node::Sandbox) {
        let key = Key {
            image: format!("{}@{}", sb.record.image, sb.record.layers.join(",")),
            // Its limit is the call's memory and the overhead (its request, since workers are
            // admitted by use, says nothing of the call's memory).
            memory: sb
                .record
                .resources
                .memory_limit
                .bytes()
                .saturating_sub(OVERHEAD),
        };
        if self.fncall.give_back(key, sb.record.id.clone()).is_err() {
            let _ = self.kill(&sb.record.id).await;
        }
    }

    /// The sweep's work on the pools (every tick): idle workers past their pool's recent
    /// peak or unused for [`crate::workers::IDLE_TTL`] killed, workers started for pools
    /// with calls waiting, and grants made where room freed.
    pub(crate) fn fncall_upkeep(self: &Arc<Self>) {
        self.fncall.pump_now(&self.admission);
        let (kill, start) = self.fncall.upkeep();
        for (key, template) in start {
            self.start_workers(&key, &template, 1);
        }
        if !kill.is_empty() {
            let node = self.clone();
            tokio::spawn(async move {
                for id in kill {
                    let _ = node.kill(&id).await;
                }
            });
        }
    }

    /// Kills up to `n` idle workers, the longest idle first, for a create that found no
    /// room; returns how many.
    pub(crate) async fn reclaim_workers(&self, n: usize) -> usize {
        let ids = self.fncall.take_idle(n);
        let kills = ids.iter().map(|id| self.kill(id));
        futures_util::future::join_all(kills).await;
        ids.len()
    }
}

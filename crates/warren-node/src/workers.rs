//! The function-call worker pools of a node: idle workers by image and memory, the node's
//! FnCall memory budget, and the queue of calls waiting for it (see the `fncall` module, which
//! runs calls on them).
//!
//! Workers never crowd out sandboxes. A worker is admitted by what it uses idle
//! ([`WORKER_REQUEST`]), not by its limit; the memory of the call it runs is held only while
//! the call runs, out of the node's FnCall budget (`fncall_memory_share` of what its admission
//! allows) and the node's admission both. Idle workers are the first thing reclaimed when a
//! create (or a busier pool) finds no room.
//!
//! A call first gets a **grant** of its memory: at once when the budget has room and no call
//! waits, else it queues. The queue is fair across projects (each project's calls in arrival
//! order, projects in turn) and bounded ([`MAX_QUEUE`]); a call waits up to its deadline. Then
//! it gets a **worker** of its pool: an idle one, or the next one given back or started for
//! it. A pool starts workers ahead of demand, from the calls waiting on it (at most
//! [`MAX_STARTING`] at once), up to as many as its budget lets run at once.
//!
//! A pool keeps as many idle workers as it had calls in flight at its busiest in the last
//! [`PEAK_WINDOW`] (at least [`MIN_IDLE`]); the timer sweep kills the rest within seconds of
//! the peak passing, and idle workers unused for [`IDLE_TTL`].

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use warren_types::id::SandboxId;

use crate::admission::Admission;
use crate::error::NodeError;

/// Idle workers a pool keeps at the least (more when its recent peak was higher).
pub const MIN_IDLE: usize = 8;
/// An idle worker unused this long is killed.
pub const IDLE_TTL: Duration = Duration::from_secs(600);
/// How far back a pool's peak of calls in flight counts.
pub const PEAK_WINDOW: Duration = Duration::from_secs(5);
/// Workers one pool starts at once.
pub const MAX_STARTING: usize = 4;
/// Calls that may wait for a grant on one node; past it a call is refused at once.
pub const MAX_QUEUE: usize = 4096;
/// The memory request a worker is admitted with: what an idle one uses (its guest, its call
/// server, a zygote), not the call's limit.
pub const WORKER_REQUEST: u64 = 16 << 20;

/// Which workers can run a call: same image, same memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) image: String,
    pub(crate) memory: u64,
}

/// What a worker of a pool is started from (the last call's image and limits).
#[derive(Debug, Clone)]
pub(crate) struct Template {
    pub(crate) call: warren_types::fncall::NodeCall,
}

/// A worker, or why none will come.
type WorkerReply = Result<SandboxId, NodeError>;

/// One pool.
struct Pool {
    idle: Vec<(SandboxId, Instant)>,
    /// Calls in flight (waiting or running).
    in_flight: usize,
    /// Calls holding a worker.
    running: usize,
    /// The most calls in flight since `peak_at`.
    peak: usize,
    peak_at: Instant,
    /// Workers being started for it.
    starting: usize,
    /// Calls with a grant waiting for a worker, in order.
    wanting: VecDeque<(u64, oneshot::Sender<WorkerReply>)>,
    template: Option<Template>,
    /// Calls asked of it since it was made; of them, those that found no idle worker.
    calls: u64,
    cold_calls: u64,
    /// Workers started for it (not counting starts that failed).
    started: u64,
    /// Calls that waited past their deadline.
    timed_out: u64,
}

impl Pool {
    fn new() -> Pool {
        Pool {
            idle: Vec::new(),
            in_flight: 0,
            running: 0,
            peak: 0,
            peak_at: Instant::now(),
            starting: 0,
            wanting: VecDeque::new(),
            template: None,
            calls: 0,
            cold_calls: 0,
            started: 0,
            timed_out: 0,
        }
    }

    /// How many idle workers it keeps now: its recent peak, at least [`MIN_IDLE`], at most
    /// `cap` (as many as can run at once).
    fn keep(&mut self, cap: usize) -> usize {
        if self.peak_at.elapsed() > PEAK_WINDOW {
            self.peak = self.in_flight;
            self.peak_at = Instant::now();
        }
        self.peak.max(MIN_IDLE).min(cap.max(1))
    }
}

/// A call waiting for a grant.
struct Waiter {
    ticket: u64,
    key: Key,
    tx: oneshot::Sender<()>,
}

/// Calls waiting for a grant: each project's in arrival order, projects in turn.
#[derive(Default)]
struct Queue {
    turn: VecDeque<String>,
    by: HashMap<String, VecDeque<Waiter>>,
    len: usize,
    /// How many wait for each pool.
    per_pool: HashMap<Key, usize>,
}

impl Queue {
    fn push(&mut self, project: &str, w: Waiter) {
        let q = self.by.entry(project.to_string()).or_default();
        if q.is_empty() {
            self.turn.push_back(project.to_string());
        }
        *self.per_pool.entry(w.key.clone()).or_default() += 1;
        q.push_back(w);
        self.len += 1;
    }

    /// One call of pool `key` left the queue.
    fn left(&mut self, key: &Key) {
        self.len -= 1;
        if let Some(n) = self.per_pool.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.per_pool.remove(key);
            }
        }
    }

    /// The call whose turn it is.
    fn front(&self) -> Option<&Waiter> {
        let p = self.turn.front()?;
        self.by.get(p)?.front()
    }

    /// Takes the call whose turn it is; its project goes to the back of the turn.
    fn pop(&mut self) -> Option<Waiter> {
        let p = self.turn.pop_front()?;
        let q = self.by.get_mut(&p)?;
        let w = q.pop_front();
        if q.is_empty() {
            self.by.remove(&p);
        } else {
            self.turn.push_back(p);
        }
        if let Some(w) = &w {
            self.left(&w.key);
        }
        w
    }

    /// Takes out the call with `ticket` (gone, or past its deadline); false if not queued.
    fn remove(&mut self, ticket: u64) -> bool {
        let Some((p, i)) = self.by.iter().find_map(|(p, q)| {
            q.iter()
                .position(|w| w.ticket == ticket)
                .map(|i| (p.clone(), i))
        }) else {
            return false;
        };
        let q = self.by.get_mut(&p).expect("found above");
        let w = q.remove(i).expect("found above");
        if q.is_empty() {
            self.by.remove(&p);
            self.turn.retain(|t| *t != p);
        }
        self.left(&w.key);
        true
    }

    /// How many wait for pool `key`.
    fn of(&self, key: &Key) -> usize {
        self.per_pool.get(key).copied().unwrap_or(0)
    }
}

struct Inner {
    pools: HashMap<Key, Pool>,
    /// Memory of the calls holding a grant.
    held: u64,
    queue: Queue,
    tickets: u64,
}

/// The node's worker pools and FnCall budget.
pub struct Workers {
    inner: Mutex<Inner>,
    /// The most memory calls may hold at once.
    budget: u64,
    /// What the node's admission allows in all (requests), for the grants' share of it.
    allocatable: u64,
}

/// A call's memory, held until dropped.
pub(crate) struct Grant<'a> {
    workers: &'a Workers,
    admission: &'a Admission,
    memory: u64,
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.workers.release(self.memory, self.admission);
    }
}

/// A call's place in the queue for a grant: dropped before it was granted, it leaves the queue;
/// granted but not taken up (its call gone at that moment), the grant is released.
struct Place<'a> {
    workers: &'a Workers,
    admission: &'a Admission,
    ticket: u64,
    memory: u64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let queued = self.workers.lock().queue.remove(self.ticket);
        rx.close();
        if !queued && rx.try_recv().is_ok() {
            self.workers.release(self.memory, self.admission);
        }
    }
}

/// A call in flight in a pool (counted until dropped).
pub(crate) struct InFlight<'a> {
    workers: &'a Workers,
    key: Key,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.workers.lock().pools.get_mut(&self.key) {
            p.in_flight = p.in_flight.saturating_sub(1);
        }
    }
}

/// How a call gets its worker.
pub(crate) enum Take {
    /// An idle one; and how many to start in the background.
    Idle(SandboxId, usize),
    /// It waits for one given back or started (`starts` to start now, in the background).
    Wait(WaitWorker, usize),
}

/// A call waiting for a worker; dropped unanswered, it gives up its place (and gives back a
/// worker handed to it meanwhile, in [`WaitWorker::abandon`]).
pub(crate) struct WaitWorker {
    pub(crate) ticket: u64,
    pub(crate) rx: oneshot::Receiver<WorkerReply>,
}

impl Workers {
    /// Pools with `budget` bytes for calls, on a node whose admission allows `allocatable`.
    pub fn new(budget: u64, allocatable: u64) -> Workers {
        Workers {
            inner: Mutex::new(Inner {
                pools: HashMap::new(),
                held: 0,
                queue: Queue::default(),
                tickets: 0,
            }),
            budget,
            allocatable,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most memory calls may hold at once.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Memory held by calls now.
    pub fn held(&self) -> u64 {
        self.lock().held
    }

    /// Calls waiting for a grant now.
    pub fn queued(&self) -> usize {
        self.lock().queue.len
    }

    /// How many calls of `memory` can run at once.
    fn cap(&self, memory: u64) -> usize {
        (self.budget / memory.max(1)) as usize
    }

    /// Counts a call in flight in `key`'s pool until the guard is dropped; `template` is what
    /// its workers start from.
    pub(crate) fn enter(&self, key: &Key, template: Template) -> InFlight<'_> {
        let cap = self.cap(key.memory);
        let mut m = self.lock();
        let p = m.pools.entry(key.clone()).or_insert_with(Pool::new);
        p.in_flight += 1;
        p.calls += 1;
        p.keep(cap);
        if p.in_flight > p.peak {
            p.peak = p.in_flight;
        }
        p.template = Some(template);
        InFlight {
            workers: self,
            key: key.clone(),
        }
    }

    /// Holds `key.memory` for a call of `project`: at once when the budget and the node's
    /// admission have room and no call waits before it, else after waiting in the queue, until
    /// `deadline`.
    pub(crate) async fn grant<'a>(
        &'a self,
        key: &Key,
        project: &str,
        admission: &'a Admission,
        deadline: tokio::time::Instant,
    ) -> Result<Grant<'a>, NodeError> {
        let memory = key.memory;
        if memory > self.budget {
            return Err(NodeError::Capacity {
                message: format!(
                    "a function call of {} can never run on this node: its FnCall budget is {} \
                     (fncall_memory_share of its memory admission); ask for less memory",
                    warren_types::ByteSize(memory),
                    warren_types::ByteSize(self.budget)
                ),
                retry_after: 60,
            });
        }
        let granted = || Grant {
            workers: self,
            admission,
            memory,
        };
        let (ticket, rx) = {
            let mut m = self.lock();
            if m.queue.len == 0
                && m.held + memory <= self.budget
                && admission.try_hold(memory, self.allocatable)
            {
                m.held += memory;
                return Ok(granted());
            }
            if m.queue.len >= MAX_QUEUE {
                return Err(NodeError::Capacity {
                    message: format!(
                        "{MAX_QUEUE} function calls already wait on this node; retry shortly"
                    ),
                    retry_after: 1,
                });
            }
            m.tickets += 1;
            let ticket = m.tickets;
            let (tx, rx) = oneshot::channel();
            m.queue.push(
                project,
                Waiter {
                    ticket,
                    key: key.clone(),
                    tx,
                },
            );
            (ticket, rx)
        };
        // Dropped here (the call's client gone): its place goes, or the grant it was given.
        let mut place = Place {
            workers: self,
            admission,
            ticket,
            memory,
            rx: Some(rx),
        };
        let rx = place.rx.as_mut().expect("set above");
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(())) => {
                place.rx = None;
                Ok(granted())
            }
            // The sender went without a word (never: it is dropped only after sending), or the
            // deadline passed: the place is given up as it drops.
            Ok(Err(_)) | Err(_) => {
                drop(place);
                Err(self.timed_out(key))
            }
        }
    }

    /// Counts a call past its deadline, and says so.
    pub(crate) fn timed_out(&self, key: &Key) -> NodeError {
        let mut m = self.lock();
        let queued = m.queue.len;
        let running = m.pools.values().map(|p| p.running).sum::<usize>();
        let (wanting, starting) = m
            .pools
            .get(key)
            .map_or((0, 0), |p| (p.wanting.len(), p.starting));
        if let Some(p) = m.pools.get_mut(key) {
            p.timed_out += 1;
        }
        NodeError::Timeout(format!(
            "no function-call worker became free before the call's deadline: on this node \
             {running} calls run, {queued} wait for memory (its FnCall budget is {}), and \
             {wanting} more of this image and memory wait for a worker, {starting} starting; \
             retry, or send fewer calls at once",
            warren_types::ByteSize(self.budget)
        ))
    }

    /// Gives back a grant's memory and grants the calls it makes room for.
    fn release(&self, memory: u64, admission: &Admission) {
        let mut m = self.lock();
        m.held = m.held.saturating_sub(memory);
        admission.unhold(memory);
        self.pump(&mut m, admission);
    }

    /// Grants queued calls, in turn, while the budget and the admission have room (a call
    /// that does not fit waits, and so do those after it: a large call is not passed over
    /// forever).
    fn pump(&self, m: &mut Inner, admission: &Admission) {
        while let Some(w) = m.queue.front() {
            let memory = w.key.memory;
            if m.held + memory > self.budget || !admission.try_hold(memory, self.allocatable) {
                break;
            }
            let w = m.queue.pop().expect("front was there");
            m.held += memory;
            if w.tx.send(()).is_err() {
                // Gone meanwhile.
                m.held -= memory;
                admission.unhold(memory);
            }
        }
    }

    /// Grants what room freed elsewhere (sandboxes that ended) allows; from the timer sweep.
    pub(crate) fn pump_now(&self, admission: &Admission) {
        let mut m = self.lock();
        self.pump(&mut m, admission);
    }

    /// An idle worker of `key`, or a place in line for the next one. Also says how many
    /// workers to start in the background (the caller starts them and reports each with
    /// [`Workers::start_done`]).
    pub(crate) fn take(&self, key: &Key) -> Take {
        let cap = self.cap(key.memory);
        let mut m = self.lock();
        let queued = m.queue.of(key);
        m.tickets += 1;
        let ticket = m.tickets;
        let p = m.pools.entry(key.clone()).or_insert_with(Pool::new);
        if p.wanting.is_empty()
            && let Some((id, _)) = p.idle.pop()
        {
            p.running += 1;
            // The last idle one taken: one more is started, so the next call finds it warm.
            let starts = usize::from(p.idle.is_empty() && p.starting == 0);
            p.starting += starts;
            return Take::Idle(id, starts);
        }
        p.cold_calls += 1;
        let (tx, rx) = oneshot::channel();
        p.wanting.push_back((ticket, tx));
        let starts = Self::starts(p, queued, cap);
        Take::Wait(WaitWorker { ticket, rx }, starts)
    }

    /// How many workers `p` should start now (and counts them started): one per call waiting
    /// for a worker or for a grant of this pool, less those starting, at most
    /// [`MAX_STARTING`] at once and `cap` workers in all.
    fn starts(p: &mut Pool, queued: usize, cap: usize) -> usize {
        let want = (p.wanting.len() + queued).saturating_sub(p.starting);
        let room = MAX_STARTING.saturating_sub(p.starting);
        let workers = p.running + p.idle.len() + p.starting;
        let n = want.min(room).min(cap.saturating_sub(workers));
        p.starting += n;
        n
    }

    /// The worker a waiting call was handed, once it has one.
    pub(crate) fn got(&self, key: &Key) {
        if let Some(p) = self.lock().pools.get_mut(key) {
            p.running += 1;
        }
    }

    /// A waiting call gives up (its deadline, or its client gone): its place goes; a worker
    /// handed to it meanwhile is returned (to give back).
    pub(crate) fn abandon(&self, key: &Key, mut w: WaitWorker) -> Option<SandboxId> {
        {
            let mut m = self.lock();
            if let Some(p) = m.pools.get_mut(key) {
                p.wanting.retain(|(t, _)| *t != w.ticket);
            }
        }
        w.rx.close();
        match w.rx.try_recv() {
            Ok(Ok(id)) => Some(id),
            _ => None,
        }
    }

    /// A background start for `key` ended: the worker is handed to the first call waiting
    /// for one (or kept idle); a start that failed tells the waiting calls why when no worker
    /// will come of retrying (not for a node without room now: the sweep tries again).
    /// Returns a worker no one wants and the pool does not keep (the caller kills it).
    pub(crate) fn start_done(&self, key: &Key, started: WorkerReply) -> Option<SandboxId> {
        let mut m = self.lock();
        let Some(p) = m.pools.get_mut(key) else {
            return started.ok();
        };
        p.starting = p.starting.saturating_sub(1);
        match started {
            Ok(id) => {
                p.started += 1;
                drop(m);
                self.give_back(key.clone(), id).err()
            }
            Err(e @ (NodeError::Capacity { .. } | NodeError::Busy { .. })) => {
                tracing::debug!("starting a function-call worker: {e}");
                None
            }
            Err(e) => {
                // The image cannot run calls (or the host failed): every call waiting now
                // would wait for the same failure.
                for (_, tx) in p.wanting.drain(..) {
                    let _ = tx.send(Err(match &e {
                        NodeError::Invalid(m) => NodeError::Invalid(m.clone()),
                        NodeError::ImageNotFound(m) => NodeError::ImageNotFound(m.clone()),
                        other => NodeError::host(
                            "starting a function-call worker",
                            std::io::Error::other(other.to_string()),
                        ),
                    }));
                }
                None
            }
        }
    }

    /// Puts a worker back after a call: to the first call waiting for one, else idle; `Err`
    /// with the worker when the pool keeps enough idle ones (the caller kills it).
    pub(crate) fn give_back(&self, key: Key, mut id: SandboxId) -> Result<(), SandboxId> {
        let cap = self.cap(key.memory);
        let mut m = self.lock();
        let p = m.pools.entry(key).or_insert_with(Pool::new);
        while let Some((_, tx)) = p.wanting.pop_front() {
            match tx.send(Ok(id)) {
                Ok(()) => return Ok(()),
                Err(Ok(back)) => id = back,
                Err(Err(_)) => unreachable!("an Ok was sent"),
            }
        }
        if p.idle.len() >= p.keep(cap) {
            return Err(id);
        }
        p.idle.push((id, Instant::now()));
        Ok(())
    }

    /// A call's worker is done with (given back or killed).
    pub(crate) fn finished(&self, key: &Key) {
        if let Some(p) = self.lock().pools.get_mut(key) {
            p.running = p.running.saturating_sub(1);
        }
    }

    /// Up to `n` idle workers, the longest idle first, taken out of their pools (to kill: a
    /// create needs their room).
    pub(crate) fn take_idle(&self, n: usize) -> Vec<SandboxId> {
        let mut m = self.lock();
        let mut all: Vec<(Instant, Key, SandboxId)> = m
            .pools
            .iter()
            .flat_map(|(k, p)| p.idle.iter().map(|(id, at)| (*at, k.clone(), id.clone())))
            .collect();
        all.sort_by_key(|(at, _, _)| *at);
        all.truncate(n);
        for (_, k, id) in &all {
            if let Some(p) = m.pools.get_mut(k) {
                p.idle.retain(|(i, _)| i != id);
            }
        }
        all.into_iter().map(|(_, _, id)| id).collect()
    }

    /// The sweep's work on the pools: idle workers beyond what each pool keeps now, or
    /// unused for [`IDLE_TTL`], taken out (to kill); and the starts pools with calls waiting
    /// need (their templates, to start from).
    pub(crate) fn upkeep(&self) -> (Vec<SandboxId>, Vec<(Key, Template)>) {
        let mut m = self.lock();
        let Inner { pools, queue, .. } = &mut *m;
        let mut kill = Vec::new();
        let mut start = Vec::new();
        for (k, p) in pools.iter_mut() {
            let cap = self.cap(k.memory);
            p.idle.retain(|(id, at)| {
                let keep = at.elapsed() < IDLE_TTL;
                if !keep {
                    kill.push(id.clone());
                }
                keep
            });
            let keep = p.keep(cap);
            if p.idle.len() > keep {
                // The longest idle go first.
                p.idle.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
                kill.extend(p.idle.drain(keep..).map(|(id, _)| id));
            }
            let n = Self::starts(p, queue.of(k), cap);
            if let Some(t) = p.template.as_ref().filter(|_| n > 0) {
                start.extend(std::iter::repeat_n((k.clone(), t.clone()), n));
            } else {
                p.starting -= n;
            }
        }
        pools.retain(|_, p| {
            !p.idle.is_empty() || p.in_flight > 0 || p.starting > 0 || !p.wanting.is_empty()
        });
        (kill, start)
    }

    /// Idle workers, all pools.
    pub fn idle_count(&self) -> usize {
        self.lock().pools.values().map(|p| p.idle.len()).sum()
    }

    /// Every pool as `GET /v1/nodes` shows it, by image and memory.
    pub fn stats(&self) -> Vec<warren_types::api::FnCallPool> {
        let mut m = self.lock();
        let Inner { pools, queue, .. } = &mut *m;
        let mut out: Vec<_> = pools
            .iter_mut()
            .map(|(k, p)| warren_types::api::FnCallPool {
                // The image as calls name it (the layers after `@` tell pools of one name
                // apart, a name pointed at new layers, but say nothing to a reader).
                image: k
                    .image
                    .rsplit_once('@')
                    .map_or(&*k.image, |(n, _)| n)
                    .into(),
                memory: warren_types::ByteSize(k.memory),
                idle: p.idle.len() as u32,
                busy: p.running as u32,
                queued: (queue.of(k) + p.wanting.len()) as u32,
                starting: p.starting as u32,
                keep: p.keep(self.cap(k.memory)) as u32,
                calls: p.calls,
                cold_calls: p.cold_calls,
                workers_started: p.started,
                timed_out: p.timed_out,
            })
            .collect();
        out.sort_by(|a, b| (&a.image, a.memory).cmp(&(&b.image, b.memory)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> SandboxId {
        let node: warren_types::id::NodeId = "abcdef".parse().unwrap();
        let mut random = [0u8; warren_types::id::SANDBOX_RANDOM_LEN];
        random[0] = n;
        SandboxId::new(&node, random)
    }

    fn key(image: &str, memory: u64) -> Key {
        Key {
            image: image.into(),
            memory,
        }
    }

    fn template(k: &Key) -> Template {
        Template {
            call: warren_types::fncall::NodeCall {
                image: k.image.clone(),
                resolved: None,
                memory: warren_types::ByteSize(k.memory),
                spec: Default::default(),
                project: None,
                wait_ms: None,
            },
        }
    }

    fn later(ms: u64) -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(ms)
    }

    #[test]
    fn a_pool_keeps_as_many_idle_workers_as_its_peak_in_flight() {
        let w = Workers::new(1 << 40, 1 << 40);
        let k = key("host@", 1 << 29);
        // 20 calls in flight at once, then all end: all 20 workers are kept (the peak).
        let guards: Vec<_> = (0..20).map(|_| w.enter(&k, template(&k))).collect();
        drop(guards);
        let kept = (0..24)
            .filter(|&n| w.give_back(k.clone(), id(n)).is_ok())
            .count();
        assert_eq!(kept, 20);
        assert_eq!(w.idle_count(), 20);
        // A quiet pool keeps MIN_IDLE.
        let quiet = key("other@", 1 << 29);
        drop(w.enter(&quiet, template(&quiet)));
        let kept = (0..24)
            .filter(|&n| w.give_back(quiet.clone(), id(100 + n)).is_ok())
            .count();
        assert_eq!(kept, MIN_IDLE);
        // Taking the last idle one asks for one more, once until it is done.
        for _ in 0..MIN_IDLE - 1 {
            assert!(matches!(w.take(&quiet), Take::Idle(_, 0)));
        }
        assert!(matches!(w.take(&quiet), Take::Idle(_, 1)));
        // None idle: the next call waits (for the one being started: no second start).
        let Take::Wait(mut waiting, 0) = w.take(&quiet) else {
            panic!("a call with no idle worker waits for one")
        };
        // A worker given back goes to it, not to the idle list.
        assert!(w.give_back(quiet.clone(), id(200)).is_ok());
        assert_eq!(waiting.rx.try_recv().unwrap().unwrap(), id(200));
        assert_eq!(w.idle_count(), 20);
        // A start that ends with no one waiting leaves its worker idle.
        assert!(w.start_done(&quiet, Ok(id(201))).is_none());
        assert_eq!(w.idle_count(), 21);
    }

    #[test]
    fn a_pool_is_capped_by_the_budget_and_shrinks_after_its_peak() {
        // Room for 4 calls of 256 MiB at once.
        let w = Workers::new(1 << 30, 1 << 40);
        let k = key("host@", 1 << 28);
        let guards: Vec<_> = (0..10).map(|_| w.enter(&k, template(&k))).collect();
        // No more than the cap (4) is kept idle, whatever the peak.
        let kept = (0..10)
            .filter(|&n| w.give_back(k.clone(), id(n)).is_ok())
            .count();
        assert_eq!(kept, 4);
        drop(guards);
        // Starts for waiting calls stop at the cap too: 4 idle, 0 more.
        let mut p = Pool::new();
        p.wanting.push_back((1, oneshot::channel().0));
        p.idle.push((id(50), Instant::now()));
        p.running = 3;
        assert_eq!(Workers::starts(&mut p, 9, 4), 0);
        p.running = 0;
        assert_eq!(Workers::starts(&mut p, 9, 64), MAX_STARTING);
        assert_eq!(Workers::starts(&mut p, 9, 64), 0, "MAX_STARTING at once");
    }

    #[tokio::test]
    async fn grants_wait_in_turn_across_projects_and_time_out() {
        let a = std::sync::Arc::new(Admission::default());
        // Room for two calls of 1 GiB.
        let w = std::sync::Arc::new(Workers::new(2 << 30, 1 << 40));
        let k = key("host@", 1 << 30);
        let g1 = w.grant(&k, "root/a", &a, later(10)).await.unwrap();
        let g2 = w.grant(&k, "root/a", &a, later(10)).await.unwrap();
        assert_eq!(w.held(), 2 << 30);
        assert_eq!(
            a.usage().memory,
            2 << 30,
            "grants count on the node's admission"
        );
        // Full: a third waits to its deadline, then is told (a 504), holding nothing.
        let e = w.grant(&k, "root/a", &a, later(50)).await.err().unwrap();
        assert!(matches!(e, NodeError::Timeout(_)), "{e}");
        assert_eq!((w.queued(), w.held()), (0, 2 << 30));
        // Three calls of project a queue, then one of b: b's is granted second, not fourth.
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, p) in ["root/a", "root/a", "root/a", "root/b"]
            .into_iter()
            .enumerate()
        {
            let (w2, a, order, k) = (w.clone(), a.clone(), order.clone(), k.clone());
            tasks.push(tokio::spawn(async move {
                let g = w2.grant(&k, p, &a, later(5000)).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(g);
            }));
            while w.queued() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        // A call that gives up leaves the queue (its client gone).
        let gone = {
            let (w, a, k) = (w.clone(), a.clone(), k.clone());
            tokio::spawn(async move { w.grant(&k, "root/c", &a, later(5000)).await.is_ok() })
        };
        while w.queued() < 5 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        assert_eq!(w.queued(), 4);
        assert_eq!(w.lock().queue.of(&k), 4, "counted by pool as well");
        drop((g1, g2));
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 4);
        assert!(
            order.iter().position(|&i| i == 3) < Some(2),
            "project b's call goes in turn, with the first of a's: {order:?}"
        );
        // Everything given back, on the budget and on the node's admission.
        assert_eq!((w.held(), a.usage().memory), (0, 0));
        assert_eq!(w.lock().queue.of(&k), 0);
    }

    #[tokio::test]
    async fn a_call_larger_than_the_budget_is_refused_at_once() {
        let a = Admission::default();
        let w = Workers::new(1 << 30, 1 << 40);
        let e = w
            .grant(&key("host@", 2 << 30), "root", &a, later(5000))
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("can never run"), "{e}");
    }

    #[test]
    fn idle_workers_are_taken_longest_idle_first() {
        let w = Workers::new(1 << 40, 1 << 40);
        let (k1, k2) = (key("a@", 1 << 28), key("b@", 1 << 28));
        w.give_back(k1.clone(), id(1)).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        w.give_back(k2.clone(), id(2)).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        w.give_back(k1.clone(), id(3)).unwrap();
        assert_eq!(w.take_idle(2), vec![id(1), id(2)]);
        assert_eq!(w.idle_count(), 1);
    }
}

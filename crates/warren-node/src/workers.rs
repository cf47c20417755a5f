//! The function-call worker pools of a node: idle workers by image and memory (see the
//! `fncall` module, which runs calls on them).
//!
//! A pool sizes itself to its load: it keeps as many idle workers as it had calls in flight
//! at its busiest in the last [`PEAK_WINDOW`] (at least [`MAX_IDLE`]), so a steady load finds a
//! warm worker for every call instead of starting and killing workers at the rate calls end.
//! Workers are sandboxes, so the node's admission bounds them all: a pool cannot grow past
//! the node's limits, and a call that finds none idle and cannot start one is refused (429).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use warren_types::id::SandboxId;

/// Idle workers a pool keeps at the least (more when its recent peak was higher).
pub const MAX_IDLE: usize = 8;
/// An idle worker unused this long is killed.
pub const IDLE_TTL: Duration = Duration::from_secs(600);
/// How far back a pool's peak of calls in flight counts.
pub const PEAK_WINDOW: Duration = Duration::from_secs(60);

/// Which workers can run a call: same image, same memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) image: String,
    pub(crate) memory: u64,
}

/// One pool.
struct Pool {
    idle: Vec<(SandboxId, Instant)>,
    /// Calls in flight.
    busy: usize,
    /// The most calls in flight since `peak_at`.
    peak: usize,
    peak_at: Instant,
    /// A worker being started in the background for it (at most one at a time).
    refilling: bool,
    /// Calls asked of it since it was made; of them, those that found no idle worker.
    calls: u64,
    cold_calls: u64,
    /// Workers started for it (not counting starts that failed).
    started: u64,
}

impl Pool {
    fn new() -> Pool {
        Pool {
            idle: Vec::new(),
            busy: 0,
            peak: 0,
            peak_at: Instant::now(),
            refilling: false,
            calls: 0,
            cold_calls: 0,
            started: 0,
        }
    }

    /// How many idle workers it keeps now.
    fn keep(&mut self) -> usize {
        if self.peak_at.elapsed() > PEAK_WINDOW {
            self.peak = self.busy;
            self.peak_at = Instant::now();
        }
        self.peak.max(MAX_IDLE)
    }
}

/// The node's worker pools.
#[derive(Default)]
pub struct Workers {
    pools: Mutex<HashMap<Key, Pool>>,
}

/// A call in flight in a pool (counted until dropped).
pub(crate) struct InFlight<'a> {
    workers: &'a Workers,
    key: Key,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.workers.lock().get_mut(&self.key) {
            p.busy = p.busy.saturating_sub(1);
        }
    }
}

impl Workers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Pool>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a call in flight in `key`'s pool until the guard is dropped.
    pub(crate) fn enter(&self, key: &Key) -> InFlight<'_> {
        let mut m = self.lock();
        let p = m.entry(key.clone()).or_insert_with(Pool::new);
        p.busy += 1;
        p.calls += 1;
        p.keep();
        if p.busy > p.peak {
            p.peak = p.busy;
        }
        InFlight {
            workers: self,
            key: key.clone(),
        }
    }

    /// An idle worker of `key`, and whether the caller should start one more in the background
    /// (it took the last, and none is being started: then one is marked started, and the
    /// caller calls [`Workers::refilled`] when it is done, whether it started or not).
    pub(crate) fn take(&self, key: &Key) -> Option<(SandboxId, bool)> {
        let mut m = self.lock();
        let p = m.get_mut(key)?;
        let (id, _) = p.idle.pop()?;
        let refill = p.idle.is_empty() && !p.refilling;
        p.refilling |= refill;
        Some((id, refill))
    }

    /// The background start [`Workers::take`] asked for is done.
    pub(crate) fn refilled(&self, key: &Key) {
        if let Some(p) = self.lock().get_mut(key) {
            p.refilling = false;
        }
    }

    /// Puts a worker back; false when the pool keeps enough idle ones (the caller kills it).
    pub(crate) fn give_back(&self, key: Key, id: SandboxId) -> bool {
        let mut m = self.lock();
        let p = m.entry(key).or_insert_with(Pool::new);
        if p.idle.len() >= p.keep() {
            return false;
        }
        p.idle.push((id, Instant::now()));
        true
    }

    /// Idle workers unused for [`IDLE_TTL`], taken out of the pools.
    pub(crate) fn expired(&self) -> Vec<SandboxId> {
        let mut m = self.lock();
        let mut out = Vec::new();
        for p in m.values_mut() {
            p.idle.retain(|(id, at)| {
                let keep = at.elapsed() < IDLE_TTL;
                if !keep {
                    out.push(id.clone());
                }
                keep
            });
        }
        m.retain(|_, p| !p.idle.is_empty() || p.busy > 0 || p.refilling);
        out
    }

    /// Idle workers, all pools.
    pub fn idle_count(&self) -> usize {
        self.lock().values().map(|p| p.idle.len()).sum()
    }

    /// A call of `key`'s pool found no idle worker.
    pub(crate) fn cold(&self, key: &Key) {
        if let Some(p) = self.lock().get_mut(key) {
            p.cold_calls += 1;
        }
    }

    /// A worker was started for `key`'s pool.
    pub(crate) fn started(&self, key: &Key) {
        self.lock()
            .entry(key.clone())
            .or_insert_with(Pool::new)
            .started += 1;
    }

    /// Every pool as `GET /v1/nodes` shows it, by image and memory.
    pub fn stats(&self) -> Vec<warren_types::api::FnCallPool> {
        let mut m = self.lock();
        let mut out: Vec<_> = m
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
                busy: p.busy as u32,
                keep: p.keep() as u32,
                calls: p.calls,
                cold_calls: p.cold_calls,
                workers_started: p.started,
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

    #[test]
    fn a_pool_keeps_as_many_idle_workers_as_its_peak_in_flight() {
        let w = Workers::default();
        let key = Key {
            image: "host@".into(),
            memory: 1 << 29,
        };
        // 20 calls in flight at once, then all end: all 20 workers are kept (the peak).
        let guards: Vec<_> = (0..20).map(|_| w.enter(&key)).collect();
        drop(guards);
        let kept = (0..24).filter(|&n| w.give_back(key.clone(), id(n))).count();
        assert_eq!(kept, 20);
        assert_eq!(w.idle_count(), 20);
        // A quiet pool keeps MAX_IDLE.
        let quiet = Key {
            image: "other@".into(),
            memory: 1 << 29,
        };
        drop(w.enter(&quiet));
        let kept = (0..24)
            .filter(|&n| w.give_back(quiet.clone(), id(100 + n)))
            .count();
        assert_eq!(kept, MAX_IDLE);
        // Taking the last idle one asks for one more, once until it is done.
        for _ in 0..MAX_IDLE - 1 {
            assert_eq!(w.take(&quiet).map(|(_, refill)| refill), Some(false));
        }
        assert_eq!(w.take(&quiet).map(|(_, refill)| refill), Some(true));
        assert!(w.take(&quiet).is_none());
        assert!(w.give_back(quiet.clone(), id(200)));
        assert_eq!(
            w.take(&quiet).map(|(_, refill)| refill),
            Some(false),
            "one is being started already"
        );
        w.refilled(&quiet);
        assert!(w.give_back(quiet.clone(), id(201)));
        assert_eq!(w.take(&quiet).map(|(_, refill)| refill), Some(true));
    }
}

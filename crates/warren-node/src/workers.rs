//! The function-call worker pools of a node: idle workers by image and memory (see the
//! `fncall` module, which runs calls on them).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use warren_types::id::SandboxId;

/// Idle workers kept per pool.
pub const MAX_IDLE: usize = 8;
/// An idle worker unused this long is killed.
pub const IDLE_TTL: Duration = Duration::from_secs(600);

/// Which workers can run a call: same image, same memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) image: String,
    pub(crate) memory: u64,
}

/// The node's worker pools.
#[derive(Default)]
pub struct Workers {
    idle: Mutex<HashMap<Key, Vec<(SandboxId, Instant)>>>,
}

impl Workers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Vec<(SandboxId, Instant)>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle worker of `key`, and whether it was the last.
    pub(crate) fn take(&self, key: &Key) -> Option<(SandboxId, bool)> {
        let mut m = self.lock();
        let list = m.get_mut(key)?;
        let (id, _) = list.pop()?;
        Some((id, list.is_empty()))
    }

    /// Puts a worker back; false when the pool is full (the caller kills it).
    pub(crate) fn give_back(&self, key: Key, id: SandboxId) -> bool {
        let mut m = self.lock();
        let list = m.entry(key).or_default();
        if list.len() >= MAX_IDLE {
            return false;
        }
        list.push((id, Instant::now()));
        true
    }

    /// Idle workers unused for [`IDLE_TTL`], taken out of the pools.
    pub(crate) fn expired(&self) -> Vec<SandboxId> {
        let mut m = self.lock();
        let mut out = Vec::new();
        for list in m.values_mut() {
            list.retain(|(id, at)| {
                let keep = at.elapsed() < IDLE_TTL;
                if !keep {
                    out.push(id.clone());
                }
                keep
            });
        }
        m.retain(|_, l| !l.is_empty());
        out
    }

    /// Idle workers, all pools.
    pub fn idle_count(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

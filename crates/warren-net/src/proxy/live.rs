//! The connections past their decision, with the policy generation each was allowed under,
//! so that a policy change can judge them again. Bounded by the connection slots: each entry
//! belongs to a connection holding one, and leaves with it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::Policy;

#[derive(Debug)]
struct Conn {
    src: IpAddr,
    name: String,
    port: u16,
    generation: u64,
    cut: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    conns: HashMap<u64, Conn>,
}

/// The live connections.
#[derive(Debug, Default)]
pub(super) struct Live {
    table: Mutex<Table>,
}

/// A connection's place in [`Live`]; dropping it takes the connection out.
#[derive(Debug)]
pub(super) struct Entry {
    live: Arc<Live>,
    id: u64,
    /// Notified (a permit kept if nobody waits yet) when the connection is to be cut.
    pub(super) cut: Arc<Notify>,
}

impl Entry {
    /// The connection was judged again and allowed under `generation`.
    pub(super) fn set_generation(&self, generation: u64) {
        if let Some(c) = self.live.lock().conns.get_mut(&self.id) {
            c.generation = generation;
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.live.lock().conns.remove(&self.id);
    }
}

impl Live {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; should it ever, the table is still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a connection from `src` to `name` on `port`, allowed under `generation`.
    pub(super) fn insert(
        self: &Arc<Self>,
        src: IpAddr,
        name: &str,
        port: u16,
        generation: u64,
    ) -> Entry {
        let cut = Arc::new(Notify::new());
        let mut t = self.lock();
        let id = t.next;
        t.next += 1;
        t.conns.insert(
            id,
            Conn {
                src,
                name: name.to_string(),
                port,
                generation,
                cut: Arc::clone(&cut),
            },
        );
        Entry {
            live: Arc::clone(self),
            id,
            cut,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.lock().conns.len()
    }

    /// Judges again the connections (of `only`, or all) whose source's generation is not the
    /// one they were allowed under; cuts those no longer allowed. The policy is asked with
    /// the table unlocked. Returns how many were cut.
    pub(super) fn recheck(&self, policy: &dyn Policy, only: Option<IpAddr>) -> usize {
        let snapshot: Vec<(u64, IpAddr, String, u16, u64)> = self
            .lock()
            .conns
            .iter()
            .filter(|(_, c)| only.is_none_or(|s| s == c.src))
            .map(|(&id, c)| (id, c.src, c.name.clone(), c.port, c.generation))
            .collect();
        let mut current: HashMap<IpAddr, Option<u64>> = HashMap::new();
        let mut allowed = Vec::new();
        let mut cut = Vec::new();
        for (id, src, name, port, generation) in snapshot {
            let now = *current.entry(src).or_insert_with(|| policy.current(src));
            if now == Some(generation) {
                continue;
            }
            match policy.decide(src, &name, port) {
                Some(g) => allowed.push((id, g)),
                None => cut.push(id),
            }
        }
        let mut t = self.lock();
        for (id, g) in allowed {
            if let Some(c) = t.conns.get_mut(&id) {
                c.generation = g;
            }
        }
        let mut n = 0;
        for id in cut {
            if let Some(c) = t.conns.get(&id) {
                c.cut.notify_one();
                n += 1;
            }
        }
        n
    }
}

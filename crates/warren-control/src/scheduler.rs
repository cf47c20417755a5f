//! Placement: power-of-k random choice over eligible nodes, with an in-flight overlay.
//!
//! Each node's last reported load plus the placements the control plane has sent it and not
//! yet heard back about (the overlay) decides eligibility and order. Eligibility is by
//! requests (what the node may still admit); order is by the most loaded of a node's
//! dimensions, promised (sandboxes, memory requests) and measured (memory charged to
//! sandboxes, CPU in use): a node whose sandboxes asked for little but use much is not
//! preferred. The node's own admission check has the final word: a refusal makes the caller
//! try the next candidate.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::nodes::NodeEntry;

/// The order in which to try nodes for a sandbox of `memory` bytes: the best of `k` random
/// eligible nodes first, then the other eligible nodes in random order. When no node looks
/// eligible, the `k` least loaded nodes that answer. With an idempotency
/// key, the order is fixed by the key (rendezvous hashing), so a retried create goes to the
/// node that may already have made it.
pub fn candidates(
    nodes: &[Arc<NodeEntry>],
    k: usize,
    memory: u64,
    key: Option<&str>,
) -> Vec<Arc<NodeEntry>> {
    let mut eligible: Vec<Arc<NodeEntry>> =
        nodes.iter().filter(|n| fits(n, memory)).cloned().collect();
    if eligible.is_empty() {
        // Reports may be stale: ask the least loaded answering nodes anyway; their admission
        // check answers for now, with its reason.
        let mut up: Vec<Arc<NodeEntry>> = nodes.iter().filter(|n| n.is_up()).cloned().collect();
        up.sort_by(|a, b| load(a).total_cmp(&load(b)));
        up.truncate(k.max(1));
        return up;
    }
    if let Some(key) = key {
        eligible.sort_by_key(|n| std::cmp::Reverse(rendezvous(key, n.id.as_str())));
        return eligible;
    }
    shuffle(&mut eligible);
    let k = k.max(1).min(eligible.len());
    eligible[..k].sort_by(|a, b| load(a).total_cmp(&load(b)));
    eligible
}

fn fits(n: &NodeEntry, memory: u64) -> bool {
    if !n.is_up() {
        return false;
    }
    let info = n.info();
    let inflight = n.inflight.load(Ordering::Relaxed);
    let inflight_mem = n.inflight_memory.load(Ordering::Relaxed);
    info.sandboxes + inflight < info.max_sandboxes
        && info
            .memory_reserved
            .bytes()
            .saturating_add(inflight_mem)
            .saturating_add(memory)
            <= info.memory_allocatable.bytes()
}

/// Fraction of the node's capacity in use, overlay included: the largest of sandboxes against
/// its most, memory requests against what it may admit, memory charged to sandboxes against
/// its physical memory, and CPU in use.
fn load(n: &NodeEntry) -> f64 {
    let info = n.info();
    let count = (info.sandboxes + n.inflight.load(Ordering::Relaxed)) as f64
        / info.max_sandboxes.max(1) as f64;
    let mem = (info.memory_reserved.bytes() + n.inflight_memory.load(Ordering::Relaxed)) as f64
        / info.memory_allocatable.bytes().max(1) as f64;
    let used = if info.memory_total.bytes() > 0 {
        info.memory_used.bytes() as f64 / info.memory_total.bytes() as f64
    } else {
        0.0
    };
    let cpu = info.cpu_used_pct / 100.0;
    count.max(mem).max(used).max(cpu)
}

fn shuffle<T>(v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rand::random_range(0..=i);
        v.swap(i, j);
    }
}

fn rendezvous(key: &str, node: &str) -> u64 {
    // FNV-1a over key and node: stable across processes and releases.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes().chain([0]).chain(node.bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Holds a placement in a node's in-flight overlay until dropped.
pub struct InFlight {
    node: Arc<NodeEntry>,
    memory: u64,
}

impl InFlight {
    /// Adds a placement of `memory` bytes to `node`'s overlay.
    pub fn new(node: Arc<NodeEntry>, memory: u64) -> InFlight {
        node.inflight.fetch_add(1, Ordering::Relaxed);
        node.inflight_memory.fetch_add(memory, Ordering::Relaxed);
        InFlight { node, memory }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.node.inflight.fetch_sub(1, Ordering::Relaxed);
        self.node
            .inflight_memory
            .fetch_sub(self.memory, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_order_is_stable() {
        assert_eq!(rendezvous("k", "aaaaaa"), rendezvous("k", "aaaaaa"));
        assert_ne!(rendezvous("k", "aaaaaa"), rendezvous("k", "bbbbbb"));
    }

    #[test]
    fn shuffle_keeps_elements() {
        let mut v: Vec<u32> = (0..50).collect();
        shuffle(&mut v);
        v.sort();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
    }
}

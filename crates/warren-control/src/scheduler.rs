//! Placement: power-of-k random choice over eligible nodes, with an in-flight overlay.
//!
//! Each node's last reported load plus the overlay — placements this control plane has sent
//! it and not heard back about, and those it made that no report of the node counts yet —
//! decides eligibility and order. Eligibility: the node answers, is not cordoned, has the
//! backend, may still admit the requests (sandbox count, memory, CPU), and is not measured
//! hot (memory charged to sandboxes past 90 % of its memory, or memory pressure past 10 %).
//! Order is by the most loaded of a node's promised dimensions (sandboxes, memory and CPU
//! requests, overlay included) and, once it is substantial (half the node or more), its
//! measured use (memory charged, CPU in use): so a node whose sandboxes asked for little but
//! use much is not preferred, while the noise of lightly loaded nodes' samples — the same
//! for a whole burst, since reports are a poll old — does not outweigh the overlay and send
//! a burst to one node. The node's own admission check has the final word: a refusal makes
//! the caller try the next candidate.
//!
//! Nodes of the `burst` pool (cloud bursting, as the paper does it) are candidates only for a
//! sandbox whose image may burst, and only while the default pool is busy — its utilisation,
//! the most loaded of its summed dimensions, at or past the threshold — or has no node with
//! room for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::RngExt;
use warren_types::api::BackendKind;

use crate::nodes::NodeEntry;

/// What a sandbox asks of a node.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Memory request, bytes.
    pub memory: u64,
    /// CPU request, millicores.
    pub cpu: u64,
    /// The backend it runs in.
    pub backend: BackendKind,
    /// Labels its node must have (all of them).
    pub selector: &'a BTreeMap<String, String>,
    /// Whether it may go to the burst pool, and from what utilisation of the default pool
    /// (0 to 1): none for an image not eligible.
    pub burst_above: Option<f64>,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl Ask<'_> {
    /// A sandbox asking for `memory` and `cpu` in `backend`, with no selector, not bursting.
    pub fn plain(memory: u64, cpu: u64, backend: BackendKind) -> Ask<'static> {
        Ask {
            memory,
            cpu,
            backend,
            selector: &NO_LABELS,
            burst_above: None,
        }
    }
}

/// The order in which to try nodes for a sandbox asking `ask`, at most `attempts` of them:
/// the best of `k` random eligible nodes first, then other eligible nodes in random order.
/// Nodes are drawn at random from those usable and checked for room as they are drawn, so a
/// placement reads the load of a few nodes, not of all. When no node looks eligible, the `k`
/// least loaded usable nodes (reports may be stale; their admission check answers for now,
/// with its reason). With an idempotency key, the order is fixed by the key (rendezvous
/// hashing over the eligible nodes), so a retried create goes to the node that may already
/// have made it. Nodes that do not answer, are cordoned or lack the backend are never
/// candidates.
pub fn candidates<R: rand::Rng + ?Sized>(
    nodes: &[Arc<NodeEntry>],
    k: usize,
    attempts: usize,
    ask: &Ask,
    key: Option<&str>,
    rng: &mut R,
) -> Vec<Arc<NodeEntry>> {
    let attempts = attempts.max(1);
    let k = k.max(1);
    let mut usable: Vec<Arc<NodeEntry>> = Vec::with_capacity(nodes.len());
    let mut burst: Vec<Arc<NodeEntry>> = Vec::new();
    for n in nodes {
        if self::usable(n, ask) {
            if n.is_burst() {
                burst.push(n.clone());
            } else {
                usable.push(n.clone());
            }
        }
    }
    if let Some(above) = ask.burst_above
        && !burst.is_empty()
    {
        // The default pool busy, or none of its nodes with room: the burst pool joins it.
        if utilisation(nodes) >= above || !usable.iter().any(|n| fits(n, ask)) {
            usable.extend(burst);
        }
    }
    if let Some(key) = key {
        let mut eligible: Vec<Arc<NodeEntry>> =
            usable.iter().filter(|n| fits(n, ask)).cloned().collect();
        if !eligible.is_empty() {
            eligible.sort_by_key(|n| std::cmp::Reverse(rendezvous(key, n.id.as_str())));
            eligible.truncate(attempts);
            return eligible;
        }
    } else {
        shuffle(&mut usable, rng);
        // k to choose the first from, and as many as may be tried.
        let want = k.max(attempts);
        let mut chosen: Vec<Arc<NodeEntry>> = Vec::with_capacity(want);
        for n in &usable {
            if chosen.len() >= want {
                break;
            }
            if fits(n, ask) {
                chosen.push(n.clone());
            }
        }
        if !chosen.is_empty() {
            let k = k.min(chosen.len());
            by_rank(&mut chosen[..k]);
            chosen.truncate(attempts);
            return chosen;
        }
    }
    by_rank(&mut usable);
    usable.truncate(k.min(attempts));
    usable
}

/// Whether a node may get new sandboxes of this backend and selector at all (burst nodes
/// included: [`candidates`] decides when they are used).
pub fn usable(n: &NodeEntry, ask: &Ask) -> bool {
    if !n.is_up() || n.is_cordoned() {
        return false;
    }
    n.with_report(|i| has_backend(i, ask.backend) && matches(i, ask.selector))
}

/// Whether a node (by its report) runs `backend`: a node from before backends were reported
/// runs containers.
pub fn has_backend(i: &warren_types::api::NodeInfo, backend: BackendKind) -> bool {
    i.backends.contains(&backend) || (i.backends.is_empty() && backend == BackendKind::Container)
}

/// Whether a node (by its report) has every label of `selector`.
pub fn matches(i: &warren_types::api::NodeInfo, selector: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| i.labels.get(k) == Some(v))
}

/// The default pool's utilisation, 0 to 1 and past it when overcommitted by reports: of its
/// nodes that answer and are not cordoned, the most loaded of sandboxes against their most,
/// memory and CPU requests against what they may admit (each summed over the pool, overlay
/// included). 1 when it has no such node.
pub fn utilisation(nodes: &[Arc<NodeEntry>]) -> f64 {
    let (mut count, mut max, mut mem, mut mem_cap, mut cpu, mut cpu_cap) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    for n in nodes {
        if !n.is_up() || n.is_cordoned() {
            continue;
        }
        let o = n.overlay();
        if n.is_burst() {
            continue;
        }
        n.with_report(|i| {
            count += u64::from(i.sandboxes) + u64::from(o.sandboxes);
            max += u64::from(i.max_sandboxes);
            mem = mem.saturating_add(i.memory_reserved.bytes().saturating_add(o.memory));
            mem_cap = mem_cap.saturating_add(i.memory_allocatable.bytes());
            cpu = cpu.saturating_add(i.cpu_requested.saturating_add(o.cpu));
            cpu_cap = cpu_cap.saturating_add(i.cpu_allocatable);
        });
    }
    if max == 0 {
        return 1.0;
    }
    let share = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    share(count, max)
        .max(share(mem, mem_cap))
        .max(share(cpu, cpu_cap))
}

/// Measured use below this share of a node is left out of its order.
const MEASURED_FLOOR: f64 = 0.5;
/// A node with more of its memory charged to sandboxes than this is not a candidate.
const HOT_MEMORY: f64 = 0.9;
/// Nor one whose memory pressure (PSI some avg10, %) is past this.
const HOT_PRESSURE: f64 = 10.0;

fn fits(n: &NodeEntry, ask: &Ask) -> bool {
    let o = n.overlay();
    n.with_report(|info| fits_report(info, o, ask))
}

fn fits_report(info: &warren_types::api::NodeInfo, o: crate::nodes::Overlay, ask: &Ask) -> bool {
    let hot = (info.memory_total.bytes() > 0
        && info.memory_used.bytes() as f64 > HOT_MEMORY * info.memory_total.bytes() as f64)
        || info.pressure.is_some_and(|p| p.memory > HOT_PRESSURE);
    !hot && info.sandboxes.saturating_add(o.sandboxes) < info.max_sandboxes
        && info
            .memory_reserved
            .bytes()
            .saturating_add(o.memory)
            .saturating_add(ask.memory)
            <= info.memory_allocatable.bytes()
        && (info.cpu_allocatable == 0
            || info
                .cpu_requested
                .saturating_add(o.cpu)
                .saturating_add(ask.cpu)
                <= info.cpu_allocatable)
}

/// A node's place in the order: its load, then — between nodes equally loaded, as nodes
/// busy by measure are — its promised load alone, so the one with fewer sandboxes and
/// requests goes first.
fn rank(n: &NodeEntry) -> (f64, f64) {
    let o = n.overlay();
    n.with_report(|info| load_report(info, o))
}

/// Sorts nodes least loaded first (each node's rank read once).
fn by_rank(nodes: &mut [Arc<NodeEntry>]) {
    let mut ranked: Vec<((f64, f64), Arc<NodeEntry>)> =
        nodes.iter().map(|n| (rank(n), n.clone())).collect();
    ranked.sort_by(|(a, _), (b, _)| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    for (slot, (_, n)) in nodes.iter_mut().zip(ranked) {
        *slot = n;
    }
}

/// The fraction of a node's capacity in use, overlay included — the largest of sandboxes
/// against its most, memory and CPU requests against what it may admit, and, when half the
/// node or more, memory charged to sandboxes against its physical memory and CPU in use — and
/// the promised part alone.
fn load_report(info: &warren_types::api::NodeInfo, o: crate::nodes::Overlay) -> (f64, f64) {
    let count =
        info.sandboxes.saturating_add(o.sandboxes) as f64 / info.max_sandboxes.max(1) as f64;
    let mem = info.memory_reserved.bytes().saturating_add(o.memory) as f64
        / info.memory_allocatable.bytes().max(1) as f64;
    let cpu_req = if info.cpu_allocatable > 0 {
        info.cpu_requested.saturating_add(o.cpu) as f64 / info.cpu_allocatable as f64
    } else {
        0.0
    };
    let used = if info.memory_total.bytes() > 0 {
        info.memory_used.bytes() as f64 / info.memory_total.bytes() as f64
    } else {
        0.0
    };
    let cpu = info.cpu_used_pct / 100.0;
    let measured = used.max(cpu);
    let promised = count.max(mem).max(cpu_req);
    if measured >= MEASURED_FLOOR {
        (promised.max(measured), promised)
    } else {
        (promised, promised)
    }
}

fn shuffle<T, R: rand::Rng + ?Sized>(v: &mut [T], rng: &mut R) {
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
}

fn rendezvous(key: &str, node: &str) -> u64 {
    // FNV-1a over key and node, stable across processes and releases, then mixed
    // (MurmurHash3's finalizer): FNV alone leaves ids that differ in their last characters
    // ordered alike for every key, so one node would win them all.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes().chain([0]).chain(node.bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51afd7ed558ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ceb9fe1a85ec53);
    h ^ (h >> 33)
}

/// Holds a placement in a node's in-flight overlay until dropped; [`InFlight::placed`] turns
/// it into a placement the node made, counted until its next report.
pub struct InFlight {
    node: Arc<NodeEntry>,
    memory: u64,
    cpu: u64,
}

impl InFlight {
    /// Adds a placement asking `ask` to `node`'s overlay.
    pub fn new(node: Arc<NodeEntry>, ask: &Ask) -> InFlight {
        use std::sync::atomic::Ordering;
        node.inflight.fetch_add(1, Ordering::Relaxed);
        node.inflight_memory
            .fetch_add(ask.memory, Ordering::Relaxed);
        node.inflight_cpu.fetch_add(ask.cpu, Ordering::Relaxed);
        InFlight {
            node,
            memory: ask.memory,
            cpu: ask.cpu,
        }
    }

    /// The node made the sandbox: it stays in the overlay until the node's report counts it.
    pub fn placed(self) {
        self.node.placed(self.memory, self.cpu);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        self.node.inflight.fetch_sub(1, Ordering::Relaxed);
        self.node
            .inflight_memory
            .fetch_sub(self.memory, Ordering::Relaxed);
        self.node
            .inflight_cpu
            .fetch_sub(self.cpu, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use warren_types::ByteSize;
    use warren_types::api::{BURST_POOL, NodeInfo};
    use warren_types::id::NodeId;

    use super::*;

    const GI: u64 = 1 << 30;

    fn node(i: usize, sandboxes: u32) -> Arc<NodeEntry> {
        let id: NodeId = format!("n{i:05}").parse().unwrap();
        let mut info = NodeInfo::unknown(id);
        info.sandboxes = sandboxes;
        info.max_sandboxes = 1000;
        info.memory_total = ByteSize(16 * GI);
        info.memory_allocatable = ByteSize(64 * GI);
        info.memory_reserved = ByteSize(sandboxes as u64 * (64 << 20));
        info.cpu_cores = 2;
        info.cpu_allocatable = 16_000;
        info.backends = vec![BackendKind::Container];
        Arc::new(NodeEntry::simulated(info, true))
    }

    fn ask() -> Ask<'static> {
        Ask::plain(64 << 20, 10, BackendKind::Container)
    }

    /// Places `n` sandboxes one after another (each placed, in the overlay); returns how many
    /// went to each node.
    fn place(nodes: &[Arc<NodeEntry>], k: usize, n: usize, seed: u64) -> HashMap<String, usize> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut count = HashMap::new();
        for _ in 0..n {
            let order = candidates(nodes, k, 4, &ask(), None, &mut rng);
            let first = order.first().expect("a candidate").clone();
            *count.entry(first.id.to_string()).or_insert(0) += 1;
            InFlight::new(first, &ask()).placed();
        }
        count
    }

    fn imbalance(count: &HashMap<String, usize>, nodes: usize, n: usize) -> f64 {
        let max = count.values().copied().max().unwrap_or(0) as f64;
        max / (n as f64 / nodes as f64)
    }

    #[test]
    fn rendezvous_order_is_stable() {
        assert_eq!(rendezvous("k", "aaaaaa"), rendezvous("k", "aaaaaa"));
        assert_ne!(rendezvous("k", "aaaaaa"), rendezvous("k", "bbbbbb"));
    }

    #[test]
    fn keys_spread_over_nodes_whose_ids_differ_at_the_end() {
        let ids: Vec<String> = (0..160).map(|i| format!("s{i:05}")).collect();
        let mut first = std::collections::HashMap::new();
        for k in 0..16_000 {
            let key = format!("episode-{k}");
            let best = ids
                .iter()
                .max_by_key(|id| rendezvous(&key, id))
                .unwrap()
                .clone();
            *first.entry(best).or_insert(0usize) += 1;
        }
        // 100 keys per node on average: every node wins some, none more than twice that.
        assert_eq!(first.len(), 160);
        assert!(first.values().all(|n| *n < 200), "{first:?}");
    }

    #[test]
    fn shuffle_keeps_elements() {
        let mut v: Vec<u32> = (0..50).collect();
        shuffle(&mut v, &mut StdRng::seed_from_u64(1));
        v.sort();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn the_same_seed_places_the_same_way() {
        let nodes: Vec<_> = (0..10).map(|i| node(i, 0)).collect();
        let a = place(&nodes, 2, 100, 7);
        let nodes: Vec<_> = (0..10).map(|i| node(i, 0)).collect();
        let b = place(&nodes, 2, 100, 7);
        assert_eq!(a, b);
    }

    #[test]
    fn two_choices_with_the_overlay_spread_evenly() {
        // 500 placements on 10 nodes with no report in between: the overlay alone spreads
        // them. k = 2 keeps the fullest node near the mean; k = 1 (random) does not.
        let nodes: Vec<_> = (0..10).map(|i| node(i, 0)).collect();
        let two = imbalance(&place(&nodes, 2, 500, 3), 10, 500);
        let nodes: Vec<_> = (0..10).map(|i| node(i, 0)).collect();
        let one = imbalance(&place(&nodes, 1, 500, 3), 10, 500);
        assert!(two <= 1.1, "k=2 imbalance {two}");
        assert!(one > two, "k=1 {one} should be worse than k=2 {two}");
    }

    #[test]
    fn without_the_overlay_a_burst_piles_onto_the_emptiest() {
        // The same burst, each placement forgotten at once (no overlay): every choice sees the
        // same stale reports, and the one empty node takes everything it is drawn for.
        let mut nodes: Vec<_> = (0..10).map(|i| node(i, 100)).collect();
        nodes[0] = node(0, 0);
        let mut rng = StdRng::seed_from_u64(5);
        let mut to_empty = 0;
        for _ in 0..200 {
            let first = candidates(&nodes, 10, 4, &ask(), None, &mut rng)[0].clone();
            to_empty += usize::from(first.id == nodes[0].id);
        }
        assert_eq!(to_empty, 200);
        // With it, the empty node fills up to the others' level and then shares.
        let mut rng = StdRng::seed_from_u64(5);
        let mut to_empty = 0;
        for _ in 0..300 {
            let first = candidates(&nodes, 10, 4, &ask(), None, &mut rng)[0].clone();
            to_empty += usize::from(first.id == nodes[0].id);
            InFlight::new(first, &ask()).placed();
        }
        assert!((100..=125).contains(&to_empty), "{to_empty}");
    }

    #[test]
    fn a_report_that_counts_placements_takes_them_out_of_the_overlay() {
        let n = node(0, 0);
        InFlight::new(n.clone(), &ask()).placed();
        InFlight::new(n.clone(), &ask()).placed();
        assert_eq!(n.overlay().sandboxes, 2);
        // A report asked for before they were placed still leaves them in.
        let before = std::time::Instant::now() - std::time::Duration::from_secs(1);
        n.record(n.info(), before);
        assert_eq!(n.overlay().sandboxes, 2);
        let mut info = n.info();
        info.sandboxes = 2;
        n.record(info, std::time::Instant::now());
        assert_eq!(n.overlay(), Default::default());
        // In flight counts until dropped.
        let f = InFlight::new(n.clone(), &ask());
        assert_eq!(n.overlay().memory, 64 << 20);
        drop(f);
        assert_eq!(n.overlay().sandboxes, 0);
    }

    #[test]
    fn cordoned_and_unreachable_nodes_are_never_candidates() {
        let nodes: Vec<_> = (0..4).map(|i| node(i, 0)).collect();
        nodes[0].set_cordoned(true);
        nodes[1].set_up(false);
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..50 {
            let order = candidates(&nodes, 2, 4, &ask(), None, &mut rng);
            assert_eq!(order.len(), 2);
            assert!(
                order
                    .iter()
                    .all(|n| n.id == nodes[2].id || n.id == nodes[3].id)
            );
        }
        // Every node full: the least loaded usable ones are still asked (their admission
        // answers), never a cordoned or unreachable one.
        let big = Ask {
            memory: 1 << 50,
            ..ask()
        };
        let order = candidates(&nodes, 2, 4, &big, None, &mut rng);
        assert_eq!(order.len(), 2);
        assert!(order.iter().all(|n| !n.is_cordoned() && n.is_up()));
    }

    #[test]
    fn cpu_requests_count_toward_eligibility() {
        let nodes = vec![node(0, 0), node(1, 0)];
        let mut info = nodes[0].info();
        info.cpu_requested = 15_990;
        nodes[0].record(info, std::time::Instant::now());
        let mut rng = StdRng::seed_from_u64(2);
        let a = Ask { cpu: 100, ..ask() };
        for _ in 0..20 {
            let order = candidates(&nodes, 2, 4, &a, None, &mut rng);
            assert_eq!(order.len(), 1);
            assert_eq!(order[0].id, nodes[1].id);
        }
    }

    #[test]
    fn light_measured_noise_does_not_outweigh_the_overlay() {
        // Two idle nodes whose CPU samples differ a little: a burst still splits evenly.
        let nodes = vec![node(0, 0), node(1, 0)];
        let mut info = nodes[0].info();
        info.cpu_used_pct = 3.0;
        nodes[0].record(info, std::time::Instant::now());
        let count = place(&nodes, 2, 200, 11);
        assert_eq!(count.values().copied().max(), Some(100), "{count:?}");
    }

    #[test]
    fn heavy_measured_use_is_avoided_and_a_hot_node_is_not_a_candidate() {
        let nodes = vec![node(0, 0), node(1, 10)];
        // Node 0 promised little, but its sandboxes use 70 % of its memory.
        let mut info = nodes[0].info();
        info.memory_used = ByteSize(info.memory_total.bytes() * 7 / 10);
        nodes[0].record(info, std::time::Instant::now());
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(
            candidates(&nodes, 2, 4, &ask(), None, &mut rng)[0].id,
            nodes[1].id
        );
        // Under memory pressure it is not a candidate at all while another is.
        let mut info = nodes[0].info();
        info.pressure = Some(warren_types::api::Pressure {
            cpu: 0.0,
            memory: 25.0,
            io: 0.0,
        });
        nodes[0].record(info, std::time::Instant::now());
        let order = candidates(&nodes, 2, 4, &ask(), None, &mut rng);
        assert_eq!(order.len(), 1);
        assert_eq!(order[0].id, nodes[1].id);
    }

    #[test]
    fn attempts_bound_the_order_and_only_nodes_with_room_are_in_it() {
        let mut nodes: Vec<_> = (0..50).map(|i| node(i, 0)).collect();
        // Half the nodes are full by their reports.
        for n in nodes.iter_mut().step_by(2) {
            *n = node(0, 1000);
        }
        let mut rng = StdRng::seed_from_u64(8);
        for _ in 0..100 {
            let order = candidates(&nodes, 2, 3, &ask(), None, &mut rng);
            assert_eq!(order.len(), 3);
            assert!(order.iter().all(|n| n.info().sandboxes == 0));
        }
    }

    #[test]
    fn between_nodes_equally_busy_by_measure_the_one_promised_less_goes_first() {
        // Both nodes on a host at 90 % CPU (as two nodes of one test machine are): the one
        // with fewer sandboxes first.
        let nodes = vec![node(0, 600), node(1, 100)];
        for n in &nodes {
            let mut info = n.info();
            info.cpu_used_pct = 90.0;
            n.record(info, std::time::Instant::now());
        }
        let mut rng = StdRng::seed_from_u64(12);
        for _ in 0..20 {
            assert_eq!(
                candidates(&nodes, 2, 2, &ask(), None, &mut rng)[0].id,
                nodes[1].id
            );
        }
    }

    #[test]
    fn an_idempotency_key_fixes_the_order() {
        let nodes: Vec<_> = (0..5).map(|i| node(i, 0)).collect();
        let mut rng = StdRng::seed_from_u64(4);
        let a = candidates(&nodes, 2, 5, &ask(), Some("key-1"), &mut rng);
        let b = candidates(&nodes, 2, 5, &ask(), Some("key-1"), &mut rng);
        let ids = |v: &[Arc<NodeEntry>]| v.iter().map(|n| n.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&b));
        assert_eq!(a.len(), 5);
    }

    fn with(n: &Arc<NodeEntry>, f: impl FnOnce(&mut NodeInfo)) {
        let mut info = n.info();
        f(&mut info);
        n.record(info, std::time::Instant::now());
    }

    #[test]
    fn a_node_selector_keeps_to_nodes_with_every_label() {
        let nodes: Vec<_> = (0..6).map(|i| node(i, 0)).collect();
        for n in &nodes[..3] {
            with(n, |i| {
                i.labels.insert("gpu".into(), "h200".into());
            });
        }
        with(&nodes[0], |i| {
            i.labels.insert("zone".into(), "a".into());
        });
        let gpu: BTreeMap<String, String> = [("gpu".to_string(), "h200".to_string())].into();
        let both: BTreeMap<String, String> = [
            ("gpu".to_string(), "h200".to_string()),
            ("zone".to_string(), "a".to_string()),
        ]
        .into();
        let mut rng = StdRng::seed_from_u64(21);
        for _ in 0..50 {
            let a = Ask {
                selector: &gpu,
                ..ask()
            };
            let order = candidates(&nodes, 2, 6, &a, None, &mut rng);
            assert_eq!(order.len(), 3);
            assert!(order.iter().all(|n| n.info().labels.contains_key("gpu")));
            let a = Ask {
                selector: &both,
                ..ask()
            };
            let order = candidates(&nodes, 2, 6, &a, None, &mut rng);
            assert_eq!(order.len(), 1);
            assert_eq!(order[0].id, nodes[0].id);
            // With a key too.
            let order = candidates(&nodes, 2, 6, &a, Some("k"), &mut rng);
            assert_eq!(order.len(), 1);
            assert_eq!(order[0].id, nodes[0].id);
        }
        // A label no node has: no candidate, not even a full one.
        let none: BTreeMap<String, String> = [("gpu".to_string(), "b200".to_string())].into();
        let a = Ask {
            selector: &none,
            ..ask()
        };
        assert!(candidates(&nodes, 2, 6, &a, None, &mut rng).is_empty());
    }

    /// Four default nodes and two burst nodes, the default ones holding `held` of 1000 each.
    fn pools(held: u32) -> Vec<Arc<NodeEntry>> {
        let mut nodes: Vec<_> = (0..4).map(|i| node(i, held)).collect();
        for i in 4..6 {
            let n = node(i, 0);
            with(&n, |r| r.pool = BURST_POOL.into());
            nodes.push(n);
        }
        nodes
    }

    fn to_burst(nodes: &[Arc<NodeEntry>], a: &Ask, n: usize, seed: u64) -> usize {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut burst = 0;
        for _ in 0..n {
            let first = candidates(nodes, 2, 4, a, None, &mut rng)[0].clone();
            burst += usize::from(first.info().pool == BURST_POOL);
        }
        burst
    }

    #[test]
    fn the_burst_pool_is_used_only_past_the_threshold_and_for_eligible_images() {
        let eligible = Ask {
            burst_above: Some(0.8),
            ..ask()
        };
        // The default pool at 50 %: burst nodes are never chosen, eligible or not.
        let nodes = pools(500);
        assert!((utilisation(&nodes) - 0.5).abs() < 1e-9);
        assert_eq!(to_burst(&nodes, &eligible, 200, 1), 0);
        assert_eq!(to_burst(&nodes, &ask(), 200, 1), 0);
        // At 85 %: an eligible image goes to the (emptier) burst nodes when drawn; one that
        // is not never does.
        let nodes = pools(850);
        assert!(to_burst(&nodes, &eligible, 200, 2) > 50);
        assert_eq!(to_burst(&nodes, &ask(), 200, 2), 0);
        // A threshold of 0.9 keeps them out at 85 %.
        let strict = Ask {
            burst_above: Some(0.9),
            ..ask()
        };
        assert_eq!(to_burst(&nodes, &strict, 200, 2), 0);
        // The default pool full by its reports: the burst pool takes what may burst, even
        // below the threshold; what may not is still sent to a default node (whose admission
        // answers).
        let nodes = pools(1000);
        let never = Ask {
            burst_above: Some(2.0),
            ..ask()
        };
        assert_eq!(to_burst(&nodes, &never, 50, 3), 50);
        assert_eq!(to_burst(&nodes, &ask(), 50, 3), 0);
        // Cordoned or unreachable default nodes do not count toward the pool's utilisation;
        // with none left, it is busy.
        let nodes = pools(0);
        for n in &nodes[..4] {
            n.set_cordoned(true);
        }
        assert_eq!(utilisation(&nodes), 1.0);
        assert_eq!(to_burst(&nodes, &eligible, 20, 4), 20);
    }

    #[test]
    fn the_overlay_counts_toward_the_default_pools_utilisation() {
        // A burst of placements with no report in between pushes the pool past the threshold.
        let nodes = pools(700);
        let eligible = Ask {
            burst_above: Some(0.8),
            ..ask()
        };
        let mut rng = StdRng::seed_from_u64(6);
        let mut first_burst = None;
        for i in 0..800 {
            let first = candidates(&nodes, 2, 4, &eligible, None, &mut rng)[0].clone();
            if first.info().pool == BURST_POOL && first_burst.is_none() {
                first_burst = Some(i);
            }
            InFlight::new(first, &eligible).placed();
        }
        // 4 nodes × 1000 at 70 % reach 80 % after 400 placements: none before, and from
        // then on a burst node is drawn (two of six nodes) within a few.
        let first = first_burst.expect("the burst pool used");
        assert!((400..420).contains(&first), "{first}");
    }
}

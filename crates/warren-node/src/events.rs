//! The node's incident store: what its sandboxes tried that the platform stopped or cut.
//!
//! Events come from two places: the guest agents (denied system calls, attempts on the agent
//! itself: their records stream to the node, see the `incidents` module) and the node
//! (cut output, process and memory limits, disk quotas). Occurrences of one kind and detail
//! in one sandbox within a minute are one event with a count. The store is bounded
//! ([`MAX_EVENTS`], oldest dropped) and kept in `events.jsonl` in the state directory, so it
//! outlives the sandboxes it describes and restarts of the daemon.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use warren_types::events::{Event, EventKind};
use warren_types::guest::Incident;
use warren_types::id::{NodeId, SandboxId};

use crate::state;

/// Events kept; the oldest go first.
pub const MAX_EVENTS: usize = 100_000;

/// Events one sandbox may hold in the store: past that, its new node-made events add to one
/// overflow event per kind, so one sandbox cannot push every other's out.
pub const MAX_EVENTS_PER_SANDBOX: usize = 1000;

/// Occurrences within this long of an event's first one add to it.
const WINDOW: Duration = Duration::from_secs(60);

/// The log is rewritten from what is kept once it has grown by this much.
const COMPACT_AFTER: u64 = 32 << 20;

/// An event as kept (times in ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    id: String,
    sandbox: SandboxId,
    #[serde(default)]
    task: Option<String>,
    /// The sandbox's project (absent in records from before projects were kept: those are
    /// shown only to cluster-wide readers once their sandbox is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    project: Option<String>,
    kind: EventKind,
    detail: String,
    count: u64,
    first_ms: u64,
    last_ms: u64,
    #[serde(default)]
    pid: Option<i32>,
    #[serde(default)]
    comm: Option<String>,
    /// A network event's ports (disjoint ranges, sorted; at most [`MAX_PORT_RANGES`]) and
    /// what was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    net: Option<NetRecord>,
}

/// Port ranges a network event keeps; further ports are counted, not listed.
const MAX_PORT_RANGES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct NetRecord {
    protocol: String,
    destination: String,
    #[serde(default)]
    ranges: Vec<(u16, u16)>,
    #[serde(default)]
    port_count: u32,
    #[serde(default)]
    more: bool,
    #[serde(default)]
    domain: Option<String>,
}

impl NetRecord {
    fn add_ports(&mut self, ports: &[u16]) {
        for &p in ports {
            if self.ranges.iter().any(|&(a, b)| a <= p && p <= b) {
                continue;
            }
            self.port_count += 1;
            let at = self.ranges.partition_point(|&(a, _)| a < p);
            let joins_left = at > 0 && self.ranges[at - 1].1.checked_add(1) == Some(p);
            let joins_right = at < self.ranges.len() && p.checked_add(1) == Some(self.ranges[at].0);
            match (joins_left, joins_right) {
                (true, true) => {
                    self.ranges[at - 1].1 = self.ranges[at].1;
                    self.ranges.remove(at);
                }
                (true, false) => self.ranges[at - 1].1 = p,
                (false, true) => self.ranges[at].0 = p,
                (false, false) if self.ranges.len() < MAX_PORT_RANGES => {
                    self.ranges.insert(at, (p, p))
                }
                (false, false) => self.more = true,
            }
        }
    }

    fn view(&self) -> warren_types::events::NetEvent {
        let mut ports: Vec<String> = self
            .ranges
            .iter()
            .map(|&(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        if self.more {
            ports.push("…".into());
        }
        warren_types::events::NetEvent {
            protocol: self.protocol.clone(),
            destination: self.destination.clone(),
            ports: ports.join(","),
            port_count: self.port_count,
            domain: self.domain.clone(),
        }
    }
}

/// A refused network attempt, as the node saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetOccurrence {
    /// `tcp`, `udp`, `icmp`, `dns`, …
    pub protocol: String,
    /// The address tried.
    pub destination: String,
    /// Ports tried.
    pub ports: Vec<u16>,
    /// The name refused (a lookup).
    pub domain: Option<String>,
}

/// Whose sandbox an event is about: its task and its project.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The sandbox's task, if it has one.
    pub task: Option<&'a str>,
    /// The sandbox's project (none when it is no longer known: a sandbox gone before its
    /// event was counted; such events are shown only to cluster-wide readers).
    pub project: Option<&'a str>,
}

impl<'a> Owner<'a> {
    /// Whose a sandbox's events are: its record's task and project.
    pub fn of(r: &'a state::Record) -> Owner<'a> {
        Owner {
            task: r.task.as_deref(),
            project: Some(&r.project),
        }
    }
}

/// Which events to list.
#[derive(Debug, Default, Clone)]
pub struct EventFilter {
    pub sandbox: Option<SandboxId>,
    pub task: Option<String>,
    pub kind: Option<EventKind>,
    /// Only events whose last occurrence is at or after this, ms since the epoch.
    pub since_ms: Option<u64>,
    /// Only events of sandboxes of these projects and their subtrees (a comma-separated
    /// list, as the control plane sends it; absent: all). Events recorded without a project
    /// match only a scope that holds the root.
    pub scope: Option<String>,
}

/// The store.
pub struct EventStore {
    inner: Mutex<Inner>,
}

struct Inner {
    path: PathBuf,
    by_id: HashMap<String, Record>,
    /// (first occurrence, id), for listing oldest first and dropping the oldest.
    order: BTreeMap<(u64, String), ()>,
    /// The open window of node-made events: (sandbox, kind, detail) → id.
    open: HashMap<(SandboxId, EventKind, String), String>,
    /// Events each sandbox holds in the store.
    per_sandbox: HashMap<SandboxId, usize>,
    next: u64,
    file: Option<std::fs::File>,
    written: u64,
}

impl EventStore {
    /// Opens the store in `dir` (`events.jsonl`), keeping what an earlier run recorded.
    pub fn open(dir: &Path) -> EventStore {
        let path = dir.join("events.jsonl");
        let mut inner = Inner {
            path: path.clone(),
            by_id: HashMap::new(),
            order: BTreeMap::new(),
            open: HashMap::new(),
            per_sandbox: HashMap::new(),
            next: state::now_ms(),
            file: None,
            written: 0,
        };
        if let Ok(f) = std::fs::File::open(&path) {
            for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                if let Ok(r) = serde_json::from_str::<Record>(&line) {
                    inner.put(r);
                }
            }
        }
        inner.compact();
        EventStore {
            inner: Mutex::new(inner),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `n` occurrences of an event the node itself saw.
    pub fn occur(
        &self,
        sandbox: &SandboxId,
        owner: Owner<'_>,
        kind: EventKind,
        detail: String,
        n: u64,
    ) {
        self.occur_with(sandbox, owner, kind, detail, n, None);
    }

    /// Adds `n` refused network attempts to one destination (or name): within the window,
    /// attempts on the same destination add to one event, their ports merged — a port scan
    /// is one event with the ports it tried.
    pub fn occur_network(
        &self,
        sandbox: &SandboxId,
        owner: Owner<'_>,
        what: NetOccurrence,
        n: u64,
    ) {
        let detail = match &what.domain {
            Some(d) if what.protocol.starts_with("dns") => format!("lookup of {d} refused"),
            // The transparent proxy: a connection judged by the name it asked for.
            Some(d) => format!("{} to {d} ({}) refused", what.protocol, what.destination),
            None => format!("{} to {} refused", what.protocol, what.destination),
        };
        self.occur_with(sandbox, owner, EventKind::Network, detail, n, Some(what));
    }

    /// Adds `n` occurrences to the open event of (sandbox, kind, detail), or opens one; a
    /// network occurrence's ports are merged into it.
    fn occur_with(
        &self,
        sandbox: &SandboxId,
        owner: Owner<'_>,
        kind: EventKind,
        detail: String,
        n: u64,
        net: Option<NetOccurrence>,
    ) {
        let now = state::now_ms();
        let mut g = self.lock();
        let mut key = (sandbox.clone(), kind, detail);
        let mut net = net;
        let is_open = |g: &Inner, key: &(SandboxId, EventKind, String)| {
            g.open
                .get(key)
                .and_then(|id| g.by_id.get(id))
                .is_some_and(|r| now.saturating_sub(r.first_ms) < WINDOW.as_millis() as u64)
        };
        if !is_open(&g, &key)
            && g.per_sandbox.get(sandbox).copied().unwrap_or(0) >= MAX_EVENTS_PER_SANDBOX
        {
            // Full: counted in the overflow event of its kind (which may itself be new).
            key.2 = format!(
                "more than {MAX_EVENTS_PER_SANDBOX} events of this sandbox: further ones of \
                 this kind are counted here"
            );
            net = None;
        }
        let open = g
            .open
            .get(&key)
            .and_then(|id| g.by_id.get(id))
            .filter(|r| now.saturating_sub(r.first_ms) < WINDOW.as_millis() as u64)
            .cloned();
        let mut rec = match open {
            Some(mut r) => {
                r.count += n;
                r.last_ms = now;
                r
            }
            None => {
                g.next += 1;
                let id = format!("{}-n{}", sandbox, g.next);
                g.open.insert(key.clone(), id.clone());
                Record {
                    id,
                    sandbox: sandbox.clone(),
                    task: owner.task.map(str::to_string),
                    project: owner.project.map(str::to_string),
                    kind,
                    detail: key.2,
                    count: n,
                    first_ms: now,
                    last_ms: now,
                    pid: None,
                    comm: None,
                    net: net.as_ref().map(|w| NetRecord {
                        protocol: w.protocol.clone(),
                        destination: w.destination.clone(),
                        ranges: Vec::new(),
                        port_count: 0,
                        more: false,
                        domain: w.domain.clone(),
                    }),
                }
            }
        };
        if let (Some(r), Some(w)) = (&mut rec.net, &net) {
            r.add_ports(&w.ports);
        }
        g.save(rec);
    }

    /// Takes in a record the sandbox's guest reported (a later report of the same record
    /// replaces it).
    pub fn from_guest(&self, sandbox: &SandboxId, owner: Owner<'_>, i: &Incident) {
        let kind = match i.kind.as_str() {
            "management" => EventKind::Management,
            _ => EventKind::Seccomp,
        };
        let id = format!("{sandbox}-g{}", i.id);
        {
            let g = self.lock();
            let full = !g.by_id.contains_key(&id)
                && g.per_sandbox.get(sandbox).copied().unwrap_or(0) >= MAX_EVENTS_PER_SANDBOX;
            drop(g);
            if full {
                // Counted in the overflow event of its kind, like the node's own past the cap
                // (a guest's details can be made to differ at will: a pid, say).
                self.occur_with(sandbox, owner, kind, String::new(), i.count.max(1), None);
                return;
            }
        }
        let rec = Record {
            id,
            sandbox: sandbox.clone(),
            task: owner.task.map(str::to_string),
            project: owner.project.map(str::to_string),
            kind,
            detail: i.detail.chars().take(256).collect(),
            count: i.count,
            first_ms: i.first_ms,
            last_ms: i.last_ms,
            pid: i.pid,
            comm: i.comm.as_ref().map(|c| c.chars().take(64).collect()),
            net: None,
        };
        self.lock().save(rec);
    }

    /// Events matching `f`, oldest first.
    pub fn list(&self, node: &NodeId, f: &EventFilter) -> Vec<Event> {
        let g = self.lock();
        g.order
            .keys()
            .filter_map(|(_, id)| g.by_id.get(id))
            .filter(|r| f.sandbox.as_ref().is_none_or(|s| *s == r.sandbox))
            .filter(|r| f.task.as_ref().is_none_or(|t| r.task.as_ref() == Some(t)))
            .filter(|r| f.kind.is_none_or(|k| k == r.kind))
            .filter(|r| f.since_ms.is_none_or(|s| r.last_ms >= s))
            .filter(|r| {
                f.scope.as_deref().is_none_or(|scope| {
                    let project = r.project.as_deref().unwrap_or(warren_types::project::ROOT);
                    warren_types::project::in_scope_list(scope, project)
                })
            })
            .map(|r| Event {
                id: r.id.clone(),
                node: node.clone(),
                sandbox: r.sandbox.clone(),
                task: r.task.clone(),
                project: r.project.clone(),
                kind: r.kind,
                detail: r.detail.clone(),
                count: r.count,
                first_at: state::rfc3339(r.first_ms),
                last_at: state::rfc3339(r.last_ms),
                pid: r.pid,
                comm: r.comm.clone(),
                network: r.net.as_ref().map(NetRecord::view),
            })
            .collect()
    }
}

impl Inner {
    /// Puts a record in memory (replacing one with its id), dropping the oldest past the
    /// bound.
    fn put(&mut self, r: Record) {
        if let Some(old) = self.by_id.remove(&r.id) {
            self.order.remove(&(old.first_ms, old.id));
        } else {
            *self.per_sandbox.entry(r.sandbox.clone()).or_default() += 1;
        }
        self.order.insert((r.first_ms, r.id.clone()), ());
        self.by_id.insert(r.id.clone(), r);
        while self.by_id.len() > MAX_EVENTS {
            let Some(((_, id), ())) = self.order.pop_first() else {
                break;
            };
            if let Some(r) = self.by_id.remove(&id) {
                if let Some(n) = self.per_sandbox.get_mut(&r.sandbox) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_sandbox.remove(&r.sandbox);
                    }
                }
                self.open.remove(&(r.sandbox, r.kind, r.detail));
            }
        }
    }

    /// Puts a record and appends it to the log.
    fn save(&mut self, r: Record) {
        let mut line = serde_json::to_vec(&r).unwrap_or_default();
        line.push(b'\n');
        self.put(r);
        if self.file.is_none() {
            self.file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .ok();
        }
        if let Some(f) = &mut self.file
            && f.write_all(&line).is_ok()
        {
            self.written += line.len() as u64;
        }
        if self.written > COMPACT_AFTER {
            self.compact();
        }
    }

    /// Rewrites the log with what is kept (one line per event).
    fn compact(&mut self) {
        let tmp = self.path.with_extension("jsonl.tmp");
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            for (_, id) in self.order.keys() {
                if let Some(r) = self.by_id.get(id) {
                    serde_json::to_writer(&mut f, r)?;
                    f.write_all(b"\n")?;
                }
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        match write() {
            Ok(()) => {
                self.file = None;
                self.written = 0;
            }
            Err(e) => tracing::warn!("rewriting {}: {e}", self.path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_OWNER: Owner<'static> = Owner {
        task: None,
        project: Some("root"),
    };

    #[test]
    fn occurrences_add_up_and_survive_a_reopen() {
        let d = tempfile::tempdir().unwrap();
        let node = NodeId::from_random(rand::random());
        let id = SandboxId::new(&node, rand::random());
        let sid = || id.clone();
        let s = EventStore::open(d.path());
        for _ in 0..1000 {
            s.occur(
                &sid(),
                Owner {
                    task: Some("t"),
                    project: Some("root/a"),
                },
                EventKind::OutputTruncated,
                "stdout".into(),
                1,
            );
        }
        let i = Incident {
            id: 3,
            kind: "seccomp".into(),
            detail: "mount".into(),
            count: 5,
            first_ms: 1,
            last_ms: 2,
            pid: Some(9),
            comm: Some("x".into()),
        };
        s.from_guest(&sid(), ROOT_OWNER, &i);
        s.from_guest(&sid(), ROOT_OWNER, &Incident { count: 9, ..i });
        let all = s.list(&node, &EventFilter::default());
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].kind, EventKind::Seccomp, "oldest first");
        assert_eq!(all[0].count, 9, "a later report replaces the record");
        assert_eq!(all[1].count, 1000);
        drop(s);
        let s = EventStore::open(d.path());
        let again = s.list(&node, &EventFilter::default());
        assert_eq!(again, all);
        let f = EventFilter {
            kind: Some(EventKind::Seccomp),
            ..EventFilter::default()
        };
        assert_eq!(s.list(&node, &f).len(), 1);
        let f = EventFilter {
            task: Some("t".into()),
            ..EventFilter::default()
        };
        assert_eq!(s.list(&node, &f).len(), 1);
        // A scoped reader sees the events of its projects' sandboxes, kept with them.
        let scoped = |scope: &str| {
            s.list(
                &node,
                &EventFilter {
                    scope: Some(scope.into()),
                    ..EventFilter::default()
                },
            )
        };
        assert_eq!(scoped("root/a").len(), 1);
        assert_eq!(
            scoped("root/a").first().unwrap().project.as_deref(),
            Some("root/a")
        );
        assert_eq!(scoped("root/b,root/a").len(), 1);
        assert_eq!(scoped("root/ab").len(), 0, "a sibling with a common prefix");
        assert_eq!(
            scoped("root/a/x").len(),
            0,
            "a child does not see its parent's"
        );
        assert_eq!(scoped("").len(), 0);
        assert_eq!(scoped("root").len(), 2);
    }

    #[test]
    fn records_from_before_projects_are_the_roots() {
        let d = tempfile::tempdir().unwrap();
        let node = NodeId::from_random(rand::random());
        let id = SandboxId::new(&node, rand::random());
        let old = format!(
            r#"{{"id":"{id}-n1","sandbox":"{id}","kind":"pids_limit","detail":"x","count":1,"first_ms":1,"last_ms":1}}"#
        );
        std::fs::write(d.path().join("events.jsonl"), old + "\n").unwrap();
        let s = EventStore::open(d.path());
        let f = |scope: &str| EventFilter {
            scope: Some(scope.into()),
            ..EventFilter::default()
        };
        assert_eq!(s.list(&node, &f("root/a")).len(), 0);
        assert_eq!(s.list(&node, &f("root")).len(), 1);
    }

    #[test]
    fn a_port_scan_is_one_event_with_its_ports() {
        let d = tempfile::tempdir().unwrap();
        let node = NodeId::from_random(rand::random());
        let id = SandboxId::new(&node, rand::random());
        let s = EventStore::open(d.path());
        let hit = |ports: Vec<u16>| NetOccurrence {
            protocol: "tcp".into(),
            destination: "10.200.0.1".into(),
            ports,
            domain: None,
        };
        for chunk in (1..=1024u16).collect::<Vec<_>>().chunks(100) {
            s.occur_network(&id, ROOT_OWNER, hit(chunk.to_vec()), chunk.len() as u64);
        }
        s.occur_network(&id, ROOT_OWNER, hit(vec![8080, 3000, 22]), 3);
        let all = s.list(&node, &EventFilter::default());
        assert_eq!(all.len(), 1, "{all:?}");
        let e = &all[0];
        assert_eq!(e.count, 1027);
        let n = e.network.as_ref().unwrap();
        assert_eq!(n.ports, "1-1024,3000,8080");
        assert_eq!(n.port_count, 1026);
        // Ports far apart: the list is bounded, the count goes on.
        for p in (2000..60000u16).step_by(100) {
            s.occur_network(&id, ROOT_OWNER, hit(vec![p]), 1);
        }
        let n = s.list(&node, &EventFilter::default())[0]
            .network
            .clone()
            .unwrap();
        assert!(n.ports.ends_with('…'), "{}", n.ports);
        assert_eq!(n.ports.split(',').count(), MAX_PORT_RANGES + 1);
        assert_eq!(n.port_count, 1026 + 580 - 1);
    }

    #[test]
    fn a_sandbox_past_its_cap_adds_to_one_overflow_event_and_others_keep_theirs() {
        let d = tempfile::tempdir().unwrap();
        let node = NodeId::from_random(rand::random());
        let noisy = SandboxId::new(&node, rand::random());
        let quiet = SandboxId::new(&node, rand::random());
        let s = EventStore::open(d.path());
        let to = |i: usize| NetOccurrence {
            protocol: "tcp".into(),
            destination: format!("198.51.{}.{}", i / 256, i % 256),
            ports: vec![80],
            domain: None,
        };
        s.occur_network(&quiet, ROOT_OWNER, to(0), 1);
        for i in 0..MAX_EVENTS_PER_SANDBOX + 500 {
            s.occur_network(&noisy, ROOT_OWNER, to(i), 1);
        }
        let f = |sb: &SandboxId| EventFilter {
            sandbox: Some(sb.clone()),
            ..EventFilter::default()
        };
        let mine = s.list(&node, &f(&noisy));
        assert_eq!(mine.len(), MAX_EVENTS_PER_SANDBOX + 1);
        let over = mine.last().unwrap();
        assert!(over.detail.contains("counted here"), "{over:?}");
        assert_eq!(over.count, 500);
        assert_eq!(s.list(&node, &f(&quiet)).len(), 1);
        // The guest's records too: past the cap, one overflow event of their kind.
        for id in 0..50 {
            let i = Incident {
                id,
                kind: "seccomp".into(),
                detail: format!("prlimit64 of pid {id}"),
                count: 1,
                first_ms: 1,
                last_ms: 2,
                pid: None,
                comm: None,
            };
            s.from_guest(&noisy, ROOT_OWNER, &i);
        }
        let mine = s.list(&node, &f(&noisy));
        assert_eq!(mine.len(), MAX_EVENTS_PER_SANDBOX + 2);
        let g = mine.iter().find(|e| e.kind == EventKind::Seccomp).unwrap();
        assert_eq!(g.count, 50, "{g:?}");
    }
}

//! The node's firewall: one nftables table, `inet warren`, whose rules never grow with the
//! number of sandboxes. Everything per sandbox is an element of a set or map: its own (its
//! addresses, generation, exposed ports, resolved addresses) keyed by the name of its
//! interface's node end (`wv<index>`); its rules' elements keyed by a **policy id**, shared by
//! every sandbox whose policy expands to the same elements — a task of thousands of sandboxes
//! holds its rules once, and `pol` maps each interface to the id. The rule lookups set the
//! connection's mark to the id (`ct mark set iifname map @pol`) and match `ct mark . address`;
//! policy ids have the high bit set, generations never do, so the one cannot pass for the
//! other. A create, a policy change or a kill is one atomic nf_tables transaction of element
//! changes, written from here as a netlink batch (`batch.rs`): a task's change writes the new
//! rules once and moves each sandbox's `pol`, `gen` and `live` entries (hash sets, cheap),
//! where per-sandbox rules would churn the interval sets, whose changes cost time per element
//! they hold. Only the table itself (at node start and stop) is written by `nft -f -`.
//!
//! The rules match only Warren's interfaces (`iifname`/`oifname "wv*"`) and, for the NAT,
//! only the pools' source addresses: the host's own traffic never meets them.
//!
//! Outbound, a new connection from a sandbox is checked in this order:
//! 1. its source address must be its own (`src4`/`src6`), else it is dropped;
//! 2. the always-denied ranges: the node's own addresses, the control plane it joined, the
//!    cluster's addresses, the pools and `internal` (`pinned4`/`pinned6`: no exemption opens
//!    them), and the reviewed list of `warren_types::denied` — private, shared and
//!    benchmarking space, loopback, link-local, metadata, multicast, the IPv6 prefixes that
//!    carry IPv4 addresses — less the administrator's exemptions (`internal4`/`internal6`,
//!    `exempt4`/`exempt6`);
//! 3. the sandbox's deny rules (`denyany*` for whole CIDRs, `deny*` by protocol and port);
//! 4. its allow rules: whole CIDRs (`any*`, which lets ICMP through too), by protocol and port
//!    (`allow*`), and the addresses its allowed domains resolved to, for their TTL (`dyn*`,
//!    TCP only);
//! 5. anything else is refused: logged to an NFLOG group (bounded rate per sandbox and per
//!    node) and answered with a
//!    TCP reset or an ICMP "administratively prohibited" — never silently dropped, so a client
//!    fails at once instead of hanging.
//!
//! An allowed connection's conntrack entry is marked with the sandbox's policy generation
//! (`gen`); later packets of it pass only while the generation is current (`live`). A policy
//! change bumps the generation, so every open connection is judged again by the new policy at
//! its next packet: still allowed, it is marked anew; no longer allowed, it is reset.
//!
//! With a proxy port ([`FirewallConfig::proxy_port`]), a new TCP connection to port 80 or 443
//! that only a domain's resolved address (`dyn*`) would allow is redirected to the node's
//! transparent proxy instead (a NAT prerouting chain, `sni`), which judges it by the name it
//! asks for ([`crate::proxy`]); the proxy's port takes nothing that was not redirected.
//!
//! Inbound, nothing reaches a sandbox but replies to its own connections (and neighbour
//! discovery) and the node's connections to the ports it exposes (`expose`: the node's
//! forwarders, see [`crate::expose`]); to the node itself it may reach only the DNS proxy on
//! the gateway address.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::process::{Command, Stdio};

use warren_types::net::{Cidr, PortRange};

use crate::link::{Addressing, HOST_PREFIX, Lease};

mod batch;
mod element;
mod expand;
pub mod measure;

use batch::{Batch, Netlink};
use element::{Element, Field, IfName, Set};
use expand::outermost;
pub use expand::{Elements, expand};

/// The table's name (family `inet`).
pub const TABLE: &str = "warren";

/// Most firewall elements one sandbox's policy may expand to.
pub const MAX_ELEMENTS: usize = 65_536;

/// Refused packets logged per second, node-wide (the rest are refused unlogged).
pub const LOG_RATE: u32 = 2000;

/// Refused packets logged per second for one sandbox, after a burst of
/// [`LOG_BURST_SANDBOX`]: one flooding sandbox cannot use up the node's log rate (a port scan
/// of a few hundred ports is still logged whole).
pub const LOG_RATE_SANDBOX: u32 = 200;

/// See [`LOG_RATE_SANDBOX`].
pub const LOG_BURST_SANDBOX: u32 = 1000;

/// The packet mark of the transparent proxy's own connections (`SO_MARK`): the table refuses
/// those to the node itself and to the always-denied ranges (see [`crate::proxy::Config::mark`]).
/// Chosen not to collide with the marks others are known to use (Kubernetes' 0x4000/0x8000,
/// Docker's, Calico's low bits).
pub const PROXY_MARK: u32 = 0x5752_0000;

/// Most addresses × port ranges one sandbox's domains may have open at once.
pub const MAX_RESOLVED: usize = 1024;

/// How the table is set up.
#[derive(Debug, Clone)]
pub struct FirewallConfig {
    /// The sandbox pools (and the gateway).
    pub addressing: Addressing,
    /// Always denied, whatever an exemption says: the node's own addresses, the control plane,
    /// the cluster's addresses, and whatever the administrator adds (the reviewed list of
    /// `warren_types::denied` and the pools are added to these by the table).
    pub internal: Vec<Cidr>,
    /// Cut out of the reviewed list (still needing an allow rule); never out of `internal` or
    /// the pools: an exemption for a mirror on `10.0.0.0/8` must not reopen the node, the
    /// control plane or other sandboxes.
    pub exempt: Vec<Cidr>,
    /// NFLOG group of refused packets.
    pub log_group: u16,
    /// Masquerade allowed traffic leaving through other interfaces.
    pub masquerade: bool,
    /// The transparent proxy's port: new TCP connections to ports 80 and 443 that only an
    /// address resolved for a domain allows are redirected there (see [`crate::proxy`]).
    pub proxy_port: Option<u16>,
}

impl FirewallConfig {
    /// What no exemption opens: the pools (other sandboxes, the gateway) and `internal` (the
    /// node's own addresses, the cluster's, the administrator's).
    pub fn pinned(&self) -> Vec<Cidr> {
        let mut v = vec![self.addressing.v4, self.addressing.v6];
        v.extend(self.internal.iter().copied());
        v
    }

    /// Every destination no sandbox reaches here, as plain ranges: [`FirewallConfig::pinned`]
    /// and the reviewed list less the exemptions (for the DNS and transparent proxies).
    pub fn never(&self) -> Vec<Cidr> {
        let mut v = warren_types::denied::subtract(&warren_types::denied::cidrs(), &self.exempt);
        v.extend(self.pinned());
        v
    }
}

/// One sandbox's firewall state.
#[derive(Debug, Clone)]
struct Entry {
    lease: Lease,
    generation: u32,
    static_elements: Elements,
    /// Its rules' canonical text: the key of the shared policy it uses.
    policy: String,
}

/// One policy's rules, written once and shared by every sandbox whose policy expands to the
/// same elements (a task's thousands of sandboxes, the deny-everything of warm inits): its
/// elements are keyed by the policy's id, and each sandbox's interface maps to it (`pol`).
#[derive(Debug, Clone)]
struct Shared {
    id: u32,
    users: usize,
    rules: Elements,
}

/// An address a sandbox's allowed domain resolved to, open on some ports for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Resolved {
    index: u32,
    addr: IpAddr,
    ports: PortRange,
}

/// Policy ids have the high bit set; generations never do, so a connection's mark holding a
/// policy id (the firewall looks rules up by it) is never taken for a live generation.
pub const POLICY_ID_BASE: u32 = 0x8000_0000;

/// The table and what each sandbox holds in it.
pub struct Firewall {
    cfg: FirewallConfig,
    entries: HashMap<u32, Entry>,
    /// The policies in use, by their rules' canonical text.
    policies: HashMap<String, Shared>,
    /// The next policy id to try.
    next_policy: u32,
    /// Dynamic (domain) elements believed present → their expiry (ms, monotonic) and the
    /// domain that resolved to them.
    dynamic: HashMap<Resolved, (u64, String)>,
    /// The nf_tables socket, opened by the first change after [`Firewall::install`]: it acts
    /// on the network namespace of the thread that opened it.
    netlink: Option<Netlink>,
    /// Write changes by `nft -f -` instead (the old way, kept to measure against).
    exec: bool,
}

fn iface(lease: &Lease) -> IfName {
    IfName::new(&lease.host_if())
}

/// One sandbox's change: its new state, or none (it goes).
struct Change {
    lease: Lease,
    new: Option<(u32, Elements)>,
}

impl Firewall {
    /// The table as it should be with no sandbox in it.
    pub fn new(cfg: FirewallConfig) -> Firewall {
        Firewall {
            cfg,
            entries: HashMap::new(),
            policies: HashMap::new(),
            next_policy: POLICY_ID_BASE + 1,
            dynamic: HashMap::new(),
            netlink: None,
            exec: false,
        }
    }

    /// Writes every change by `nft -f -` (to measure netlink against).
    pub(crate) fn with_exec(cfg: FirewallConfig) -> Firewall {
        Firewall {
            exec: true,
            ..Firewall::new(cfg)
        }
    }

    /// Most always-denied ranges added after start.
    pub const MAX_ADDED_INTERNAL: usize = 4096;

    /// Adds always-denied ranges after start (the cluster's members and database, which the
    /// control plane names when the node joins); whether any is new. The caller installs the
    /// table again ([`Firewall::install`]) for them to take effect. Never removes one; at most
    /// [`Firewall::MAX_ADDED_INTERNAL`] are added.
    pub fn deny_also(&mut self, more: &[Cidr]) -> bool {
        let mut changed = false;
        for c in more {
            if self.cfg.internal.len() >= Self::MAX_ADDED_INTERNAL {
                break;
            }
            if !self.cfg.internal.contains(c) {
                self.cfg.internal.push(*c);
                changed = true;
            }
        }
        changed
    }

    /// Why no rule can allow `c` here, if none can: it lies inside an always-denied range
    /// (and no exemption covers it).
    pub fn never_allowed(&self, c: &Cidr) -> Option<Cidr> {
        if let Some(p) = self.cfg.pinned().into_iter().find(|i| i.covers(c)) {
            return Some(p);
        }
        if self.cfg.exempt.iter().any(|e| e.covers(c)) {
            return None;
        }
        warren_types::denied::cidrs()
            .into_iter()
            .find(|i| i.covers(c))
    }

    /// Replaces the whole table (an earlier daemon's included) in one transaction, with every
    /// sandbox this firewall knows and the resolved addresses it still holds open (with what
    /// is left of their time). Used at start, after re-adopting sandboxes, and to rebuild the
    /// table after a failure.
    pub fn install(&mut self) -> io::Result<()> {
        // The next change opens a socket in the caller's namespace.
        self.netlink = None;
        let now = mono_ms();
        let entries = &self.entries;
        self.dynamic
            .retain(|k, (exp, _)| *exp > now + 1000 && entries.contains_key(&k.index));
        let mut b = Batch::default();
        for sh in self.policies.values() {
            for (set, el) in shared_elements(sh) {
                b.add(set, el);
            }
        }
        for e in self.entries.values() {
            let id = self.policies.get(&e.policy).map_or(0, |s| s.id);
            for (set, el) in own(e, id) {
                b.add(set, el);
            }
        }
        for (r, (exp, _)) in &self.dynamic {
            let k = iface(&self.entries[&r.index].lease);
            let (set, e) = resolved(k, r, Some(exp - now));
            b.add(set, e);
        }
        let mut s = String::new();
        // `add` then `delete` so that the delete never fails on a missing table.
        let _ = writeln!(s, "add table inet {TABLE}");
        let _ = writeln!(s, "delete table inet {TABLE}");
        s.push_str(&self.skeleton());
        s.push_str(&b.script());
        run(&s)
    }

    /// Removes the table (the node stops for good, or a test ends).
    pub fn remove(&mut self) -> io::Result<()> {
        self.entries.clear();
        self.policies.clear();
        self.dynamic.clear();
        self.netlink = None;
        run(&format!(
            "add table inet {TABLE}\ndelete table inet {TABLE}\n"
        ))
    }

    /// Records `lease` (a sandbox's interface) with `policy`'s elements at generation `gen`,
    /// in memory only (for [`Firewall::install`] after a restart).
    pub fn adopt(&mut self, lease: Lease, generation: u32, elements: Elements) {
        let key = elements.canonical();
        if let Some(old) = self.entries.remove(&lease.index) {
            self.unuse(&old.policy);
        }
        if let Some(sh) = self.policies.get_mut(&key) {
            sh.users += 1;
        } else {
            let id = self.free_policy_id(&HashSet::new());
            self.next_policy = id.wrapping_add(1).max(POLICY_ID_BASE + 1);
            let (rules, _) = elements.split();
            self.policies.insert(
                key.clone(),
                Shared {
                    id,
                    users: 1,
                    rules,
                },
            );
        }
        self.entries.insert(
            lease.index,
            Entry {
                lease,
                generation,
                static_elements: elements,
                policy: key,
            },
        );
    }

    /// Adds a sandbox's interface with the elements of its policy (one transaction, which
    /// also takes out whatever an earlier holder of the interface left).
    pub fn add(&mut self, lease: Lease, generation: u32, elements: Elements) -> io::Result<()> {
        self.change(
            vec![Change {
                lease,
                new: Some((generation, elements)),
            }],
            &|_, _, _| false,
        )
    }

    /// Replaces a sandbox's policy and bumps its generation, in one transaction: its open
    /// connections are judged again by the new policy at their next packet.
    pub fn update(&mut self, index: u32, generation: u32, elements: Elements) -> io::Result<()> {
        self.update_many(vec![(index, generation, elements)])
    }

    /// [`Firewall::update`] for many sandboxes in one transaction (a task's change): all or
    /// none. Addresses resolved for a domain are kept where `keep` says the new policy still
    /// allows that domain on those ports; the rest go with the old policy.
    pub fn update_many(&mut self, updates: Vec<(u32, u32, Elements)>) -> io::Result<()> {
        self.update_keeping(updates, |_, _, _| false)
    }

    /// [`Firewall::update_many`], keeping the resolved addresses for which
    /// `keep(index, domain, ports)` holds. Sandboxes that take the same rules share them: a
    /// task's change writes the new rules once and moves each sandbox's `pol` entry, whatever
    /// the number of sandboxes; an element already gone from the kernel (one that timed out)
    /// fails nothing.
    pub fn update_keeping(
        &mut self,
        updates: Vec<(u32, u32, Elements)>,
        keep: impl Fn(u32, &str, PortRange) -> bool,
    ) -> io::Result<()> {
        let mut changes = Vec::with_capacity(updates.len());
        for (index, generation, elements) in updates {
            let Some(old) = self.entries.get(&index) else {
                return Err(io::Error::other("the sandbox has no interface"));
            };
            changes.push(Change {
                lease: old.lease,
                new: Some((generation, elements)),
            });
        }
        self.change(changes, &keep)
    }

    /// A sandbox's current policy generation.
    pub fn generation(&self, index: u32) -> Option<u32> {
        self.entries.get(&index).map(|e| e.generation)
    }

    /// Removes everything of a sandbox's (one transaction); unknown is no error, and neither
    /// is an element already gone from the kernel. Forgotten even if the transaction fails.
    pub fn remove_entry(&mut self, index: u32) -> io::Result<()> {
        let Some(e) = self.entries.get(&index) else {
            return Ok(());
        };
        let lease = e.lease;
        let r = self.change(vec![Change { lease, new: None }], &|_, _, _| false);
        if r.is_err() {
            // Forgotten all the same; a later install writes the table as this says.
            if let Some(old) = self.entries.remove(&index) {
                self.unuse(&old.policy);
            }
            self.dynamic.retain(|k, _| k.index != index);
        }
        r
    }

    /// One transaction of sandboxes' changes: each one's own elements (its sources,
    /// generation, policy id and exposed ports) replaced by what changed, the shared rules of
    /// policies that gain their first user written, those of policies that lose their last
    /// one deleted. The bookkeeping changes only once the kernel took it all.
    fn change(
        &mut self,
        changes: Vec<Change>,
        keep: &dyn Fn(u32, &str, PortRange) -> bool,
    ) -> io::Result<()> {
        let mut b = Batch::default();
        // Users each policy gains (or loses), and the rules of those new to the table.
        let mut delta: HashMap<String, isize> = HashMap::new();
        let mut fresh: HashMap<String, Elements> = HashMap::new();
        let mut planned: Vec<(u32, Option<Entry>)> = Vec::with_capacity(changes.len());
        // A task's sandboxes take one policy: its canonical text made once.
        let mut last: Option<(Elements, String)> = None;
        for c in changes {
            let old = self.entries.get(&c.lease.index);
            if let Some(o) = old {
                *delta.entry(o.policy.clone()).or_default() -= 1;
            }
            let new = c.new.map(|(generation, elements)| {
                let key = match &last {
                    Some((e, k)) if *e == elements => k.clone(),
                    _ => {
                        let k = elements.canonical();
                        last = Some((elements.clone(), k.clone()));
                        k
                    }
                };
                if !self.policies.contains_key(&key) && !fresh.contains_key(&key) {
                    fresh.insert(key.clone(), elements.split().0);
                }
                *delta.entry(key.clone()).or_default() += 1;
                Entry {
                    lease: c.lease,
                    generation,
                    static_elements: elements,
                    policy: key,
                }
            });
            planned.push((c.lease.index, new));
        }
        // Ids for the new policies: one that loses its last user in this very transaction
        // passes its id on (so only the elements that differ are written: a sandbox whose
        // large policy changes a little costs what the change costs), else a free one.
        let mut dying: Vec<(String, u32)> = delta
            .iter()
            .filter_map(|(key, d)| {
                let sh = self.policies.get(key)?;
                (sh.users as isize + d <= 0).then(|| (key.clone(), sh.id))
            })
            .collect();
        dying.sort();
        let mut fresh_keys: Vec<&String> = fresh.keys().collect();
        fresh_keys.sort();
        let mut taken: HashSet<u32> = HashSet::new();
        let mut new_ids: HashMap<String, u32> = HashMap::new();
        // Dying policy → the fresh one that takes its id.
        let mut heir: HashMap<String, String> = HashMap::new();
        for key in fresh_keys {
            let id = match dying.pop() {
                Some((old, id)) => {
                    heir.insert(old, key.clone());
                    id
                }
                None => {
                    let id = self.free_policy_id(&taken);
                    taken.insert(id);
                    id
                }
            };
            new_ids.insert(key.clone(), id);
        }
        let id_of = |key: &str| -> u32 {
            self.policies
                .get(key)
                .map(|s| s.id)
                .or_else(|| new_ids.get(key).copied())
                .unwrap_or(0)
        };
        let mut dynamic_gone = Vec::new();
        for (index, new) in &planned {
            let old = self.entries.get(index);
            let before: HashSet<(Set, Element)> = old
                .map(|o| own(o, id_of(&o.policy)).into_iter().collect())
                .unwrap_or_default();
            let after: HashSet<(Set, Element)> = new
                .as_ref()
                .map(|n| own(n, id_of(&n.policy)).into_iter().collect())
                .unwrap_or_default();
            for (set, el) in before.difference(&after) {
                b.destroy(*set, el.clone());
            }
            for (set, el) in after.difference(&before) {
                b.add(*set, el.clone());
            }
            if let Some(o) = old {
                let k = iface(&o.lease);
                if new.is_none() {
                    // The kernel's log meter of the interface: its rate is not the next
                    // holder's.
                    b.destroy(Set::LogRate, Element::new(vec![Field::Iface(k)]));
                    dynamic_gone.extend(self.dynamic_of(&mut b, *index, k, &|_, _, _| false));
                } else {
                    dynamic_gone.extend(self.dynamic_of(&mut b, *index, k, keep));
                }
            }
        }
        // Shared rules: written for policies new to the table, deleted for those no sandbox
        // uses any more; a new policy that takes a dying one's id gets only the difference.
        let heirs: HashSet<&String> = heir.values().collect();
        for (key, d) in &delta {
            let users = self.policies.get(key).map_or(0, |s| s.users) as isize + d;
            match (self.policies.get(key), fresh.get(key)) {
                (Some(sh), _) if users <= 0 => {
                    let before: HashSet<(Set, Element)> = shared_elements(sh).into_iter().collect();
                    let after: HashSet<(Set, Element)> = match heir.get(key) {
                        Some(h) => shared_elements(&Shared {
                            id: sh.id,
                            users: 0,
                            rules: fresh[h].clone(),
                        })
                        .into_iter()
                        .collect(),
                        None => HashSet::new(),
                    };
                    for (set, el) in before.difference(&after) {
                        b.destroy(*set, el.clone());
                    }
                    for (set, el) in after.difference(&before) {
                        b.add(*set, el.clone());
                    }
                }
                (None, Some(rules)) if users > 0 && !heirs.contains(key) => {
                    let sh = Shared {
                        id: new_ids[key],
                        users: 0,
                        rules: rules.clone(),
                    };
                    for (set, el) in shared_elements(&sh) {
                        b.add(set, el);
                    }
                }
                _ => {}
            }
        }
        self.commit(&b)?;
        for key in dynamic_gone {
            self.dynamic.remove(&key);
        }
        // Dying policies go first: their ids may live on in their heirs.
        for (key, d) in &delta {
            if let Some(sh) = self.policies.get(key)
                && sh.users as isize + d <= 0
            {
                self.policies.remove(key);
            }
        }
        for (key, rules) in fresh {
            let id = new_ids[&key];
            self.policies.insert(
                key,
                Shared {
                    id,
                    users: 0,
                    rules,
                },
            );
        }
        for (key, d) in delta {
            if let Some(sh) = self.policies.get_mut(&key) {
                sh.users = (sh.users as isize + d).max(0) as usize;
                if sh.users == 0 {
                    self.policies.remove(&key);
                }
            }
        }
        if let Some(&top) = taken.iter().max() {
            self.next_policy = top.wrapping_add(1).max(POLICY_ID_BASE + 1);
        }
        for (index, new) in planned {
            match new {
                Some(e) => {
                    self.entries.insert(index, e);
                }
                None => {
                    self.entries.remove(&index);
                }
            }
        }
        Ok(())
    }

    /// A policy id no policy holds and not in `taken`.
    fn free_policy_id(&self, taken: &HashSet<u32>) -> u32 {
        let used: HashSet<u32> = self.policies.values().map(|s| s.id).collect();
        let mut id = self.next_policy.max(POLICY_ID_BASE + 1);
        while used.contains(&id) || taken.contains(&id) {
            id = id.wrapping_add(1).max(POLICY_ID_BASE + 1);
        }
        id
    }

    /// One user fewer for the policy `key` (in memory only).
    fn unuse(&mut self, key: &str) {
        if let Some(sh) = self.policies.get_mut(key) {
            sh.users = sh.users.saturating_sub(1);
            if sh.users == 0 {
                self.policies.remove(key);
            }
        }
    }

    /// Policies in use now (how many distinct rule sets the table holds).
    pub fn policies(&self) -> usize {
        self.policies.len()
    }

    /// The id of sandbox `index`'s policy (the key of its rules' elements).
    pub fn policy_id(&self, index: u32) -> Option<u32> {
        let e = self.entries.get(&index)?;
        self.policies.get(&e.policy).map(|s| s.id)
    }

    /// The id a policy new to the table gets next (when no policy gives its id up in the same
    /// transaction).
    pub fn next_policy_id(&self) -> u32 {
        self.free_policy_id(&HashSet::new())
    }

    /// Deletes the kernel's refused-packet log meters of sandboxes `indexes` (one transaction):
    /// a sandbox's rate is not the next holder's of its interface.
    pub fn reset_meters(&mut self, indexes: &[u32]) -> io::Result<()> {
        let mut b = Batch::default();
        for i in indexes {
            if let Some(e) = self.entries.get(i) {
                b.destroy(
                    Set::LogRate,
                    Element::new(vec![Field::Iface(iface(&e.lease))]),
                );
            }
        }
        self.commit(&b)
    }

    /// Lets sandbox `index` reach `addrs` on `ports` over TCP for `ttl_s` seconds (what its
    /// allowed domain resolved to). An address allowed already keeps its element while more
    /// than half its time is left (no transaction at all); otherwise it gets the new expiry.
    /// At most [`MAX_RESOLVED`] such elements per sandbox; the rest are not opened.
    pub fn allow_resolved(
        &mut self,
        index: u32,
        domain: &str,
        addrs: &[IpAddr],
        ports: &[PortRange],
        ttl_s: u32,
    ) -> io::Result<()> {
        let Some(e) = self.entries.get(&index) else {
            return Ok(());
        };
        let k = iface(&e.lease);
        let now = mono_ms();
        self.dynamic.retain(|_, (exp, _)| *exp > now);
        let mut held = self.dynamic.keys().filter(|r| r.index == index).count();
        let ttl_ms = u64::from(ttl_s) * 1000;
        // Computed before the transaction: the kernel's timer starts later, so it never
        // expires before this does.
        let expiry = now + ttl_ms;
        let mut b = Batch::default();
        let mut added = HashSet::new();
        for &addr in addrs {
            for &ports in ports {
                let r = Resolved { index, addr, ports };
                if added.contains(&r) {
                    continue;
                }
                match self.dynamic.get(&r) {
                    Some((exp, _)) if exp.saturating_sub(now) > ttl_ms / 2 => continue,
                    Some(_) => {}
                    None => {
                        if held >= MAX_RESOLVED {
                            continue;
                        }
                        held += 1;
                    }
                }
                // Deleted first: adding an element still in the kernel (about to time out,
                // or outliving this bookkeeping by the transaction's latency) would keep its
                // old expiry.
                let (set, old) = resolved(k, &r, None);
                b.destroy(set, old);
                let (set, new) = resolved(k, &r, Some(ttl_ms));
                b.add(set, new);
                added.insert(r);
            }
        }
        self.commit(&b)?;
        // Only what the kernel took is recorded.
        for r in added {
            self.dynamic.insert(r, (expiry, domain.to_string()));
        }
        Ok(())
    }

    /// Whether element deletions use `NFT_MSG_DESTROYSETELEM` (Linux 6.3 and later) rather
    /// than an addition and a deletion; `None` before the first change opened the socket.
    pub fn destroys_elements(&self) -> Option<bool> {
        self.netlink.as_ref().map(Netlink::destroys)
    }

    /// Applies one transaction.
    fn commit(&mut self, b: &Batch) -> io::Result<()> {
        if b.is_empty() {
            return Ok(());
        }
        if self.exec {
            return run(&b.script());
        }
        let nl = match &mut self.netlink {
            Some(nl) => nl,
            None => self.netlink.insert(Netlink::open()?),
        };
        let r = nl.commit(b);
        if r.is_err() {
            // A fresh socket for the next one: nothing of this one is left to read.
            self.netlink = None;
        }
        r
    }

    /// Writes the deletion of sandbox `index`'s dynamic elements that `keep` does not keep
    /// into `b`; returns them (to forget once the transaction succeeded).
    fn dynamic_of(
        &self,
        b: &mut Batch,
        index: u32,
        k: IfName,
        keep: &dyn Fn(u32, &str, PortRange) -> bool,
    ) -> Vec<Resolved> {
        let mut gone = Vec::new();
        for (r, (_, domain)) in &self.dynamic {
            if r.index != index || keep(index, domain, r.ports) {
                continue;
            }
            let (set, e) = resolved(k, r, None);
            b.destroy(set, e);
            gone.push(*r);
        }
        gone
    }

    /// The table without any sandbox.
    fn skeleton(&self) -> String {
        let c = &self.cfg;
        let list = |v6: bool, cidrs: &[Cidr]| -> String {
            let v: Vec<String> = outermost(
                &cidrs
                    .iter()
                    .filter(|x| x.addr.is_ipv6() == v6)
                    .copied()
                    .collect::<Vec<_>>(),
            )
            .iter()
            .map(|x| x.to_string())
            .collect();
            if v.is_empty() {
                String::new()
            } else {
                format!("elements = {{ {} }}", v.join(", "))
            }
        };
        let internal = warren_types::denied::cidrs();
        let pinned = c.pinned();
        let gw4 = c.addressing.gateway4();
        let p = HOST_PREFIX;
        let g = c.log_group;
        let mut nat = if c.masquerade {
            format!(
                "  chain nat {{\n    type nat hook postrouting priority srcnat; policy accept;\n    \
                 ip saddr {} oifname != \"{p}*\" masquerade\n    ip6 saddr {} oifname != \
                 \"{p}*\" masquerade\n  }}\n",
                c.addressing.v4, c.addressing.v6
            )
        } else {
            String::new()
        };
        // The transparent proxy: a new connection to port 80 or 443 that a domain's resolved
        // address would allow (and no CIDR rule does) goes to the proxy, which checks the name
        // it asks for; the firewall still refuses every other address at once. The proxy's
        // port takes only what was redirected; nothing else reaches it.
        let (proxy_in, proxy_guard, proxy_out) = match c.proxy_port {
            Some(port) => {
                nat.push_str(&format!(
                    r#"  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "{p}*" meta l4proto tcp th dport {{ 80, 443 }} jump sni
  }}
  chain sni {{
    ct mark set iifname map @pol
    ct mark . ip daddr @any4 return
    ct mark . ip6 daddr @any6 return
    ct mark . ip daddr . meta l4proto . th dport @allow4 return
    ct mark . ip6 daddr . meta l4proto . th dport @allow6 return
    iifname . ip daddr . tcp dport @dyn4 redirect to :{port}
    iifname . ip6 daddr . tcp dport @dyn6 redirect to :{port}
  }}
"#
                ));
                (
                    format!("    ct status dnat meta l4proto tcp th dport {port} accept\n"),
                    // Only what could reach the proxy's listeners from elsewhere: the gateway's
                    // IPv4 address, and IPv6 (its listener is on `[::]`).
                    format!(
                        "    iifname != \"{p}*\" iifname != \"lo\" ip daddr {gw4} tcp dport {port} drop\n    \
                         iifname != \"{p}*\" iifname != \"lo\" meta nfproto ipv6 tcp dport {port} drop\n"
                    ),
                    // The proxy's own connections (its mark) never reach the node itself or an
                    // always-denied range, whatever a name resolved to.
                    format!("    meta mark {PROXY_MARK:#x} jump proxy_out\n"),
                )
            }
            None => (String::new(), String::new(), String::new()),
        };
        format!(
            r#"table inet {TABLE} {{
  set src4 {{ type ifname . ipv4_addr; }}
  set src6 {{ type ifname . ipv6_addr; }}
  map gen {{ type ifname : mark; }}
  set live {{ type ifname . mark; }}
  map pol {{ type ifname : mark; }}
  set pinned4 {{ type ipv4_addr; flags interval; {p4} }}
  set pinned6 {{ type ipv6_addr; flags interval; {p6} }}
  set internal4 {{ type ipv4_addr; flags interval; {i4} }}
  set internal6 {{ type ipv6_addr; flags interval; {i6} }}
  set exempt4 {{ type ipv4_addr; flags interval; {e4} }}
  set exempt6 {{ type ipv6_addr; flags interval; {e6} }}
  set any4 {{ type mark . ipv4_addr; flags interval; }}
  set any6 {{ type mark . ipv6_addr; flags interval; }}
  set denyany4 {{ type mark . ipv4_addr; flags interval; }}
  set denyany6 {{ type mark . ipv6_addr; flags interval; }}
  set allow4 {{ type mark . ipv4_addr . inet_proto . inet_service; flags interval; }}
  set allow6 {{ type mark . ipv6_addr . inet_proto . inet_service; flags interval; }}
  set deny4 {{ type mark . ipv4_addr . inet_proto . inet_service; flags interval; }}
  set deny6 {{ type mark . ipv6_addr . inet_proto . inet_service; flags interval; }}
  set dyn4 {{ type ifname . ipv4_addr . inet_service; flags interval, timeout; }}
  set dyn6 {{ type ifname . ipv6_addr . inet_service; flags interval, timeout; }}
  set expose {{ type ifname . inet_service; }}
  set lograte {{ type ifname; flags dynamic, timeout; timeout 10s; size 65536; }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname "{p}*" jump egress
    oifname "{p}*" jump ingress
  }}
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    iifname "{p}*" jump to_node
    iifname != "{p}*" iifname != "lo" ip daddr {gw4} meta l4proto {{ tcp, udp }} th dport 53 drop
{proxy_guard}  }}
  chain output {{
    type filter hook output priority filter - 10; policy accept;
    oifname "{p}*" jump from_node
{proxy_out}  }}
  chain proxy_out {{
    meta l4proto tcp fib daddr type local reject with tcp reset
    meta l4proto tcp ip daddr @pinned4 reject with tcp reset
    meta l4proto tcp ip6 daddr @pinned6 reject with tcp reset
    meta l4proto tcp ip daddr @internal4 ip daddr != @exempt4 reject with tcp reset
    meta l4proto tcp ip6 daddr @internal6 ip6 daddr != @exempt6 reject with tcp reset
  }}
  chain spoof {{
    meta nfproto ipv4 iifname . ip saddr != @src4 drop
    meta nfproto ipv6 ip6 saddr != fe80::/10 iifname . ip6 saddr != @src6 drop
  }}
  chain egress {{
    jump spoof
    ct state established,related iifname . ct mark @live accept
    ip daddr @pinned4 goto refuse
    ip6 daddr @pinned6 goto refuse
    ct original ip daddr @pinned4 goto refuse
    ct original ip6 daddr @pinned6 goto refuse
    ip daddr @internal4 ip daddr != @exempt4 goto refuse
    ip6 daddr @internal6 ip6 daddr != @exempt6 goto refuse
    ct original ip daddr @internal4 ct original ip daddr != @exempt4 goto refuse
    ct original ip6 daddr @internal6 ct original ip6 daddr != @exempt6 goto refuse
    ct mark set iifname map @pol
    ct mark . ip daddr @denyany4 goto refuse
    ct mark . ip6 daddr @denyany6 goto refuse
    meta l4proto {{ tcp, udp }} ct mark . ip daddr . meta l4proto . th dport @deny4 goto refuse
    meta l4proto {{ tcp, udp }} ct mark . ip6 daddr . meta l4proto . th dport @deny6 goto refuse
    ct mark . ip daddr @any4 goto pass
    ct mark . ip6 daddr @any6 goto pass
    meta l4proto {{ tcp, udp }} ct mark . ip daddr . meta l4proto . th dport @allow4 goto pass
    meta l4proto {{ tcp, udp }} ct mark . ip6 daddr . meta l4proto . th dport @allow6 goto pass
    meta l4proto tcp iifname . ip daddr . tcp dport @dyn4 goto pass
    meta l4proto tcp iifname . ip6 daddr . tcp dport @dyn6 goto pass
    goto refuse
  }}
  chain pass {{
    ct mark set iifname map @gen
    accept
  }}
  chain refuse {{
    update @lograte {{ iifname limit rate {LOG_RATE_SANDBOX}/second burst {LOG_BURST_SANDBOX} packets }} limit rate {LOG_RATE}/second burst {LOG_RATE} packets log group {g}
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }}
  chain ingress {{
    ct state established,related oifname . ct mark @live accept
    ct state established,related jump reverse
    reject with icmpx admin-prohibited
  }}
  chain reverse {{
    ct mark set oifname map @pol
    ct mark . ip saddr @denyany4 drop
    ct mark . ip6 saddr @denyany6 drop
    meta l4proto {{ tcp, udp }} ct mark . ip saddr . meta l4proto . th sport @deny4 drop
    meta l4proto {{ tcp, udp }} ct mark . ip6 saddr . meta l4proto . th sport @deny6 drop
    ct mark . ip saddr @any4 goto pass_in
    ct mark . ip6 saddr @any6 goto pass_in
    meta l4proto {{ tcp, udp }} ct mark . ip saddr . meta l4proto . th sport @allow4 goto pass_in
    meta l4proto {{ tcp, udp }} ct mark . ip6 saddr . meta l4proto . th sport @allow6 goto pass_in
    meta l4proto tcp oifname . ip saddr . tcp sport @dyn4 goto pass_in
    meta l4proto tcp oifname . ip6 saddr . tcp sport @dyn6 goto pass_in
    drop
  }}
  chain pass_in {{
    ct mark set oifname map @gen
    accept
  }}
  chain to_node {{
    jump spoof
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit }} accept
    ct state established,related accept
    ip daddr {gw4} meta l4proto {{ tcp, udp }} th dport 53 accept
{proxy_in}
    goto refuse
  }}
  chain from_node {{
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-advert }} accept
    ct state established,related accept
    ct state new meta l4proto tcp oifname . tcp dport @expose accept
    reject with icmpx admin-prohibited
  }}
{nat}}}
"#,
            p4 = list(false, &pinned),
            p6 = list(true, &pinned),
            i4 = list(false, &internal),
            i6 = list(true, &internal),
            e4 = list(false, &c.exempt),
            e6 = list(true, &c.exempt),
        )
    }
}

/// A sandbox's own elements: its addresses (`src4`, `src6`), its generation (`gen`, `live`),
/// its shared policy's id (`pol`), its exposed ports (`expose`).
fn own(e: &Entry, policy_id: u32) -> Vec<(Set, Element)> {
    let k = iface(&e.lease);
    let mut v = vec![
        (
            Set::Src4,
            Element::new(vec![Field::Iface(k), Field::Addr(IpAddr::V4(e.lease.v4))]),
        ),
        (
            Set::Src6,
            Element::new(vec![Field::Iface(k), Field::Addr(IpAddr::V6(e.lease.v6))]),
        ),
        (
            Set::Gen,
            Element {
                data: Some(e.generation),
                ..Element::new(vec![Field::Iface(k)])
            },
        ),
        (
            Set::Live,
            Element::new(vec![Field::Iface(k), Field::Mark(e.generation)]),
        ),
        (
            Set::Pol,
            Element {
                data: Some(policy_id),
                ..Element::new(vec![Field::Iface(k)])
            },
        ),
    ];
    if let Some(expose) = e.static_elements.sets.get(&Set::Expose) {
        v.extend(
            expose
                .iter()
                .map(|m| (Set::Expose, m.element(Field::Iface(k)))),
        );
    }
    v
}

/// A shared policy's rules, keyed by its id.
fn shared_elements(sh: &Shared) -> Vec<(Set, Element)> {
    let mut v = Vec::new();
    for (set, members) in sh.rules.sorted() {
        v.extend(members.iter().map(|m| (set, m.element(Field::Mark(sh.id)))));
    }
    v
}

/// A resolved address's element (with its timeout, to add it).
fn resolved(k: IfName, r: &Resolved, timeout_ms: Option<u64>) -> (Set, Element) {
    let set = if r.addr.is_ipv6() {
        Set::Dyn6
    } else {
        Set::Dyn4
    };
    let e = Element {
        timeout_ms,
        ..Element::new(vec![
            Field::Iface(k),
            Field::Addr(r.addr),
            Field::Ports(r.ports),
        ])
    };
    (set, e)
}

/// Milliseconds on a monotonic clock (the kernel's set timeouts are monotonic too: a wall
/// clock that steps would make the bookkeeping disagree with the table).
fn mono_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

/// Runs one `nft -f -` transaction (all of it or nothing).
fn run(script: &str) -> io::Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(e.kind(), format!("running nft (the nftables package): {e}"))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first: String = err.lines().take(6).collect::<Vec<_>>().join("; ");
        Err(io::Error::other(format!("nft: {first}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use warren_types::net::{NetRule, NetworkPolicy, Protocol};

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
    }

    /// An exemption opens part of the reviewed list only: never the pools (other sandboxes),
    /// the node's or the cluster's addresses, or `internal`, even when it covers them — an
    /// operator who exempts `10.0.0.0/8` for a mirror must not reopen the control plane on
    /// `10.1.2.3`. The table and the proxies' list say the same.
    #[test]
    fn an_exemption_never_reopens_the_node_the_cluster_or_the_pools() {
        let cidr = |s: &str| Cidr::parse(s).unwrap();
        let fw = Firewall::new(FirewallConfig {
            addressing: Addressing::new(cidr("10.200.0.0/16"), cidr("fd77:7761::/64")).unwrap(),
            internal: vec![cidr("10.1.2.3/32"), cidr("203.0.113.9/32")],
            exempt: vec![cidr("10.0.0.0/8"), cidr("fd00::/8"), cidr("203.0.113.0/24")],
            log_group: 9,
            masquerade: false,
            proxy_port: None,
        });
        assert_eq!(fw.never_allowed(&cidr("10.20.0.0/16")), None, "exempted");
        for pinned in [
            "10.1.2.3/32",
            "10.200.0.0/24",
            "fd77:7761::/96",
            "203.0.113.9/32",
        ] {
            assert!(
                fw.never_allowed(&cidr(pinned)).is_some(),
                "{pinned} reopened by an exemption"
            );
        }
        assert!(
            fw.never_allowed(&cidr("172.16.0.0/16")).is_some(),
            "not exempted"
        );
        let never = fw.cfg.never();
        let covered = |a: &str| never.iter().any(|c| c.covers(&cidr(a)));
        assert!(!covered("10.20.0.1/32") && !covered("203.0.113.1/32"));
        assert!(covered("10.1.2.3/32") && covered("10.200.0.7/32") && covered("203.0.113.9/32"));
        assert!(covered("172.16.0.1/32") && covered("127.0.0.1/32"));
        let table = fw.skeleton();
        assert!(
            table.contains("ip daddr @pinned4 goto refuse")
                && table.contains("10.1.2.3")
                && table.contains("ct original ip6 daddr @pinned6 goto refuse"),
            "{table}"
        );
    }

    /// A network namespace of this test's, deleted when dropped.
    struct Netns(String);

    impl Netns {
        fn new(tag: &str) -> Netns {
            let name = format!("wnu-{}-{tag}", std::process::id());
            let ok = Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip netns add {name}");
            Netns(name)
        }

        /// Runs `f` on a thread inside it.
        fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
            let fd = std::fs::File::open(format!("/run/netns/{}", self.0)).unwrap();
            std::thread::scope(|s| {
                s.spawn(move || {
                    rustix::thread::move_into_link_name_space(
                        fd.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .unwrap();
                    f()
                })
                .join()
                .unwrap()
            })
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    fn sh(script: &str) -> String {
        let out = Command::new("sh").args(["-c", script]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn before_linux_6_3_deletions_fail_on_no_missing_element_either() {
        if !is_root() {
            eprintln!("SKIP: needs root (a network namespace, nftables)");
            return;
        }
        let ns = Netns::new("old-kernel");
        ns.run(|| {
            let addressing = Addressing::new(
                Cidr::parse("10.200.0.0/16").unwrap(),
                Cidr::parse("fd77:7761::/64").unwrap(),
            )
            .unwrap();
            let mut fw = Firewall::new(FirewallConfig {
                addressing,
                internal: vec![],
                exempt: vec![],
                log_group: 9,
                masquerade: false,
                proxy_port: None,
            });
            fw.install().unwrap();
            let mut nl = Netlink::open().unwrap();
            nl.as_before_destroy();
            fw.netlink = Some(nl);
            let policy = expand(
                &NetworkPolicy {
                    allow: vec![
                        NetRule::cidr("198.51.100.0/24"),
                        NetRule {
                            cidr: Some("0.0.0.0/0".into()),
                            ports: Some("443".into()),
                            protocol: Some(Protocol::Tcp),
                            ..NetRule::default()
                        },
                    ],
                    ..NetworkPolicy::default()
                }
                .parse()
                .unwrap(),
            )
            .unwrap();
            let lease = addressing.lease(2).unwrap();
            fw.add(lease, 1, policy.clone()).unwrap();
            let http = [PortRange { lo: 80, hi: 80 }];
            let a: IpAddr = "203.0.113.1".parse().unwrap();
            let b: IpAddr = "203.0.113.2".parse().unwrap();
            fw.allow_resolved(2, "a.test", &[a], &http, 1).unwrap();
            fw.allow_resolved(2, "b.test", &[b], &http, 600).unwrap();
            // One times out, others vanish behind the firewall's back.
            std::thread::sleep(std::time::Duration::from_millis(1500));
            sh(
                "nft flush set inet warren any4; nft flush map inet warren gen; \
                nft flush set inet warren src4",
            );
            assert_eq!(fw.destroys_elements(), Some(false));
            fw.update(2, 2, Elements::default()).unwrap();
            assert!(!sh("nft list set inet warren dyn4").contains("203.0.113.2"));
            fw.allow_resolved(2, "b.test", &[b], &http, 600).unwrap();
            assert!(sh("nft list set inet warren dyn4").contains("203.0.113.2"));
            fw.remove_entry(2).unwrap();
            let table = sh("nft list table inet warren");
            assert!(!table.contains("wv2"), "{table}");
            fw.remove().unwrap();
        });
    }

    #[test]
    fn a_batch_of_hundreds_of_messages_is_one_transaction_that_names_a_late_refusal() {
        if !is_root() {
            eprintln!("SKIP: needs root (a network namespace, nftables)");
            return;
        }
        let ns = Netns::new("big-batch");
        ns.run(|| {
            sh("nft add table inet warren; \
                nft add map inet warren gen '{ type ifname : mark; }'");
            let element = |name: String, mark: u32| Element {
                data: Some(mark),
                ..Element::new(vec![Field::Iface(IfName::new(&name))])
            };
            let mut nl = Netlink::open().unwrap();
            // Whether `name` is in the map (listing 300,000 elements with nft takes seconds):
            // adding it with another value is refused if it is.
            let present = |nl: &mut Netlink, name: &str| {
                let mut b = Batch::default();
                b.add(Set::Gen, element(name.into(), u32::MAX));
                let taken = nl.commit(&b).is_err();
                if !taken {
                    let mut b = Batch::default();
                    b.destroy(Set::Gen, element(name.into(), u32::MAX));
                    nl.commit(&b).unwrap();
                }
                taken
            };
            // ~750 elements a message: 400 messages, more than ask an ack each.
            let mut b = Batch::default();
            for i in 0..300_000 {
                b.add(Set::Gen, element(format!("a{i}"), 1));
            }
            nl.commit(&b).unwrap();
            assert!(present(&mut nl, "a0"));
            assert!(present(&mut nl, "a299999"));
            assert!(!present(&mut nl, "b0"));
            // One bad element (a key too long for the map) deep into the next batch: the
            // error names it, and none of the batch is applied.
            let mut b = Batch::default();
            for i in 0..300_000 {
                b.add(Set::Gen, element(format!("b{i}"), 1));
            }
            let bad = Element::new(vec![Field::Iface(IfName::new("wv7")), Field::Mark(7)]);
            b.add.get_mut(&Set::Gen).unwrap().insert(250_000, bad);
            let err = nl.commit(&b).unwrap_err().to_string();
            assert!(
                err.contains(r#"adding element "wv7" . 7 to set inet warren gen"#),
                "{err}"
            );
            assert!(!present(&mut nl, "b0"));
            assert!(!present(&mut nl, "b299999"));
            // The socket goes on.
            let mut b = Batch::default();
            b.destroy(Set::Gen, element("a0".into(), 1));
            nl.commit(&b).unwrap();
            assert!(!present(&mut nl, "a0"));
        });
    }
}

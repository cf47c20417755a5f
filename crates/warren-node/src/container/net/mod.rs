//! The container backend's network: each sandbox with a `filtered` network gets an interface
//! from the node's pools (`warren_net::link`) and elements in the node's firewall table
//! (`warren_net::nft`); refused packets come back from the firewall's log (`warren_net::nflog`)
//! as (sandbox, packet) pairs for the node's incident store.
//!
//! Warm inits get their interface and a deny-everything policy when they are made, so a create
//! pays nothing for the network unless its policy has rules (one firewall transaction). An
//! init joins a ready network namespace (a [`Slot`]: interface, lease and firewall elements);
//! an ended sandbox's slot is flushed and kept for the next init (`slots`), so neither a
//! namespace nor an interface is made or destroyed per sandbox. The index of a destroyed
//! slot's lease is reused last (a FIFO), after its interface is deleted.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::mpsc;

mod slots;
mod sni;

use super::expose::{ExposeConfig, Exposures};
use crate::backend::NetDenial;
use warren_net::dns::{self, Decision, DnsProxy, Refusal};
use warren_net::link::{Addressing, Lease, Links};
use warren_net::nflog::Reader;
use warren_net::nft::{Elements, Firewall, FirewallConfig, expand};
use warren_types::net::{Cidr, DomainPattern, DomainSet, NetworkPolicy, Policy, PortRange, Target};

/// A sandbox's domain rules, for the resolver and the transparent proxy (with its deny rules
/// by address, which the proxy checks the addresses it dials against).
#[derive(Debug, Clone, Default)]
pub(crate) struct DomainRules {
    pub allow: DomainSet,
    pub deny: DomainSet,
    /// Each allow rule's pattern and ports (a rule without ports: 0-65535).
    rules: Vec<(DomainPattern, PortRange)>,
    /// Its deny rules by CIDR or port.
    deny_addresses: Vec<warren_types::net::Rule>,
}

impl DomainRules {
    fn of(policy: &Policy) -> DomainRules {
        let rules = policy
            .allow
            .iter()
            .filter_map(|r| match &r.target {
                Target::Domain(d) => {
                    Some((d.clone(), r.ports.unwrap_or(PortRange { lo: 0, hi: 65535 })))
                }
                _ => None,
            })
            .collect();
        DomainRules {
            allow: policy.allowed_domains(),
            deny: policy.denied_domains(),
            rules,
            deny_addresses: policy
                .deny
                .iter()
                .filter(|r| !matches!(r.target, Target::Domain(_)))
                .cloned()
                .collect(),
        }
    }

    /// Whether no deny rule refuses TCP to `addr` on `port`.
    pub(crate) fn may_dial(&self, addr: IpAddr, port: u16) -> bool {
        !self.deny_addresses.iter().any(|r| {
            let here = match &r.target {
                Target::Cidr(c) => c.contains(addr),
                Target::Any => true,
                Target::Domain(_) => false,
            };
            here && r.ports.is_none_or(|p| (p.lo..=p.hi).contains(&port))
                && r.protocol
                    .is_none_or(|p| p == warren_types::net::Protocol::Tcp)
        })
    }

    /// Whether `name` may be resolved.
    pub(crate) fn allows(&self, name: &str) -> bool {
        !self.deny.matches(name) && self.allow.matches(name)
    }

    /// The ports the rules that match `name` allow, as disjoint ranges (the firewall's
    /// interval sets refuse overlaps); none when it may not be resolved.
    pub(crate) fn ports_for(&self, name: &str) -> Vec<PortRange> {
        if !self.allows(name) {
            return Vec::new();
        }
        let mut ports: Vec<PortRange> = self
            .rules
            .iter()
            .filter(|(d, _)| d.matches(name))
            .map(|(_, p)| *p)
            .collect();
        ports.sort_by_key(|p| (p.lo, p.hi));
        let mut kept: Vec<PortRange> = Vec::new();
        for p in ports {
            if let Some(last) = kept.last_mut()
                && p.lo as u32 <= last.hi as u32 + 1
            {
                last.hi = last.hi.max(p.hi);
                continue;
            }
            kept.push(p);
        }
        kept
    }
}

struct Owner {
    name: String,
    domains: DomainRules,
    /// Its policy's generation (also in the firewall; here so that reading it takes no lock
    /// a DNS answer may hold).
    generation: u32,
}

/// Policy generations: unique on the node across leases, restarts included, so that a
/// conntrack entry a sandbox left behind never matches the next holder of its lease. Blocks of
/// them are reserved in a file, so a restart starts past every one handed out.
struct Generations {
    next: u32,
    reserved: u32,
    file: std::path::PathBuf,
}

const GENERATION_BLOCK: u32 = 1 << 16;

impl Generations {
    fn open(file: std::path::PathBuf, floor: u32) -> std::io::Result<Generations> {
        let stored = std::fs::read_to_string(&file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(1);
        let mut g = Generations {
            next: Some(stored.max(floor).max(1))
                .filter(|n| *n < warren_net::nft::POLICY_ID_BASE)
                .unwrap_or(1),
            reserved: 0,
            file,
        };
        g.reserve()?;
        Ok(g)
    }

    fn reserve(&mut self) -> std::io::Result<()> {
        self.reserved = self.next.saturating_add(GENERATION_BLOCK);
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{}\n", self.reserved))?;
        std::fs::rename(&tmp, &self.file)
    }

    fn take(&mut self) -> u32 {
        if self.next >= self.reserved
            && let Err(e) = self.reserve()
        {
            tracing::warn!("reserving network policy generations: {e}");
        }
        let g = self.next;
        // Below the policy ids' high bit: after two billion changes they wrap, skipping 0.
        self.next = if self.next.wrapping_add(1) >= warren_net::nft::POLICY_ID_BASE {
            1
        } else {
            self.next + 1
        };
        g
    }
}

#[derive(Default)]
struct Leases {
    used: HashSet<u32>,
    /// Freed indexes, oldest first.
    free: VecDeque<u32>,
    /// The next never-used index.
    next: u32,
}

/// How the node's network is set up.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// The DNS server the node's proxy asks for allowed names.
    pub dns_upstream: std::net::SocketAddr,
    /// The least and most TTL of the proxy's answers, seconds.
    pub dns_ttl: (u32, u32),
    /// The firewall (pools, always-denied ranges, log group, NAT). The node's own addresses
    /// are added to its always-denied ranges at start.
    pub firewall: FirewallConfig,
    /// Where the reserved policy generations are kept.
    pub generation_file: std::path::PathBuf,
    /// Where to write the `resolv.conf` every sandbox with an interface gets (naming the
    /// gateway, the node's DNS proxy).
    pub resolv_conf: std::path::PathBuf,
    /// Where exposed ports listen.
    pub expose: ExposeConfig,
    /// The transparent proxy for ports 80 and 443 of connections allowed by domain; none: such
    /// connections are allowed by the addresses their names resolved to.
    pub sni: Option<SniConfig>,
}

/// The transparent proxy's settings.
#[derive(Debug, Clone, Copy)]
pub struct SniConfig {
    /// The node's port it listens on (the gateway's, and every IPv6 address's).
    pub port: u16,
    /// Refuse TLS hellos with Encrypted Client Hello (their server name is only a public
    /// name).
    pub refuse_ech: bool,
}

/// The node's sandbox network.
pub(crate) struct NodeNet {
    rt: tokio::runtime::Handle,
    links: Links,
    addressing: Addressing,
    fw: Mutex<Firewall>,
    leases: Mutex<Leases>,
    owners: RwLock<HashMap<u32, Owner>>,
    denials: Mutex<Option<mpsc::Receiver<NetDenial>>>,
    /// The `resolv.conf` bound into every sandbox with an interface.
    pub(crate) resolv_conf: std::path::PathBuf,
    _reader: Reader,
    /// Held for the node's life: one node's network per network namespace.
    _lock: std::os::fd::OwnedFd,
    /// Policy generations handed out.
    generations: Mutex<Generations>,
    /// Refused attempts and names, to the node.
    tx: mpsc::Sender<NetDenial>,
    /// The DNS proxy on the gateway address (started once the node's network is).
    dns: Mutex<Option<DnsProxy>>,
    /// Exposed ports (taken after `fw` where both are held).
    exposures: Mutex<Exposures>,
    /// Slots of ended sandboxes, ready for the next inits.
    spare: Mutex<Vec<slots::Slot>>,
    /// Slots of ended sandboxes waiting for the flusher (`slots`).
    flushing: Mutex<Vec<slots::Slot>>,
    /// Held by the flusher while a batch it took is being flushed, so the node's stop can
    /// wait for it (the batch is in neither list meanwhile).
    flush_busy: Mutex<()>,
    /// Set when the node stops: slots given back later are destroyed, not kept.
    closed: std::sync::atomic::AtomicBool,
    /// Wakes the flusher.
    flush_wanted: std::sync::Condvar,
    /// The transparent proxy (TLS SNI / HTTP Host checks), where the node runs it.
    proxy: Mutex<Option<warren_net::proxy::Proxy>>,
}

/// Seconds the firewall keeps a resolved address open past its TTL: a client that connects
/// just as its cached answer expires is not refused.
const RESOLVED_GRACE: u32 = 5;

/// What the DNS proxy asks the node about each query.
struct DnsRules(std::sync::Weak<NodeNet>);

impl dns::Policy for DnsRules {
    fn decide(&self, src: IpAddr, name: &str) -> Decision {
        let Some(net) = self.0.upgrade() else {
            return Decision::Unknown;
        };
        match net.domains_of(src) {
            None => Decision::Unknown,
            Some((_, r)) if r.allows(name) => Decision::Allow,
            Some(_) => Decision::Deny,
        }
    }

    fn resolved(&self, src: IpAddr, name: &str, addrs: &[IpAddr], ttl: u32) {
        let Some(net) = self.0.upgrade() else { return };
        let Some(index) = net.index_of(src) else {
            return;
        };
        // The firewall opens before the sandbox has the answer: one `nft` transaction, which
        // blocks; on a multi-threaded runtime, let the others run meanwhile.
        let open = || net.allow_resolved(index, name, addrs, ttl);
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(open),
            _ => open(),
        }
    }

    fn refused(&self, src: IpAddr, name: &str, why: Refusal) {
        let Some(net) = self.0.upgrade() else { return };
        let Some(owner) = net.index_of(src).and_then(|i| net.owner_name(i)) else {
            return;
        };
        let (protocol, domain) = match &why {
            Refusal::Rebinding(_) => ("dns-rebinding", name.to_string()),
            _ => ("dns", name.to_string()),
        };
        let _ = net.tx.try_send(NetDenial {
            name: owner,
            dst: IpAddr::V4(net.addressing.gateway4()),
            protocol: protocol.into(),
            port: Some(53),
            domain: Some(domain),
        });
    }
}

/// Takes the lock of the calling thread's network namespace: two nodes in one namespace would
/// replace each other's firewall table and share interface names and routes. The lock is an
/// abstract unix socket name, which exists per network namespace and goes with the process
/// that holds it (a crash frees it; no file is left).
fn lock_namespace() -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let name = SocketAddrUnix::new_abstract_name(b"warren/node-network")?;
    match rustix::net::bind(&fd, &name) {
        Ok(()) => Ok(fd),
        Err(rustix::io::Errno::ADDRINUSE) => Err(std::io::Error::other(
            "another Warren node runs its sandbox network in this network namespace: give \
             each node a namespace of its own, or set [node.network] enabled = false",
        )),
        Err(e) => Err(e.into()),
    }
}

impl NodeNet {
    /// Opens netlink and the firewall's log in the daemon's network namespace. The table is
    /// installed by [`NodeNet::install`], once the surviving sandboxes are known.
    pub(crate) fn new(cfg: NetConfig) -> std::io::Result<Arc<NodeNet>> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| std::io::Error::other("the node's network needs a tokio runtime"))?;
        let lock = lock_namespace()?;
        let addressing = cfg.firewall.addressing;
        let links = {
            let _enter = rt.enter();
            Links::new(addressing)?
        };
        // The pools must be the node's alone: a route of the host's own into them would be
        // taken over by the sandboxes' host routes.
        let mut cfg = cfg;
        let taken = {
            let links = links.clone();
            let rt2 = rt.clone();
            std::thread::scope(|s| {
                s.spawn(move || rt2.block_on(async move { links.taken_networks().await }))
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("netlink thread panicked")))
            })?
        };
        let foreign = {
            let links = links.clone();
            let rt2 = rt.clone();
            std::thread::scope(|s| {
                s.spawn(move || rt2.block_on(async move { links.foreign().await }))
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("netlink thread panicked")))
            })?
        };
        if !foreign.is_empty() {
            return Err(std::io::Error::other(format!(
                "interfaces named like the node's sandbox interfaces (wv*) exist and are not \
                 its own: {}; the node's firewall would match them. Rename them, or run the \
                 node in a network namespace of its own",
                foreign.join(", ")
            )));
        }
        for t in &taken {
            for pool in [addressing.v4, addressing.v6] {
                if t.net.covers(&pool) && t.net.prefix > 0 || pool.covers(&t.net) {
                    return Err(std::io::Error::other(format!(
                        "the sandbox pool {pool} overlaps the host's {}: set [node.network] \
                         pool4/pool6 to a range the host does not use",
                        t.what
                    )));
                }
            }
            if let Some(a) = t.address {
                cfg.firewall.internal.push(Cidr {
                    addr: a,
                    prefix: if a.is_ipv4() { 32 } else { 128 },
                });
            }
        }
        let resolv = format!(
            "# Warren: the node's DNS proxy, the only resolver this sandbox can reach.\nnameserver {}\n",
            addressing.gateway4()
        );
        let tmp = cfg.resolv_conf.with_extension("tmp");
        std::fs::write(&tmp, resolv)?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        std::fs::rename(&tmp, &cfg.resolv_conf)?;
        let (reader, mut raw) = Reader::start(cfg.firewall.log_group, 4096)?;
        let (tx, rx) = mpsc::channel(4096);
        // The DNS proxy holds a socket per query in flight, up to a thousand or so: the node
        // raised its open-file limit before making its backend (`capacity::raise_open_files`).
        // What the DNS proxy drops from answers and the transparent proxy never dials: the
        // firewall's always-denied ranges, the reviewed list's with the exemptions cut out of
        // them (an exemption inside a wider range, `10.1.0.0/16` of `10.0.0.0/8`, opens just
        // that part; none opens the node's, the cluster's, the pools or `internal`).
        let never = cfg.firewall.never();
        let mut dns_cfg = dns::Config::new(
            vec![std::net::SocketAddr::new(
                IpAddr::V4(addressing.gateway4()),
                53,
            )],
            cfg.dns_upstream,
        );
        dns_cfg.never = never.clone();
        let never_reached = never;
        (dns_cfg.min_ttl, dns_cfg.max_ttl) = cfg.dns_ttl;
        let net = Arc::new(NodeNet {
            rt: rt.clone(),
            links,
            addressing,
            fw: Mutex::new(Firewall::new(cfg.firewall)),
            leases: Mutex::new(Leases {
                next: 2,
                ..Leases::default()
            }),
            owners: RwLock::new(HashMap::new()),
            denials: Mutex::new(Some(rx)),
            resolv_conf: cfg.resolv_conf.clone(),
            _reader: reader,
            _lock: lock,
            tx: tx.clone(),
            dns: Mutex::new(None),
            exposures: Mutex::new(Exposures::new(cfg.expose)),
            spare: Mutex::new(Vec::new()),
            flushing: Mutex::new(Vec::new()),
            flush_busy: Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
            flush_wanted: std::sync::Condvar::new(),
            proxy: Mutex::new(None),
            generations: Mutex::new(Generations::open(cfg.generation_file.clone(), 1)?),
        });
        let proxy = {
            let _enter = rt.enter();
            DnsProxy::start(dns_cfg, Arc::new(DnsRules(Arc::downgrade(&net))))?
        };
        *net.dns.lock().unwrap_or_else(|p| p.into_inner()) = Some(proxy);
        NodeNet::start_flusher(&net);
        if let Some(sni) = &cfg.sni {
            let mut pc = warren_net::proxy::Config::new(
                vec![
                    std::net::SocketAddr::new(IpAddr::V4(addressing.gateway4()), sni.port),
                    std::net::SocketAddr::new(
                        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                        sni.port,
                    ),
                ],
                cfg.dns_upstream,
            );
            pc.never = never_reached.clone();
            pc.refuse_ech = sni.refuse_ech;
            pc.mark = Some(warren_net::nft::PROXY_MARK);
            // Sized for a node of thousands of sandboxes: a few dozen connections per sandbox
            // at once, each of 3 descriptors within the open-file limit raised above.
            pc.limits.conns_total = 16_384;
            pc.limits.conns_per_source = 256;
            let proxy = {
                let _enter = rt.enter();
                warren_net::proxy::Proxy::start(
                    pc,
                    Arc::new(sni::ProxyRules(Arc::downgrade(&net))),
                )?
            };
            *net.proxy.lock().unwrap_or_else(|p| p.into_inner()) = Some(proxy);
        }
        let weak = Arc::downgrade(&net);
        rt.spawn(async move {
            while let Some(d) = raw.recv().await {
                let Some(net) = weak.upgrade() else { break };
                if let Some(name) = net.index_of(d.src).and_then(|i| net.owner_name(i)) {
                    // Full: the node is behind; the firewall's own rate limit bounds the rest.
                    let _ = tx.try_send(NetDenial {
                        name,
                        dst: d.dst,
                        protocol: d.protocol_name(),
                        port: d.port,
                        domain: None,
                    });
                }
            }
        });
        Ok(net)
    }

    /// Refuses a policy that allows what no sandbox may reach here (the node, the pools, the
    /// reviewed always-denied ranges, the administrator's internal ranges).
    pub(crate) fn check(&self, policy: &Policy) -> Result<(), String> {
        let fw = self.fw.lock().unwrap_or_else(|p| p.into_inner());
        for (i, r) in policy.allow.iter().enumerate() {
            if let Target::Cidr(c) = &r.target
                && let Some(range) = fw.never_allowed(c)
            {
                return Err(format!(
                    "allow[{i}]: {c} is inside {range}, which no sandbox on this node may \
                     reach (the node itself, its sandboxes, the control plane, private and \
                     shared address space, loopback, link-local and metadata addresses are \
                     always denied); an administrator can exempt a range with [node.network] \
                     exempt"
                ));
            }
        }
        Ok(())
    }

    /// The refused packets, once (the node takes them at start).
    pub(crate) fn take_denials(&self) -> Option<mpsc::Receiver<NetDenial>> {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The pools.
    pub(crate) fn addressing(&self) -> &Addressing {
        &self.addressing
    }

    /// The lease index of a sandbox address.
    pub(crate) fn index_of(&self, ip: IpAddr) -> Option<u32> {
        let (IpAddr::V4(n4), IpAddr::V6(n6)) =
            (self.addressing.v4.network(), self.addressing.v6.network())
        else {
            return None;
        };
        let i = match ip {
            IpAddr::V4(a) if self.addressing.v4.contains(ip) => u32::from(a) - u32::from(n4),
            IpAddr::V6(a) if self.addressing.v6.contains(ip) => {
                u32::try_from(u128::from(a) - u128::from(n6)).ok()?
            }
            _ => return None,
        };
        self.addressing.lease(i).map(|l| l.index)
    }

    fn owner_name(&self, index: u32) -> Option<String> {
        self.owners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&index)
            .map(|o| o.name.clone())
    }

    /// The domain rules of the sandbox with address `ip`, if it is one.
    pub(crate) fn domains_of(&self, ip: IpAddr) -> Option<(u32, DomainRules)> {
        let i = self.index_of(ip)?;
        self.owners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&i)
            .map(|o| (i, o.domains.clone()))
    }

    /// Runs a netlink future to its end on a thread of its own (callers may be anywhere,
    /// inside the runtime or not).
    fn block_on<T: Send>(
        &self,
        f: impl std::future::Future<Output = std::io::Result<T>> + Send,
    ) -> std::io::Result<T> {
        let rt = self.rt.clone();
        std::thread::scope(|s| {
            s.spawn(move || rt.block_on(f))
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("netlink thread panicked")))
        })
    }

    fn allocate(&self) -> std::io::Result<Lease> {
        let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        let cap = self.addressing.capacity() + 1;
        // Never-used indexes first; then the one freed longest ago.
        let index = if l.next <= cap {
            let i = l.next;
            l.next += 1;
            i
        } else if let Some(i) = l.free.pop_front() {
            i
        } else {
            return Err(std::io::Error::other(format!(
                "the node's sandbox address pool {} is full: configure a larger pool4",
                self.addressing.v4
            )));
        };
        l.used.insert(index);
        self.addressing
            .lease(index)
            .ok_or_else(|| std::io::Error::other("lease out of the pool"))
    }

    /// A new policy generation (unique on the node).
    fn new_generation(&self) -> u32 {
        self.generations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn free(&self, index: u32) {
        let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        if l.used.remove(&index) {
            l.free.push_back(index);
        }
    }

    /// The sandbox of lease `index` is now called `name` (a warm init claimed).
    pub(crate) fn rename(&self, index: u32, name: &str) {
        if let Some(o) = self
            .owners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&index)
        {
            o.name = name.to_string();
        }
    }

    /// Leave to carry one more stream to exposed port `port` of lease `index`, or why not.
    pub(crate) fn permit(
        &self,
        index: u32,
        port: u16,
    ) -> Result<super::expose::Permit, crate::backend::PortRefusal> {
        self.exposures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .permit(index, port)
    }

    /// The ports lease `index` exposes and where the node's host takes connections for each.
    pub(crate) fn exposed(&self, index: u32) -> Vec<(u16, std::net::SocketAddr)> {
        self.exposures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .of(index)
    }

    /// The policy generation of lease `index`.
    pub(crate) fn generation(&self, index: u32) -> Option<u32> {
        self.owners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&index)
            .map(|o| o.generation)
    }

    /// Replaces the policies of many leases in one firewall transaction (all or none); each
    /// one gets a new generation. Addresses its allowed domains resolved stay allowed where
    /// the new policy still allows the domain on exactly those ports. The resolver's view of
    /// the rules changes under the same lock as the table, so no answer in flight opens what
    /// the new policy refuses. Blocking.
    pub(crate) fn set_policies(&self, updates: &[(u32, &Policy)]) -> std::io::Result<()> {
        let mut batch = Vec::with_capacity(updates.len());
        let mut rules: HashMap<u32, (DomainRules, u32)> = HashMap::new();
        let mut fw = self.fw.lock().unwrap_or_else(|p| p.into_inner());
        // A task's sandboxes take one policy: expanded once, not once per sandbox.
        let mut last: Option<(&Policy, Elements, DomainRules)> = None;
        for (index, policy) in updates {
            if fw.generation(*index).is_none() {
                return Err(std::io::Error::other("the sandbox has no interface"));
            }
            if !last.as_ref().is_some_and(|(p, _, _)| *p == *policy) {
                let elements = expand(policy).map_err(std::io::Error::other)?;
                last = Some((*policy, elements, DomainRules::of(policy)));
            }
            let Some((_, elements, domains)) = &last else {
                continue;
            };
            let generation = self
                .generations
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            batch.push((*index, generation, elements.clone()));
            rules.insert(*index, (domains.clone(), generation));
        }
        // Host ports for newly exposed ports are bound before the firewall changes, so a
        // change that cannot have them changes nothing.
        let mut ex = self.exposures.lock().unwrap_or_else(|p| p.into_inner());
        let mut staged = Vec::new();
        for (index, policy) in updates {
            ex.stage(*index, &policy.expose, &BTreeMap::new(), &mut staged)?;
        }
        if let Err(e) = fw.update_keeping(batch, |index, domain, ports| {
            rules
                .get(&index)
                .is_some_and(|(r, _)| r.ports_for(domain).contains(&ports))
        }) {
            ex.unstage(staged);
            return Err(e);
        }
        for (index, policy) in updates {
            if let Some(lease) = self.addressing.lease(*index) {
                ex.commit(
                    &self.rt,
                    *index,
                    IpAddr::V4(lease.v4),
                    &policy.expose,
                    &mut staged,
                );
            }
        }
        ex.unstage(staged);
        drop(ex);
        let mut owners = self.owners.write().unwrap_or_else(|p| p.into_inner());
        for (index, (r, generation)) in rules {
            if let Some(o) = owners.get_mut(&index) {
                o.domains = r;
                o.generation = generation;
            }
        }
        drop(owners);
        drop(fw);
        self.recheck_proxy();
        Ok(())
    }

    /// Lets lease `index` reach what its allowed domain resolved to, for `ttl` seconds (plus
    /// grace). The rules are read again under the firewall's lock: a policy change since the
    /// query was decided wins.
    pub(crate) fn allow_resolved(&self, index: u32, domain: &str, addrs: &[IpAddr], ttl: u32) {
        let mut fw = self.fw.lock().unwrap_or_else(|p| p.into_inner());
        let ports = match self
            .owners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&index)
        {
            Some(o) => o.domains.ports_for(domain),
            None => return,
        };
        if ports.is_empty() {
            return;
        }
        if let Err(e) = fw.allow_resolved(
            index,
            domain,
            addrs,
            &ports,
            ttl.saturating_add(RESOLVED_GRACE),
        ) {
            tracing::warn!("allowing resolved addresses: {e}");
        }
    }

    /// Takes over the interface of a sandbox a previous daemon started (its elements are put
    /// back by [`NodeNet::install`], under a new generation, so every connection it has open is
    /// judged again by the policy of its record) and its exposed ports, on the host ports it
    /// had where they are still free.
    pub(crate) fn adopt(
        &self,
        name: &str,
        index: u32,
        generation: u32,
        policy: &NetworkPolicy,
        host_ports: &BTreeMap<u16, u16>,
    ) -> Result<Lease, String> {
        let lease = self
            .addressing
            .lease(index)
            .ok_or_else(|| format!("its network lease {index} is outside the node's pools"))?;
        let parsed = policy.parse()?;
        let elements: Elements = expand(&parsed)?;
        // A fresh generation, past the recorded one: the record may have been saved with a
        // new policy that a crash kept from reaching the table, and connections marked under
        // the old one must be judged again by the policy installed now.
        let generation = {
            let mut g = self.generations.lock().unwrap_or_else(|p| p.into_inner());
            if generation >= g.next {
                g.next = generation.saturating_add(1);
            }
            g.take()
        };
        {
            let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            if !l.used.insert(index) {
                return Err(format!("network lease {index} is taken twice"));
            }
            l.next = l.next.max(index + 1);
            l.free.retain(|i| *i != index);
        }
        self.fw
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .adopt(lease, generation, elements);
        if !parsed.expose.is_empty() {
            let mut ex = self.exposures.lock().unwrap_or_else(|p| p.into_inner());
            let mut staged = Vec::new();
            match ex.stage(index, &parsed.expose, host_ports, &mut staged) {
                Ok(()) => ex.commit(
                    &self.rt,
                    index,
                    IpAddr::V4(lease.v4),
                    &parsed.expose,
                    &mut staged,
                ),
                // The sandbox lives on; its status shows the ports it lost.
                Err(e) => tracing::error!(sandbox_id = name, "its exposed ports: {e}"),
            }
        }
        self.owners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                index,
                Owner {
                    name: name.to_string(),
                    domains: DomainRules::of(&parsed),
                    generation,
                },
            );
        Ok(lease)
    }

    /// Deletes interfaces no live sandbox holds, frees the indexes below the first unused one
    /// that no one holds, and installs the whole table (replacing an earlier daemon's in one
    /// transaction). Blocking; once at start. Returns how many interfaces it deleted.
    pub(crate) fn install(&self) -> std::io::Result<usize> {
        let links = self.links.clone();
        let existing = self.block_on(async move { links.existing().await })?;
        let used: HashSet<u32> = self
            .leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .used
            .clone();
        let mut n = 0;
        for (name, index) in existing {
            if !used.contains(&index) {
                let links = self.links.clone();
                let nm = name.clone();
                match self.block_on(async move { links.delete_by_name(&nm).await }) {
                    Ok(()) => n += 1,
                    Err(e) => tracing::warn!("leftover interface {name}: {e}"),
                }
            }
        }
        {
            let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            let next = l.next;
            let used = l.used.clone();
            l.free = (2..next).filter(|i| !used.contains(i)).collect();
        }
        self.fw
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .install()?;
        Ok(n)
    }

    /// Adds `addrs` to the always-denied destinations (the cluster's, named when the node
    /// joins): the firewall's table is installed again when one is new. The DNS and
    /// transparent proxies keep the list they started with; the firewall refuses the new
    /// addresses to sandboxes and to the proxy's own connections alike. Blocking.
    pub(crate) fn deny_also(&self, addrs: &[IpAddr]) -> std::io::Result<()> {
        let cidrs: Vec<Cidr> = addrs
            .iter()
            .map(|a| Cidr {
                addr: *a,
                prefix: if a.is_ipv4() { 32 } else { 128 },
            })
            .collect();
        let mut fw = self.fw.lock().unwrap_or_else(|p| p.into_inner());
        if fw.deny_also(&cidrs) {
            fw.install()?;
        }
        Ok(())
    }

    /// Removes the whole table (the node's last sandbox is gone and it stops for good).
    pub(crate) fn remove_table(&self) -> std::io::Result<()> {
        self.fw.lock().unwrap_or_else(|p| p.into_inner()).remove()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::net::NetRule;

    #[test]
    fn each_domain_gets_the_ports_of_the_rules_that_match_it() {
        let p = NetworkPolicy {
            allow: vec![
                NetRule {
                    ports: Some("443".into()),
                    ..NetRule::domain("a.test")
                },
                NetRule::domain("*.b.test"),
                NetRule {
                    ports: Some("80".into()),
                    ..NetRule::domain("*.test")
                },
            ],
            deny: vec![NetRule::domain("x.b.test")],
            ..NetworkPolicy::default()
        }
        .parse()
        .unwrap();
        let r = DomainRules::of(&p);
        let pr = |lo, hi| PortRange { lo, hi };
        // a.test matches its own rule and *.test: 80 and 443, not *.b.test's every port.
        assert_eq!(r.ports_for("a.test"), vec![pr(80, 80), pr(443, 443)]);
        assert_eq!(r.ports_for("c.a.test"), vec![pr(80, 80)]);
        assert_eq!(r.ports_for("y.b.test"), vec![pr(0, 65535)]);
        assert!(r.ports_for("x.b.test").is_empty(), "deny wins");
        assert!(r.ports_for("elsewhere.org").is_empty());
    }

    #[test]
    fn generations_never_repeat_across_restarts() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("net-generation");
        let mut g = Generations::open(f.clone(), 1).unwrap();
        let first: Vec<u32> = (0..10).map(|_| g.take()).collect();
        drop(g);
        // A restart starts past every generation the last run could have handed out.
        let mut g = Generations::open(f, 1).unwrap();
        let next = g.take();
        assert!(first.iter().all(|x| *x < next), "{first:?} then {next}");
    }
}

//! The node's exposed ports: which host port forwards to which sandbox port, and the
//! forwarders themselves (`warren_net::expose`).
//!
//! A policy change that exposes ports binds their host ports first (staged), then changes the
//! firewall, then starts the forwarders: a change that fails leaves the old ports as they were
//! and no new one bound. Host ports come from the node's `expose_ports` range, round robin,
//! skipping ports something else holds; an adopted sandbox gets back the host ports its record
//! names where they are still free.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use crate::backend::PortRefusal;
use warren_net::expose::{Forwarder, MAX_CONNECTIONS};
use warren_types::net::PortRange;

/// Streams through the node's API (`.../ports/{port}/connect`, the control plane's
/// `<port>-<id>` route) the node carries at once, in all.
pub const MAX_TUNNELS: usize = 16_384;

/// Leave to carry one stream to an exposed port through the node's API: `stop` fires when the
/// port is unexposed or its sandbox ends; dropping it gives its place back.
pub struct Permit {
    /// Fires when the stream must end.
    pub stop: CancellationToken,
    counts: [Arc<AtomicUsize>; 2],
}

impl Drop for Permit {
    fn drop(&mut self) {
        for c in &self.counts {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Where exposed ports listen.
#[derive(Debug, Clone, Copy)]
pub struct ExposeConfig {
    /// The host address the node's listeners bind (`127.0.0.1`: this host only).
    pub address: IpAddr,
    /// The host ports handed out.
    pub ports: PortRange,
}

/// A host port bound for a sandbox port, not yet forwarding.
pub(crate) struct Staged {
    index: u32,
    port: u16,
    host_port: u16,
    listener: std::net::TcpListener,
}

struct Exposed {
    host_port: u16,
    _forwarder: Forwarder,
    /// Cancelled with the port: ends the streams the node's API carries to it.
    stop: CancellationToken,
    /// Those streams, now.
    tunnels: Arc<AtomicUsize>,
}

impl Drop for Exposed {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Every sandbox's exposed ports.
pub(crate) struct Exposures {
    cfg: ExposeConfig,
    by_lease: HashMap<u32, BTreeMap<u16, Exposed>>,
    /// Host ports held, by forwarders or staged listeners.
    used: HashSet<u16>,
    /// Where the next search for a free host port starts.
    next: u16,
    /// Streams through the node's API, every port's.
    tunnels: Arc<AtomicUsize>,
}

impl Exposures {
    pub(crate) fn new(cfg: ExposeConfig) -> Exposures {
        Exposures {
            cfg,
            by_lease: HashMap::new(),
            used: HashSet::new(),
            next: cfg.ports.lo,
            tunnels: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The ports lease `index` exposes and where each listens.
    pub(crate) fn of(&self, index: u32) -> Vec<(u16, SocketAddr)> {
        self.by_lease
            .get(&index)
            .map(|m| {
                m.iter()
                    .map(|(p, e)| (*p, SocketAddr::new(self.cfg.address, e.host_port)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Leave to carry one more stream to exposed port `port` of lease `index`, or why not: it
    /// is not exposed (now), or the port or the node carries as many as it may.
    pub(crate) fn permit(&self, index: u32, port: u16) -> Result<Permit, PortRefusal> {
        let e = self
            .by_lease
            .get(&index)
            .and_then(|m| m.get(&port))
            .ok_or(PortRefusal::NotExposed)?;
        for (c, max, what) in [
            (&e.tunnels, MAX_CONNECTIONS, "this port"),
            (&self.tunnels, MAX_TUNNELS, "the node"),
        ] {
            if c.fetch_add(1, Ordering::Relaxed) >= max {
                c.fetch_sub(1, Ordering::Relaxed);
                if what == "the node" {
                    e.tunnels.fetch_sub(1, Ordering::Relaxed);
                }
                return Err(PortRefusal::Full(format!(
                    "{what} carries {max} streams already: close some, or retry shortly"
                )));
            }
        }
        Ok(Permit {
            stop: e.stop.child_token(),
            counts: [e.tunnels.clone(), self.tunnels.clone()],
        })
    }

    /// Whether lease `index` exposes `port`.
    pub(crate) fn has(&self, index: u32, port: u16) -> bool {
        self.by_lease
            .get(&index)
            .is_some_and(|m| m.contains_key(&port))
    }

    /// Binds host ports for the ports of `want` that lease `index` does not expose yet
    /// (`prefer`: a host port to try first for a port). On failure nothing stays bound.
    pub(crate) fn stage(
        &mut self,
        index: u32,
        want: &[u16],
        prefer: &BTreeMap<u16, u16>,
        into: &mut Vec<Staged>,
    ) -> std::io::Result<()> {
        for &port in want {
            if self.has(index, port) || into.iter().any(|s| s.index == index && s.port == port) {
                continue;
            }
            match self.bind(prefer.get(&port).copied()) {
                Ok((host_port, listener)) => into.push(Staged {
                    index,
                    port,
                    host_port,
                    listener,
                }),
                Err(e) => {
                    self.unstage(std::mem::take(into));
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Gives back staged host ports (the change failed).
    pub(crate) fn unstage(&mut self, staged: Vec<Staged>) {
        for s in staged {
            self.used.remove(&s.host_port);
        }
    }

    /// Makes lease `index` expose exactly `want`: ports no longer wanted stop (their
    /// connections end), staged ones start forwarding to `target` (the sandbox's address).
    pub(crate) fn commit(
        &mut self,
        rt: &tokio::runtime::Handle,
        index: u32,
        target: IpAddr,
        want: &[u16],
        staged: &mut Vec<Staged>,
    ) {
        let current = self.by_lease.entry(index).or_default();
        let gone: Vec<u16> = current
            .keys()
            .filter(|p| !want.contains(p))
            .copied()
            .collect();
        let mut freed = Vec::new();
        for p in gone {
            if let Some(e) = current.remove(&p) {
                freed.push(e.host_port);
            }
        }
        let (mine, rest): (Vec<Staged>, Vec<Staged>) = std::mem::take(staged)
            .into_iter()
            .partition(|s| s.index == index);
        *staged = rest;
        for s in mine {
            match Forwarder::start(rt, s.listener, SocketAddr::new(target, s.port)) {
                Ok(f) => {
                    current.insert(
                        s.port,
                        Exposed {
                            host_port: s.host_port,
                            _forwarder: f,
                            stop: CancellationToken::new(),
                            tunnels: Arc::new(AtomicUsize::new(0)),
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(index, port = s.port, "forwarding an exposed port: {e}");
                    freed.push(s.host_port);
                }
            }
        }
        if current.is_empty() {
            self.by_lease.remove(&index);
        }
        for h in freed {
            self.used.remove(&h);
        }
    }

    /// Stops every exposed port of lease `index` (its sandbox ended).
    pub(crate) fn release(&mut self, index: u32) {
        if let Some(m) = self.by_lease.remove(&index) {
            for e in m.values() {
                self.used.remove(&e.host_port);
            }
        }
    }

    /// Binds a free host port of the range, `prefer` first.
    fn bind(&mut self, prefer: Option<u16>) -> std::io::Result<(u16, std::net::TcpListener)> {
        let PortRange { lo, hi } = self.cfg.ports;
        if let Some(p) = prefer.filter(|p| (lo..=hi).contains(p) && !self.used.contains(p))
            && let Ok(l) = Forwarder::bind(SocketAddr::new(self.cfg.address, p))
        {
            self.used.insert(p);
            return Ok((p, l));
        }
        let span = u32::from(hi - lo) + 1;
        for k in 0..span {
            let p = (u32::from(self.next.max(lo).min(hi) - lo) + k) % span + u32::from(lo);
            let p = p as u16;
            if self.used.contains(&p) {
                continue;
            }
            match Forwarder::bind(SocketAddr::new(self.cfg.address, p)) {
                Ok(l) => {
                    self.used.insert(p);
                    self.next = if p == hi { lo } else { p + 1 };
                    return Ok((p, l));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("binding {}:{p} for an exposed port: {e}", self.cfg.address),
                    ));
                }
            }
        }
        // A kind of its own, so the node answers 429 (no room), not 500.
        Err(std::io::Error::new(
            std::io::ErrorKind::QuotaExceeded,
            format!(
                "no free port left in the node's expose_ports range {lo}-{hi}: unexpose ports \
                 of other sandboxes, or widen [node.network] expose_ports"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposures(lo: u16, hi: u16) -> Exposures {
        Exposures::new(ExposeConfig {
            address: "127.0.0.1".parse().unwrap(),
            ports: PortRange { lo, hi },
        })
    }

    /// A free range of `n` ports on loopback (probed; the test binds them itself).
    fn free_range(n: u16) -> (u16, u16) {
        for lo in (42_000u16..48_000).step_by(97) {
            if (lo..lo + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
                return (lo, lo + n - 1);
            }
        }
        panic!("no free port range on loopback");
    }

    #[tokio::test]
    async fn host_ports_are_handed_out_once_skipping_taken_ones_and_come_back() {
        let (lo, hi) = free_range(3);
        let mut ex = exposures(lo, hi);
        let rt = tokio::runtime::Handle::current();
        // Something else holds the first port: it is skipped.
        let squatter = std::net::TcpListener::bind(("127.0.0.1", lo)).unwrap();
        let mut staged = Vec::new();
        ex.stage(2, &[80, 8080], &BTreeMap::new(), &mut staged)
            .unwrap();
        ex.commit(
            &rt,
            2,
            "127.0.0.1".parse().unwrap(),
            &[80, 8080],
            &mut staged,
        );
        let hosts: Vec<u16> = ex.of(2).iter().map(|(_, a)| a.port()).collect();
        assert_eq!(hosts, vec![lo + 1, lo + 2]);
        // The range is full now: a third port fails, saying what to do, and nothing stays
        // staged.
        let e = ex
            .stage(3, &[9000], &BTreeMap::new(), &mut staged)
            .unwrap_err();
        assert!(e.to_string().contains("expose_ports"), "{e}");
        assert!(staged.is_empty());
        // Unexposing one frees its host port for another sandbox (once its listener's task,
        // aborted, has been dropped by the runtime).
        ex.commit(&rt, 2, "127.0.0.1".parse().unwrap(), &[8080], &mut staged);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        ex.stage(3, &[9000], &BTreeMap::new(), &mut staged).unwrap();
        assert_eq!(staged[0].host_port, lo + 1);
        ex.unstage(staged);
        ex.release(2);
        assert!(ex.of(2).is_empty());
        assert!(ex.used.is_empty());
        // A preferred port (an adopted sandbox's) is taken when it is free.
        drop(squatter);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut staged = Vec::new();
        let prefer = BTreeMap::from([(80, hi)]);
        ex.stage(4, &[80], &prefer, &mut staged).unwrap();
        assert_eq!(staged[0].host_port, hi);
    }
}

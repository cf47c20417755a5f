//! What the transparent proxy (`warren_net::proxy`) asks the node: whether a sandbox may
//! reach a name on a port (its domain rules, as the DNS proxy reads them), its policy's
//! generation now (so a change cuts what it no longer allows), whether an address the name
//! resolved to is one its deny rules refuse, and where to record a refusal.

use std::net::{IpAddr, SocketAddr};

use warren_net::proxy::{Policy, Refusal};

use super::NodeNet;
use crate::backend::NetDenial;

/// The node's answers, through a weak reference (the proxy must not keep the node alive).
pub(super) struct ProxyRules(pub(super) std::sync::Weak<NodeNet>);

impl Policy for ProxyRules {
    fn decide(&self, src: IpAddr, name: &str, port: u16) -> Option<u64> {
        let net = self.0.upgrade()?;
        let index = net.index_of(src)?;
        // The rules and the generation they belong to, read together: a policy change between
        // the two reads would let a connection the new rules refuse pass as of the new
        // generation, and no later check would judge it again.
        let owners = net.owners.read().unwrap_or_else(|p| p.into_inner());
        let o = owners.get(&index)?;
        o.domains
            .ports_for(name)
            .iter()
            .any(|p| (p.lo..=p.hi).contains(&port))
            .then_some(u64::from(o.generation))
    }

    fn current(&self, src: IpAddr) -> Option<u64> {
        let net = self.0.upgrade()?;
        net.generation(net.index_of(src)?).map(u64::from)
    }

    fn may_dial(&self, src: IpAddr, addr: IpAddr, port: u16) -> bool {
        let Some(net) = self.0.upgrade() else {
            return false;
        };
        net.domains_of(src)
            .is_some_and(|(_, rules)| rules.may_dial(addr, port))
    }

    fn refused(&self, src: IpAddr, dst: SocketAddr, name: Option<&str>, why: &Refusal) {
        let Some(net) = self.0.upgrade() else { return };
        let Some(owner) = net.index_of(src).and_then(|i| net.owner_name(i)) else {
            return;
        };
        tracing::debug!(sandbox_id = owner, %dst, ?name, "proxy refused: {why}");
        let _ = net.tx.try_send(NetDenial {
            name: owner,
            dst: dst.ip(),
            protocol: if dst.port() == 443 { "tls" } else { "http" }.into(),
            port: Some(dst.port()),
            domain: name.map(str::to_string),
        });
    }
}

impl NodeNet {
    /// Has the proxy judge its open connections again (after a policy change or a sandbox's
    /// end): those whose sandbox's policy no longer allows them are cut.
    pub(super) fn recheck_proxy(&self) {
        if let Some(p) = self
            .proxy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let cut = p.recheck();
            if cut > 0 {
                tracing::debug!(cut, "proxied connections cut by a policy change");
            }
        }
    }
}

//! Network slots: a network namespace with the sandbox's interface configured in it (`eth0`,
//! its addresses and routes; the node's end `wv<index>`), its lease, and firewall elements
//! that deny everything. An init joins a slot's namespace instead of making one, and when its
//! sandbox ends the slot is flushed and kept for the next init: making and destroying a
//! network namespace (slow, serialised in the kernel), a veth pair and their addresses is off
//! the churn of sandboxes.
//!
//! Flushed means nothing of the last sandbox carries over: its processes are all gone (the
//! slot is only recycled once its init has been reaped and its cgroup removed: the pid
//! namespace, and so every process in it, died with the init), the TCP sockets still closing
//! in its namespace are destroyed (they would show in `/proc/net/tcp`), its policy is back to
//! deny-everything under a new generation (every connection marked before is judged again and
//! refused), the node's conntrack entries of its addresses are deleted, and its exposed ports
//! are closed. Nothing inside the sandbox could have changed the namespace's
//! interfaces, addresses, routes or settings: its commands hold no capabilities.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use warren_net::link::Lease;
use warren_net::nft::expand;
use warren_types::net::Policy;

use super::{DomainRules, NodeNet, Owner};

/// Slots kept for the next inits; past this, an ended sandbox's slot is destroyed.
pub(crate) const MAX_SPARE: usize = 128;

/// A network namespace ready for an init.
pub(crate) struct Slot {
    /// Its place in the pools.
    pub lease: Lease,
    /// The namespace (no process needs to live in it to keep it).
    pub netns: OwnedFd,
}

impl NodeNet {
    /// A slot for the init of `name`: a spare one, or one made now. Blocking.
    pub(crate) fn take(&self, name: &str) -> io::Result<Slot> {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(slot) = spare {
            self.rename(slot.lease.index, name);
            return Ok(slot);
        }
        self.make(name)
    }

    /// Makes a slot: a lease, a namespace, the interface in it, deny-everything elements.
    fn make(&self, name: &str) -> io::Result<Slot> {
        let lease = self.allocate()?;
        let netns = match warren_sys::net::new_netns() {
            Ok(n) => n,
            Err(e) => {
                self.free(lease.index);
                return Err(e);
            }
        };
        let r = (|| {
            let links = self.links.clone();
            let ns = netns.as_fd();
            self.block_on(async move { links.attach(ns, &lease).await })?;
            let deny_all = expand(&Policy::default()).map_err(io::Error::other)?;
            let mut fw = self.fw.lock().unwrap_or_else(|p| p.into_inner());
            let generation = self.new_generation();
            fw.add(lease, generation, deny_all)?;
            self.owners
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    lease.index,
                    Owner {
                        name: name.to_string(),
                        domains: DomainRules::default(),
                        generation,
                    },
                );
            Ok(())
        })();
        match r {
            Ok(()) => Ok(Slot { lease, netns }),
            Err(e) => {
                self.destroy(lease);
                Err(e)
            }
        }
    }

    /// Gives back the slot of an ended sandbox. With its namespace (`netns`: the caller saw
    /// every process of the sandbox gone) it is flushed and kept for the next init while
    /// there is room; otherwise (an adopted sandbox, whose namespace the node does not hold,
    /// or a flush that failed) it is destroyed. Blocking; idempotent.
    pub(crate) fn release(&self, lease: Lease, netns: Option<OwnedFd>) {
        self.exposures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(lease.index);
        if let Some(netns) = netns
            && self.spare.lock().unwrap_or_else(|p| p.into_inner()).len() < MAX_SPARE
        {
            match self.flush(lease, &netns) {
                Ok(()) => {
                    self.spare
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Slot { lease, netns });
                    return;
                }
                Err(e) => tracing::warn!(index = lease.index, "flushing a network slot: {e}"),
            }
        }
        self.destroy(lease);
    }

    /// Puts a slot back to deny-everything under a new generation, ends the TCP sockets its
    /// namespace still holds (closing ones outlive their processes), and deletes the node's
    /// conntrack entries of its addresses.
    fn flush(&self, lease: Lease, netns: &OwnedFd) -> io::Result<()> {
        let deny_all = expand(&Policy::default()).map_err(io::Error::other)?;
        {
            let mut fw = self.fw.lock().unwrap_or_else(|p| p.into_inner());
            let generation = self.new_generation();
            fw.update_keeping(vec![(lease.index, generation, deny_all)], |_, _, _| false)?;
            self.owners
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    lease.index,
                    Owner {
                        name: String::new(),
                        domains: DomainRules::default(),
                        generation,
                    },
                );
        }
        self.recheck_proxy();
        warren_net::sockets::destroy_all(netns.as_fd())?;
        warren_net::conntrack::flush(&[lease.v4.into(), lease.v6.into()])?;
        Ok(())
    }

    /// Removes a slot's elements and interface and frees its lease.
    fn destroy(&self, lease: Lease) {
        if let Err(e) = self
            .fw
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove_entry(lease.index)
        {
            tracing::warn!(index = lease.index, "removing firewall elements: {e}");
            // Rebuild from what is known, so the table never keeps a stale element.
            if let Err(e) = self.fw.lock().unwrap_or_else(|p| p.into_inner()).install() {
                tracing::error!("reinstalling the firewall: {e}");
            }
        }
        // Its interface dies with its namespace, but asynchronously: deleted here, so its
        // name and addresses are free when the lease is reused.
        let links = self.links.clone();
        if let Err(e) = self.block_on(async move { links.detach(&lease).await }) {
            tracing::warn!(index = lease.index, "deleting the interface: {e}");
        }
        self.owners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&lease.index);
        self.recheck_proxy();
        self.free(lease.index);
    }

    /// Destroys the spare slots (the node stops).
    pub(crate) fn drain_spare(&self) {
        let all = std::mem::take(&mut *self.spare.lock().unwrap_or_else(|p| p.into_inner()));
        for s in all {
            self.destroy(s.lease);
        }
    }
}

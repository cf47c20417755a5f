//! Network slots: a network namespace with the sandbox's interface configured in it (`eth0`,
//! its addresses and routes; the node's end `wv<index>`), its lease, and firewall elements
//! that deny everything. An init joins a slot's namespace instead of making one, and when its
//! sandbox ends the slot is flushed and kept for the next init: making and destroying a
//! network namespace (slow, serialised in the kernel), a veth pair and their addresses is off
//! the churn of sandboxes.
//!
//! Flushed means nothing of the last sandbox carries over: its processes are all gone (the
//! slot is only recycled once its init has been reaped and its cgroup removed: the pid
//! namespace, and so every process in it, died with the init); the TCP sockets still closing
//! in its namespace are destroyed and no socket of any other kind may be left (one kept alive
//! in flight in a unix socket makes the slot be destroyed instead); its policy is back to
//! deny-everything under a new generation (every connection marked before is judged again and
//! refused, the proxy's included) and its log meter is gone; the node's conntrack entries of
//! its addresses are deleted; its exposed ports are closed. The namespace keeps no TCP metrics
//! (`warren_sys::net::new_netns`), so nothing says where earlier connections went. Nothing
//! inside the sandbox could have changed the namespace's interfaces, addresses, routes or
//! settings: its commands hold no capabilities. Flushes run in batches on a thread of their
//! own (`start_flusher`): the conntrack table every namespace shares is walked once per batch.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use warren_net::link::Lease;
use warren_net::nft::expand;
use warren_types::net::Policy;

use super::{DomainRules, NodeNet, Owner};
use warren_net::nft::Elements;

/// Slots kept for the next inits (flushed, or waiting to be); past this, an ended sandbox's
/// slot is destroyed.
pub(crate) const MAX_SPARE: usize = 128;

/// How long the flusher waits for more ended sandboxes before it flushes a batch.
const FLUSH_GATHER: std::time::Duration = std::time::Duration::from_millis(50);

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
    /// every process of the sandbox gone) it is queued to be flushed and kept for the next init
    /// while there is room; otherwise (an adopted sandbox, whose namespace the node does not
    /// hold) it is destroyed. Nothing is decided for its address from now on. Blocking;
    /// idempotent.
    pub(crate) fn release(&self, lease: Lease, netns: Option<OwnedFd>) {
        self.exposures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(lease.index);
        // A new generation with no rules: the proxy's recheck cuts what the sandbox had open.
        let generation = self.new_generation();
        if let Some(o) = self
            .owners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&lease.index)
        {
            o.name = String::new();
            o.domains = DomainRules::default();
            o.generation = generation;
        }
        self.recheck_proxy();
        if let Some(netns) = netns
            && !self.closed.load(std::sync::atomic::Ordering::SeqCst)
        {
            let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).len();
            let mut q = self.flushing.lock().unwrap_or_else(|p| p.into_inner());
            if spare + q.len() < MAX_SPARE {
                q.push(Slot { lease, netns });
                self.flush_wanted.notify_one();
                return;
            }
        }
        self.destroy(lease);
    }

    /// Flushes a batch of ended sandboxes' slots and keeps them for the next inits: their
    /// policies back to deny-everything under new generations (one transaction), the TCP
    /// sockets still closing in their namespaces destroyed, the node's conntrack entries of
    /// their addresses deleted (one walk of the kernel's table for the whole batch: the table
    /// is shared by every namespace, and walking it is what a flush costs). A slot any step
    /// fails for is destroyed instead.
    fn flush_batch(&self, batch: Vec<Slot>) {
        let mut kept = Vec::with_capacity(batch.len());
        let deny_all = match expand(&Policy::default()) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("the deny-everything policy: {e}");
                batch.into_iter().for_each(|s| self.destroy(s.lease));
                return;
            }
        };
        {
            let mut fw = self.fw.lock().unwrap_or_else(|p| p.into_inner());
            let updates: Vec<(u32, u32, Elements)> = batch
                .iter()
                .map(|s| (s.lease.index, self.new_generation(), deny_all.clone()))
                .collect();
            let generations: Vec<(u32, u32)> = updates.iter().map(|u| (u.0, u.1)).collect();
            let indexes: Vec<u32> = generations.iter().map(|g| g.0).collect();
            if let Err(e) = fw
                .update_keeping(updates, |_, _, _| false)
                .and_then(|()| fw.reset_meters(&indexes))
            {
                drop(fw);
                tracing::warn!("resetting the policies of ended sandboxes: {e}");
                batch.into_iter().for_each(|s| self.destroy(s.lease));
                return;
            }
            let mut owners = self.owners.write().unwrap_or_else(|p| p.into_inner());
            for (index, generation) in generations {
                if let Some(o) = owners.get_mut(&index) {
                    o.generation = generation;
                }
            }
        }
        self.recheck_proxy();
        for s in batch {
            match warren_net::sockets::destroy_all(s.netns.as_fd()) {
                Ok(_) => kept.push(s),
                Err(e) => {
                    tracing::warn!(index = s.lease.index, "ending a namespace's sockets: {e}");
                    self.destroy(s.lease);
                }
            }
        }
        let addrs: Vec<std::net::IpAddr> = kept
            .iter()
            .flat_map(|s| [s.lease.v4.into(), s.lease.v6.into()])
            .collect();
        if let Err(e) = warren_net::conntrack::flush(&addrs) {
            tracing::warn!("deleting ended sandboxes' connection tracking: {e}");
            kept.into_iter().for_each(|s| self.destroy(s.lease));
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        for s in kept {
            if spare.len() < MAX_SPARE {
                spare.push(s);
            } else {
                self.destroy(s.lease);
            }
        }
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

    /// Destroys the spare slots and those waiting to be flushed (the node stops).
    pub(crate) fn drain_spare(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        // A batch the flusher holds goes back to `spare` before this lock is free.
        let _busy = self.flush_busy.lock().unwrap_or_else(|p| p.into_inner());
        let mut all = std::mem::take(&mut *self.spare.lock().unwrap_or_else(|p| p.into_inner()));
        all.extend(std::mem::take(
            &mut *self.flushing.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        for s in all {
            self.destroy(s.lease);
        }
    }

    /// Flushes what ended sandboxes gave back, in batches, until the node's network is gone.
    pub(super) fn start_flusher(net: &std::sync::Arc<NodeNet>) {
        let weak = std::sync::Arc::downgrade(net);
        let _ = std::thread::Builder::new()
            .name("net-flusher".into())
            .spawn(move || {
                loop {
                    let Some(net) = weak.upgrade() else { return };
                    let waiting = {
                        let q = net.flushing.lock().unwrap_or_else(|p| p.into_inner());
                        if q.is_empty() {
                            // Woken by a release, or now and then to see the node still there.
                            let (q, _) = net
                                .flush_wanted
                                .wait_timeout(q, std::time::Duration::from_secs(1))
                                .unwrap_or_else(|p| p.into_inner());
                            !q.is_empty()
                        } else {
                            true
                        }
                    };
                    if !waiting {
                        continue;
                    }
                    // A moment for a burst of kills to join the batch.
                    std::thread::sleep(FLUSH_GATHER);
                    let _busy = net.flush_busy.lock().unwrap_or_else(|p| p.into_inner());
                    let batch = std::mem::take(
                        &mut *net.flushing.lock().unwrap_or_else(|p| p.into_inner()),
                    );
                    if !batch.is_empty() {
                        net.flush_batch(batch);
                    }
                }
            });
    }
}

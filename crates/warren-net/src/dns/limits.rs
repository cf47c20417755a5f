//! Per-source bookkeeping: the query and event token buckets, and the in-flight query and TCP
//! connection counts, per source address and in total.
//!
//! One mutex guards the whole table: every operation is a hash lookup and a few additions, far
//! cheaper than the DNS parsing around it, and one lock keeps the per-source and total counts
//! consistent without ordering rules.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Limits;

/// How often, at most, a full table is swept for idle sources: a flood of new addresses then
/// costs one sweep a second, not one per packet.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A token bucket: `rate` tokens a second, at most `cap`.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn full(cap: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(cap),
            last: now,
        }
    }

    fn refill(&mut self, now: Instant, rate: u32, cap: u32) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * f64::from(rate)).min(f64::from(cap));
        self.last = now;
    }

    fn take(&mut self, now: Instant, rate: u32, cap: u32) -> bool {
        self.refill(now, rate, cap);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether it would be full now (forgetting it then loses nothing).
    fn is_full(&self, now: Instant, rate: u32, cap: u32) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens + dt * f64::from(rate) >= f64::from(cap)
    }
}

#[derive(Debug)]
struct Source {
    queries: Bucket,
    events: Bucket,
    inflight: usize,
    tcp: usize,
}

#[derive(Debug, Default)]
struct Table {
    map: HashMap<IpAddr, Source>,
    inflight: usize,
    tcp: usize,
    last_sweep: Option<Instant>,
}

/// The table of sources, shared by every listener and guard.
#[derive(Debug)]
pub(crate) struct Sources {
    limits: Limits,
    table: Mutex<Table>,
}

/// What a [`Guard`] holds a slot of.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Inflight,
    Tcp,
}

/// A held in-flight or TCP slot; dropping it gives the slot back, so a cancelled task (the
/// proxy stopped, a connection dropped) cannot leak one.
#[derive(Debug)]
pub(crate) struct Guard {
    sources: Arc<Sources>,
    ip: IpAddr,
    slot: Slot,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut t = self.sources.lock();
        match self.slot {
            Slot::Inflight => t.inflight = t.inflight.saturating_sub(1),
            Slot::Tcp => t.tcp = t.tcp.saturating_sub(1),
        }
        if let Some(s) = t.map.get_mut(&self.ip) {
            match self.slot {
                Slot::Inflight => s.inflight = s.inflight.saturating_sub(1),
                Slot::Tcp => s.tcp = s.tcp.saturating_sub(1),
            }
        }
    }
}

impl Sources {
    pub(crate) fn new(limits: Limits) -> Sources {
        Sources {
            limits,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; should it ever, the counts are still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `ip` may send one more query now (its token bucket). False too when the table
    /// is full of busy sources and `ip` is new.
    pub(super) fn admit_query(&self, ip: IpAddr) -> bool {
        let l = &self.limits;
        let now = Instant::now();
        let mut t = self.lock();
        match self.entry(&mut t, ip, now) {
            Some(s) => s.queries.take(now, l.rate_per_source, l.burst_per_source),
            None => false,
        }
    }

    /// Whether one more `Policy::refused` event may be reported for `ip` now.
    pub(crate) fn admit_event(&self, ip: IpAddr) -> bool {
        let l = &self.limits;
        let now = Instant::now();
        let mut t = self.lock();
        match self.entry(&mut t, ip, now) {
            Some(s) => s.events.take(now, l.events_per_source, l.events_per_source),
            None => false,
        }
    }

    /// A slot for one upstream query of `ip`, if neither its limit nor the total is reached.
    pub(super) fn inflight(self: &Arc<Self>, ip: IpAddr) -> Option<Guard> {
        self.acquire(ip, Slot::Inflight)
    }

    /// A slot for one TCP connection of `ip`, if neither its limit nor the total is reached.
    pub(crate) fn tcp(self: &Arc<Self>, ip: IpAddr) -> Option<Guard> {
        self.acquire(ip, Slot::Tcp)
    }

    fn acquire(self: &Arc<Self>, ip: IpAddr, slot: Slot) -> Option<Guard> {
        let l = &self.limits;
        let now = Instant::now();
        let mut t = self.lock();
        let (total, max_total, max_one) = match slot {
            Slot::Inflight => (t.inflight, l.inflight_total, l.inflight_per_source),
            Slot::Tcp => (t.tcp, l.tcp_conns_total, l.tcp_conns_per_source),
        };
        if total >= max_total {
            return None;
        }
        let s = self.entry(&mut t, ip, now)?;
        let one = match slot {
            Slot::Inflight => &mut s.inflight,
            Slot::Tcp => &mut s.tcp,
        };
        if *one >= max_one {
            return None;
        }
        *one += 1;
        match slot {
            Slot::Inflight => t.inflight += 1,
            Slot::Tcp => t.tcp += 1,
        }
        Some(Guard {
            sources: Arc::clone(self),
            ip,
            slot,
        })
    }

    /// The entry of `ip`, made if need be. When the table holds `max_sources` entries, idle ones
    /// (nothing in flight, no connection, full buckets: forgetting them changes nothing) are
    /// swept first, at most once a second; if it is still full, None.
    fn entry<'t>(&self, t: &'t mut Table, ip: IpAddr, now: Instant) -> Option<&'t mut Source> {
        let l = &self.limits;
        if !t.map.contains_key(&ip) && t.map.len() >= l.max_sources {
            let due = t
                .last_sweep
                .is_none_or(|last| now.saturating_duration_since(last) >= SWEEP_EVERY);
            if !due {
                return None;
            }
            t.last_sweep = Some(now);
            t.map.retain(|_, s| {
                s.inflight > 0
                    || s.tcp > 0
                    || !s
                        .queries
                        .is_full(now, l.rate_per_source, l.burst_per_source)
                    || !s
                        .events
                        .is_full(now, l.events_per_source, l.events_per_source)
            });
            if t.map.len() >= l.max_sources {
                return None;
            }
        }
        Some(t.map.entry(ip).or_insert_with(|| Source {
            queries: Bucket::full(l.burst_per_source, now),
            events: Bucket::full(l.events_per_source, now),
            inflight: 0,
            tcp: 0,
        }))
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn buckets_allow_the_burst_then_the_rate() {
        let now = Instant::now();
        let mut b = Bucket::full(3, now);
        assert!(b.take(now, 10, 3) && b.take(now, 10, 3) && b.take(now, 10, 3));
        assert!(!b.take(now, 10, 3));
        // 0.1 s at 10/s: one more token.
        let later = now + Duration::from_millis(100);
        assert!(b.take(later, 10, 3));
        assert!(!b.take(later, 10, 3));
        assert!(b.is_full(later + Duration::from_secs(1), 10, 3));
    }

    #[test]
    fn slots_are_bounded_per_source_and_in_total_and_given_back() {
        let sources = Arc::new(Sources::new(Limits {
            inflight_per_source: 2,
            inflight_total: 3,
            ..Limits::default()
        }));
        let a1 = sources.inflight(ip("10.0.0.1")).unwrap();
        let _a2 = sources.inflight(ip("10.0.0.1")).unwrap();
        assert!(sources.inflight(ip("10.0.0.1")).is_none(), "per source");
        let _b1 = sources.inflight(ip("10.0.0.2")).unwrap();
        assert!(sources.inflight(ip("10.0.0.3")).is_none(), "in total");
        drop(a1);
        assert!(sources.inflight(ip("10.0.0.1")).is_some());
    }

    #[test]
    fn a_full_table_sweeps_idle_sources_and_refuses_new_ones_when_all_are_busy() {
        let sources = Arc::new(Sources::new(Limits {
            max_sources: 2,
            ..Limits::default()
        }));
        let busy = sources.tcp(ip("10.0.0.1")).unwrap();
        assert!(sources.admit_query(ip("10.0.0.2")));
        // 10.0.0.2 spent a token: not idle yet, so the table is full of busy sources.
        assert!(!sources.admit_query(ip("10.0.0.3")));
        assert_eq!(sources.len(), 2);
        drop(busy);
        // Sweeps are at most once a second: a later new source finds the table swept of the
        // now idle 10.0.0.1 (10.0.0.2's bucket has refilled by then too).
        std::thread::sleep(SWEEP_EVERY + Duration::from_millis(50));
        assert!(sources.admit_query(ip("10.0.0.3")));
        assert!(sources.len() <= 2);
    }
}

//! Incidents the guest sees: system calls the agent filter denied, and attempts on the guest
//! itself. Occurrences of the same kind and detail within a window are one record with a
//! count, so a flood is one record, and the records kept are bounded.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use warren_types::guest::Incident;

/// Occurrences within this long of a record's first one add to it.
const WINDOW: Duration = Duration::from_secs(60);

/// Records kept for a host that has not read them yet; the oldest go first.
const KEEP: usize = 512;

/// The guest's incident records.
pub struct Incidents {
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    seq: u64,
    /// Record id of the open window for each (kind, detail).
    open: HashMap<(String, String), u64>,
    /// Records by id, each with the sequence number of its last change.
    records: BTreeMap<u64, (u64, Incident)>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Default for Incidents {
    fn default() -> Self {
        Incidents {
            inner: Mutex::new(Inner::default()),
            changed: watch::channel(0).0,
        }
    }
}

impl Incidents {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one occurrence.
    pub fn record(&self, kind: &str, detail: String, pid: Option<i32>, comm: Option<String>) {
        let now = now_ms();
        let mut g = self.lock();
        g.seq += 1;
        let seq = g.seq;
        let key = (kind.to_string(), detail);
        let open = g.open.get(&key).copied().filter(|id| {
            g.records
                .get(id)
                .is_some_and(|(_, r)| now.saturating_sub(r.first_ms) < WINDOW.as_millis() as u64)
        });
        let id = match open {
            Some(id) => {
                if let Some((s, r)) = g.records.get_mut(&id) {
                    *s = seq;
                    r.count += 1;
                    r.last_ms = now;
                    // The latest caller, unless it could not be named (it had exited).
                    if comm.is_some() {
                        r.pid = pid;
                        r.comm = comm;
                    }
                }
                id
            }
            None => {
                g.next_id += 1;
                let id = g.next_id;
                let rec = Incident {
                    id,
                    kind: key.0.clone(),
                    detail: key.1.clone(),
                    count: 1,
                    first_ms: now,
                    last_ms: now,
                    pid,
                    comm,
                };
                g.records.insert(id, (seq, rec));
                g.open.insert(key, id);
                while g.records.len() > KEEP {
                    let oldest = g
                        .records
                        .iter()
                        .min_by_key(|(_, (s, _))| *s)
                        .map(|(id, _)| *id);
                    let Some(oldest) = oldest else { break };
                    if let Some((_, r)) = g.records.remove(&oldest) {
                        g.open.remove(&(r.kind, r.detail));
                    }
                }
                id
            }
        };
        let _ = id;
        drop(g);
        self.changed.send_replace(seq);
    }

    /// Records changed after `after`, and the sequence number now.
    pub fn since(&self, after: u64) -> (Vec<Incident>, u64) {
        let g = self.lock();
        let mut changed: Vec<(u64, Incident)> = g
            .records
            .values()
            .filter(|(s, _)| *s > after)
            .cloned()
            .collect();
        changed.sort_by_key(|(s, _)| *s);
        (changed.into_iter().map(|(_, r)| r).collect(), g.seq)
    }

    /// A receiver that wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_one_record_and_records_are_bounded() {
        let i = Incidents::default();
        for _ in 0..100_000 {
            i.record("seccomp", "mount".into(), Some(7), None);
        }
        let (recs, seq) = i.since(0);
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].count, 100_000);
        assert_eq!(i.since(seq).0.len(), 0, "nothing new after the last seq");
        for n in 0..(KEEP + 10) {
            i.record("seccomp", format!("call {n}"), None, None);
        }
        let (recs, _) = i.since(0);
        assert_eq!(recs.len(), KEEP);
        assert!(recs.iter().all(|r| r.detail != "mount"), "the oldest went");
    }
}

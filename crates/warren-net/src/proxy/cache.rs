//! The names the proxy resolved lately, so that a sandbox's many connections to one name
//! (a package manager's downloads) do not each wait for the upstream resolver. Bounded in
//! entries and in time: an answer is kept for its TTL, at most [`MAX_TTL`]; only answers with
//! addresses are kept (a failure or an empty answer is asked again).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::dns::Lookup;

/// The longest an answer is kept, whatever its TTL.
pub(super) const MAX_TTL: Duration = Duration::from_secs(300);
/// How often, at most, a full cache is swept of expired answers.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// An answer and when it expires.
type Entry = (Instant, Lookup);

#[derive(Debug, Default)]
struct Table {
    /// Name → its A and AAAA answers.
    answers: HashMap<String, [Option<Entry>; 2]>,
    last_sweep: Option<Instant>,
}

/// Recent answers, of at most `max` names.
#[derive(Debug)]
pub(super) struct Cache {
    max: usize,
    table: Mutex<Table>,
}

impl Cache {
    /// A cache of at most `max` names' answers (0: none kept).
    pub(super) fn new(max: usize) -> Cache {
        Cache {
            max,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; should it ever, the table is still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer for `name` (A, or AAAA with `v6`), if one is fresh.
    pub(super) fn get(&self, name: &str, v6: bool) -> Option<Lookup> {
        let now = Instant::now();
        let t = self.lock();
        let (expiry, answer) = t.answers.get(name)?[usize::from(v6)].as_ref()?;
        (*expiry > now).then(|| answer.clone())
    }

    /// Keeps `answer` for its TTL (at most [`MAX_TTL`]) when it has addresses and there is
    /// room; a full cache is swept of expired answers first, at most once a second.
    pub(super) fn put(&self, name: &str, v6: bool, answer: &Lookup) {
        if self.max == 0 || answer.addrs.is_empty() || answer.ttl == 0 {
            return;
        }
        let now = Instant::now();
        let life = Duration::from_secs(u64::from(answer.ttl)).min(MAX_TTL);
        let mut t = self.lock();
        if t.answers.len() >= self.max && !t.answers.contains_key(name) {
            let due = t
                .last_sweep
                .is_none_or(|last| now.saturating_duration_since(last) >= SWEEP_EVERY);
            if !due {
                return;
            }
            t.last_sweep = Some(now);
            t.answers.retain(|_, both| {
                both.iter()
                    .any(|e| e.as_ref().is_some_and(|(expiry, _)| *expiry > now))
            });
            if t.answers.len() >= self.max {
                return;
            }
        }
        let both = t.answers.entry(name.to_string()).or_default();
        both[usize::from(v6)] = Some((now + life, answer.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(ttl: u32) -> Lookup {
        Lookup {
            addrs: vec!["198.51.100.1".parse().unwrap()],
            dropped: vec![],
            ttl,
        }
    }

    #[test]
    fn answers_are_kept_per_family_within_the_bound_and_empty_ones_not_at_all() {
        let c = Cache::new(2);
        c.put("a.test", false, &answer(60));
        assert_eq!(c.get("a.test", false), Some(answer(60)));
        assert_eq!(c.get("a.test", true), None, "per family");
        c.put("b.test", false, &answer(60));
        c.put("c.test", false, &answer(60));
        assert_eq!(c.get("c.test", false), None, "full of fresh answers");
        c.put("e.test", false, &Lookup::default());
        assert_eq!(c.get("e.test", false), None, "no addresses, not kept");
        c.put("z.test", false, &answer(0));
        assert_eq!(c.get("z.test", false), None, "TTL 0, not kept");
        let none = Cache::new(0);
        none.put("a.test", false, &answer(60));
        assert_eq!(none.get("a.test", false), None);
    }
}

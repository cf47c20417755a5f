//! Samples, percentiles, and the driver that runs a cycle N times with K in flight.

use std::future::Future;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Durations of one kind of operation.
#[derive(Debug, Default, Clone)]
pub struct Samples(Vec<Duration>);

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Nearest-rank percentile (`p` in 0..=100).
    pub fn pct(&self, p: f64) -> Option<Duration> {
        if self.0.is_empty() {
            return None;
        }
        let mut v = self.0.clone();
        v.sort();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        Some(v[rank.clamp(1, v.len()) - 1])
    }

    pub fn mean(&self) -> Option<Duration> {
        if self.0.is_empty() {
            return None;
        }
        Some(self.0.iter().sum::<Duration>() / self.0.len() as u32)
    }

    /// "p50 / p99 ms", or an em dash without samples.
    pub fn p50_p99(&self) -> String {
        match (self.pct(50.0), self.pct(99.0)) {
            (Some(a), Some(b)) => format!("{} / {} ms", num_ms(a), num_ms(b)),
            _ => "—".into(),
        }
    }
}

/// Milliseconds with two decimals, without the unit.
pub fn num_ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Milliseconds with two decimals and the unit.
pub fn ms(d: Duration) -> String {
    format!("{} ms", num_ms(d))
}

/// How long the parts of one cycle took; a peer that runs in one step fills none of them.
#[derive(Debug, Default, Clone, Copy)]
pub struct Phases {
    pub create: Option<Duration>,
    pub exec: Option<Duration>,
    pub destroy: Option<Duration>,
}

/// The outcome of running a cycle many times.
#[derive(Debug, Default, Clone)]
pub struct CycleStats {
    pub create: Samples,
    pub exec: Samples,
    pub destroy: Samples,
    /// Whole cycles (successful ones only).
    pub cycle: Samples,
    /// Wall time of the phase, from the first start to the last end.
    pub wall: Duration,
    pub ok: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub concurrency: usize,
    /// Host CPU time spent busy (all cores, all processes) during the phase, from /proc/stat.
    pub cpu_busy: Option<Duration>,
    /// CPU time of the bench's own processes during the phase: this process, its reaped
    /// children, and the `warren up` it started (with its reaped children, the sandboxes).
    pub cpu_own: Option<Duration>,
}

impl CycleStats {
    /// Completed creates (or, for one-step peers, completed runs) per second of wall time.
    pub fn creates_per_sec(&self) -> f64 {
        let n = if self.create.len() > 0 {
            self.create.len()
        } else {
            self.ok
        };
        n as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Busy host CPU per completed cycle, and the share of all cores that was busy.
    pub fn cpu(&self) -> Option<(Duration, f64)> {
        let busy = self.cpu_busy?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let share = busy.as_secs_f64() / (self.wall.as_secs_f64() * cores as f64).max(1e-9);
        Some((busy / self.ok.max(1) as u32, share))
    }

    /// The bench's own processes' CPU per completed cycle.
    pub fn cpu_own_per_cycle(&self) -> Option<Duration> {
        Some(self.cpu_own? / self.ok.max(1) as u32)
    }

    /// "N ok" or "N ok, E failed (first: …)".
    pub fn count(&self) -> String {
        match (&self.first_error, self.errors) {
            (_, 0) => format!("{} ok", self.ok),
            (Some(e), n) => format!("{} ok, {n} failed (first: {})", self.ok, short(e, 100)),
            (None, n) => format!("{} ok, {n} failed", self.ok),
        }
    }
}

/// Cuts `s` to `max` characters, on one line.
pub fn short(s: &str, max: usize) -> String {
    let one: String = s.replace(['\n', '\r'], " ").replace('|', "/");
    if one.chars().count() <= max {
        one
    } else {
        let mut t: String = one.chars().take(max).collect();
        t.push('…');
        t
    }
}

/// The longest one cycle may take before it counts as failed, so that a hung request cannot
/// hang the bench.
pub const CYCLE_TIMEOUT: Duration = Duration::from_secs(60);

/// `fut`, or an error once [`CYCLE_TIMEOUT`] has passed.
pub async fn bounded<T>(fut: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    match tokio::time::timeout(CYCLE_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => anyhow::bail!("no answer within {} s (hung)", CYCLE_TIMEOUT.as_secs()),
    }
}

/// Runs `warmup` cycles one at a time (not recorded; the first error aborts), then `n` cycles
/// with `concurrency` in flight. `f(worker, index)` runs one cycle; `worker` is below
/// `concurrency`, so a cycle may use per-worker resources.
pub async fn run_cycles<F, Fut>(
    warmup: usize,
    n: usize,
    concurrency: usize,
    f: F,
) -> Result<CycleStats, String>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<Phases>> + Send + 'static,
{
    for i in 0..warmup {
        bounded(f(0, usize::MAX - i))
            .await
            .map_err(|e| format!("{e:#}"))?;
    }
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let out = Arc::new(Mutex::new(CycleStats {
        concurrency,
        ..Default::default()
    }));
    let cpu0 = cpu_busy();
    let own0 = cpu_own();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency.min(n).max(1) {
        let (f, next, out) = (f.clone(), next.clone(), out.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t = Instant::now();
                let r = bounded(f(w, i)).await;
                let took = t.elapsed();
                let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                match r {
                    Ok(p) => {
                        o.ok += 1;
                        o.cycle.push(took);
                        if let Some(d) = p.create {
                            o.create.push(d);
                        }
                        if let Some(d) = p.exec {
                            o.exec.push(d);
                        }
                        if let Some(d) = p.destroy {
                            o.destroy.push(d);
                        }
                    }
                    Err(e) => {
                        o.errors += 1;
                        if o.first_error.is_none() {
                            o.first_error = Some(format!("{e:#}"));
                        }
                        // Everything failing: stop instead of hammering.
                        if o.ok == 0 && o.errors >= 10 {
                            next.store(n, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = start.elapsed();
    let cpu1 = cpu_busy();
    let own1 = cpu_own();
    let mut o = out.lock().unwrap_or_else(|p| p.into_inner()).clone();
    o.wall = wall;
    o.cpu_busy = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    o.cpu_own = match (own0, own1) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    if o.ok == 0 {
        return Err(o
            .first_error
            .unwrap_or_else(|| "no cycle completed".to_string()));
    }
    Ok(o)
}

/// The `warren up` this bench runs, whose CPU counts as the bench's own (0: none).
pub static DAEMON_PID: AtomicI32 = AtomicI32::new(0);

/// utime + stime + cutime + cstime of a process, from /proc/<pid>/stat.
fn process_cpu(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')' comes field 3 (state); utime is field 14, cstime field 17.
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(14 - 3)
        .take(4)
        .filter_map(|x| x.parse().ok())
        .collect();
    (f.len() == 4).then(|| Duration::from_millis(f.iter().sum::<u64>() * 10))
}

/// CPU time of this process and its reaped children, plus the daemon's (see [`DAEMON_PID`]).
pub fn cpu_own() -> Option<Duration> {
    let mut t = process_cpu("self")?;
    let d = DAEMON_PID.load(Ordering::Relaxed);
    if d > 0 {
        t += process_cpu(&d.to_string())?;
    }
    Some(t)
}

/// Busy CPU time of the whole host since boot (all cores; idle and iowait excluded).
pub fn cpu_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    let busy: u64 = v.iter().take(8).sum::<u64>() - v.get(3)? - v.get(4)?;
    // USER_HZ is 100 on every Linux architecture Warren runs on.
    Some(Duration::from_millis(busy * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = Samples::default();
        for i in 1..=100 {
            s.push(Duration::from_millis(i));
        }
        assert_eq!(s.pct(50.0), Some(Duration::from_millis(50)));
        assert_eq!(s.pct(99.0), Some(Duration::from_millis(99)));
        assert_eq!(s.pct(100.0), Some(Duration::from_millis(100)));
        assert_eq!(s.pct(0.0), Some(Duration::from_millis(1)));
        assert_eq!(Samples::default().pct(50.0), None);
    }

    #[test]
    fn short_cuts_and_flattens() {
        assert_eq!(short("a|b\nc", 10), "a/b c");
        assert_eq!(short("abcdef", 3), "abc…");
    }
}

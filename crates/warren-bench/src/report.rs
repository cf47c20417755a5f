//! The printed report: Markdown tables, one per measurement group.

use std::fmt::Write as _;
use std::time::Duration;

use crate::Plan;
use crate::host::Machine;
use crate::peers::{PeerIdle, PeerResults};
use crate::stats::{CycleStats, ms, num_ms, short};
use crate::warren_lib::LibResults;
use crate::warren_rest::{IdleMemory, RestResults};

/// Everything one run measured.
pub struct Results {
    pub rest: Result<RestResults, String>,
    pub lib: Result<LibResults, String>,
    pub lib_cold: Result<LibResults, String>,
    pub plain: PeerResults,
    pub plain_exec: Result<CycleStats, String>,
    pub bwrap: PeerResults,
    pub runc: Result<PeerResults, String>,
    pub bwrap_idle: Result<PeerIdle, String>,
    pub took: Duration,
    /// /proc/loadavg's 1-, 5- and 15-minute figures when the run ended.
    pub loadavg_end: String,
}

/// The project's targets.
const TARGET_CREATE_P50: Duration = Duration::from_millis(5);
const TARGET_EXEC_P50: Duration = Duration::from_millis(2);
const TARGET_CREATES_PER_SEC: f64 = 200.0;

type Cell<'a> = Result<&'a CycleStats, String>;

fn flat<'a, T>(
    r: &'a Result<T, String>,
    pick: impl Fn(&'a T) -> &'a Result<CycleStats, String>,
) -> Cell<'a> {
    match r {
        Ok(t) => pick(t).as_ref().map_err(Clone::clone),
        Err(e) => Err(e.clone()),
    }
}

fn direct(r: &Result<CycleStats, String>) -> Cell<'_> {
    r.as_ref().map_err(Clone::clone)
}

/// The cell of a row: the value, or on the first row of a failed column the reason.
fn cell<T>(r: &Result<T, String>, first: bool, f: impl Fn(&T) -> String) -> String {
    match r {
        Ok(v) => f(v),
        Err(e) if first => format!("did not run here: {}", short(e, 160)),
        Err(_) => "—".into(),
    }
}

fn table(out: &mut String, head: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        head.iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---|" } else { "---:|" })
            .collect::<String>()
    );
    for r in rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}

fn bytes(b: f64) -> String {
    if b.abs() >= 10.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}

fn ratio(a: Option<Duration>, b: Option<Duration>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if !b.is_zero() => {
            format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64())
        }
        _ => "n/a".into(),
    }
}

fn p50(c: &Cell<'_>, pick: impl Fn(&CycleStats) -> &crate::stats::Samples) -> Option<Duration> {
    c.as_ref().ok().and_then(|s| pick(s).pct(50.0))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "meets" } else { "misses" }
}

pub fn render(plan: &Plan, m: &Machine, r: &Results) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# warren-bench ({})\n",
        if plan.quick { "--quick" } else { "full run" }
    );
    let _ = writeln!(
        o,
        "- machine: {} cores, kernel {}, {}, {:.1} GiB RAM, cgroups {}; load average {} at \
         the start, {} at the end",
        m.nproc,
        m.kernel,
        m.os,
        m.mem_total as f64 / (1u64 << 30) as f64,
        m.cgroups,
        m.loadavg,
        r.loadavg_end
    );
    match m.busy_before {
        Some(b) if b > 0.2 => {
            let _ = writeln!(
                o,
                "- **other work was running**: {:.0} % of all cores were busy in the second \
                 before the run, so latencies and rates are pessimistic and noisy; the \
                 \"whole host\" CPU rows show how busy the machine was in each phase.",
                b * 100.0
            );
        }
        Some(b) => {
            let _ = writeln!(
                o,
                "- {:.0} % of all cores were busy in the second before the run.",
                b * 100.0
            );
        }
        None => {}
    }
    let _ = writeln!(o, "- peers: {}; {}", m.bwrap, m.runc);
    let _ = writeln!(
        o,
        "- sizes: {} cycles at concurrency 1, {} at concurrency {}; {} exec round trips; {} idle \
         Warren sandboxes (created {} at a time); {} idle bwrap instances; {} unrecorded warm-up \
         cycles before each timed phase. Percentiles are nearest-rank. The whole run took {:.0} s.",
        plan.n_c1,
        plan.n_cn,
        plan.conc,
        plan.n_exec,
        plan.n_idle,
        plan.idle_conc,
        plan.n_peer_idle,
        plan.warmup,
        r.took.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "- same root everywhere: host /usr read-only, /bin, /lib… as on the host, /proc, /dev, \
         a tmpfs /tmp. Warren's `host` image adds an overlay writable layer and a minimal /etc; \
         Warren sandboxes get 64 MiB memory limits and new pid, mount, uts, ipc, net and cgroup \
         namespaces; bwrap runs with `--unshare-all`, runc with the namespaces of `runc spec`.\n"
    );

    let runc_part = |pick: fn(&PeerResults) -> &Result<CycleStats, String>| -> Cell<'_> {
        match &r.runc {
            Ok(p) => direct(pick(p)),
            Err(e) => Err(e.clone()),
        }
    };
    let rest_c1 = flat(&r.rest, |x| &x.c1);
    let lib_c1 = flat(&r.lib, |x| &x.c1);
    let cold_c1 = flat(&r.lib_cold, |x| &x.c1);
    let runc_c1 = runc_part(|p| &p.c1);
    let bwrap_c1 = direct(&r.bwrap.c1);
    let plain_c1 = direct(&r.plain.c1);
    let rest_cn = flat(&r.rest, |x| &x.cn);
    let lib_cn = flat(&r.lib, |x| &x.cn);
    let cold_cn = flat(&r.lib_cold, |x| &x.cn);
    let runc_cn = runc_part(|p| &p.cn);
    let bwrap_cn = direct(&r.bwrap.cn);
    let plain_cn = direct(&r.plain.cn);

    let warm_of = |x: &Result<usize, String>| match x {
        Ok(n) => format!("{n}"),
        Err(_) => "?".into(),
    };
    let _ = writeln!(
        o,
        "- Warren's warm pool (inits started ahead of requests; their cgroups are named `warm-…`): \
         {} held by `warren up` after it settled, {} by the in-process node with default settings, \
         {} by the node configured with `warm_pool = 0` (\"no pool\" column: every create takes \
         the whole path). Before each timed phase the bench waits for the pool to stop changing.\n",
        warm_of(&r.rest.as_ref().map(|x| x.warm_pool).map_err(Clone::clone)),
        warm_of(&r.lib.as_ref().map(|x| x.warm_pool).map_err(Clone::clone)),
        warm_of(
            &r.lib_cold
                .as_ref()
                .map(|x| x.warm_pool)
                .map_err(Clone::clone)
        ),
    );

    let head = [
        "what",
        "warren (REST)",
        "warren (node lib)",
        "warren (node lib, no pool)",
        "bwrap",
        "runc",
        "plain spawn of `true` (floor)",
        "target",
    ];
    // Columns: the first three are Warren's (they have create / exec / destroy phases).
    let rows_for = |cols: &[&Cell<'_>; 6],
                    first: bool,
                    f: &dyn Fn(&CycleStats) -> String,
                    warren_only: bool| {
        cols.iter()
            .enumerate()
            .map(|(i, c)| {
                if warren_only && i >= 3 {
                    cell(c, first, |_| "—".into())
                } else {
                    cell(c, first, |s| f(s))
                }
            })
            .collect::<Vec<String>>()
    };
    let row = |label: &str, cells: Vec<String>, target: &str| {
        let mut v = vec![label.to_string()];
        v.extend(cells);
        v.push(target.to_string());
        v
    };

    // 1. One at a time.
    let _ = writeln!(
        o,
        "## Create → first exec of `true` → destroy, one at a time (N = {})\n",
        plan.n_c1
    );
    let cols1 = [&rest_c1, &lib_c1, &cold_c1, &bwrap_c1, &runc_c1, &plain_c1];
    let rows = vec![
        row(
            "create → ready, p50 / p99",
            rows_for(&cols1, true, &|s| s.create.p50_p99(), true),
            "p50 ≤ 5 ms",
        ),
        row(
            "first exec, p50 / p99",
            rows_for(&cols1, false, &|s| s.exec.p50_p99(), true),
            "",
        ),
        row(
            "destroy, p50 / p99",
            rows_for(&cols1, false, &|s| s.destroy.p50_p99(), true),
            "",
        ),
        row(
            "whole cycle, p50 / p99",
            rows_for(&cols1, false, &|s| s.cycle.p50_p99(), false),
            "",
        ),
        row(
            "whole cycle, mean",
            rows_for(
                &cols1,
                false,
                &|s| s.cycle.mean().map(ms).unwrap_or_default(),
                false,
            ),
            "",
        ),
        row(
            "CPU per cycle, the bench's own processes (see below)",
            rows_for(&cols1, false, &own_cpu_cell, false),
            "",
        ),
        row(
            "CPU per cycle, whole host (share of all cores busy)",
            rows_for(&cols1, false, &cpu_cell, false),
            "",
        ),
        row("cycles", rows_for(&cols1, false, &|s| s.count(), false), ""),
    ];
    table(&mut o, &head, &rows);
    let cyc = |c: &Cell<'_>| p50(c, |s| &s.cycle);
    let _ = writeln!(
        o,
        "CPU rows: \"own processes\" is user + system time of this bench, the children it reaped \
         (bwrap, runc, in-process sandboxes) and the `warren up` it started with the sandboxes \
         that one reaped (a sandbox's CPU arrives when it ends: warm-pool inits \
         still alive and the exec table's sandbox are not in it); kernel work done in worker \
         threads (e.g. tearing network namespaces down) shows only in \"whole host\", which also \
         counts anything else running on the machine. Both have 10 ms resolution.\n"
    );
    let _ = writeln!(
        o,
        "For bwrap, runc and the plain spawn a cycle is one command run to exit (runc: `runc run`, \
         which creates, starts, waits and deletes). Whole cycle p50: warren (REST) = {} bwrap, {} \
         runc; warren (node lib) = {} bwrap, {} runc; without the pool = {} bwrap, {} runc. REST \
         over node lib: {} (create {}, exec {}, destroy {}). Pool vs no pool, create p50: {} vs {}.\n",
        ratio(cyc(&rest_c1), cyc(&bwrap_c1)),
        ratio(cyc(&rest_c1), cyc(&runc_c1)),
        ratio(cyc(&lib_c1), cyc(&bwrap_c1)),
        ratio(cyc(&lib_c1), cyc(&runc_c1)),
        ratio(cyc(&cold_c1), cyc(&bwrap_c1)),
        ratio(cyc(&cold_c1), cyc(&runc_c1)),
        diff(cyc(&rest_c1), cyc(&lib_c1)),
        diff(p50(&rest_c1, |s| &s.create), p50(&lib_c1, |s| &s.create)),
        diff(p50(&rest_c1, |s| &s.exec), p50(&lib_c1, |s| &s.exec)),
        diff(p50(&rest_c1, |s| &s.destroy), p50(&lib_c1, |s| &s.destroy)),
        opt_ms(p50(&lib_c1, |s| &s.create)),
        opt_ms(p50(&cold_c1, |s| &s.create)),
    );

    // 2. Concurrently.
    let _ = writeln!(
        o,
        "## The same cycle, {} in flight (N = {})\n",
        plan.conc, plan.n_cn
    );
    let colsn = [&rest_cn, &lib_cn, &cold_cn, &bwrap_cn, &runc_cn, &plain_cn];
    let rows = vec![
        row(
            "creates/s (completed creates ÷ wall time; peers: runs/s)",
            rows_for(
                &colsn,
                true,
                &|s| format!("{:.0}", s.creates_per_sec()),
                false,
            ),
            "≥ 200 creates/s",
        ),
        row(
            "create → ready, p50 / p99",
            rows_for(&colsn, false, &|s| s.create.p50_p99(), true),
            "",
        ),
        row(
            "whole cycle, p50 / p99",
            rows_for(&colsn, false, &|s| s.cycle.p50_p99(), false),
            "",
        ),
        row(
            "wall time of the phase",
            rows_for(&colsn, false, &|s| ms(s.wall), false),
            "",
        ),
        row(
            "CPU per cycle, the bench's own processes (see below)",
            rows_for(&colsn, false, &own_cpu_cell, false),
            "",
        ),
        row(
            "CPU per cycle, whole host (share of all cores busy)",
            rows_for(&colsn, false, &cpu_cell, false),
            "",
        ),
        row("cycles", rows_for(&colsn, false, &|s| s.count(), false), ""),
    ];
    table(&mut o, &head, &rows);
    let rate = |c: &Cell<'_>| c.as_ref().ok().map(|s| s.creates_per_sec());
    let rr = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "n/a".into(),
    };
    let _ = writeln!(
        o,
        "Throughput: warren (REST) = {} bwrap's, {} runc's; warren (node lib) = {} bwrap's, {} \
         runc's; without the pool = {} bwrap's, {} runc's. With {} cores and the CPU near 100 % \
         busy, throughput is about cores ÷ CPU per cycle.\n",
        rr(rate(&rest_cn), rate(&bwrap_cn)),
        rr(rate(&rest_cn), rate(&runc_cn)),
        rr(rate(&lib_cn), rate(&bwrap_cn)),
        rr(rate(&lib_cn), rate(&runc_cn)),
        rr(rate(&cold_cn), rate(&bwrap_cn)),
        rr(rate(&cold_cn), rate(&runc_cn)),
        m.nproc,
    );

    // 3. Exec round trip.
    let rest_ex = flat(&r.rest, |x| &x.exec);
    let lib_ex = flat(&r.lib, |x| &x.exec);
    let plain_ex = direct(&r.plain_exec);
    let _ = writeln!(
        o,
        "## Exec round trip of `true` in one warm sandbox (N = {})\n",
        plan.n_exec
    );
    let colse = [&rest_ex, &lib_ex, &plain_ex];
    let rows_e = |first: bool, f: &dyn Fn(&CycleStats) -> String| {
        colse
            .iter()
            .map(|c| cell(c, first, |s| f(s)))
            .collect::<Vec<_>>()
    };
    let rows = vec![
        row(
            "p50 / p99",
            rows_e(true, &|s| s.cycle.p50_p99()),
            "p50 ≤ 2 ms",
        ),
        row(
            "mean",
            rows_e(false, &|s| s.cycle.mean().map(ms).unwrap_or_default()),
            "",
        ),
        row(
            "CPU per exec, the bench's own processes",
            rows_e(false, &own_cpu_cell),
            "",
        ),
        row(
            "CPU per exec, whole host (share of all cores busy)",
            rows_e(false, &cpu_cell),
            "",
        ),
        row("runs", rows_e(false, &|s| s.count()), ""),
    ];
    table(
        &mut o,
        &[
            "what",
            "warren (REST)",
            "warren (node lib)",
            "plain spawn of `true` on the host (floor)",
            "target",
        ],
        &rows,
    );
    let _ = writeln!(
        o,
        "REST over node lib: {} per exec (p50); node lib over a plain spawn: {}.\n",
        diff(cyc(&rest_ex), cyc(&lib_ex)),
        diff(cyc(&lib_ex), cyc(&plain_ex)),
    );

    // 4. A layered image's creates beside `host`'s.
    render_layered(&mut o, r);

    // 5. Idle memory.
    render_idle(&mut o, plan, r);

    // Targets.
    let _ = writeln!(o, "## Targets\n");
    let mut rows = Vec::new();
    let create_p50 = |c: &Cell<'_>| p50(c, |s| &s.create);
    let meets = |v: Option<Duration>, t: Duration| match v {
        Some(v) => format!("{} ({})", ms(v), verdict(v <= t)),
        None => "not measured".into(),
    };
    rows.push(vec![
        "create → ready p50 ≤ 5 ms (one at a time)".to_string(),
        meets(create_p50(&rest_c1), TARGET_CREATE_P50),
        meets(create_p50(&lib_c1), TARGET_CREATE_P50),
        meets(create_p50(&cold_c1), TARGET_CREATE_P50),
    ]);
    rows.push(vec![
        "exec round trip p50 ≤ 2 ms".to_string(),
        meets(cyc(&rest_ex), TARGET_EXEC_P50),
        meets(cyc(&lib_ex), TARGET_EXEC_P50),
        meets(
            flat(&r.lib_cold, |x| &x.exec)
                .as_ref()
                .ok()
                .and_then(|s| s.cycle.pct(50.0)),
            TARGET_EXEC_P50,
        ),
    ]);
    let rate_cell = |c: &Cell<'_>| match rate(c) {
        Some(v) => format!("{v:.0}/s ({})", verdict(v >= TARGET_CREATES_PER_SEC)),
        None => "not measured".into(),
    };
    rows.push(vec![
        format!(
            "≥ 200 creates/s at concurrency {}, whole create → exec → destroy cycles",
            plan.conc
        ),
        rate_cell(&rest_cn),
        rate_cell(&lib_cn),
        rate_cell(&cold_cn),
    ]);
    let bulk = match r.rest.as_ref().map(|x| x.idle.as_ref()) {
        Ok(Ok(i)) => {
            let v = i.create_lat.len() as f64 / i.create_wall.as_secs_f64().max(1e-9);
            format!("{v:.0}/s ({})", verdict(v >= TARGET_CREATES_PER_SEC))
        }
        _ => "not measured".into(),
    };
    rows.push(vec![
        format!(
            "≥ 200 creates/s at concurrency {}, creates alone ({} sandboxes, pool drained after the first 16)",
            plan.idle_conc, plan.n_idle
        ),
        bulk,
        "—".into(),
        "—".into(),
    ]);
    table(
        &mut o,
        &[
            "target",
            "warren (REST)",
            "warren (node lib)",
            "warren (node lib, no pool)",
        ],
        &rows,
    );

    // Notes: failures in full, and cleanup problems.
    let mut notes: Vec<String> = Vec::new();
    let mut failed = |what: &str, c: &Cell<'_>| {
        if let Err(e) = c {
            notes.push(format!("{what} did not run here: {e}"));
        } else if let Ok(s) = c
            && let Some(e) = &s.first_error
        {
            notes.push(format!("{what}: {} failed; the first: {e}", s.errors));
        }
    };
    failed("warren (REST), concurrency 1", &rest_c1);
    failed("warren (REST), concurrency N", &rest_cn);
    failed("warren (REST), exec", &rest_ex);
    failed("warren (node lib), concurrency 1", &lib_c1);
    failed("warren (node lib), concurrency N", &lib_cn);
    failed("warren (node lib), exec", &lib_ex);
    failed("warren (node lib, no pool), concurrency 1", &cold_c1);
    failed("warren (node lib, no pool), concurrency N", &cold_cn);
    failed("bwrap, concurrency 1", &bwrap_c1);
    failed("bwrap, concurrency N", &bwrap_cn);
    failed("runc, concurrency 1", &runc_c1);
    failed("runc, concurrency N", &runc_cn);
    failed("plain spawn", &plain_c1);
    if let Ok(x) = &r.rest {
        notes.extend(x.notes.iter().cloned());
        if let Err(e) = &x.idle {
            notes.push(format!("idle Warren sandboxes did not run here: {e}"));
        }
    }
    if let Ok(x) = &r.lib {
        notes.extend(x.notes.iter().cloned());
    }
    if let Ok(x) = &r.lib_cold {
        notes.extend(x.notes.iter().cloned());
    }
    if let Err(e) = &r.bwrap_idle {
        notes.push(format!("idle bwrap did not run here: {e}"));
    }
    if !notes.is_empty() {
        let _ = writeln!(o, "## Notes\n");
        for n in notes {
            let _ = writeln!(o, "- {}", n.replace('\n', " / "));
        }
        o.push('\n');
    }
    o
}

fn own_cpu_cell(s: &CycleStats) -> String {
    s.cpu_own_per_cycle()
        .map(ms)
        .unwrap_or_else(|| "n/a".into())
}

fn cpu_cell(s: &CycleStats) -> String {
    match s.cpu() {
        Some((per, share)) => format!("{} ({:.0} %)", ms(per), share * 100.0),
        None => "n/a".into(),
    }
}

/// A MemAvailable drop; a rise means something else on the host freed memory meanwhile.
fn avail_cell(d: Option<f64>) -> String {
    match d {
        Some(d) if d > 0.0 => bytes(d),
        Some(d) => format!(
            "n/a: MemAvailable rose by {} per instance (other activity on the host)",
            bytes(-d)
        ),
        None => "n/a".into(),
    }
}

fn opt_ms(d: Option<Duration>) -> String {
    d.map(ms).unwrap_or_else(|| "n/a".into())
}

fn diff(a: Option<Duration>, b: Option<Duration>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => {
            let d = a.as_secs_f64() - b.as_secs_f64();
            format!(
                "{}{:.2} ms",
                if d >= 0.0 { "+" } else { "−" },
                d.abs() * 1e3
            )
        }
        _ => "n/a".into(),
    }
}

fn render_layered(o: &mut String, r: &Results) {
    let _ = writeln!(
        o,
        "\n### Creates of a layered image beside `host` (REST, alternating, create only)\n"
    );
    match r.rest.as_ref().map(|x| x.layered.as_ref()) {
        Ok(Ok(l)) => {
            let (h, y) = (l.host.pct(50.0), l.layered.pct(50.0));
            table(
                o,
                &["image", "create p50 / p99", "vs host (p50)", "target"],
                &[
                    vec![
                        "host".into(),
                        l.host.p50_p99(),
                        "1.00×".into(),
                        String::new(),
                    ],
                    vec![
                        "layered (busybox, one layer)".into(),
                        l.layered.p50_p99(),
                        ratio(y, h),
                        format!(
                            "≤ 1.5× {}",
                            verdict(
                                matches!((y, h), (Some(y), Some(h)) if y.as_secs_f64() <= 1.5 * h.as_secs_f64())
                            )
                        ),
                    ],
                ],
            );
        }
        Ok(Err(e)) | Err(e) => {
            let _ = writeln!(o, "not measured: {e}");
        }
    }
}

fn render_idle(o: &mut String, plan: &Plan, r: &Results) {
    let idle: Result<&IdleMemory, String> = match &r.rest {
        Ok(x) => x.idle.as_ref().map_err(Clone::clone),
        Err(e) => Err(e.clone()),
    };
    let peer = r.bwrap_idle.as_ref().map_err(Clone::clone);
    let _ = writeln!(
        o,
        "## Idle instances: memory, and bulk create / kill ({} Warren sandboxes, {} bwrap `sleep infinity`)\n",
        plan.n_idle, plan.n_peer_idle
    );
    let mut rows = Vec::new();
    rows.push(vec![
        "instances running".to_string(),
        cell(&idle, true, |i| {
            let mut s = format!("{} of {}", i.made, i.wanted);
            if let Some(e) = &i.first_error {
                let _ = write!(s, " ({} failed: {})", i.create_errors, short(e, 100));
            }
            s
        }),
        cell(&peer, true, |p| format!("{} of {}", p.running, p.wanted)),
    ]);
    rows.push(vec![
        "host MemAvailable drop per instance".to_string(),
        cell(&idle, false, |i| avail_cell(i.mem_available_drop)),
        cell(&peer, false, |p| avail_cell(p.mem_available_drop)),
    ]);
    rows.push(vec![
        "memory cgroup usage per instance, mean".to_string(),
        cell(&idle, false, |i| match i.cgroup_usage {
            Some((m, n)) => format!("{} (n = {n})", bytes(m as f64)),
            None => "n/a".into(),
        }),
        cell(&peer, false, |p| match p.cgroup_usage {
            Some(u) => format!(
                "{} (one cgroup for all {}, divided)",
                bytes(u as f64),
                p.wanted
            ),
            None => "n/a (could not make a memory cgroup)".into(),
        }),
    ]);
    rows.push(vec![
        "RSS: Warren's PID 1 (warren-guest), mean / bwrap: sum over an instance's processes, mean"
            .to_string(),
        cell(&idle, false, |i| match i.guest_rss {
            Some((m, n)) => format!("{} (n = {n})", bytes(m as f64)),
            None => "n/a".into(),
        }),
        cell(&peer, false, |p| match p.tree_rss {
            Some(m) => format!(
                "{} ({:.1} processes each)",
                bytes(m as f64),
                p.procs_per_instance
            ),
            None => "n/a".into(),
        }),
    ]);
    rows.push(vec![
        "warm-pool inits alive meanwhile (in MemAvailable before and after; not counted)"
            .to_string(),
        cell(&idle, false, |i| format!("{}", i.warm_inits)),
        "—".into(),
    ]);
    rows.push(vec![
        "`warren up` RSS growth per sandbox".to_string(),
        cell(&idle, false, |i| {
            i.daemon_rss_growth.map(bytes).unwrap_or("n/a".into())
        }),
        "—".into(),
    ]);
    rows.push(vec![
        format!(
            "bulk create, {} in flight: creates/s; create p50 / p99",
            plan.idle_conc
        ),
        cell(&idle, false, |i| {
            format!(
                "{:.0}/s; {}",
                i.create_lat.len() as f64 / i.create_wall.as_secs_f64().max(1e-9),
                i.create_lat.p50_p99()
            )
        }),
        "—".into(),
    ]);
    rows.push(vec![
        "kill all: wall time, kills/s".to_string(),
        cell(&idle, false, |i| {
            let mut s = format!(
                "{}, {:.0}/s",
                ms(i.kill_wall),
                i.killed as f64 / i.kill_wall.as_secs_f64().max(1e-9)
            );
            if i.kill_errors > 0 {
                let _ = write!(s, " ({} failed)", i.kill_errors);
            }
            s
        }),
        cell(&peer, false, |p| {
            format!(
                "{}, {:.0}/s (SIGKILL to each bwrap, then wait)",
                ms(p.kill_wall),
                p.wanted as f64 / p.kill_wall.as_secs_f64().max(1e-9)
            )
        }),
    ]);
    table(
        o,
        &["what", "warren (REST)", "bwrap (`sleep infinity`)"],
        &rows,
    );
    if let (Ok(i), Ok(p)) = (&idle, &peer) {
        let cg = match (i.cgroup_usage, p.cgroup_usage) {
            (Some((a, _)), Some(b)) if b > 0 => format!("{:.2}×", a as f64 / b as f64),
            _ => "n/a".into(),
        };
        let avail = match (i.mem_available_drop, p.mem_available_drop) {
            (Some(a), Some(b)) if a > 0.0 && b > 0.0 => format!("{:.2}×", a / b),
            _ => "n/a".into(),
        };
        let _ = writeln!(
            o,
            "Per idle instance, warren ÷ bwrap: memory cgroup usage {cg}, MemAvailable drop \
             {avail}. The cgroup figures are the steadier ones (they also count reclaimable \
             kernel caches such as dentries and inodes, which MemAvailable treats as \
             available); MemAvailable is host-wide, so anything else running moves it, and it \
             includes kernel memory no cgroup is charged for (and, for Warren, the daemon's \
             growth). Kill p50 one at a time (first table): {} \
             (REST).\n",
            match &r.rest {
                Ok(x) =>
                    x.c1.as_ref()
                        .ok()
                        .and_then(|s| s.destroy.pct(50.0))
                        .map(|d| format!("{} ms", num_ms(d)))
                        .unwrap_or("n/a".into()),
                Err(_) => "n/a".into(),
            }
        );
    }
}

//! cgroups for sandboxes, v1 and v2, detected at run time.
//!
//! Warren creates one parent of its own in each hierarchy it uses (`<mount>/<parent>`, default
//! `warren`) and every sandbox's cgroup under it. It never writes to, freezes or removes a
//! cgroup it did not create.
//!
//! - **v2** (unified, most production hosts): one directory; `cpu.max`, `memory.max`,
//!   `pids.max`, `cgroup.freeze`, `cgroup.kill`. A new init starts inside it through
//!   `CLONE_INTO_CGROUP`.
//! - **v1** (and hybrid, like the development machines): a directory per controller (cpu,
//!   memory, pids, freezer, and the `name=systemd` hierarchy when present, so a service
//!   manager stopping the daemon's unit cannot take sandboxes with it; only where systemd
//!   runs). A new init joins them
//!   by writing to each `cgroup.procs` before it execs.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warren_types::api::{QosClass, Resources};

/// CFS period used for CPU limits, microseconds.
const CPU_PERIOD_US: u64 = 100_000;

/// Which cgroup layout the host has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Everything on the unified hierarchy.
    V2 {
        /// Where cgroup2 is mounted.
        root: PathBuf,
    },
    /// Controllers on v1 hierarchies (possibly with a cgroup2 mount for others: hybrid).
    V1 {
        cpu: PathBuf,
        memory: PathBuf,
        pids: PathBuf,
        freezer: PathBuf,
        /// The `name=systemd` hierarchy, if mounted.
        systemd: Option<PathBuf>,
        /// Whether a cgroup2 hierarchy is also mounted.
        hybrid: bool,
    },
}

impl Layout {
    /// `v1`, `v2` or `hybrid`.
    pub fn name(&self) -> &'static str {
        match self {
            Layout::V2 { .. } => "v2",
            Layout::V1 { hybrid: true, .. } => "hybrid",
            Layout::V1 { .. } => "v1",
        }
    }

    /// Detects the layout from `/proc/self/mountinfo`.
    pub fn detect() -> io::Result<Layout> {
        let info = fs::read_to_string("/proc/self/mountinfo")?;
        Self::from_mountinfo(&info, |p| {
            fs::read_to_string(p.join("cgroup.controllers")).ok()
        })
    }

    fn from_mountinfo(
        info: &str,
        controllers: impl Fn(&Path) -> Option<String>,
    ) -> io::Result<Layout> {
        let mut v1: Vec<(PathBuf, Vec<String>)> = Vec::new();
        let mut v2: Option<PathBuf> = None;
        for line in info.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).unwrap_or_default();
            let mut r = right.split(' ');
            let fstype = r.next().unwrap_or_default();
            let _source = r.next();
            let opts = r.next().unwrap_or_default();
            match fstype {
                "cgroup2" => v2 = Some(PathBuf::from(mount_point)),
                "cgroup" => v1.push((
                    PathBuf::from(mount_point),
                    opts.split(',').map(str::to_string).collect(),
                )),
                _ => {}
            }
        }
        if let Some(root) = &v2 {
            let ctrls = controllers(root).unwrap_or_default();
            let has = |c: &str| ctrls.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") && has("cpu") {
                return Ok(Layout::V2 { root: root.clone() });
            }
        }
        let find = |name: &str| {
            v1.iter()
                .find(|(_, opts)| opts.iter().any(|o| o == name))
                .map(|(p, _)| p.clone())
        };
        let missing = |c: &str| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no usable cgroup {c} controller: mount cgroup2 with cpu, memory and pids, or the v1 {c} hierarchy"
                ),
            )
        };
        Ok(Layout::V1 {
            cpu: find("cpu").ok_or_else(|| missing("cpu"))?,
            memory: find("memory").ok_or_else(|| missing("memory"))?,
            pids: find("pids").ok_or_else(|| missing("pids"))?,
            freezer: find("freezer").ok_or_else(|| missing("freezer"))?,
            // Only where systemd runs: its hierarchy is what lets a stop of the daemon's unit
            // spare the sandboxes; elsewhere it would be one more cgroup per sandbox for nothing.
            systemd: find("name=systemd").filter(|_| Path::new("/run/systemd/system").is_dir()),
            hybrid: v2.is_some(),
        })
    }

    /// Every directory that makes up the cgroup of sandbox `name` under `parent`.
    fn dirs(&self, parent: &str, name: &str) -> Vec<PathBuf> {
        self.parents(parent)
            .into_iter()
            .map(|p| p.join(name))
            .collect()
    }

    /// Warren's parent directory in every hierarchy it uses.
    fn parents(&self, parent: &str) -> Vec<PathBuf> {
        match self {
            Layout::V2 { root } => vec![root.join(parent)],
            Layout::V1 {
                cpu,
                memory,
                pids,
                freezer,
                systemd,
                ..
            } => {
                let mut v = vec![
                    cpu.join(parent),
                    memory.join(parent),
                    pids.join(parent),
                    freezer.join(parent),
                ];
                if let Some(s) = systemd {
                    v.push(s.join(parent));
                }
                v
            }
        }
    }
}

/// Warren's cgroups on this host.
#[derive(Debug, Clone)]
pub struct Cgroups {
    pub layout: Layout,
    parent: String,
    /// Whether best-effort sandboxes' cgroups are made idle (the backend sets it from its
    /// probe and the node's `qos_cpu_idle`). Default false.
    pub use_idle: bool,
}

/// A sandbox's cgroup (one directory per hierarchy).
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    layout: Layout,
    dirs: Vec<PathBuf>,
    /// Whether best-effort cgroups are made idle (`cpu.idle`); else the knob is left at 0.
    use_idle: bool,
}

/// What a new init needs to start inside its cgroup.
pub enum JoinFds {
    /// v1: `cgroup.procs` of each hierarchy, to write "0" into.
    Procs(Vec<OwnedFd>),
    /// v2: the directory, for `CLONE_INTO_CGROUP`.
    Dir(OwnedFd),
}

/// Makes a cgroup idle (or not) where the kernel has `cpu.idle`; without it, nothing.
fn write_idle(dir: &Path, idle: bool) -> io::Result<()> {
    let f = dir.join("cpu.idle");
    match fs::OpenOptions::new().write(true).open(&f) {
        Ok(mut file) => {
            use std::io::Write;
            file.write_all(if idle { b"1" } else { b"0" }).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("writing cpu.idle of {}: {e}", dir.display()),
                )
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", path.display()),
        )
    })
}

impl Cgroups {
    /// Detects the layout and makes Warren's parent directories.
    pub fn new(parent: &str) -> io::Result<Cgroups> {
        let layout = Layout::detect()?;
        let cg = Cgroups {
            layout,
            parent: parent.to_string(),
            use_idle: false,
        };
        for p in cg.layout.parents(parent) {
            fs::create_dir_all(&p)
                .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", p.display())))?;
        }
        if let Layout::V2 { .. } = &cg.layout {
            let p = &cg.layout.parents(parent)[0];
            // Let sandboxes below the parent use the controllers; the parent's own parent must
            // have delegated them (the root cgroup does on every systemd host).
            write(&p.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
        }
        Ok(cg)
    }

    /// Whether the kernel has `cpu.idle` (probed on Warren's parent cgroup).
    pub fn has_cpu_idle(&self) -> bool {
        let dir = match &self.layout {
            Layout::V2 { .. } => self.layout.parents(&self.parent)[0].clone(),
            Layout::V1 { cpu, .. } => cpu.join(&self.parent),
        };
        dir.join("cpu.idle").exists()
    }

    /// Memory charged to every sandbox (Warren's parent cgroup), bytes.
    pub fn memory_charged(&self) -> Option<u64> {
        let file = match &self.layout {
            Layout::V2 { .. } => self.layout.parents(&self.parent)[0].join("memory.current"),
            Layout::V1 { memory, .. } => memory.join(&self.parent).join("memory.usage_in_bytes"),
        };
        fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// How a paused sandbox's memory is reclaimed here.
    pub fn reclaim_method(&self) -> &'static str {
        match &self.layout {
            Layout::V2 { .. } => "memory.reclaim",
            Layout::V1 { .. } => "limit",
        }
    }

    /// The cgroup of sandbox `name` (not created).
    pub fn sandbox(&self, name: &str) -> SandboxCgroup {
        SandboxCgroup {
            layout: self.layout.clone(),
            dirs: self.layout.dirs(&self.parent, name),
            use_idle: self.use_idle,
        }
    }

    /// Kills what is left in every sandbox cgroup and removes them and Warren's parent
    /// directories (for uninstalling, and for tests that used a parent of their own).
    pub fn remove_all(&self) -> io::Result<()> {
        for name in self.existing() {
            let cg = self.sandbox(&name);
            cg.kill_all();
            cg.remove(Duration::from_secs(5))?;
        }
        for p in self.layout.parents(&self.parent) {
            match fs::remove_dir(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("removing {}: {e}", p.display()),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every directory of Warren's parent cgroup, in each hierarchy.
    pub fn parent_dirs(&self) -> Vec<PathBuf> {
        self.layout.parents(&self.parent)
    }

    /// Names of sandbox cgroups that exist under Warren's parent (for garbage collection).
    pub fn existing(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for p in self.layout.parents(&self.parent) {
            if let Ok(rd) = fs::read_dir(&p) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if !names.contains(&n) {
                            names.push(n);
                        }
                    }
                }
            }
        }
        names
    }
}

impl SandboxCgroup {
    /// Creates the cgroup, with `limits` when given, and returns what an init needs to join it.
    pub fn create(&self, limits: Option<&Resources>) -> io::Result<JoinFds> {
        for d in &self.dirs {
            match fs::create_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("creating {}: {e}", d.display()),
                    ));
                }
            }
        }
        if let Some(r) = limits {
            self.set_limits(r)?;
        }
        match &self.layout {
            Layout::V2 { .. } => Ok(JoinFds::Dir(fs::File::open(&self.dirs[0])?.into())),
            Layout::V1 { .. } => {
                let mut fds = Vec::new();
                for d in &self.dirs {
                    let f = fs::OpenOptions::new()
                        .write(true)
                        .open(d.join("cgroup.procs"))?;
                    fds.push(f.into());
                }
                Ok(JoinFds::Procs(fds))
            }
        }
    }

    /// Writes CPU, memory and process limits and the QoS class: the CFS quota is the CPU
    /// limit; a latency-sensitive sandbox is weighted by its CPU request (`cpu.shares`,
    /// `cpu.weight`) and keeps its memory request from reclaim (v2 `memory.low`); a
    /// best-effort one's cgroup is made idle (`cpu.idle`, where the kernel has it; else its
    /// weight is the least and its commands run under `SCHED_IDLE`). v1's soft limit is the
    /// memory request: under host pressure, cgroups above theirs are reclaimed first.
    pub fn set_limits(&self, r: &Resources) -> io::Result<()> {
        let r = r.normalized();
        let quota = (r.cpu_limit as u64 * CPU_PERIOD_US / 1000).max(1000);
        let mem = r.memory_limit.bytes();
        let ls = r.qos == QosClass::Ls;
        // v1 shares: 1024 per core requested, 2 the least.
        let shares = if ls {
            (r.cpu as u64 * 1024 / 1000).clamp(2, 262_144)
        } else {
            2
        };
        match &self.layout {
            Layout::V2 { .. } => {
                let d = &self.dirs[0];
                write(&d.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                // The kernel's own shares-to-weight mapping.
                let weight = 1 + (shares - 2) * 9999 / 262_142;
                write(&d.join("cpu.weight"), &weight.to_string())?;
                write_idle(d, !ls && self.use_idle)?;
                write(&d.join("memory.max"), &mem.to_string())?;
                let low = if ls { r.memory.bytes() } else { 0 };
                let _ = write(&d.join("memory.low"), &low.to_string());
                // Swap is bounded like v1's memory+swap limit: at most the limit again (only
                // where the host has swap; a pause's reclaim moves memory there).
                let _ = write(&d.join("memory.swap.max"), &mem.to_string());
                write(&d.join("pids.max"), &r.pids.to_string())
            }
            Layout::V1 { .. } => {
                let [cpu, memory, pids, ..] = &self.dirs[..] else {
                    return Err(io::Error::other("v1 layout without its hierarchies"));
                };
                write(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
                write(&cpu.join("cpu.shares"), &shares.to_string())?;
                write_idle(cpu, !ls && self.use_idle)?;
                self.set_memory_limit(mem)?;
                let _ = write(
                    &memory.join("memory.soft_limit_in_bytes"),
                    &r.memory.bytes().to_string(),
                );
                write(&pids.join("pids.max"), &r.pids.to_string())
            }
        }
    }

    /// Writes the memory limit (v1: with the memory+swap limit beside it, in the order the
    /// kernel accepts: memsw is never below the limit).
    fn set_memory_limit(&self, mem: u64) -> io::Result<()> {
        match &self.layout {
            Layout::V2 { .. } => write(&self.dirs[0].join("memory.max"), &mem.to_string()),
            Layout::V1 { .. } => {
                let memory = &self.dirs[1];
                let limit = memory.join("memory.limit_in_bytes");
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    let now_memsw: u64 = fs::read_to_string(&memsw)
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .unwrap_or(u64::MAX);
                    if mem > now_memsw {
                        write(&memsw, &mem.to_string())?;
                        write(&limit, &mem.to_string())
                    } else {
                        write(&limit, &mem.to_string())?;
                        write(&memsw, &mem.to_string())
                    }
                } else {
                    write(&limit, &mem.to_string())
                }
            }
        }
    }

    /// Reclaims what the kernel can of the (frozen) cgroup's memory: page cache, and
    /// anonymous memory where the host has swap. v2: `memory.reclaim`; v1: the limit lowered
    /// to nothing (the kernel reclaims until it cannot, then refuses the limit), then put back
    /// to `limit`. Returns the bytes freed. Only for a frozen cgroup: on v1 a process that
    /// allocated meanwhile would meet the lowered limit.
    pub fn reclaim(&self, limit: u64) -> io::Result<u64> {
        let before = self.memory_usage();
        match &self.layout {
            Layout::V2 { .. } => {
                // Asks for all of it; the kernel answers EAGAIN when it got less.
                let _ = fs::write(self.dirs[0].join("memory.reclaim"), before.to_string());
            }
            Layout::V1 { .. } => {
                let file = self.dirs[1].join("memory.limit_in_bytes");
                // EBUSY once nothing more can be reclaimed: expected.
                let _ = fs::write(&file, "4096");
                self.set_memory_limit(limit)?;
            }
        }
        Ok(before.saturating_sub(self.memory_usage()))
    }

    /// Puts the memory limit back (after a reclaim a daemon may have been stopped in).
    pub fn restore_memory_limit(&self, limit: u64) -> io::Result<()> {
        self.set_memory_limit(limit)
    }

    /// Renames the cgroup (in every hierarchy) to `name`, processes and all.
    pub fn rename(&self, name: &str) -> io::Result<SandboxCgroup> {
        let mut dirs = Vec::with_capacity(self.dirs.len());
        for d in &self.dirs {
            let to = d.with_file_name(name);
            fs::rename(d, &to).map_err(|e| {
                io::Error::new(e.kind(), format!("renaming {} to {name}: {e}", d.display()))
            })?;
            dirs.push(to);
        }
        Ok(SandboxCgroup {
            layout: self.layout.clone(),
            dirs,
            use_idle: self.use_idle,
        })
    }

    fn freezer_dir(&self) -> &Path {
        match &self.layout {
            Layout::V2 { .. } => &self.dirs[0],
            Layout::V1 { .. } => &self.dirs[3],
        }
    }

    /// Freezes (`true`) or thaws every process, and waits until the kernel says it is done.
    pub fn set_frozen(&self, frozen: bool) -> io::Result<()> {
        self.start_freeze(frozen)?;
        self.wait_frozen(frozen)
    }

    /// The freezer's control file, the value to write, the file to read back and the line
    /// that says it is done.
    fn freezer_files(
        &self,
        frozen: bool,
    ) -> (&'static str, &'static str, &'static str, &'static str) {
        match &self.layout {
            Layout::V2 { .. } => (
                "cgroup.freeze",
                if frozen { "1" } else { "0" },
                "cgroup.events",
                if frozen { "frozen 1" } else { "frozen 0" },
            ),
            Layout::V1 { .. } => {
                let state = if frozen { "FROZEN" } else { "THAWED" };
                ("freezer.state", state, "freezer.state", state)
            }
        }
    }

    /// Asks the kernel to freeze (or thaw); it works on it asynchronously.
    pub fn start_freeze(&self, frozen: bool) -> io::Result<()> {
        let (file, value, _, _) = self.freezer_files(frozen);
        write(&self.freezer_dir().join(file), value)
    }

    /// Waits until the freeze (or thaw) is done.
    pub fn wait_frozen(&self, frozen: bool) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.freeze_settled(frozen)? {
            if Instant::now() > deadline {
                let what = if frozen { "freeze" } else { "thaw" };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("cgroup did not {what} in 10 s"),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Whether the freeze (or thaw) is done, read once. On v1, one not done yet is asked again
    /// (writing FROZEN again makes the kernel retry tasks that were busy).
    pub fn freeze_settled(&self, frozen: bool) -> io::Result<bool> {
        let (file, value, check, want) = self.freezer_files(frozen);
        let d = self.freezer_dir();
        if fs::read_to_string(d.join(check))?
            .lines()
            .any(|l| l.trim() == want)
        {
            return Ok(true);
        }
        if matches!(self.layout, Layout::V1 { .. }) {
            write(&d.join(file), value)?;
        }
        Ok(false)
    }

    /// Whether the cgroup is frozen (or freezing).
    pub fn is_frozen(&self) -> bool {
        let d = self.freezer_dir();
        match &self.layout {
            Layout::V2 { .. } => {
                fs::read_to_string(d.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1")
            }
            Layout::V1 { .. } => {
                fs::read_to_string(d.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
            }
        }
    }

    /// Pids in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        let d = &self.dirs[match &self.layout {
            Layout::V2 { .. } => 0,
            Layout::V1 { .. } => 2, // pids hierarchy: every task is in it
        }];
        fs::read_to_string(d.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills every process in the cgroup (used for leftovers with no init to kill).
    pub fn kill_all(&self) {
        if let Layout::V2 { .. } = &self.layout {
            let _ = write(&self.dirs[0].join("cgroup.kill"), "1");
        } else {
            for pid in self.pids() {
                let _ = warren_sys::process::kill(pid, 9);
            }
            let _ = self.set_frozen(false);
        }
    }

    /// How often the kernel killed a process of the cgroup for memory, and how often a fork
    /// failed at the process limit (`memory.oom_control`/`memory.events` `oom_kill`,
    /// `pids.events` `max`).
    pub fn limit_counters(&self) -> (u64, u64) {
        let field = |path: PathBuf, name: &str| {
            fs::read_to_string(path)
                .ok()
                .and_then(|s| {
                    s.lines().find_map(|l| {
                        l.strip_prefix(name)
                            .and_then(|v| v.strip_prefix(' '))
                            .and_then(|v| v.trim().parse().ok())
                    })
                })
                .unwrap_or(0)
        };
        match &self.layout {
            Layout::V2 { .. } => (
                field(self.dirs[0].join("memory.events"), "oom_kill"),
                field(self.dirs[0].join("pids.events"), "max"),
            ),
            Layout::V1 { .. } => (
                field(self.dirs[1].join("memory.oom_control"), "oom_kill"),
                field(self.dirs[2].join("pids.events"), "max"),
            ),
        }
    }

    /// Memory in use, bytes.
    pub fn memory_usage(&self) -> u64 {
        let (d, file) = match &self.layout {
            Layout::V2 { .. } => (&self.dirs[0], "memory.current"),
            Layout::V1 { .. } => (&self.dirs[1], "memory.usage_in_bytes"),
        };
        fs::read_to_string(d.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Page cache among the memory in use, bytes (`memory.stat` `file`, v1 `total_cache`).
    pub fn memory_cache(&self) -> u64 {
        let (d, key) = match &self.layout {
            Layout::V2 { .. } => (&self.dirs[0], "file "),
            Layout::V1 { .. } => (&self.dirs[1], "total_cache "),
        };
        fs::read_to_string(d.join("memory.stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            })
            .unwrap_or(0)
    }

    /// CPU time the cgroup's processes used, ns, where its cpu controller counts it (v2
    /// `cpu.stat` `usage_usec`); `None` on v1, whose cpu hierarchy does not count usage.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        match &self.layout {
            Layout::V2 { .. } => fs::read_to_string(self.dirs[0].join("cpu.stat"))
                .ok()?
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
                .map(|us| us.saturating_mul(1000)),
            Layout::V1 { .. } => None,
        }
    }

    /// Gives back the memory still charged to the (empty) cgroup: page cache and kernel
    /// objects its processes left. A memory cgroup removed with pages charged to it lives on
    /// in the kernel, unseen, until they are reclaimed: under churn a node loses gigabytes to
    /// such dead cgroups. v1 `memory.force_empty`, v2 `memory.reclaim`; best effort.
    pub fn release_memory(&self) {
        match &self.layout {
            Layout::V2 { .. } => {
                let _ = fs::write(self.dirs[0].join("memory.reclaim"), "1T");
            }
            Layout::V1 { .. } => {
                let _ = fs::write(self.dirs[1].join("memory.force_empty"), "0");
            }
        }
    }

    /// Removes the cgroup, waiting (up to `wait`) for its processes to be gone. Its memory
    /// charges are given back first (see [`SandboxCgroup::release_memory`]).
    pub fn remove(&self, wait: Duration) -> io::Result<()> {
        let deadline = Instant::now() + wait;
        let mut released = false;
        for d in &self.dirs {
            loop {
                // Once no process is left (the first hierarchy's directory went), and before
                // the memory hierarchy's.
                if !released && self.is_memory_dir(d) {
                    self.release_memory();
                    released = true;
                }
                match fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if e.raw_os_error() == Some(16) && Instant::now() < deadline => {
                        // EBUSY: processes still exiting.
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("removing {}: {e}", d.display()),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn is_memory_dir(&self, d: &Path) -> bool {
        match &self.layout {
            Layout::V2 { .. } => true,
            Layout::V1 { .. } => self.dirs.get(1).is_some_and(|m| m == d),
        }
    }

    /// Whether any of its directories still exists.
    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|d| d.exists())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
33 30 0:29 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
36 30 0:32 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
37 30 0:33 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
";

    #[test]
    fn detects_hybrid_as_v1_controllers() {
        let l = Layout::from_mountinfo(HYBRID, |_| Some("hugetlb".into())).unwrap();
        assert_eq!(l.name(), "hybrid");
        let dirs = l.dirs("warren", "abc");
        assert_eq!(dirs[0], PathBuf::from("/sys/fs/cgroup/cpu/warren/abc"));
        let systemd = Path::new("/run/systemd/system").is_dir();
        assert_eq!(
            dirs.len(),
            if systemd { 5 } else { 4 },
            "cpu, memory, pids, freezer (+ name=systemd under systemd)"
        );
    }

    #[test]
    fn detects_unified_v2() {
        let info = "31 30 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let l = Layout::from_mountinfo(info, |_| Some("cpuset cpu io memory pids".into())).unwrap();
        assert_eq!(
            l,
            Layout::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
        assert_eq!(
            l.dirs("warren", "abc"),
            vec![PathBuf::from("/sys/fs/cgroup/warren/abc")]
        );
    }

    #[test]
    fn missing_controllers_are_named() {
        let err = Layout::from_mountinfo("", |_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cpu"), "{err}");
    }
}

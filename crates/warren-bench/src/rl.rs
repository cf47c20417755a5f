//! `warren-bench rl [--episodes N] [--quick]`: a training step's load on one node — a rollout
//! of episodes (create, write, 5 execs, read, kill) with a reward call per episode through the
//! unmodified `sandbox-fusion` client and a task pause in the middle, beside the same rollout
//! without reward calls; then a 200-call burst through that client beside the node's plain
//! single-call rate at 4 in flight, all in one run.
//!
//! The load is Python, as a training job's is: `sdk/python/bench/rl.py` (the SDK's
//! `AsyncClient` for the episodes, `sandbox_fusion.run_code_async` for the rewards) checks
//! every episode and reward and prints the tables. This starts its own `warren up`, makes a
//! virtual environment for the driver (before it enters its network namespace, which has no
//! route out), runs it and passes its tables on.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use warren_sdk::Client;

use crate::warren_rest::{WarrenUp, wait_healthy};

/// The cgroup parent of this benchmark's `warren up`, apart from the other benchmarks'.
const CGROUP_PARENT: &str = "warren-bench-rl";

/// The client package, pinned as `sdk/python/run-tests.sh` pins it (a test below checks).
const SANDBOX_FUSION: &str = "sandbox-fusion==0.3.7";

/// Episodes per rollout: the 1,000, or a smoke run's.
pub const EPISODES: usize = 1000;
pub const QUICK_EPISODES: usize = 200;

/// The repository this was built from: the driver and the SDK are read from it.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The driver's virtual environment: `$WARREN_BENCH_VENV`, or `bench-venv` in the target
/// directory (beside `release/`, where this executable is).
fn venv_dir(exe_dir: &Path) -> PathBuf {
    match std::env::var_os("WARREN_BENCH_VENV") {
        Some(v) => PathBuf::from(v),
        None => exe_dir
            .parent()
            .unwrap_or(exe_dir)
            .to_path_buf()
            .join("bench-venv"),
    }
}

/// Makes the virtual environment if it is missing and installs this checkout's SDK and the
/// pinned client package into it. Run outside the benchmark's network namespace (pip needs the
/// package index). A failed install over a venv that already has both packages is a warning:
/// an offline machine can run with what it has.
pub fn prepare_venv(exe_dir: &Path) -> anyhow::Result<()> {
    let venv = venv_dir(exe_dir);
    let python = venv.join("bin/python");
    if !python.is_file() {
        eprintln!("warren-bench rl: making {}", venv.display());
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("python3 -m venv")?
            .success();
        if !ok {
            bail!(
                "cannot make a virtual environment at {}: install Python 3.9+ with venv \
                 (Debian: apt-get install python3-venv)",
                venv.display()
            );
        }
    }
    let sdk = repo_root().join("sdk/python");
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .arg(&sdk)
        .arg(SANDBOX_FUSION)
        .status()
        .context("pip install")?
        .success();
    if !installed {
        if !imports(&python) {
            bail!(
                "pip could not install {} and {SANDBOX_FUSION} into {}",
                sdk.display(),
                venv.display()
            );
        }
        eprintln!("warren-bench rl: pip install failed; running with what the venv already has");
    }
    Ok(())
}

fn imports(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import warren, sandbox_fusion"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs the benchmark; returns its Markdown.
pub async fn run(exe_dir: &Path, episodes: usize) -> anyhow::Result<String> {
    let python = venv_dir(exe_dir).join("bin/python");
    let driver = repo_root().join("sdk/python/bench/rl.py");
    if !imports(&python) {
        bail!(
            "{} cannot import warren and sandbox_fusion: run `warren-bench rl` outside a \
             network namespace once so that it installs them",
            python.display()
        );
    }
    if !driver.is_file() {
        bail!("the driver {} is missing", driver.display());
    }
    crate::host::preflight_cgroup_parent(CGROUP_PARENT)?;
    let work = tempfile::Builder::new()
        .prefix("warren-bench-rl.")
        .tempdir()?;
    let (mut up, url, data) = WarrenUp::start_in(exe_dir, work.path(), CGROUP_PARENT)?;
    let r = drive(&mut up, &url, &data, &python, &driver, episodes).await;
    let clean = up.stop();
    let left = crate::host::remove_cgroup_parent(CGROUP_PARENT, !clean);
    let mut out = match r {
        Ok(s) => s,
        Err(e) => bail!("{e:#}; warren up's log ends: {}", up.log_tail(10)),
    };
    for p in left {
        out.push_str(&format!("\nNote: cgroup left behind: {p}\n"));
    }
    Ok(out)
}

async fn drive(
    up: &mut WarrenUp,
    url: &str,
    data: &Path,
    python: &Path,
    driver: &Path,
    episodes: usize,
) -> anyhow::Result<String> {
    wait_healthy(&Client::new(url, None)?, up).await?;
    let key = std::fs::read_to_string(data.join("admin.key"))?;
    let machine = crate::host::Machine::read();
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(driver)
        .arg("--url")
        .arg(url)
        .arg("--episodes")
        .arg(episodes.to_string())
        .env("WARREN_API_KEY", key.trim())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // Not `output()`, which would capture stderr too: the driver's progress goes to ours.
    let out = cmd
        .spawn()
        .context("starting the driver")?
        .wait_with_output()
        .await
        .context("running the driver")?;
    let tables = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("the driver {} exited with {}", driver.display(), out.status);
    }
    // The driver's client shares the machine with the node, as does anything else running:
    // how busy the machine was says how far the figures can be compared with another run's.
    Ok(format!(
        "# warren-bench rl\n\n{} CPUs, {:.0} GiB, {} (kernel {}), cgroups {}; before the run \
         {} of all cores busy, load average {}; after it {}.\n\n{tables}",
        machine.nproc,
        machine.mem_total as f64 / (1u64 << 30) as f64,
        machine.os,
        machine.kernel,
        machine.cgroups,
        machine
            .busy_before
            .map(|b| format!("{:.0} %", b * 100.0))
            .unwrap_or_else(|| "?".into()),
        machine.loadavg,
        crate::host::Machine::loadavg(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_package_is_pinned_as_the_sdk_tests_pin_it() {
        let tests = std::fs::read_to_string(repo_root().join("sdk/python/run-tests.sh"))
            .expect("sdk/python/run-tests.sh");
        assert!(
            tests.contains(SANDBOX_FUSION),
            "sdk/python/run-tests.sh no longer installs {SANDBOX_FUSION}: pin the same \
             version in crates/warren-bench/src/rl.rs"
        );
    }
}

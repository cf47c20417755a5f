//! A PostgreSQL server of its own, for tests and local clusters: Debian's `postgresql` binaries
//! started in a data directory given to the unprivileged `postgres` user (PostgreSQL refuses
//! to run as root), reached over a unix socket in that directory only — no TCP port — and
//! stopped when dropped. Tuned for throwaway data (`fsync` off): never for data to keep.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A running local PostgreSQL server.
#[derive(Debug)]
pub struct LocalPostgres {
    dir: PathBuf,
    bin: PathBuf,
    as_user: Option<String>,
    /// Its URL (database `warren`, user `warren`, over the socket).
    pub url: String,
}

/// The directory of the newest installed PostgreSQL's programs, or why there is none.
pub fn binaries() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| {
            format!(
                "no PostgreSQL in /usr/lib/postgresql ({e}): install Debian's postgresql package"
            )
        })?
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, b)| b)
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".to_string())
}

fn is_root() -> bool {
    // The effective uid: the second field of `Uid:` in /proc/self/status.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

impl LocalPostgres {
    /// Makes a database cluster in `dir` (which must be empty or missing; it is given to the
    /// `postgres` user when running as root) and starts a server on it. Blocking (a few
    /// seconds).
    pub fn start(dir: &Path) -> Result<LocalPostgres, String> {
        let bin = binaries()?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let as_user = if is_root() {
            let o = Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir)
                .output()
                .map_err(|e| format!("chown: {e}"))?;
            if !o.status.success() {
                return Err(format!(
                    "giving {} to the postgres user: {} (is Debian's postgresql package \
                     installed? it makes that user)",
                    dir.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Some("postgres".to_string())
        } else {
            None
        };
        let mut pg = LocalPostgres {
            dir: dir.to_path_buf(),
            bin,
            as_user,
            url: String::new(),
        };
        let data = dir.join("data");
        pg.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "warren",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
        )?;
        pg.restart()?;
        pg.run(
            "createdb",
            &[
                "-h",
                &dir.display().to_string(),
                "-p",
                "5432",
                "-U",
                "warren",
                "warren",
            ],
        )?;
        pg.url = format!(
            "postgres://warren@localhost/warren?host={}&port=5432",
            dir.display()
        );
        Ok(pg)
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let prog = self.bin.join(program);
        let mut cmd = match &self.as_user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(u).arg("--").arg(&prog);
                c
            }
            None => Command::new(&prog),
        };
        let o = cmd
            .args(args)
            .current_dir(&self.dir)
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            Err(format!(
                "{program} failed: {}{}\n{}",
                String::from_utf8_lossy(&o.stderr).trim(),
                String::from_utf8_lossy(&o.stdout).trim(),
                log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
            ))
        }
    }

    /// Stops the server now (its clients see their connections end), keeping its data.
    pub fn stop(&self) {
        let _ = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.dir.join("data").display().to_string(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// Starts the server (again, after [`LocalPostgres::stop`]).
    pub fn restart(&self) -> Result<(), String> {
        let opts = format!(
            "-k {} -p 5432 -c listen_addresses= -c fsync=off -c full_page_writes=off \
             -c synchronous_commit=off -c max_connections=200",
            self.dir.display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.dir.join("data").display().to_string(),
                "-l",
                &self.dir.join("server.log").display().to_string(),
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

//! Starting a container init: its directory, cgroup and control socket, one clone3 into new
//! namespaces and the exec of the guest agent (no Rust runs in the child before exec), then the
//! configuration that makes the agent build its root (overlay, /proc, /dev, pivot_root). The
//! init reports its root built and waits for its activation (environment); from then on it
//! answers on its control socket.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use warren_types::api::Resources;
use warren_types::guest::{Activate, InitConfig, RootfsSpec};

use super::Host;
use super::cgroups::JoinFds;
use super::instance::Held;
use crate::images::Rootfs;

/// What an init is given beyond its root and limits.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InitKind {
    /// A builder's (its root commands hold the build capabilities).
    pub builder: bool,
    /// With a network interface.
    pub net: bool,
    /// A function-call worker's (its guest runs a call server).
    pub calls: bool,
}

/// An init that builds its root and then waits for [`Activate`].
pub(crate) struct Spawned {
    pub pid: i32,
    pub start_time: u64,
    /// Its configuration channel (fd 4 in the init): configuration and activation go down,
    /// "ready" comes back once the root is built.
    pub config: std::os::unix::net::UnixStream,
}

impl Spawned {
    /// Waits (up to `timeout`) until the init reports its root built.
    pub fn wait_built(&self, timeout: Duration) -> std::io::Result<()> {
        use std::io::BufRead;
        self.config.set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        std::io::BufReader::new(&self.config).read_line(&mut line)?;
        self.config.set_read_timeout(None)?;
        if line == "ready\n" {
            Ok(())
        } else {
            Err(std::io::Error::other(
                "the init exited while building its root",
            ))
        }
    }

    /// Sends the activation: the init starts answering. On failure the caller's `Held` (armed)
    /// ends it.
    pub fn activate(mut self, a: &Activate) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(a).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.config.write_all(&line)
    }
}

impl Host {
    /// Prepares `dir`, creates the cgroup `name` (with `limits`), binds the control socket,
    /// clones the guest agent into new namespaces and sends it its root's configuration. Each
    /// resource is recorded in `held` as soon as it exists. Blocking.
    pub(crate) fn spawn_guest(
        &self,
        held: &mut Held,
        name: &str,
        rootfs: &Rootfs,
        limits: Option<&Resources>,
        dir: &Path,
        kind: InitKind,
    ) -> std::io::Result<Spawned> {
        let InitKind {
            builder,
            net,
            calls,
        } = kind;
        std::fs::DirBuilder::new().mode(0o700).create(dir)?;
        held.dir = Some(dir.to_path_buf());
        let mut config = self.prepare_dir(rootfs, dir, limits.and_then(|r| r.disk))?;
        config.builder = builder;
        config.call_server = calls;
        if net && let Some(n) = &self.net {
            config.resolv_conf = Some(n.resolv_conf.to_string_lossy().into_owned());
        }
        let cgroup = self.cgroups.sandbox(name);
        held.cgroup = Some(cgroup.clone());
        let join = cgroup.create(limits)?;
        let socket = self.socket_of(name);
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket)?;
        held.socket = Some(socket.clone());
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("guest.log"))?;
        let null = std::fs::File::open("/dev/null")?;
        let (mut cfg_w, cfg_r) = std::os::unix::net::UnixStream::pair()?;
        let program = self.guest_bin.clone();
        // A sandbox with an interface joins a ready network namespace (a slot); one without,
        // a loopback-only namespace (recycled too).
        if net {
            let Some(n) = &self.net else {
                return Err(std::io::Error::other(
                    "this node has no sandbox network ([node.network] enabled = false)",
                ));
            };
            let slot = n.take(name)?;
            held.net = Some(slot.lease);
            held.netns = Some(slot.netns);
        } else {
            held.netns = Some(self.take_loopback()?);
        }
        let mut namespaces = warren_sys::spawn::Namespaces::container();
        namespaces.net = false;
        let (procs, dirfd) = match &join {
            JoinFds::Procs(v) => (v.iter().map(|f| f.as_fd()).collect::<Vec<_>>(), None),
            JoinFds::Dir(d) => (Vec::new(), Some(d.as_fd())),
        };
        let fds = [
            (null.as_fd(), 0),
            (log.as_fd(), 1),
            (log.as_fd(), 2),
            (listener.as_fd(), 3),
            (cfg_r.as_fd(), 4),
        ];
        let spawned = warren_sys::spawn::spawn(&warren_sys::spawn::SpawnSpec {
            program: &program,
            args: &["warren-guest", "init"],
            env: &[(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )],
            namespaces,
            join_net: held.netns.as_ref().map(|f| f.as_fd()),
            join_cgroups: &procs,
            into_cgroup: dirfd,
            fds: &fds,
            ..warren_sys::spawn::SpawnSpec::new(&program, &[], &[])
        })?;
        held.process = Some(Arc::new(spawned.pidfd));
        // The init is in the namespace now and holds it: the node lets go of its descriptor
        // and finds the namespace again through the init when the sandbox ends.
        if let Some(ns) = held.netns.take() {
            match super::instance::ns_identity(&ns) {
                Some(id) => held.joined = Some((spawned.pid, id)),
                None => held.netns = Some(ns),
            }
        }
        let start_time = warren_sys::process::start_time(spawned.pid).unwrap_or(0);
        let mut line = serde_json::to_vec(&config).map_err(std::io::Error::other)?;
        line.push(b'\n');
        cfg_w.write_all(&line)?;
        Ok(Spawned {
            pid: spawned.pid,
            start_time,
            config: cfg_w,
        })
    }

    /// Fills an init's directory (writable layer, links to the read-only layers) and returns
    /// the configuration that builds its root from it.
    fn prepare_dir(
        &self,
        rootfs: &Rootfs,
        dir: &Path,
        disk: Option<warren_types::ByteSize>,
    ) -> std::io::Result<InitConfig> {
        match &self.disk {
            // The writable layer in a volume of the disk pool, under its quota.
            Some(pool) => {
                pool.attach(dir, disk.map(|d| d.bytes()))?;
            }
            None => {
                for sub in ["upper", "work"] {
                    std::fs::DirBuilder::new()
                        .mode(0o755)
                        .create(dir.join(sub))?;
                }
            }
        }
        let mut lowers = Vec::new();
        for (i, layer) in rootfs.layers.iter().enumerate() {
            let name = format!("l{i}");
            std::os::unix::fs::symlink(layer, dir.join(&name))?;
            lowers.push(name);
        }
        Ok(InitConfig {
            sandbox_dir: dir.to_string_lossy().into_owned(),
            hostname: "sandbox".into(),
            rootfs: RootfsSpec {
                lowers,
                upper: "upper".into(),
                work: "work".into(),
                binds: rootfs.binds.clone(),
            },
            limits: self.guest_limits,
            grader: self.grader.clone(),
            builder: false,
            call_server: false,
            resolv_conf: None,
        })
    }
}

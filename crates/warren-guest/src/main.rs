//! `warren-guest`: the guest agent, PID 1 of every sandbox.
//!
//! ```text
//! warren-guest init              PID 1 of a container sandbox: reads its InitConfig from fd 4 (a
//!                                socket), builds the root, answers "ready", waits for its
//!                                Activate, then serves the listening socket on fd 3
//! warren-guest serve SOCKET      serve on a new unix socket, no set-up (development)
//! warren-guest --version
//! ```
//!
//! Its control channel is a socket the node bound on the host before the sandbox's root was
//! pivoted away: nothing inside the sandbox can reach it, see its path, or read the guest's
//! log (stderr, a host file).

mod call;
mod confine;
mod default_user;
mod files;
mod grader;
mod incidents;
mod linger;
mod procs;
mod server;
mod setup;
mod spawner;
mod tarball;
mod users;
mod watch;
mod wire;

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::UnixListener;
use warren_types::guest::{Activate, InitConfig};

use server::Guest;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = match args.get(1).map(String::as_str) {
        Some("init") => init(),
        Some("serve") if args.len() == 3 => serve_path(&args[2]),
        Some("--version") => {
            println!("warren-guest {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => Err(
            "usage: warren-guest init | warren-guest serve SOCKET | warren-guest --version"
                .to_string(),
        ),
    };
    if let Err(e) = code {
        eprintln!("warren-guest: {e}");
        std::process::exit(1);
    }
}

fn init() -> Result<(), String> {
    let started = Instant::now();
    let listener =
        warren_sys::process::inherited_fd(3).map_err(|e| format!("control socket: {e}"))?;
    let cfg_fd = warren_sys::process::inherited_fd(4).map_err(|e| format!("config pipe: {e}"))?;
    let channel = std::fs::File::from(cfg_fd);
    let mut reader = std::io::BufReader::new(&channel);
    let cfg: InitConfig = read_line(&mut reader, "config")?;
    setup::rootfs(&cfg).map_err(|e| format!("setting up the root file system: {e}"))?;
    // The terminals' devpts, taken before any agent process runs: terminals are opened
    // beneath it, never by a /dev path an agent's root could replace.
    let pts = open_pts()?;
    // Keys of this sandbox never meet another's, or the daemon's.
    warren_sys::confine::join_new_session_keyring()
        .map_err(|e| format!("joining a new session keyring: {e}"))?;
    let mut limits = cfg.limits;
    limits.max_open_files = warren_sys::confine::raise_own_open_files(limits.max_open_files);
    let confinement =
        confine::prepare(limits).map_err(|e| format!("preparing the sandbox policy: {e}"))?;
    // While the guest has one thread and its capabilities: the spawner (a process that starts
    // every agent command, confined once), then the grader's thread (keeps the few it needs).
    let spawner = spawner::Spawner::start(confinement.0.clone(), cfg.builder)
        .map_err(|e| format!("starting the spawner: {e}"))?;
    // A function-call worker's call server, forked likewise (it keeps what it needs to mount).
    let call_server = if cfg.call_server {
        Some(
            call::CallServer::start(&cfg, confinement.0.clone()).map_err(|e| {
                // Logged now, while the control socket is still open: the node reads the log
                // when it sees the socket close, and tells the caller why.
                let m = format!("starting the call server: {e}");
                eprintln!("warren-guest: {m}");
                m
            })?,
        )
    } else {
        None
    };
    let grader =
        grader::Grader::start(&cfg).map_err(|e| format!("starting the grader thread: {e}"))?;
    users::reserve(&[cfg.grader.uid]);
    setup::lock_down().map_err(|e| format!("dropping privileges: {e}"))?;
    // Tell the node the root is built: from now on it may rename the init's directory. A node
    // starting a sandbox directly has sent the activation already and does not listen.
    let _ = (&channel).write_all(b"ready\n");
    // A warm init waits here until a sandbox takes it (or the node goes away: end of file).
    let act: Activate = read_line(&mut reader, "activation")?;
    drop(reader);
    drop(channel);
    let listener = std::os::unix::net::UnixListener::from(listener);
    run(
        listener,
        act.env,
        started,
        confinement,
        Roles {
            grader: Some(grader),
            spawner: Some(spawner),
            call_server,
        },
        pts,
    )
}

/// A descriptor for `/dev/pts` (`O_PATH`, not followed if it is a link).
fn open_pts() -> Result<std::os::fd::OwnedFd, String> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        "/dev/pts",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("opening /dev/pts: {e}"))
}

/// Reads one JSON line from the configuration pipe.
fn read_line<T: serde::de::DeserializeOwned>(
    pipe: &mut impl std::io::BufRead,
    what: &str,
) -> Result<T, String> {
    let mut line = String::new();
    match pipe.read_line(&mut line) {
        Ok(0) => Err(format!("no {what}: the node closed the pipe")),
        Ok(_) => serde_json::from_str(&line).map_err(|e| format!("{what}: {e}")),
        Err(e) => Err(format!("reading {what}: {e}")),
    }
}

fn serve_path(path: &str) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let listener =
        std::os::unix::net::UnixListener::bind(path).map_err(|e| format!("bind {path}: {e}"))?;
    let confinement = confine::prepare(Default::default())
        .map_err(|e| format!("preparing the sandbox policy: {e}"))?;
    run(
        listener,
        Vec::new(),
        Instant::now(),
        confinement,
        Roles::default(),
        open_pts()?,
    )
}

/// The processes and threads beside the guest's own (none in development `serve` mode).
#[derive(Default)]
struct Roles {
    grader: Option<grader::Grader>,
    spawner: Option<spawner::Spawner>,
    call_server: Option<call::CallServer>,
}

fn run(
    listener: std::os::unix::net::UnixListener,
    env: Vec<(String, String)>,
    started: Instant,
    (confinement, listeners): (Arc<warren_sys::confine::Confinement>, std::os::fd::OwnedFd),
    Roles {
        grader,
        spawner,
        call_server,
    }: Roles,
    pts: std::os::fd::OwnedFd,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(8)
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async move {
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("listener: {e}"))?;
        let listener = UnixListener::from_std(listener).map_err(|e| format!("listener: {e}"))?;
        let guest = Arc::new(Guest {
            table: procs::Table::new(pts),
            env,
            started,
            confinement,
            incidents: Arc::new(incidents::Incidents::default()),
            grader,
            spawner,
            call_server,
            watches: Arc::default(),
        });
        tokio::spawn(confine::serve_listeners(listeners, guest.incidents.clone()));
        // Reap every child, ours or orphaned into us; report ours to the process table.
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .map_err(|e| format!("SIGCHLD handler: {e}"))?;
        let reaper = guest.clone();
        tokio::spawn(async move {
            loop {
                while let Some((pid, how)) = warren_sys::process::reap_any() {
                    match &reaper.spawner {
                        Some(sp) if sp.pid() == pid => {
                            sp.gone();
                            reaper.incidents.record(
                                "management",
                                format!("the spawner exited ({how:?}); commands now start from the agent"),
                                Some(pid),
                                Some("warren-spawner".into()),
                            );
                        }
                        _ => reaper.table.on_exit(pid, how),
                    }
                }
                if sigchld.recv().await.is_none() {
                    break;
                }
            }
        });
        server::serve(listener, guest).await;
        Ok(())
    })
}

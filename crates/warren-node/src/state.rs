//! What the node keeps on disk about each sandbox, so a restarted daemon can find it again.
//!
//! ```text
//! <state-dir>/
//!   node.id                        this node's id
//!   sandboxes/<id>/state.json      the record below (written atomically, see `save`)
//!   sandboxes/<id>/state.json.tmp  the previous record, written over by the next save
//!   sandboxes/<id>/upper, work     the sandbox's writable layer
//!   sandboxes/<id>/l0, l1, ...     symlinks to its read-only layers
//!   sandboxes/<id>/guest.log       the guest agent's stderr (host-only)
//!   sandboxes/<id>/trajectory.jsonl its recorded operations, when asked for
//!   sockets/<id>.sock              the guest's control socket (host-only)
//!   guest/<hex>/warren-guest       the node's copies of the guest agent, by digest (guest_bin)
//!   images/                        built-in image skeletons (host, runtime)
//!   layers/<hex>                   mount points of image layers (see the layers module)
//!   trash/                         directories of killed sandboxes being deleted
//!   warm/                          logs of warm inits (see the pool module)
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use warren_types::api::{BackendKind, IdleAction, Resources};
use warren_types::id::SandboxId;

/// Current record format.
pub const RECORD_VERSION: u32 = 1;

/// A sandbox as the node remembers it across restarts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Record format.
    pub version: u32,
    /// The sandbox id.
    pub id: SandboxId,
    /// Image it was made from.
    pub image: String,
    /// Training task.
    pub task: Option<String>,
    /// Project (sandboxes from before projects are root's).
    #[serde(default = "root_project")]
    pub project: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Environment for every command.
    pub env: BTreeMap<String, String>,
    /// Limits.
    pub resources: Resources,
    /// Creation, ms since the epoch.
    pub created_ms: u64,
    /// When the absolute timeout kills it, ms since the epoch.
    pub expires_ms: u64,
    /// Its init's pid.
    pub pid: i32,
    /// Its init's start time (clock ticks after boot): with the pid, its identity.
    pub start_time: u64,
    /// The `Idempotency-Key` it was created with.
    pub idempotency_key: Option<String>,
    /// Seconds of API inactivity before `on_idle`.
    #[serde(default)]
    pub idle_timeout: Option<u64>,
    /// What idleness does.
    #[serde(default)]
    pub on_idle: IdleAction,
    /// Whether its operations are recorded (`trajectory.jsonl`).
    #[serde(default)]
    pub trajectory: bool,
    /// The backend that runs it (records from before backends were recorded are containers).
    #[serde(default)]
    pub backend: BackendKind,
    /// Its image's layer digests, bottom first (empty for `host`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// The image's default user for commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_user: Option<String>,
    /// The image's default working directory for commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_cwd: Option<String>,
    /// The digest (`sha256:<hex>`) of the guest agent binary its init runs; unknown for
    /// records from before it was recorded. Keeps that copy on the node while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<String>,
    /// A builder sandbox: its root commands hold the build capabilities.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub builder: bool,
    /// A function-call worker (its guest runs a call server; made by the node itself).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fncall_worker: bool,
    /// Its network policy as it stands (records from before networks: loopback only).
    #[serde(default = "warren_types::net::NetworkPolicy::none")]
    pub network: warren_types::net::NetworkPolicy,
    /// Its interface's lease in the node's pools, and its policy's generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_lease: Option<(u32, u32)>,
    /// The host port of each exposed port, so a restarted daemon listens on the same ones.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub host_ports: std::collections::BTreeMap<u16, u16>,
}

/// The file a save writes before swapping it in; between saves it holds the previous record.
const NEXT: &str = "state.json.tmp";

/// Saves serialised per sandbox directory: two saves of one sandbox (a timeout change beside a
/// network change) must not write the same next file at once.
static SAVING: [std::sync::Mutex<()>; 64] = [const { std::sync::Mutex::new(()) }; 64];

/// Writes `record` to `dir/state.json` atomically: whole into `state.json.tmp`, which is then
/// swapped with `state.json` (`renameat2` with `RENAME_EXCHANGE`). The swap leaves the previous
/// record's file as the next save's `state.json.tmp`, written over in place: after a sandbox's
/// second save no save makes or deletes a file. (On ext4 under sandbox churn, allocating an
/// inode scans past the recently deleted ones: a save that made a new file cost ~0.3 ms of CPU,
/// and a task's network change saves one record per sandbox.) The first save, and one on a file
/// system without the exchange, renames instead.
///
/// Not fsynced: the record must survive a crash of the daemon, which the page cache does; a
/// crash of the machine ends every sandbox anyway, and an fsync on the create path costs a
/// millisecond or more.
pub fn save(dir: &Path, record: &Record) -> io::Result<()> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::OpenOptionsExt;
    let body = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    let _one_at_a_time = SAVING[(h.finish() % SAVING.len() as u64) as usize]
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let next = dir.join(NEXT);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        // Never reached through a link.
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&next)?;
    f.write_all(&body)?;
    f.set_len(body.len() as u64)?;
    drop(f);
    let current = dir.join("state.json");
    match rustix::fs::renameat_with(
        rustix::fs::CWD,
        &next,
        rustix::fs::CWD,
        &current,
        rustix::fs::RenameFlags::EXCHANGE,
    ) {
        Ok(()) => Ok(()),
        // No record yet (the first save), or no exchange on this file system.
        Err(e)
            if e == rustix::io::Errno::NOENT
                || e == rustix::io::Errno::INVAL
                || e == rustix::io::Errno::NOSYS =>
        {
            fs::rename(&next, &current)
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads `dir/state.json`. A record from before requests and limits were separate gets its
/// limits from its `cpu` and `memory` (which were the limits then).
pub fn load(dir: &Path) -> io::Result<Record> {
    let raw = fs::read(dir.join("state.json"))?;
    let mut r: Record =
        serde_json::from_slice(&raw).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    r.resources = r.resources.normalized();
    Ok(r)
}

pub use warren_images::{now_ms, rfc3339};

/// `n` random lower-case letters and digits.
pub fn random_name(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn root_project() -> String {
    warren_types::project::ROOT.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::ByteSize;

    #[test]
    fn records_round_trip_through_disk() {
        let dir = tempfile::tempdir().unwrap();
        let r = Record {
            version: RECORD_VERSION,
            id: "abcdef0123456789wxyz".parse().unwrap(),
            image: "host".into(),
            task: Some("t".into()),
            project: "root/rl".into(),
            labels: [("a".to_string(), "b".to_string())].into(),
            env: BTreeMap::new(),
            resources: Resources {
                cpu: 100,
                cpu_limit: 1000,
                memory: ByteSize(1 << 26),
                memory_limit: ByteSize(1 << 29),
                qos: warren_types::api::QosClass::Ls,
                pids: 64,
                disk: None,
            },
            created_ms: 1,
            expires_ms: 2,
            pid: 42,
            start_time: 7,
            idempotency_key: None,
            idle_timeout: Some(60),
            on_idle: IdleAction::Stop,
            trajectory: true,
            backend: BackendKind::Container,
            layers: vec![format!("sha256:{}", "a".repeat(64))],
            default_user: Some("root".into()),
            default_cwd: None,
            guest: Some(format!("sha256:{}", "b".repeat(64))),
            builder: true,
            fncall_worker: false,
            network: warren_types::net::NetworkPolicy {
                allow: vec![warren_types::net::NetRule::domain("pypi.org")],
                expose: vec![8000],
                ..Default::default()
            },
            net_lease: Some((7, 3)),
            host_ports: BTreeMap::from([(8000, 28001)]),
        };
        save(dir.path(), &r).unwrap();
        assert_eq!(load(dir.path()).unwrap(), r);
        assert!(!dir.path().join("state.json.tmp").exists());
        // Later saves swap: the previous record becomes the next save's file, written over in
        // place (longer and shorter records alike), and no file is made any more.
        let ino = |n: &str| {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(dir.path().join(n)).unwrap().ino()
        };
        let mut longer = r.clone();
        longer.labels.insert("long".into(), "x".repeat(5000));
        save(dir.path(), &longer).unwrap();
        assert_eq!(load(dir.path()).unwrap(), longer);
        let (a, b) = (ino("state.json"), ino("state.json.tmp"));
        for (i, rec) in [&r, &longer, &r].into_iter().enumerate() {
            save(dir.path(), rec).unwrap();
            assert_eq!(&load(dir.path()).unwrap(), rec, "save {i}");
            assert_eq!(
                std::collections::BTreeSet::from([ino("state.json"), ino("state.json.tmp")]),
                std::collections::BTreeSet::from([a, b]),
                "the same two files"
            );
        }
        // A link planted as the next file is not followed.
        fs::remove_file(dir.path().join("state.json.tmp")).unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, "untouched").unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("state.json.tmp")).unwrap();
        assert!(save(dir.path(), &r).is_err());
        assert_eq!(fs::read_to_string(&outside).unwrap(), "untouched");
        // A record from before networks: loopback only, no lease.
        let mut old = serde_json::to_value(&r).unwrap();
        old.as_object_mut().unwrap().remove("network");
        old.as_object_mut().unwrap().remove("net_lease");
        let old: Record = serde_json::from_value(old).unwrap();
        assert_eq!(old.network, warren_types::net::NetworkPolicy::none());
        assert_eq!(old.net_lease, None);
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn records_from_before_the_guest_digest_load_with_it_unknown() {
        let dir = tempfile::tempdir().unwrap();
        // As an earlier node wrote it: no backend, layers, defaults or guest.
        let old = serde_json::json!({
            "version": 1,
            "id": "abcdef0123456789wxyz",
            "image": "host",
            "task": null,
            "labels": {},
            "env": {},
            "resources": {"cpu": 1000, "memory": 536870912, "pids": 64},
            "created_ms": 1,
            "expires_ms": 2,
            "pid": 42,
            "start_time": 7,
            "idempotency_key": null
        });
        fs::write(dir.path().join("state.json"), old.to_string()).unwrap();
        let r = load(dir.path()).unwrap();
        assert_eq!(r.guest, None);
        // Its cpu and memory were its limits; it is best-effort.
        assert_eq!(r.resources.cpu_limit, 1000);
        assert_eq!(r.resources.memory_limit, ByteSize(536870912));
        assert_eq!(r.resources.qos, warren_types::api::QosClass::Be);
        assert_eq!(r.backend, BackendKind::Container);
        // And saved again, it stays without one.
        save(dir.path(), &r).unwrap();
        assert!(
            !fs::read_to_string(dir.path().join("state.json"))
                .unwrap()
                .contains("guest")
        );
    }
}

//! The node daemon's configuration, with its defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use warren_types::ByteSize;

/// Whether sandboxes get disk quotas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskQuota {
    /// A btrfs pool with a quota per sandbox; without btrfs (or loop devices), no quotas, and
    /// the node says so in its log and its `NodeInfo`.
    #[default]
    Auto,
    /// No quotas: writable layers are plain directories in the state directory.
    Off,
}

/// How a node runs. Every field has a default; see [`NodeConfig::default`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Where the node keeps its state (sandbox records, writable layers, sockets).
    /// Default `/var/lib/warren/node`.
    pub state_dir: PathBuf,
    /// Name of Warren's parent cgroup in each hierarchy. Default `warren`.
    pub cgroup_parent: String,
    /// The guest agent binary. Default: `warren-guest` beside the running executable.
    pub guest_binary: Option<PathBuf>,
    /// Labels the node reports, for placement and for `warren node ls` (at most 64; keys of
    /// letters, digits and `. _ - : /`). Default none.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The pool the node is in: `default`, or `burst` for nodes used only when the others are
    /// busy. Default `default`.
    pub pool: String,
    /// Most sandboxes this node runs at once. Default: derived at start from what the host
    /// has (see `capacity.rs`: memory, `kernel.pid_max`, open files); a value here caps it.
    pub max_sandboxes: Option<u32>,
    /// Sum of sandboxes' memory requests allowed, as a multiple of physical memory (sandboxes
    /// are mostly idle, and measured pressure is checked as well). Default 4.0.
    pub memory_overcommit: f64,
    /// Sum of sandboxes' CPU requests allowed, as a multiple of the cores. Default 8.0.
    pub cpu_overcommit: f64,
    /// The share of the memory admission (physical memory × `memory_overcommit`) running
    /// function calls may hold at once; calls past it wait for one to end. Idle workers hold
    /// only what they use (16 MiB each) and are killed first when a create needs room.
    /// Default 0.25.
    pub fncall_memory_share: f64,
    /// Refuse new sandboxes when the kernel reports less memory available than this.
    /// Default 256Mi.
    pub min_free_memory: ByteSize,
    /// Refuse new sandboxes while tasks stall waiting for memory more than this share of the
    /// time (PSI `memory some avg10`, percent), where the kernel reports it: a node that is
    /// already reclaiming hard takes no more. Default 10.
    pub max_memory_pressure: f64,
    /// Raise `kernel.pid_max` at start to `pid_max` when it is lower (each idle sandbox holds
    /// two processes, and the kernel's default of 32768 stops a node near 16,000 of them).
    /// Set false to leave the host's setting alone. Default true.
    pub raise_pid_max: bool,
    /// The `kernel.pid_max` the node raises to. Default 4194304 (the kernel's most on 64-bit).
    pub pid_max: u32,
    /// On pause, give back what the kernel can of the sandbox's memory (page cache, and
    /// anonymous memory to swap where the host has swap). Default true.
    pub reclaim_on_pause: bool,
    /// After a resume of a sandbox whose memory a pause reclaimed, ask the kernel to read its
    /// processes' swapped-out memory back in the background (`process_madvise(MADV_WILLNEED)`),
    /// so its first steps after resume do not fault page by page. Default true.
    pub prefetch_on_resume: bool,
    /// Best-effort sandboxes' cgroups are made idle (`cpu.idle`) where the kernel has the
    /// knob; false (or without it): their processes run under `SCHED_IDLE` instead, the
    /// weaker protection (`warren-bench qos` compares them). Default true.
    pub qos_cpu_idle: bool,
    /// Creates a node starts at once; more wait in a queue. Default: 4 per core.
    pub max_concurrent_creates: Option<u32>,
    /// Creates that may wait for a start slot; past this a create is refused at once (429,
    /// `Retry-After`). Default 4096.
    pub create_queue: u32,
    /// The longest a create waits in the queue before it is refused (429), seconds. Default 90
    /// (a thousand creates at once on a busy 2-core node took up to 28 s; the SDKs wait 120 s
    /// for an answer).
    pub create_queue_timeout: u64,
    /// Refuse new sandboxes when fewer than this many pids are left below `kernel.pid_max`.
    /// Default 512.
    pub pid_headroom: u32,
    /// CPU request when a create gives none, millicores. Default 10 (RL sandboxes are mostly
    /// idle while the model thinks).
    pub default_cpu: u32,
    /// CPU limit when a create gives none, millicores (at most the node's cores). Default 2000.
    pub default_cpu_limit: u32,
    /// Memory request when a create gives none. Default 64Mi.
    pub default_memory: ByteSize,
    /// Memory limit when a create gives none (at most physical memory). Default 2Gi.
    pub default_memory_limit: ByteSize,
    /// Process limit when a request gives none. Default 1024.
    pub default_pids: u32,
    /// Largest process limit a request may ask for. Default 32768.
    pub max_pids: u32,
    /// Open files per process in a sandbox (`RLIMIT_NOFILE` soft limit). Default 4096.
    pub open_files: u64,
    /// The most a sandbox process may raise its open-file limit to (hard limit). Default 65536.
    pub max_open_files: u64,
    /// Whether sandbox commands run under the system-call policy. Turn it off only to measure
    /// what it costs (`warren-bench containment` does): without it, agents can make user
    /// namespaces, mount, load BPF. Default true.
    pub seccomp: bool,
    /// The grader role's uid (and gid), which no agent process has. Default 61000.
    pub grader_uid: u32,
    /// The agent's directories a grader command sees, where they exist. Default
    /// `["/home/user", "/workspace"]`.
    pub grader_paths: Vec<String>,
    /// The grader's own writable layer (a fresh tmpfs for each command, charged to the
    /// sandbox's memory). Default 256Mi.
    pub grader_tmp: ByteSize,
    /// Lifetime when a request gives none, seconds. Default 3600.
    pub default_timeout: u64,
    /// Longest lifetime a request may ask for, seconds. Default 7 days.
    pub max_timeout: u64,
    /// Disk quotas of writable layers: `auto` (a btrfs pool with a quota per sandbox, see the
    /// `disk` module; none, with an error in the log, where the kernel lacks btrfs or loop
    /// devices) or `off`. Default `auto`.
    pub disk_quota: DiskQuota,
    /// Size of the disk pool's sparse file, made on first start. Default: half the free space
    /// where the state directory is, at most 1Ti.
    pub disk_pool_size: Option<ByteSize>,
    /// Disk quota when a request gives none. Default 10Gi.
    pub default_disk: ByteSize,
    /// Sum of sandboxes' disk quotas allowed, as a multiple of the pool's size: a quota bounds
    /// what one sandbox can take, and most write little. Default 1024.
    pub disk_overcommit: f64,
    /// Refuse new sandboxes when the disk pool has less free space than this. Default 1Gi.
    pub min_free_disk: ByteSize,
    /// The most a sandbox's trajectory log (with its blobs) may hold on the node's disk; past
    /// it, operations are no longer recorded. Default 1Gi.
    pub max_trajectory: ByteSize,
    /// Largest file upload, bytes. Default 1Gi.
    pub max_upload: ByteSize,
    /// Inits of the built-in `host` image kept started, with their roots built, ahead of
    /// requests (see the container backend's pool): a create then skips the clone, the cgroup
    /// join and the mounts. 0: none. Default 16.
    pub warm_pool: u32,
    /// The image `warm_pool` prepares: `host`, the only one it can (layered images get their
    /// own small pools, below). Default `host`.
    pub warm_image: String,
    /// How many layered images keep warm inits: the most recently created ones. 0: none.
    /// Default 4.
    pub warm_images: u32,
    /// Warm inits kept for each of those images. Default 4.
    pub warm_per_image: u32,
    /// The image layer store: a directory of EROFS layer files and named images, shared by
    /// every node of a cluster (NFS, CephFS, JuiceFS...). Default `/var/lib/warren/images`.
    pub image_store: PathBuf,
    /// How layers are mounted: `file` (EROFS straight from the file; no loop device, cheaper
    /// to set up, reads ahead through the file's page cache) or `loop` (a loop device with
    /// direct I/O; reads only what sandboxes ask for). Default `file` (see `make bench-images`).
    pub layer_mount: crate::layers::LayerMount,
    /// Readahead of a layer's loop device (`layer_mount = "loop"`), KiB: what one read of a
    /// sandbox may bring in beyond what it asked for. The kernel gives a loop device the
    /// readahead of the file system under its file (2560 KiB here), which on a shared file
    /// system fetches several times what sandboxes use. Default 128. (With `file`, reads
    /// ahead as the store's own file system is set to: a host setting Warren leaves alone.)
    pub layer_readahead_kb: u32,
    /// Seconds a layer stays mounted after its last sandbox is gone. Default 60.
    pub layer_idle_unmount: u64,
    /// The sandbox network (`[node.network]`).
    pub network: NetworkConfig,
}

/// The sandbox network: interfaces from address pools, one nftables table (`inet warren`),
/// outbound denied unless a sandbox's policy allows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// Give sandboxes interfaces (network mode `filtered`, the default of creates). Off: every
    /// sandbox is loopback only (`none`) and a create that asks for `filtered` is refused.
    /// Default on.
    pub enabled: bool,
    /// The IPv4 pool, /8 to /27: its first address is every sandbox's gateway (and DNS
    /// resolver). Must not overlap any network the host uses. Default `10.200.0.0/16`.
    pub pool4: String,
    /// The IPv6 pool, /64 to /120. Default `fd77:7761::/64`.
    pub pool6: String,
    /// More destinations no sandbox may reach, whatever its policy: a database or another
    /// node on a public address. Always in: the reviewed list of `warren_types::denied`
    /// (private, shared and unique-local space, loopback, link-local, metadata, ...), the
    /// node's own addresses, the pools and the control plane's `--join` addresses. CIDRs.
    pub internal: Vec<String>,
    /// Destinations taken out of the always-denied ones (a sandbox still needs a rule to reach
    /// them), e.g. `10.20.0.0/16` for a package mirror on the site's network; a range inside a
    /// wider denied one opens just that part. CIDRs.
    pub exempt: Vec<String>,
    /// The NFLOG group refused packets are logged to (one per node per network namespace).
    /// Default 1977.
    pub log_group: u16,
    /// The DNS server the node's proxy asks for the names sandboxes may resolve, `ADDR` or
    /// `ADDR:PORT`. Default: the first `nameserver` of the host's `/etc/resolv.conf`.
    pub dns_upstream: Option<String>,
    /// The least TTL, seconds, the proxy gives an allowed name's answer (and so the least time
    /// the firewall keeps its addresses open, plus 5 s of grace). Default 30.
    pub dns_min_ttl: u32,
    /// The most. Default 600.
    pub dns_max_ttl: u32,
    /// Masquerade (source NAT) allowed traffic out of the node. Default on. Forwarding itself
    /// (`net.ipv4.ip_forward`, `net.ipv6.conf.all.forwarding`) is the host's setting: Warren
    /// leaves it as it is, so without it no allowed traffic leaves the node.
    pub masquerade: bool,
    /// The host address exposed ports listen on. Default `127.0.0.1`: this host only (the
    /// control plane's `<port>-<id>.<domain>` route reaches them through the node's API
    /// anyway); `0.0.0.0` makes them reachable from every network the host is on.
    pub expose_address: String,
    /// The host ports exposed ports are given, a range. Default `28000-29999` (below the
    /// kernel's ephemeral ports, 32768 and up).
    pub expose_ports: String,
    /// Check the TLS server name (SNI) or HTTP Host of every connection to ports 80 and 443
    /// that a domain rule allows, through a transparent proxy on the node that dials the name
    /// itself: allowing `pypi.org` then allows no other site on the same CDN address. Off:
    /// such connections are allowed by the addresses their names resolved to. Default on.
    pub sni_proxy: bool,
    /// The node's port the transparent proxy listens on (the gateway address's, and IPv6's).
    /// Default 15080.
    pub proxy_port: u16,
    /// Refuse TLS hellos that carry Encrypted Client Hello, whose visible server name is only
    /// a public name. Chromium sends the extension (a "GREASE" one) by default: set false, or
    /// start it with `--disable-features=EncryptedClientHello`. Default true.
    pub refuse_ech: bool,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            enabled: true,
            pool4: "10.200.0.0/16".into(),
            pool6: "fd77:7761::/64".into(),
            internal: Vec::new(),
            exempt: Vec::new(),
            log_group: 1977,
            dns_upstream: None,
            dns_min_ttl: 30,
            dns_max_ttl: 600,
            masquerade: true,
            expose_address: "127.0.0.1".into(),
            expose_ports: "28000-29999".into(),
            sni_proxy: true,
            proxy_port: 15080,
            refuse_ech: true,
        }
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            state_dir: PathBuf::from("/var/lib/warren/node"),
            cgroup_parent: "warren".into(),
            guest_binary: None,
            labels: Default::default(),
            pool: warren_types::api::DEFAULT_POOL.to_string(),
            max_sandboxes: None,
            memory_overcommit: 4.0,
            cpu_overcommit: 8.0,
            fncall_memory_share: 0.25,
            min_free_memory: ByteSize(256 << 20),
            max_memory_pressure: 10.0,
            raise_pid_max: true,
            pid_max: 4_194_304,
            qos_cpu_idle: true,
            reclaim_on_pause: true,
            prefetch_on_resume: true,
            max_concurrent_creates: None,
            create_queue: 4096,
            create_queue_timeout: 90,
            pid_headroom: 512,
            default_cpu: 10,
            default_cpu_limit: 2000,
            default_memory: ByteSize(64 << 20),
            default_memory_limit: ByteSize(2 << 30),
            default_pids: 1024,
            max_pids: 32768,
            open_files: 4096,
            max_open_files: 65536,
            seccomp: true,
            grader_uid: 61000,
            grader_paths: vec!["/home/user".into(), "/workspace".into()],
            grader_tmp: ByteSize(256 << 20),
            default_timeout: 3600,
            max_timeout: 7 * 24 * 3600,
            disk_quota: DiskQuota::Auto,
            disk_pool_size: None,
            default_disk: ByteSize(10 << 30),
            disk_overcommit: 1024.0,
            min_free_disk: ByteSize(1 << 30),
            max_trajectory: ByteSize(1 << 30),
            max_upload: ByteSize(1 << 30),
            warm_pool: 16,
            warm_image: "host".into(),
            warm_images: 4,
            warm_per_image: 4,
            image_store: PathBuf::from("/var/lib/warren/images"),
            layer_mount: crate::layers::LayerMount::File,
            layer_readahead_kb: 128,
            layer_idle_unmount: 60,
            network: NetworkConfig::default(),
        }
    }
}

impl NodeConfig {
    /// The grader role's settings.
    pub fn grader(&self) -> warren_types::guest::GraderSpec {
        warren_types::guest::GraderSpec {
            uid: self.grader_uid,
            workspaces: self.grader_paths.clone(),
            tmp_size: self.grader_tmp.bytes(),
        }
    }

    /// The limits every sandbox command gets.
    pub fn guest_limits(&self) -> warren_types::guest::GuestLimits {
        warren_types::guest::GuestLimits {
            open_files: self.open_files.min(self.max_open_files),
            max_open_files: self.max_open_files,
            system_call_filter: self.seccomp,
        }
    }
}

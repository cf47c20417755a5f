//! Incident events: what sandboxes tried that the platform stopped or cut, and what held them
//! up (a create that waited long for its node) (`GET /v1/events`).
//!
//! Each event sums the occurrences of one kind and detail in one sandbox over a window (a
//! burst of a million denied system calls is one event with its count), so the store stays
//! small whatever an agent does.

use serde::{Deserialize, Serialize};

use crate::id::{NodeId, SandboxId};

/// What an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A system call the sandbox policy denies (it failed with EPERM).
    Seccomp,
    /// An attempt on the guest agent, the sandbox's management process (signals, ptrace,
    /// limits aimed at PID 1).
    Management,
    /// The sandbox's writable layer reached its disk quota.
    DiskQuota,
    /// A command's output passed `max_output` and was cut.
    OutputTruncated,
    /// The sandbox reached its process limit (a fork failed).
    PidsLimit,
    /// The kernel killed a process of the sandbox for memory.
    OomKill,
    /// A connection attempt or a name lookup its network policy refused.
    Network,
    /// Its create waited long for one of its node's start slots: the node was starting many
    /// sandboxes at once (the detail says how long and how many waited). At most one such
    /// event every 10 s per node.
    CreateQueued,
}

impl EventKind {
    /// Every kind, for help texts.
    pub const ALL: [EventKind; 8] = [
        EventKind::Seccomp,
        EventKind::Management,
        EventKind::DiskQuota,
        EventKind::OutputTruncated,
        EventKind::PidsLimit,
        EventKind::OomKill,
        EventKind::Network,
        EventKind::CreateQueued,
    ];

    /// The kind's name as the API writes it.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Seccomp => "seccomp",
            EventKind::Management => "management",
            EventKind::DiskQuota => "disk_quota",
            EventKind::OutputTruncated => "output_truncated",
            EventKind::PidsLimit => "pids_limit",
            EventKind::OomKill => "oom_kill",
            EventKind::Network => "network",
            EventKind::CreateQueued => "create_queued",
        }
    }

    /// The kind for a name.
    pub fn parse(s: &str) -> Option<EventKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// One incident event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    /// Unique on its node; an update of the same event (a higher count) keeps the id.
    pub id: String,
    /// The node that recorded it.
    pub node: NodeId,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The sandbox's task, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The sandbox's project (absent for events recorded before projects were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// What happened.
    pub kind: EventKind,
    /// Which: the system call, the stream, the limit.
    pub detail: String,
    /// Occurrences summed in this event.
    pub count: u64,
    /// The first occurrence (RFC 3339).
    pub first_at: String,
    /// The last occurrence (RFC 3339).
    pub last_at: String,
    /// The process of the last occurrence, in the sandbox's pid namespace, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Its command name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// What a `network` event refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetEvent>,
}

/// The refused attempts of a `network` event: one destination (or, for a sweep across many,
/// a summary), its ports, or the name looked up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetEvent {
    /// `tcp`, `udp`, `icmp`, `icmpv6`, `dns`, `dns-rebinding`, or `tls` / `http` for a
    /// connection the node's transparent proxy refused by the name it asked for.
    pub protocol: String,
    /// The address tried (for a name lookup: the resolver).
    pub destination: String,
    /// The ports tried, as ranges (`22`, `1-1024`), up to 64 ranges (then `…`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ports: String,
    /// How many distinct ports.
    #[serde(default)]
    pub port_count: u32,
    /// The name refused (a lookup, or the TLS server name / HTTP host of a connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// `GET /v1/events`: events, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventList {
    /// The events.
    pub events: Vec<Event>,
}

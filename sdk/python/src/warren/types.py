"""What Warren answers, as dataclasses. Field names are the API's (see ``/v1/openapi.json``)."""

from __future__ import annotations

import base64
from collections import abc
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, TypeVar, Union

T = TypeVar("T")


def _decode(text: str, encoding: str) -> bytes:
    if encoding == "base64":
        return base64.b64decode(text)
    return text.encode("utf-8")


@dataclass(frozen=True)
class Resources:
    """Resources a sandbox was given: requests (what the node's admission counts) and limits
    (what the kernel enforces), and its QoS class."""

    cpu: int
    """CPU request in millicores (1000 = one core)."""
    memory: int
    """Memory request in bytes."""
    pids: int
    """Most processes and threads."""
    disk: Optional[int] = None
    """Disk quota of the writable layer in bytes; ``None`` where the node enforces none."""
    cpu_limit: int = 0
    """CPU limit in millicores."""
    memory_limit: int = 0
    """Memory limit in bytes."""
    qos: str = "be"
    """``"be"`` (best-effort: idle CPU priority) or ``"ls"`` (latency-sensitive)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Resources:
        disk = d.get("disk")
        return cls(
            cpu=int(d["cpu"]),
            memory=int(d["memory"]),
            pids=int(d["pids"]),
            disk=None if disk is None else int(disk),
            cpu_limit=int(d.get("cpu_limit") or d["cpu"]),
            memory_limit=int(d.get("memory_limit") or d["memory"]),
            qos=d.get("qos", "be"),
        )


# Networks.


@dataclass(frozen=True)
class NetRule:
    """One network rule: a destination (a ``cidr`` or a ``domain``, or neither for every
    address on ``ports``), optional ``ports`` and ``protocol``.

    ::

        NetRule(cidr="203.0.113.0/24")              # every port and protocol of a range
        NetRule(domain="*.pythonhosted.org")        # TCP to the names under it
        NetRule(cidr="2001:db8::/32", ports="443", protocol="tcp")
        NetRule.port("53/udp")                      # UDP port 53 of every address
    """

    cidr: Optional[str] = None
    """An address or CIDR, IPv4 or IPv6 (``10.1.2.3``, ``10.0.0.0/8``); host bits must be 0."""
    domain: Optional[str] = None
    """``pypi.org`` (that name only) or ``*.pythonhosted.org`` (every name under it, not the
    name itself). A domain rule is TCP only: it allows the addresses the node's resolver gave
    the sandbox for the name, for their TTL."""
    ports: Union[str, int, None] = None
    """A port (``443``) or an inclusive range (``"8000-8100"``); ``None``: every port."""
    protocol: Optional[str] = None
    """``"tcp"`` or ``"udp"``; ``None``: both (a domain is always TCP)."""

    @classmethod
    def port(cls, spec: Union[str, int], protocol: Optional[str] = None) -> NetRule:
        """Every address on a port or range, written as the CLI's ``--allow-port`` takes it:
        ``443``, ``"53/udp"``, ``"8000-8100/tcp"`` (no protocol: TCP and UDP)."""
        from ._validate import port_spec

        ports, proto = port_spec(spec)
        if protocol is not None and proto is not None and protocol != proto:
            from .errors import InvalidArgument

            raise InvalidArgument(f"port {spec!r} says {proto}, and protocol says {protocol!r}")
        return cls(ports=ports, protocol=proto or protocol)

    def to_json(self) -> Dict[str, Any]:
        """The rule as the API takes it (unset fields left out)."""
        d: Dict[str, Any] = {}
        if self.cidr is not None:
            d["cidr"] = self.cidr
        if self.domain is not None:
            d["domain"] = self.domain
        if self.ports is not None:
            d["ports"] = str(self.ports)
        if self.protocol is not None:
            d["protocol"] = self.protocol
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NetRule:
        ports = d.get("ports")
        return cls(
            cidr=d.get("cidr"),
            domain=d.get("domain"),
            ports=None if ports is None else str(ports),
            protocol=d.get("protocol"),
        )


def _rules(items: Iterable[Any], what: str) -> List[NetRule]:
    from ._validate import net_rule_of

    return [net_rule_of(r, f"{what}[{i}]") for i, r in enumerate(items)]


@dataclass(frozen=True)
class ExposedPort:
    """A port of a sandbox reachable from outside it (``NetworkStatus.exposed``)."""

    port: int
    """The sandbox's TCP port."""
    host: str
    """Where its node's host takes connections for it: ``"ADDRESS:PORT"`` (the node's
    ``[node.network] expose_address``, loopback by default, and a port of its ``expose_ports``
    range)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExposedPort:
        return cls(port=int(d["port"]), host=d["host"])


@dataclass(frozen=True, init=False)
class NetworkPolicy:
    """What a sandbox may reach: ``mode`` ``"filtered"`` (the default: an interface, every
    outbound connection denied unless an ``allow`` rule matches and no ``deny`` rule does) or
    ``"none"`` (loopback only: no interface at all, the cheapest).

    The rules as :class:`NetRule` objects (or dicts of the same fields), or by kind::

        NetworkPolicy()                                         # an interface, nothing allowed
        NetworkPolicy.none()                                    # loopback only
        NetworkPolicy.internet(deny_cidrs=["203.0.113.0/24"])   # every public address but a range
        NetworkPolicy(allow_domains=["pypi.org", "*.pythonhosted.org"],
                      allow_cidrs=["203.0.113.0/24"], allow_ports=["443/tcp", "53/udp"])

    ``expose`` lists TCP ports of the sandbox reachable from outside it (at most 32; mode
    ``filtered`` only): inbound connections are denied except to these. Each gets a port on its
    node's host (``NetworkStatus.exposed``) and, where the control plane has a
    ``sandbox_domain``, the address ``sandbox.get_host(port)``. A service must listen on
    ``0.0.0.0`` or ``::``, not only on ``127.0.0.1``::

        NetworkPolicy(allow_domains=["pypi.org"], expose=[8000])

    Some destinations are never reachable whatever the rules say (the node, other sandboxes,
    loopback, link-local and cloud metadata addresses), unless the node's administrator allows
    them. Rules are checked lightly before a request (:class:`~warren.InvalidArgument`); the
    server checks the rest and names the rule it refuses (``allow[0]: ...``).
    """

    mode: str
    """``"filtered"`` or ``"none"``."""
    allow: List[NetRule]
    deny: List[NetRule]
    expose: List[int]
    """Exposed TCP ports, sorted, once each (as the server keeps them)."""

    def __init__(
        self,
        mode: str = "filtered",
        allow: Iterable[Union[NetRule, Mapping[str, Any]]] = (),
        deny: Iterable[Union[NetRule, Mapping[str, Any]]] = (),
        *,
        allow_domains: Iterable[str] = (),
        allow_cidrs: Iterable[str] = (),
        allow_ports: Iterable[Union[str, int]] = (),
        deny_domains: Iterable[str] = (),
        deny_cidrs: Iterable[str] = (),
        deny_ports: Iterable[Union[str, int]] = (),
        expose: Iterable[int] = (),
    ) -> None:
        rules = {}
        for what, given, domains, cidrs, ports in (
            ("allow", allow, allow_domains, allow_cidrs, allow_ports),
            ("deny", deny, deny_domains, deny_cidrs, deny_ports),
        ):
            for name, items in (
                (what, given),
                (f"{what}_domains", domains),
                (f"{what}_cidrs", cidrs),
                (f"{what}_ports", ports),
            ):
                if isinstance(items, (str, bytes, Mapping, NetRule)):
                    from .errors import ArgumentTypeError

                    raise ArgumentTypeError(
                        f"{name} must be a list, not one {type(items).__name__}: "
                        f"write {name}=[{items!r}]"
                    )
            rules[what] = (
                _rules(given, what)
                + [NetRule(domain=d) for d in domains]
                + [NetRule(cidr=c) for c in cidrs]
                + [NetRule.port(p) for p in ports]
            )
        if isinstance(expose, (str, bytes, Mapping)) or not isinstance(expose, abc.Iterable):
            from .errors import ArgumentTypeError

            raise ArgumentTypeError(
                f"expose must be a list of ports, not one {type(expose).__name__}: "
                f"write expose=[{expose!r}]"
            )
        exposed = list(expose)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in exposed):
            exposed = sorted(set(exposed))  # as the server keeps them, so policies compare equal
        # Anything else is kept as given, for the checks before a request to name.
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "allow", rules["allow"])
        object.__setattr__(self, "deny", rules["deny"])
        object.__setattr__(self, "expose", exposed)

    @classmethod
    def none(cls) -> NetworkPolicy:
        """Loopback only. At create: no interface at all. On a running sandbox created with an
        interface: every connection denied (the interface stays)."""
        return cls(mode="none")

    @classmethod
    def internet(
        cls,
        *,
        deny: Iterable[Union[NetRule, Mapping[str, Any]]] = (),
        deny_domains: Iterable[str] = (),
        deny_cidrs: Iterable[str] = (),
        deny_ports: Iterable[Union[str, int]] = (),
        expose: Iterable[int] = (),
    ) -> NetworkPolicy:
        """Every public address, every port (``0.0.0.0/0`` and ``::/0``: the node, other
        sandboxes, private networks, loopback, link-local and metadata addresses stay denied),
        less what ``deny`` says; ``expose`` as for the constructor."""
        return cls(
            allow_cidrs=["0.0.0.0/0", "::/0"],
            deny=deny,
            deny_domains=deny_domains,
            deny_cidrs=deny_cidrs,
            deny_ports=deny_ports,
            expose=expose,
        )

    def to_json(self) -> Dict[str, Any]:
        """The policy as the API takes it."""
        d: Dict[str, Any] = {"mode": self.mode}
        if self.allow:
            d["allow"] = [r.to_json() for r in self.allow]
        if self.deny:
            d["deny"] = [r.to_json() for r in self.deny]
        if self.expose:
            d["expose"] = list(self.expose)
        return d


@dataclass(frozen=True)
class NetworkStatus:
    """A sandbox's network as it stands (``sandbox.network.get()``, ``SandboxInfo.network``)."""

    mode: str
    """``"filtered"`` or ``"none"``."""
    ipv4: Optional[str] = None
    """Its IPv4 address (mode ``filtered``)."""
    ipv6: Optional[str] = None
    gateway: Optional[str] = None
    """The node's address on its interface, and its only DNS resolver (mode ``filtered``)."""
    allow: List[NetRule] = field(default_factory=list)
    deny: List[NetRule] = field(default_factory=list)
    exposed: List[ExposedPort] = field(default_factory=list)
    """Its exposed ports, each with where its node's host takes connections for it (empty
    from servers older than exposed ports)."""

    @property
    def policy(self) -> NetworkPolicy:
        """Its policy, to change and give back to ``sandbox.network.update``."""
        return NetworkPolicy(
            self.mode, self.allow, self.deny, expose=[e.port for e in self.exposed]
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NetworkStatus:
        return cls(
            mode=d.get("mode", "filtered"),
            ipv4=d.get("ipv4"),
            ipv6=d.get("ipv6"),
            gateway=d.get("gateway"),
            allow=[NetRule.from_json(r) for r in d.get("allow") or []],
            deny=[NetRule.from_json(r) for r in d.get("deny") or []],
            exposed=[ExposedPort.from_json(e) for e in d.get("exposed") or []],
        )


@dataclass(frozen=True)
class NetEvent:
    """What a ``network`` event refused: one destination (or, for a sweep across many, a
    summary), the ports tried, or the name looked up."""

    protocol: str
    """``tcp``, ``udp``, ``icmp``, ``icmpv6``, ``dns``, ..."""
    destination: str
    """The address tried (for a name lookup: the resolver)."""
    ports: str = ""
    """The ports tried, as ranges (``"22"``, ``"1-52,54-300"``), up to 64 ranges (then ``…``)."""
    port_count: int = 0
    """How many distinct ports."""
    domain: Optional[str] = None
    """The name refused (a lookup)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NetEvent:
        return cls(
            protocol=d.get("protocol", ""),
            destination=d.get("destination", ""),
            ports=d.get("ports") or "",
            port_count=int(d.get("port_count") or 0),
            domain=d.get("domain"),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the API shows it."""

    id: str
    node: str
    backend: str
    """``"container"`` for now."""
    image: str
    state: str
    """``"running"`` or ``"paused"``; ``"unknown"`` while its node does not answer (listed
    as last heard)."""
    resources: Resources
    created_at: str
    """RFC 3339."""
    expires_at: str
    """When its absolute timeout kills it, RFC 3339."""
    task: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    idle_timeout: Optional[int] = None
    on_idle: str = "pause"
    trajectory: bool = False
    layers: List[str] = field(default_factory=list)
    """Digests of its image layers, bottom first (empty for ``host``)."""
    guest: Optional[str] = None
    """Digest (``sha256:...``) of the guest agent binary it runs; None where unknown."""
    builder: bool = False
    """An image build's sandbox, whose root commands hold the build capabilities."""
    network: Optional[NetworkStatus] = None
    """Its network: mode, addresses and policy (``None`` from nodes older than networks)."""
    pool: str = "default"
    """Its node's pool: ``default``, or ``burst`` (a node used while the others are busy)."""
    project: str = "root"
    """Its project (``root/rl/job-42``): who may see and touch it, and whose quota counts it."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxInfo:
        return cls(
            id=d["id"],
            node=d["node"],
            backend=d["backend"],
            image=d["image"],
            state=d["state"],
            resources=Resources.from_json(d["resources"]),
            created_at=d["created_at"],
            expires_at=d["expires_at"],
            task=d.get("task"),
            labels=dict(d.get("labels") or {}),
            idle_timeout=d.get("idle_timeout"),
            on_idle=d.get("on_idle", "pause"),
            trajectory=bool(d.get("trajectory", False)),
            layers=list(d.get("layers") or []),
            guest=d.get("guest"),
            builder=bool(d.get("builder", False)),
            network=NetworkStatus.from_json(d["network"]) if d.get("network") else None,
            pool=d.get("pool", "default"),
            project=d.get("project", "root"),
        )


@dataclass(frozen=True)
class ExitStatus:
    """How a command ended."""

    exit_code: int
    """Exit code; 128 + the signal number when a signal ended it; 127 when the program was not
    found, 126 when it could not be executed."""
    stdout_bytes: int = 0
    """Bytes written to stdout, kept or not."""
    stderr_bytes: int = 0
    """Bytes written to stderr, kept or not."""
    duration_ms: int = 0
    signal: Optional[int] = None
    """The signal that ended it, if one did."""
    timed_out: bool = False
    """Whether the command's timeout killed it."""
    stdout_truncated: bool = False
    """Whether stdout was cut at ``max_output``."""
    stderr_truncated: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExitStatus:
        return cls(
            exit_code=int(d["exit_code"]),
            stdout_bytes=int(d.get("stdout_bytes", 0)),
            stderr_bytes=int(d.get("stderr_bytes", 0)),
            duration_ms=int(d.get("duration_ms", 0)),
            signal=d.get("signal"),
            timed_out=bool(d.get("timed_out", False)),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
        )


@dataclass(frozen=True)
class ExecResult:
    """What a command gave.

    ``stdout`` and ``stderr`` are text. When the command wrote bytes that are not UTF-8 the
    server sends them as base64 (``stdout_encoding == "base64"``): ``stdout`` is then a lossy
    decoding and :attr:`stdout_data` has the exact bytes (it always has them).
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    """Bytes written to stdout, kept or not (a count, not the data: see :attr:`stdout_data`)."""
    stderr_bytes: int = 0
    duration_ms: int = 0
    signal: Optional[int] = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_encoding: str = "utf8"
    stderr_encoding: str = "utf8"
    replayed: bool = False
    """The recorded result of a replayed trajectory: the command was not run again."""
    replay_ended: bool = False
    """This command did not match the replayed trajectory, so replay ended here and it ran live."""
    _stdout_raw: bytes = field(default=b"", repr=False, compare=False)
    _stderr_raw: bytes = field(default=b"", repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Whether the command exited with code 0."""
        return self.exit_code == 0

    @property
    def fault(self) -> Optional[str]:
        """``"agent"`` when the command failed (a non-zero exit, a signal, its timeout): the
        agent's own doing, to be scored; ``None`` when it succeeded. Failures of the platform
        are exceptions (:attr:`warren.WarrenError.fault`), never results."""
        if self.exit_code == 0 and self.signal is None and not self.timed_out:
            return None
        return "agent"

    @property
    def stdout_data(self) -> bytes:
        """Standard output as the exact bytes the command wrote (up to ``max_output``)."""
        return self._stdout_raw

    @property
    def stderr_data(self) -> bytes:
        """Standard error as the exact bytes the command wrote (up to ``max_output``)."""
        return self._stderr_raw

    @property
    def status(self) -> ExitStatus:
        """How the command ended, without its output."""
        return ExitStatus(
            exit_code=self.exit_code,
            stdout_bytes=self.stdout_bytes,
            stderr_bytes=self.stderr_bytes,
            duration_ms=self.duration_ms,
            signal=self.signal,
            timed_out=self.timed_out,
            stdout_truncated=self.stdout_truncated,
            stderr_truncated=self.stderr_truncated,
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExecResult:
        st = ExitStatus.from_json(d)
        out_enc = d.get("stdout_encoding", "utf8")
        err_enc = d.get("stderr_encoding", "utf8")
        out_raw = _decode(d.get("stdout", ""), out_enc)
        err_raw = _decode(d.get("stderr", ""), err_enc)
        return cls(
            exit_code=st.exit_code,
            stdout=out_raw.decode("utf-8", "replace") if out_enc != "utf8" else d.get("stdout", ""),
            stderr=err_raw.decode("utf-8", "replace") if err_enc != "utf8" else d.get("stderr", ""),
            stdout_bytes=st.stdout_bytes,
            stderr_bytes=st.stderr_bytes,
            duration_ms=st.duration_ms,
            signal=st.signal,
            timed_out=st.timed_out,
            stdout_truncated=st.stdout_truncated,
            stderr_truncated=st.stderr_truncated,
            stdout_encoding=out_enc,
            stderr_encoding=err_enc,
            replayed=bool(d.get("replayed", False)),
            replay_ended=bool(d.get("replay_ended", False)),
            _stdout_raw=out_raw,
            _stderr_raw=err_raw,
        )


@dataclass(frozen=True)
class ProcessInfo:
    """A background process in a sandbox."""

    process_id: int
    """Its id in the sandbox's process table (not a pid: never reused)."""
    pid: int
    """Its pid inside the sandbox."""
    argv: List[str]
    user: str
    running: bool
    exit: Optional[ExitStatus] = None
    """How it ended, once it has."""
    pty: bool = False
    """Whether it runs on a terminal (its output is then all stdout)."""
    stdin_open: bool = False
    """Whether its stdin is open for ``send_stdin``."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProcessInfo:
        ex = d.get("exit")
        return cls(
            process_id=int(d["process_id"]),
            pid=int(d["pid"]),
            argv=list(d["argv"]),
            user=d["user"],
            running=bool(d["running"]),
            exit=ExitStatus.from_json(ex) if ex else None,
            pty=bool(d.get("pty", False)),
            stdin_open=bool(d.get("stdin_open", False)),
        )


@dataclass(frozen=True)
class SandboxMetrics:
    """What a sandbox uses, measured when asked (``sandbox.metrics()``)."""

    timestamp_ms: int
    cpu_used_ns: int
    """CPU time its processes used since it started."""
    cpu_used_pct: float
    """CPU use as a percentage of its CPU limit, since the previous read (within a minute),
    else over its life."""
    cpu_limit: int
    """Millicores."""
    memory_used: int
    memory_cache: int
    """Page cache among ``memory_used``."""
    memory_limit: int
    disk_used: Optional[int] = None
    disk_limit: Optional[int] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxMetrics:
        return cls(
            timestamp_ms=int(d["timestamp_ms"]),
            cpu_used_ns=int(d["cpu_used_ns"]),
            cpu_used_pct=float(d["cpu_used_pct"]),
            cpu_limit=int(d["cpu_limit"]),
            memory_used=int(d["memory_used"]),
            memory_cache=int(d["memory_cache"]),
            memory_limit=int(d["memory_limit"]),
            disk_used=d.get("disk_used"),
            disk_limit=d.get("disk_limit"),
        )


@dataclass(frozen=True)
class FsEvent:
    """One change under a watched directory."""

    kind: str
    """``create``, ``write``, ``remove``, ``rename`` (the old name) or ``chmod``."""
    path: str
    """Relative to the watched directory."""


@dataclass(frozen=True)
class WatchEvents:
    """A watch's changes since the last call."""

    events: List[FsEvent]
    overflowed: bool = False
    """Some were lost: more came than the sandbox keeps per watch (10,000)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WatchEvents:
        return cls(
            events=[FsEvent(kind=e["kind"], path=e["path"]) for e in d.get("events", [])],
            overflowed=bool(d.get("overflowed", False)),
        )


@dataclass(frozen=True)
class FileEntry:
    """A file or directory in a sandbox."""

    name: str
    path: str
    kind: str
    """``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``."""
    size: int
    mode: int
    """Permission bits, e.g. ``0o644``."""
    uid: int
    gid: int
    modified: int
    """Seconds since the epoch."""
    link_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FileEntry:
        return cls(
            name=d["name"],
            path=d["path"],
            kind=d["kind"],
            size=int(d["size"]),
            mode=int(d["mode"]),
            uid=int(d["uid"]),
            gid=int(d["gid"]),
            modified=int(d["modified"]),
            link_target=d.get("link_target"),
        )


@dataclass(frozen=True)
class ErrorInfo:
    """An error as the API reports it inside a result (see :class:`TaskFailure`)."""

    code: str
    message: str


@dataclass(frozen=True)
class NodeFailure:
    """A node that gave no answer to a call Warren made to every node, and why (``unavailable``
    when it did not answer at all). What it holds is missing from the answer."""

    node: str
    error: ErrorInfo

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeFailure:
        return cls(node=d["node"], error=ErrorInfo(d["error"]["code"], d["error"]["message"]))


def unreachable_from_json(d: Mapping[str, Any]) -> List[NodeFailure]:
    """The ``unreachable`` nodes of an answer gathered from every node (none when absent)."""
    return [NodeFailure.from_json(f) for f in d.get("unreachable") or []]


class Listing(List[T]):
    """A list gathered from every node: a plain ``list`` of what the nodes that answered hold,
    and ``unreachable``, the nodes that did not answer (their items are missing)."""

    unreachable: List[NodeFailure]

    def __init__(self, items: Iterable[T] = (), unreachable: Iterable[NodeFailure] = ()) -> None:
        super().__init__(items)
        self.unreachable = list(unreachable)

    @property
    def complete(self) -> bool:
        """Whether every node answered, so that nothing is missing."""
        return not self.unreachable

    def __repr__(self) -> str:
        if self.unreachable:
            nodes = ", ".join(f.node for f in self.unreachable)
            return f"Listing({list.__repr__(self)}, unreachable=[{nodes}])"
        return f"Listing({list.__repr__(self)})"


@dataclass(frozen=True)
class TaskFailure:
    """A sandbox a task-level operation failed on, and why."""

    id: str
    error: ErrorInfo


def _task_failures(d: Mapping[str, Any]) -> List[TaskFailure]:
    return [
        TaskFailure(id=f["id"], error=ErrorInfo(f["error"]["code"], f["error"]["message"]))
        for f in d.get("failed") or []
    ]


@dataclass(frozen=True)
class TaskResult:
    """What a task-level operation did."""

    task: str
    action: str
    """``"pause"``, ``"resume"`` or ``"stop"``."""
    succeeded: int
    """How many sandboxes it succeeded on."""
    failed: List[TaskFailure] = field(default_factory=list)
    unreachable: List[NodeFailure] = field(default_factory=list)
    """Nodes that did not answer: their sandboxes of the task were not reached."""
    memory_freed: Optional[int] = None
    """For a pause: bytes of memory the paused sandboxes gave back before the answer (page
    cache, and anonymous memory where the node has swap); the nodes reclaim the rest after."""
    creates_in_flight: int = 0
    """Creates of the task still in flight when it acted: after a pause they land paused,
    after a stop they are killed as they land (their create raises ``SandboxGone``)."""

    @property
    def ok(self) -> bool:
        """Whether it succeeded on every sandbox of the task, on every node."""
        return not self.failed and not self.unreachable

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TaskResult:
        freed = d.get("memory_freed")
        return cls(
            task=d["task"],
            action=d["action"],
            succeeded=int(d["succeeded"]),
            failed=_task_failures(d),
            unreachable=unreachable_from_json(d),
            memory_freed=None if freed is None else int(freed),
            creates_in_flight=int(d.get("creates_in_flight", 0)),
        )


@dataclass(frozen=True)
class TaskNetworkResult:
    """How a task's sandboxes took a new network policy (``client.tasks.set_network``)."""

    task: str
    succeeded: int
    """How many sandboxes took it."""
    failed: List[TaskFailure] = field(default_factory=list)
    """The ones that did not, with why (a sandbox created with network mode ``none`` has no
    interface to filter)."""
    unreachable: List[NodeFailure] = field(default_factory=list)
    """Nodes that did not answer: their sandboxes of the task were not reached."""

    @property
    def ok(self) -> bool:
        """Whether every sandbox of the task, on every node, took the policy."""
        return not self.failed and not self.unreachable

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TaskNetworkResult:
        return cls(
            task=d["task"],
            succeeded=int(d["succeeded"]),
            failed=_task_failures(d),
            unreachable=unreachable_from_json(d),
        )


@dataclass(frozen=True)
class TaskInfo:
    """A task and how many sandboxes it has."""

    name: str
    sandboxes: int
    running: int
    paused: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TaskInfo:
        return cls(
            name=d["name"],
            sandboxes=int(d["sandboxes"]),
            running=int(d["running"]),
            paused=int(d["paused"]),
        )


@dataclass(frozen=True)
class Health:
    """``GET /v1/health``."""

    status: str
    """``"ok"``, or ``"degraded"`` when a node does not answer."""
    version: str
    nodes_up: int
    nodes: int
    sandbox_domain: Optional[str] = None
    """The domain of the ``<port>-<sandbox id>.<domain>`` route to exposed ports
    (``sandbox.get_host``), where the control plane has one (``[control] sandbox_domain``)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Health:
        return cls(
            status=d["status"],
            version=d["version"],
            nodes_up=int(d["nodes_up"]),
            nodes=int(d["nodes"]),
            sandbox_domain=d.get("sandbox_domain") or None,
        )


@dataclass(frozen=True)
class NodeInfo:
    """A node with its capacity and load (``GET /v1/nodes``): what its sandboxes requested
    and what they use, measured."""

    id: str
    version: str
    sandboxes: int
    max_sandboxes: int
    memory_reserved: int
    """Memory requested by its sandboxes."""
    memory_allocatable: int
    """Memory requests it admits in all (physical memory × overcommit)."""
    memory_available: int
    """What the kernel reports available now (free plus reclaimable)."""
    threads: int
    pid_max: int
    cgroups: str
    max_upload: int
    guest: Optional[str] = None
    """Digest (``sha256:...``) of the guest agent binary its new sandboxes run."""
    memory_total: int = 0
    memory_used: int = 0
    """Memory charged to its sandboxes now, measured."""
    cpu_requested: int = 0
    """CPU requested by its sandboxes, millicores."""
    cpu_allocatable: int = 0
    cpu_cores: int = 0
    cpu_used_pct: float = 0.0
    """The host's CPU use over the last second, percent of all cores."""
    pressure: Optional[Dict[str, float]] = None
    """PSI ``some avg10`` of ``cpu``, ``memory`` and ``io``, percent, where the kernel has it."""
    qos: Optional[Dict[str, Any]] = None
    """What the kernel supports for QoS: ``cpu_idle``, ``smt``, ``core_scheduling``, ..."""
    labels: Dict[str, str] = field(default_factory=dict)
    """The node's labels, from its configuration."""
    pool: str = "default"
    """Its pool: ``default``, or ``burst``."""
    cordoned: bool = False
    """Whether new sandboxes are kept off it."""
    reachable: bool = True
    """Whether it answered the control plane's last poll (if not, the figures are its last
    report's)."""
    address: Optional[str] = None
    """Where the control plane reaches it, for a node that joined over the network."""
    fncall_pools: List[Dict[str, Any]] = field(default_factory=list)
    """Its function-call worker pools, one per image and memory: ``image``, ``memory``,
    ``idle``, ``busy``, ``queued``, ``starting``, ``keep``, ``calls``, ``cold_calls``,
    ``workers_started``, ``timed_out``."""
    fncall_budget: int = 0
    """The most memory function calls may hold on it at once, bytes (``fncall_memory_share``
    of its memory admission); a call holds its memory only while it runs."""
    fncall_held: int = 0
    """Memory running function calls hold now, bytes."""
    creates_starting: int = 0
    """Creates starting now, each holding one of its ``create_slots``."""
    creates_waiting: int = 0
    """Creates waiting for a start slot now (they start in arrival order)."""
    create_slots: int = 0
    """Creates it starts at once (``max_concurrent_creates``)."""
    create_wait_ms: int = 0
    """The longest a create waited for a start slot over the last minute, those still
    waiting included, milliseconds."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeInfo:
        return cls(
            id=d["id"],
            version=d["version"],
            sandboxes=int(d["sandboxes"]),
            max_sandboxes=int(d["max_sandboxes"]),
            memory_reserved=int(d["memory_reserved"]),
            memory_allocatable=int(d["memory_allocatable"]),
            memory_available=int(d["memory_available"]),
            threads=int(d["threads"]),
            pid_max=int(d["pid_max"]),
            cgroups=d["cgroups"],
            max_upload=int(d["max_upload"]),
            guest=d.get("guest"),
            memory_total=int(d.get("memory_total", 0)),
            memory_used=int(d.get("memory_used", 0)),
            cpu_requested=int(d.get("cpu_requested", 0)),
            cpu_allocatable=int(d.get("cpu_allocatable", 0)),
            cpu_cores=int(d.get("cpu_cores", 0)),
            cpu_used_pct=float(d.get("cpu_used_pct", 0.0)),
            pressure=d.get("pressure"),
            qos=d.get("qos"),
            labels=dict(d.get("labels") or {}),
            pool=d.get("pool", "default"),
            cordoned=bool(d.get("cordoned", False)),
            reachable=bool(d.get("reachable", True)),
            address=d.get("address"),
            fncall_pools=[dict(p) for p in d.get("fncall_pools") or []],
            fncall_budget=int(d.get("fncall_budget", 0)),
            fncall_held=int(d.get("fncall_held", 0)),
            creates_starting=int(d.get("creates_starting", 0)),
            creates_waiting=int(d.get("creates_waiting", 0)),
            create_slots=int(d.get("create_slots", 0)),
            create_wait_ms=int(d.get("create_wait_ms", 0)),
        )


@dataclass(frozen=True)
class IncidentEvent:
    """An incident event (``client.events.list``): what a sandbox tried that the platform
    stopped or cut. A burst is one event with its ``count``."""

    id: str
    node: str
    sandbox: str
    task: Optional[str]
    kind: str
    """``seccomp``, ``management``, ``disk_quota``, ``output_truncated``, ``pids_limit``,
    ``oom_kill``, ``network`` (a connection attempt or name lookup its policy refused) or
    ``create_queued`` (its create waited long for one of its node's start slots)."""
    detail: str
    """Which: the system call, the stream, the limit."""
    count: int
    first_at: str
    last_at: str
    pid: Optional[int] = None
    """The process of the last occurrence (in the sandbox), when known."""
    comm: Optional[str] = None
    network: Optional[NetEvent] = None
    """What a ``network`` event refused: protocol, destination, ports, the domain looked up."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IncidentEvent:
        return cls(
            id=d["id"],
            node=d["node"],
            sandbox=d["sandbox"],
            task=d.get("task"),
            kind=d["kind"],
            detail=d["detail"],
            count=int(d["count"]),
            first_at=d["first_at"],
            last_at=d["last_at"],
            pid=d.get("pid"),
            comm=d.get("comm"),
            network=NetEvent.from_json(d["network"]) if d.get("network") else None,
        )


@dataclass(frozen=True)
class ApiKey:
    """An API key (``client.create_key``); ``secret`` only in the answer that made it."""

    id: str
    name: str
    identity: str
    project: str
    role: str
    secret: Optional[str] = None
    expires_at: Optional[str] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ApiKey:
        return cls(
            id=d["id"],
            name=d["name"],
            identity=d["identity"],
            project=d["project"],
            role=d["role"],
            secret=d.get("secret"),
            expires_at=d.get("expires_at"),
        )


@dataclass(frozen=True)
class StepOutcome:
    """What one step of a function call (its compile, or its run) did."""

    stdout: str
    stderr: str
    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    output_limited: bool
    wall_time: float
    """Seconds, wall clock."""
    cpu_time: float
    """Seconds of CPU, user and system."""
    peak_memory: int
    """Bytes, the largest resident set."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StepOutcome:
        return cls(
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            timed_out=bool(d.get("timed_out", False)),
            output_limited=bool(d.get("output_limited", False)),
            wall_time=float(d.get("wall_time", 0.0)),
            cpu_time=float(d.get("cpu_time", 0.0)),
            peak_memory=int(d.get("peak_memory", 0)),
        )


@dataclass(frozen=True)
class FnCallResult:
    """The answer to a function call (``client.fncall.run``). ``status`` is ``"ok"``,
    ``"compile_error"``, ``"timeout"``, ``"memory_limit"``, ``"runtime_error"`` or
    ``"output_limit"``."""

    status: str
    compile: Optional[StepOutcome]
    run: Optional[StepOutcome]
    files: Dict[str, bytes]
    """Fetched files, path → content."""
    missing_files: Dict[str, str]
    """Files asked for that could not be returned, path → why."""
    node: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def stdout(self) -> str:
        """The run's standard output ("" when it did not run)."""
        return self.run.stdout if self.run else ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FnCallResult:
        return cls(
            status=d["status"],
            compile=StepOutcome.from_json(d["compile"]) if d.get("compile") else None,
            run=StepOutcome.from_json(d["run"]) if d.get("run") else None,
            files={k: base64.b64decode(v) for k, v in (d.get("files") or {}).items()},
            missing_files=dict(d.get("missing_files") or {}),
            node=d.get("node", ""),
        )


@dataclass(frozen=True)
class CaseResult:
    """One test case of a batch: how its run ended, the run, and whether it passed (``None``
    without an expected output)."""

    status: str
    run: StepOutcome
    passed: Optional[bool]
    checker_message: Optional[str]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaseResult:
        return cls(
            status=d["status"],
            run=StepOutcome.from_json(d["run"]),
            passed=d.get("passed"),
            checker_message=d.get("checker_message"),
        )


@dataclass(frozen=True)
class BatchResult:
    """The answer to ``client.fncall.batch``: ``status`` ``"ok"`` or ``"compile_error"``."""

    status: str
    compile: Optional[StepOutcome]
    cases: List[CaseResult]
    passed: int
    nodes: List[str]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BatchResult:
        return cls(
            status=d["status"],
            compile=StepOutcome.from_json(d["compile"]) if d.get("compile") else None,
            cases=[CaseResult.from_json(c) for c in d.get("cases", [])],
            passed=int(d.get("passed", 0)),
            nodes=list(d.get("nodes", [])),
        )

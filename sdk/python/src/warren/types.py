"""What Warren answers, as dataclasses. Field names are the API's (see ``/v1/openapi.json``)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, TypeVar

T = TypeVar("T")


def _decode(text: str, encoding: str) -> bytes:
    if encoding == "base64":
        return base64.b64decode(text)
    return text.encode("utf-8")


@dataclass(frozen=True)
class Resources:
    """Resources a sandbox was given."""

    cpu: int
    """CPU limit in millicores (1000 = one core)."""
    memory: int
    """Memory limit in bytes."""
    pids: int
    """Most processes and threads."""
    disk: Optional[int] = None
    """Disk quota of the writable layer in bytes; ``None`` where the node enforces none."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Resources:
        disk = d.get("disk")
        return cls(
            cpu=int(d["cpu"]),
            memory=int(d["memory"]),
            pids=int(d["pids"]),
            disk=None if disk is None else int(disk),
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
    """``"running"`` or ``"paused"``."""
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

    @property
    def ok(self) -> bool:
        """Whether it succeeded on every sandbox of the task, on every node."""
        return not self.failed and not self.unreachable

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TaskResult:
        return cls(
            task=d["task"],
            action=d["action"],
            succeeded=int(d["succeeded"]),
            failed=[
                TaskFailure(id=f["id"], error=ErrorInfo(f["error"]["code"], f["error"]["message"]))
                for f in d.get("failed") or []
            ],
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

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Health:
        return cls(
            status=d["status"],
            version=d["version"],
            nodes_up=int(d["nodes_up"]),
            nodes=int(d["nodes"]),
        )


@dataclass(frozen=True)
class NodeInfo:
    """A node with its capacity and load (``GET /v1/nodes``)."""

    id: str
    version: str
    sandboxes: int
    max_sandboxes: int
    memory_reserved: int
    memory_allocatable: int
    memory_available: int
    threads: int
    pid_max: int
    cgroups: str
    max_upload: int
    guest: Optional[str] = None
    """Digest (``sha256:...``) of the guest agent binary its new sandboxes run."""

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
    """``seccomp``, ``management``, ``disk_quota``, ``output_truncated``, ``pids_limit`` or
    ``oom_kill``."""
    detail: str
    """Which: the system call, the stream, the limit."""
    count: int
    first_at: str
    last_at: str
    pid: Optional[int] = None
    """The process of the last occurrence (in the sandbox), when known."""
    comm: Optional[str] = None

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
        )

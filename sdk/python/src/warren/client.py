"""The blocking client. :class:`warren.AsyncClient` has the same shape, to ``await``.

::

    client
    ├── containers   create / replay container sandboxes   (a backend)
    ├── sandboxes    list, get (re-attach by id)            (any backend)
    ├── tasks        pause / resume / stop a whole task, set its network, list tasks
    ├── health()
    └── nodes()

Each backend is an attribute with its own ``create`` arguments; container sandboxes are the
one Warren runs today, and others (microVMs, VMs, function calls) will sit beside it as
``client.microvms``, ``client.vms``, ``client.fncall``. Every backend's ``create`` returns the
same :class:`~warren.sandbox.Sandbox` handle.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _ops
from . import _validate as v
from ._config import resolve_key, resolve_url
from ._http import SyncTransport
from .sandbox import Sandbox
from .trajectory import LogSource, load
from .types import (
    ApiKey,
    BatchResult,
    FnCallResult,
    Health,
    IncidentEvent,
    Listing,
    NetworkPolicy,
    NodeInfo,
    SandboxInfo,
    TaskInfo,
    TaskNetworkResult,
    TaskResult,
)

Size = Union[int, str]
NetworkArg = Union[NetworkPolicy, Mapping[str, Any], str]
"""A :class:`~warren.types.NetworkPolicy`, a dict of its JSON fields, or ``"none"`` /
``"filtered"`` (no rules)."""


class Containers:
    """Container sandboxes: ``client.containers``."""

    backend = "container"

    def __init__(self, t: SyncTransport) -> None:
        self._t = t

    def create(
        self,
        *,
        image: Union[str, Sequence[str]],
        task: Optional[str] = None,
        project: Optional[str] = None,
        cpu: Optional[int] = None,
        memory: Optional[Size] = None,
        pids: Optional[int] = None,
        cpu_limit: Optional[int] = None,
        memory_limit: Optional[Size] = None,
        qos: Optional[str] = None,
        disk: Optional[Size] = None,
        timeout: Optional[int] = None,
        idle_timeout: Optional[int] = None,
        on_idle: Optional[str] = None,
        labels: Optional[Dict[str, str]] = None,
        node_selector: Optional[Dict[str, str]] = None,
        env: Optional[Dict[str, str]] = None,
        trajectory: bool = False,
        network: Optional[NetworkArg] = None,
        expose: Optional[Sequence[int]] = None,
        idempotency_key: Optional[str] = None,
    ) -> Sandbox:
        """Creates a container sandbox and returns a handle once it is ready for commands.

        Args:
            image: Image name, e.g. ``"host"`` (the host's own /usr, read-only) or an imported
                one (``"base/python:3.12"``), or a list of names composed bottom first
                (``["base/python:3.12", "ws/repo@4f2a1c", "tk/agent:v3"]``).
            task: The training task it belongs to (task-level operations act on all of one).
            project: Its project (``"root/rl/job-42"``; default the key's): only keys holding
                permissions there see it, and the project's quotas count it.
            cpu: CPU request in millicores (1000 = one core): what the node's admission
                counts (server default 10).
            memory: Memory request: bytes, or a string like ``"256Mi"``: what admission counts
                (server default 64Mi).
            pids: Most processes and threads (server default 1024).
            cpu_limit: CPU limit in millicores, enforced by the kernel (server default 2000,
                at most the node's cores).
            memory_limit: Memory limit, enforced by the kernel: past it the sandbox's
                processes are OOM-killed (server default 2Gi).
            qos: ``"be"`` (best-effort, the default: idle CPU priority) or ``"ls"``
                (latency-sensitive: weighted by its CPU request; best-effort sandboxes yield
                to it).
            disk: Disk quota of the writable layer: bytes or ``"10Gi"`` (server default 10Gi);
                writes past it fail inside the sandbox with "Disk quota exceeded".
            timeout: Absolute lifetime in seconds, after which it is killed (default 3600).
            idle_timeout: Seconds without API activity after which ``on_idle`` happens.
            on_idle: ``"pause"`` (default; the next operation resumes it) or ``"stop"``.
            labels: Free-form labels, filterable in ``client.sandboxes.list``.
            node_selector: Labels its node must have, all of them (a node's labels are in
                ``client.nodes()``); placement keeps to such nodes, and a selector no node
                matches is an ``InvalidArgument``.
            env: Environment variables for every command.
            trajectory: Record every exec and file write (``sandbox.trajectory()``).
            network: What it may reach: a :class:`~warren.NetworkPolicy` (rules of what to
                allow and deny), a dict of its JSON fields, or ``"none"`` (loopback only, no
                interface). Default: the node's, an interface with every outbound connection
                denied (``"filtered"``, no rules). Change it later with
                ``sandbox.network.update``.
            expose: TCP ports of the sandbox to make reachable from outside it (at most 32),
                joined to ``network``'s own ``expose`` (with no ``network``: a ``filtered``
                policy with no rules). Each gets a port on its node's host
                (``sb.last_info.network.exposed``) and ``sb.get_host(port)`` through the
                control plane; a service must listen on ``0.0.0.0`` or ``::``. Not with
                ``network="none"``. Change them later with ``sandbox.network.expose``.
            idempotency_key: Sent as ``Idempotency-Key``; a create with a key already used
                returns the sandbox the first one made. Default: a fresh UUID, kept across this
                call's retries, so a retry never makes a second sandbox.

        Raises:
            CapacityError: No node had room, after the client's retries.
            NotFound: The image does not exist.
            InvalidArgument: A value out of range.
        """
        call = _ops.create(
            self.backend,
            image=image,
            task=task,
            project=project,
            cpu=cpu,
            memory=memory,
            pids=pids,
            cpu_limit=cpu_limit,
            memory_limit=memory_limit,
            qos=qos,
            disk=disk,
            timeout=timeout,
            idle_timeout=idle_timeout,
            on_idle=on_idle,
            labels=labels,
            node_selector=node_selector,
            env=env,
            trajectory=trajectory,
            network=network,
            expose=expose,
            idempotency_key=idempotency_key,
        )
        return Sandbox(self._t, self._t.call(call))

    def replay(self, log: LogSource, *, image: str, **create_args: Any) -> Sandbox:
        """Creates a sandbox that replays a trajectory log (the paper's fast-forward).

        The new sandbox re-applies the log to rebuild its state, then answers the same leading
        exec and file-write operations with the recorded results (``replayed=True``) until the
        first one that differs, which runs live (``replay_ended=True``), as does everything
        after it. Its own trajectory is recorded.

        Args:
            log: Entries as ``sandbox.trajectory()`` returned them, JSON lines text, or the path
                of a JSON lines file (see :mod:`warren.trajectory`).
            image, create_args: As for :meth:`create`.
        """
        entries = load(log)
        call = _ops.create(self.backend, image=image, replay=entries, **create_args)
        return Sandbox(self._t, self._t.call(call))


class Sandboxes:
    """Sandboxes of every backend: ``client.sandboxes``."""

    def __init__(self, t: SyncTransport) -> None:
        self._t = t

    def list(
        self,
        *,
        task: Optional[str] = None,
        labels: Optional[Dict[str, str]] = None,
        state: Optional[str] = None,
    ) -> Listing[SandboxInfo]:
        """Sandboxes, oldest first: only ``task``'s, only those with all ``labels``, only
        those in ``state`` (``"running"`` or ``"paused"``). A list; its ``unreachable`` names
        the nodes that did not answer, whose sandboxes are missing."""
        return self._t.call(_ops.list_sandboxes(task, labels, state))

    def get(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox (e.g. after a restart of the program).

        Raises:
            NotFound: No such sandbox (it was killed, timed out, or never existed).
        """
        return Sandbox(self._t, self._t.call(_ops.get(v.sandbox_id(sandbox_id))))


class Tasks:
    """Task-level operations: ``client.tasks``. One request acts on every sandbox of a task,
    on every node."""

    def __init__(self, t: SyncTransport) -> None:
        self._t = t

    def pause(self, name: str) -> TaskResult:
        """Pauses every sandbox of the task (memory kept; any operation on one resumes it)."""
        return self._t.call(_ops.task_action(name, "pause"))

    def resume(self, name: str) -> TaskResult:
        """Resumes every sandbox of the task."""
        return self._t.call(_ops.task_action(name, "resume"))

    def stop(self, name: str) -> TaskResult:
        """Kills every sandbox of the task."""
        return self._t.call(_ops.task_action(name, "stop"))

    def set_network(self, name: str, policy: NetworkArg) -> TaskNetworkResult:
        """Gives every sandbox of the task this network policy, replacing its own (e.g.
        :meth:`NetworkPolicy.none() <warren.NetworkPolicy.none>` for an agent phase after a
        setup phase that could reach a package index). New connections follow it at once; an
        open one it no longer allows is reset. A sandbox of the task created with network
        mode ``none`` has no interface to filter: it takes a ``none`` policy as it is, and is
        listed in ``failed`` for any other (the others still take it)."""
        return self._t.call(_ops.task_network(name, policy))

    def list(self) -> Listing[TaskInfo]:
        """Every task with sandboxes, and how many are running and paused. A list; its
        ``unreachable`` names the nodes that did not answer, whose sandboxes are not counted."""
        return self._t.call(_ops.list_tasks())


class Events:
    """Incident events: ``client.events``. What sandboxes tried that the platform stopped or
    cut (denied system calls, attempts on the guest agent, limits reached, connections their
    network policy refused), gathered from every node; events outlive their sandboxes."""

    def __init__(self, t: SyncTransport) -> None:
        self._t = t

    def list(
        self,
        *,
        sandbox: Optional[str] = None,
        task: Optional[str] = None,
        kind: Optional[str] = None,
        since: Optional[str] = None,
    ) -> Listing[IncidentEvent]:
        """Events, oldest first: only ``sandbox``'s, only ``task``'s, only of ``kind``
        (``"seccomp"``, ``"management"``, ``"disk_quota"``, ``"output_truncated"``,
        ``"pids_limit"``, ``"oom_kill"``, ``"network"``, ``"create_queued"``), only since
        ``since`` (RFC 3339, or a duration back from now such as ``"10m"``). A list; its
        ``unreachable`` names the nodes that did not answer, whose events are missing. A
        ``network`` event's ``network`` says what was refused (:class:`~warren.NetEvent`)."""
        return self._t.call(_ops.list_events(sandbox, task, kind, since))


class FnCalls:
    """Function calls: ``client.fncall``. A program run once on a warm worker — an online
    judge's submission, a reward script — with nothing kept between calls."""

    def __init__(self, t: SyncTransport) -> None:
        self._t = t

    def run(
        self,
        *,
        language: str,
        code: str,
        stdin: Optional[Union[str, bytes]] = None,
        files: Optional[Dict[str, Union[str, bytes]]] = None,
        timeout: Optional[float] = None,
        compile_timeout: Optional[float] = None,
        memory: Optional[Union[int, str]] = None,
        max_output: Optional[Union[int, str]] = None,
        fetch_files: Optional[List[str]] = None,
        image: Optional[str] = None,
        project: Optional[str] = None,
        queue_timeout: Optional[float] = None,
    ) -> FnCallResult:
        """Runs ``code`` in ``language`` (``"python"``, ``"bash"``, ``"c"``, ``"cpp"``,
        ``"java"``, ``"javascript"``, ``"rust"``, ``"go"`` — those the image has toolchains
        for) with ``stdin`` and ``files`` beside it, compiled first where the language is.
        ``timeout`` (default 10 s) bounds the run, ``compile_timeout`` (30 s) the compile,
        ``memory`` (512Mi) the program and its files, ``max_output`` (8Mi) each of stdout
        and stderr. The answer's ``status`` says how it ended; ``fetch_files`` come back in
        ``files``. A call waits for a worker while the node is busy, up to ``queue_timeout``
        seconds (default: its own timeouts together); past it, a :class:`CapacityError`
        (after the client's retries)."""
        return self._t.call(
            _ops.fncall(
                language,
                code,
                stdin=stdin,
                files=files,
                timeout=timeout,
                compile_timeout=compile_timeout,
                memory=memory,
                max_output=max_output,
                fetch_files=fetch_files,
                image=image,
                project=project,
                queue_timeout=queue_timeout,
            )
        )


    def batch(
        self,
        *,
        language: str,
        code: str,
        cases: Sequence[Any],
        checker: Optional[Union[str, Dict[str, Any]]] = None,
        **kw: Any,
    ) -> BatchResult:
        """Runs one program over many test cases: ``cases`` are ``(stdin, expected)`` pairs
        (or dicts; ``expected`` may be ``None``). Compiled once, spread over workers, each
        case judged by ``checker``: ``"exact"`` (default), ``"whitespace"``,
        ``{"kind": "float", "tolerance": 1e-6}`` or ``{"kind": "custom", "language": ...,
        "code": ...}``. Other arguments as :meth:`run`."""
        return self._t.call(_ops.fncall_batch(language, code, cases, checker=checker, **kw))


class Client:
    """A client of Warren's REST API (blocking; thread-safe; one connection pool).

    Args:
        url: Base address; default ``WARREN_URL``, else ``http://127.0.0.1:7700``.
        api_key: Default ``WARREN_API_KEY``, else ``$WARREN_DATA_DIR/admin.key``
            (``/var/lib/warren/admin.key``) when readable.
        timeout: Seconds to wait for an answer (commands wait for as long as their own timeout
            needs); ``None``: no limit.
        max_retries: Retries after a capacity (429) or unavailable (503) answer or a failed
            connection; 0 turns retries off.
        backoff: First delay between retries, seconds; doubled each retry, with jitter.
        backoff_max: Longest delay between retries (a server's ``Retry-After`` is honoured
            even when longer, up to 60 s).
        max_connections: Size of the connection pool. Urgent calls (a task's pause, resume
            and stop; a sandbox's pause, resume and kill) have connections of their own beside
            it, so they never wait for one behind the client's other requests.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: Optional[float] = 120.0,
        max_retries: int = 5,
        backoff: float = 0.25,
        backoff_max: float = 8.0,
        max_connections: int = 100,
    ) -> None:
        key, hint = resolve_key(api_key)
        self._t = SyncTransport(
            resolve_url(url),
            key,
            hint,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            backoff_max=backoff_max,
            max_connections=v.whole(max_connections, "max_connections", minimum=1),
        )
        self.containers = Containers(self._t)
        self.sandboxes = Sandboxes(self._t)
        self.tasks = Tasks(self._t)
        self.events = Events(self._t)
        self.fncall = FnCalls(self._t)

    @property
    def url(self) -> str:
        """The base address this client talks to."""
        return self._t.url

    def __repr__(self) -> str:
        return f"Client(url={self.url!r})"

    def health(self) -> Health:
        """Whether Warren and its nodes answer (needs no key)."""
        return self._t.call(_ops.health())

    def nodes(self) -> Listing[NodeInfo]:
        """The nodes with their capacity and load. A list; its ``unreachable`` names the nodes
        that did not answer now (listed with their last report)."""
        return self._t.call(_ops.nodes())

    def cordon(self, node: str) -> NodeInfo:
        """Keeps new sandboxes off ``node`` (its sandboxes run on); returns the node."""
        return self._t.call(_ops.cordon(node, True))

    def uncordon(self, node: str) -> NodeInfo:
        """Lets new sandboxes on a cordoned ``node`` again; returns the node."""
        return self._t.call(_ops.cordon(node, False))

    def create_project(self, path: str) -> str:
        """Creates project ``path`` (``"root/rl/job-42"``) under its parent; needs
        ``project.admin`` on the parent. Returns the path."""
        return self._t.call(_ops.create_project(path))

    def create_key(
        self,
        name: str,
        *,
        project: Optional[str] = None,
        role: str = "runner",
        identity: Optional[str] = None,
        expires_in: Optional[int] = None,
    ) -> ApiKey:
        """Makes a key scoped to ``project`` with ``role`` (``viewer``, ``runner``,
        ``builder``, ``project-admin``) — e.g. one per training job. Its ``secret`` is in
        this answer only. The calling key needs ``iam.delegate`` there and every permission
        of the role."""
        return self._t.call(_ops.create_key(name, project, role, identity, expires_in))

    def revoke_key(self, key_id: str) -> None:
        """Revokes a key: every replica refuses it within a second or two."""
        self._t.call(_ops.revoke_key(key_id))

    def whoami(self) -> Dict[str, Any]:
        """This client's key: its identity, project and grants."""
        return self._t.call(_ops.whoami())

    def close(self) -> None:
        """Closes the connection pool (sandboxes are not touched)."""
        self._t.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

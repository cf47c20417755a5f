"""The asyncio client: the twin of :class:`warren.Client`, every request awaited.

One :class:`AsyncClient` holds one connection pool (1,000 connections by default), so it can
drive thousands of sandboxes from one event loop::

    async with warren.AsyncClient() as client:
        sbs = await asyncio.gather(*[client.containers.create(image="host") for _ in range(1000)])
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

from . import _ops
from . import _validate as v
from ._config import resolve_key, resolve_url
from ._http import AsyncTransport
from .async_sandbox import AsyncSandbox
from .client import NetworkArg, Size
from .trajectory import LogSource, load
from .types import (
    BatchResult,
    FnCallResult,
    Health,
    IncidentEvent,
    Listing,
    NodeInfo,
    SandboxInfo,
    TaskInfo,
    TaskNetworkResult,
    TaskResult,
)


class AsyncContainers:
    """Container sandboxes: ``client.containers`` (see :class:`warren.client.Containers`)."""

    backend = "container"

    def __init__(self, t: AsyncTransport) -> None:
        self._t = t

    async def create(
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
    ) -> AsyncSandbox:
        """Creates a container sandbox (arguments as :meth:`warren.client.Containers.create`).
        ``async with await client.containers.create(...) as sb:`` kills it on leaving."""
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
        return AsyncSandbox(self._t, await self._t.call(call))

    async def replay(self, log: LogSource, *, image: str, **create_args: Any) -> AsyncSandbox:
        """Creates a sandbox that replays a trajectory log (see
        :meth:`warren.client.Containers.replay`)."""
        entries = load(log)
        call = _ops.create(self.backend, image=image, replay=entries, **create_args)
        return AsyncSandbox(self._t, await self._t.call(call))


class AsyncSandboxes:
    """Sandboxes of every backend: ``client.sandboxes``."""

    def __init__(self, t: AsyncTransport) -> None:
        self._t = t

    async def list(
        self,
        *,
        task: Optional[str] = None,
        labels: Optional[Dict[str, str]] = None,
        state: Optional[str] = None,
    ) -> Listing[SandboxInfo]:
        """Sandboxes, oldest first, filtered by task, labels (all of them) and state."""
        return await self._t.call(_ops.list_sandboxes(task, labels, state))

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on an existing sandbox; raises :class:`~warren.NotFound` if there is none."""
        return AsyncSandbox(self._t, await self._t.call(_ops.get(v.sandbox_id(sandbox_id))))


class AsyncTasks:
    """Task-level operations: ``client.tasks``."""

    def __init__(self, t: AsyncTransport) -> None:
        self._t = t

    async def pause(self, name: str) -> TaskResult:
        """Pauses every sandbox of the task."""
        return await self._t.call(_ops.task_action(name, "pause"))

    async def resume(self, name: str) -> TaskResult:
        """Resumes every sandbox of the task."""
        return await self._t.call(_ops.task_action(name, "resume"))

    async def stop(self, name: str) -> TaskResult:
        """Kills every sandbox of the task."""
        return await self._t.call(_ops.task_action(name, "stop"))

    async def set_network(self, name: str, policy: NetworkArg) -> TaskNetworkResult:
        """Gives every sandbox of the task this network policy (see
        :meth:`warren.client.Tasks.set_network`)."""
        return await self._t.call(_ops.task_network(name, policy))

    async def list(self) -> Listing[TaskInfo]:
        """Every task with sandboxes, and how many are running and paused. A list; its
        ``unreachable`` names the nodes that did not answer, whose sandboxes are not counted."""
        return await self._t.call(_ops.list_tasks())


class AsyncEvents:
    """Incident events: ``client.events``. What sandboxes tried that the platform stopped or
    cut (denied system calls, attempts on the guest agent, limits reached, connections their
    network policy refused), gathered from every node; events outlive their sandboxes."""

    def __init__(self, t: AsyncTransport) -> None:
        self._t = t

    async def list(
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
        return await self._t.call(_ops.list_events(sandbox, task, kind, since))


class AsyncFnCalls:
    """Function calls: ``client.fncall``, as :class:`warren.client.FnCalls`."""

    def __init__(self, t: AsyncTransport) -> None:
        self._t = t

    async def run(self, *, language: str, code: str, **kw: Any) -> FnCallResult:
        """Runs ``code`` once; arguments and answer as :meth:`warren.client.FnCalls.run`."""
        return await self._t.call(_ops.fncall(language, code, **kw))

    async def batch(
        self, *, language: str, code: str, cases: Sequence[Any], **kw: Any
    ) -> BatchResult:
        """One program over many test cases; as :meth:`warren.client.FnCalls.batch`."""
        return await self._t.call(_ops.fncall_batch(language, code, cases, **kw))


class AsyncClient:
    """A client of Warren's REST API for asyncio; arguments as :class:`warren.Client`, with a
    pool of ``max_connections=1000`` by default. Use ``async with``, or ``await close()``."""

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: Optional[float] = 120.0,
        max_retries: int = 5,
        backoff: float = 0.25,
        backoff_max: float = 8.0,
        max_connections: int = 1000,
    ) -> None:
        key, hint = resolve_key(api_key)
        self._t = AsyncTransport(
            resolve_url(url),
            key,
            hint,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            backoff_max=backoff_max,
            max_connections=v.whole(max_connections, "max_connections", minimum=1),
        )
        self.containers = AsyncContainers(self._t)
        self.sandboxes = AsyncSandboxes(self._t)
        self.tasks = AsyncTasks(self._t)
        self.events = AsyncEvents(self._t)
        self.fncall = AsyncFnCalls(self._t)

    @property
    def url(self) -> str:
        """The base address this client talks to."""
        return self._t.url

    def __repr__(self) -> str:
        return f"AsyncClient(url={self.url!r})"

    async def health(self) -> Health:
        """Whether Warren and its nodes answer (needs no key)."""
        return await self._t.call(_ops.health())

    async def nodes(self) -> Listing[NodeInfo]:
        """The nodes with their capacity and load. A list; its ``unreachable`` names the nodes
        that did not answer now (listed with their last report)."""
        return await self._t.call(_ops.nodes())

    async def cordon(self, node: str) -> NodeInfo:
        """Keeps new sandboxes off ``node`` (its sandboxes run on); returns the node."""
        return await self._t.call(_ops.cordon(node, True))

    async def uncordon(self, node: str) -> NodeInfo:
        """Lets new sandboxes on a cordoned ``node`` again; returns the node."""
        return await self._t.call(_ops.cordon(node, False))

    async def close(self) -> None:
        """Closes the connection pool (sandboxes are not touched)."""
        await self._t.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

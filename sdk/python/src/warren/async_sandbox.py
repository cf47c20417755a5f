"""A handle on one sandbox (asyncio): the twin of :mod:`warren.sandbox`, every method awaited."""

from __future__ import annotations

from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    Generator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import httpx

from . import _http, _ops, _tar
from . import _validate as v
from .errors import NotFound, ProtocolError, SandboxGone, Unavailable, WarrenError
from .events import ExecEvent, Exit, parse
from .sandbox import Command, ProcessRef, Stdin, _stream_bytes
from .trajectory import TrajectoryEntry
from .types import (
    ExecResult,
    ExitStatus,
    FileEntry,
    NetworkStatus,
    ProcessInfo,
    SandboxInfo,
    SandboxMetrics,
    WatchEvents,
)

if TYPE_CHECKING:
    from ._http import AsyncTransport, Opened
    from .client import NetworkArg


class AsyncEventStream:
    """The events of a streaming exec or of a process's output, as they happen.

    ``async for ev in stream`` (the request is sent when iteration starts), or
    ``async with stream:`` to send it at once and be sure the connection is closed on leaving.
    It ends after :class:`~warren.events.Exit`; ``exit`` holds the final status once seen.
    """

    def __init__(self, open_: Callable[[], Awaitable[Opened]], what: str) -> None:
        self._open = open_
        self._what = what
        self._opened: Optional[Opened] = None
        self._resp: Optional[httpx.Response] = None
        self._lines: Any = None
        self.exit: Optional[ExitStatus] = None
        self._done = False

    async def _start(self) -> None:
        if self._resp is None and not self._done:
            self._opened = await self._open()
            self._resp = self._opened.response
            self._lines = self._resp.aiter_lines()

    def __await__(self) -> Generator[Any, None, AsyncEventStream]:
        async def started() -> AsyncEventStream:
            await self._start()
            return self

        return started().__await__()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> ExecEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            await self._start()
            async for line in self._lines:
                if not line.strip():
                    continue
                ev = parse(line)
                if isinstance(ev, Exit):
                    self.exit = ev.status
                    await self.aclose()
                return ev
        except httpx.HTTPError as e:
            await self.aclose()
            raise Unavailable(
                f"the event stream of {self._what} was cut: {e or type(e).__name__}"
            ) from None
        except WarrenError:
            await self.aclose()
            raise
        await self.aclose()
        raise ProtocolError(f"the event stream of {self._what} ended before its exit event")

    async def aclose(self) -> None:
        """Stops reading and closes the connection (the command itself goes on)."""
        self._done = True
        if self._opened is not None:
            opened, self._opened = self._opened, None
            try:
                await opened.response.aclose()
            finally:
                opened.release()

    def __del__(self) -> None:
        # Abandoned without being closed: at least stop counting its connection as busy.
        opened = getattr(self, "_opened", None)
        if opened is not None:
            self._opened = None
            opened.release()

    async def __aenter__(self) -> AsyncEventStream:
        await self._start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncPortStream:
    """A TCP connection to an exposed port of a sandbox, carried through Warren
    (``await sandbox.connect_port(port)``): the twin of :class:`warren.sandbox.PortStream`,
    every read and write awaited. ``async with`` closes it on leaving::

        async with await sb.connect_port(8000) as s:
            await s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
            first = await s.recv(65536)
    """

    def __init__(self, opened: Opened, what: str) -> None:
        self._opened: Optional[Opened] = opened
        self._what = what
        self._timeout: Optional[float] = None
        # Checked by ``connect_port``, which closes it if it is not an upgrade.
        self._stream: Any = None

    async def _check(self) -> AsyncPortStream:
        assert self._opened is not None
        try:
            self._stream = _http.upgraded_stream(self._opened.response, self._what)
        except BaseException:
            await self.aclose()
            raise
        return self

    def settimeout(self, seconds: Optional[float]) -> None:
        """Seconds each :meth:`recv` or :meth:`sendall` may wait before it raises
        :class:`~warren.Timeout` (the stream stays usable); ``None``, the default: no limit."""
        self._timeout = v.seconds(seconds, "timeout", zero_ok=False)

    def gettimeout(self) -> Optional[float]:
        """What :meth:`settimeout` set."""
        return self._timeout

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._opened is None

    def _live(self) -> Any:
        if self._opened is None:
            raise Unavailable(f"{self._what}: the stream is closed")
        return self._stream

    async def sendall(self, data: Union[bytes, bytearray, memoryview]) -> None:
        """Sends all of ``data``."""
        stream = self._live()
        try:
            await stream.write(_stream_bytes(data), timeout=self._timeout)
        except _http.STREAM_ERRORS as e:
            raise _http.stream_error(e, self._what) from None

    async def recv(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes, as soon as some have come; ``b""`` once the sandbox's side
        has closed the connection."""
        n = v.whole(max_bytes, "max_bytes", minimum=1)
        stream = self._live()
        try:
            data: bytes = await stream.read(n, timeout=self._timeout)
        except _http.STREAM_ERRORS as e:
            raise _http.stream_error(e, self._what) from None
        return data

    async def aclose(self) -> None:
        """Closes the connection (the service in the sandbox sees it close)."""
        if self._opened is not None:
            opened, self._opened = self._opened, None
            try:
                await opened.response.aclose()  # closes the upgraded connection with it
            finally:
                opened.release()

    def __del__(self) -> None:
        # Abandoned without being closed: at least stop counting its connection as busy.
        opened = getattr(self, "_opened", None)
        if opened is not None:
            self._opened = None
            opened.release()

    async def __aenter__(self) -> AsyncPortStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncPortStream({self._what}{', closed' if self.closed else ''})"


class AsyncProcesses:
    """Background processes of a sandbox: ``sandbox.processes``."""

    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def start(
        self,
        cmd: Command,
        *,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        user: Union[str, int, None] = None,
        timeout: Optional[float] = None,
        stdin: Optional[Stdin] = None,
        max_output: Union[int, str, None] = None,
        role: Optional[str] = None,
        stdin_open: bool = False,
        pty: Optional[Tuple[int, int]] = None,
    ) -> ProcessInfo:
        """Starts a command in the background and returns at once (no timeout by default)."""
        body = _ops.exec_body(
            cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin, max_output=max_output,
            role=role,
        )
        _ops.interactive(body, stdin_open, pty)
        return await self._sb._t.call(_ops.start_process(self._sb.id, body))

    async def list(self) -> List[ProcessInfo]:
        """Running processes, and finished ones not yet forgotten, oldest first."""
        return await self._sb._t.call(_ops.list_processes(self._sb.id))

    async def get(self, process: ProcessRef) -> ProcessInfo:
        """One process, by the id ``start`` returned."""
        return await self._sb._t.call(_ops.get_process(self._sb.id, process))

    async def wait(self, process: ProcessRef, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits for a process to exit, at most ``timeout`` seconds; look at ``running``."""
        return await self._sb._t.call(_ops.wait_process(self._sb.id, process, timeout))

    async def signal(self, process: ProcessRef, signal: Union[str, int] = "TERM") -> None:
        """Sends a signal to the process and its process group."""
        await self._sb._t.call(_ops.signal_process(self._sb.id, process, signal))

    def output(self, process: ProcessRef) -> AsyncEventStream:
        """The process's output from its start, then live until it exits (``async for``)."""
        call = _ops.process_output(self._sb.id, process)
        return AsyncEventStream(lambda: self._sb._t.open(call), f"process {v.process_id(process)}")

    async def forget(self, process: ProcessRef) -> None:
        """Forgets a process and its kept output (a running one keeps running)."""
        await self._sb._t.call(_ops.forget_process(self._sb.id, process))

    async def send_stdin(self, process: ProcessRef, data: Union[str, bytes]) -> None:
        """Writes ``data`` to the stdin (or terminal) of a process started with
        ``stdin_open=True`` (or ``pty``); returns once it is written."""
        await self._sb._t.call(_ops.send_stdin(self._sb.id, process, data, False))

    async def close_stdin(self, process: ProcessRef) -> None:
        """Closes the stdin of a process started with ``stdin_open=True``: it reads end of
        file. (A terminal is not closed: send it ``"\\x04"``, its end-of-file character.)"""
        await self._sb._t.call(_ops.send_stdin(self._sb.id, process, b"", True))

    async def resize(self, process: ProcessRef, cols: int, rows: int) -> None:
        """Changes the size of a process's terminal (one started with ``pty``)."""
        await self._sb._t.call(_ops.resize_pty(self._sb.id, process, cols, rows))


class AsyncFiles:
    """Files in a sandbox: ``sandbox.files`` (see :class:`warren.sandbox.Files`)."""

    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def read(self, path: str, *, user: Union[str, int, None] = None) -> bytes:
        """A file's bytes."""
        return await self._sb._t.call(_ops.read_file(self._sb.id, path, user))

    async def read_text(
        self, path: str, *, user: Union[str, int, None] = None, encoding: str = "utf-8"
    ) -> str:
        """A file's contents as text."""
        return (await self.read(path, user=user)).decode(encoding)

    async def write(
        self,
        path: str,
        data: Union[str, bytes],
        *,
        mode: Optional[int] = None,
        user: Union[str, int, None] = None,
    ) -> FileEntry:
        """Writes a file (``str`` as UTF-8), replacing it and making missing parents."""
        return await self._sb._t.call(_ops.write_file(self._sb.id, path, data, mode, user))

    async def list(self, path: str = ".", *, user: Union[str, int, None] = None) -> List[FileEntry]:
        """A directory's entries, sorted by name."""
        return await self._sb._t.call(_ops.list_dir(self._sb.id, path, user))

    async def stat(self, path: str, *, user: Union[str, int, None] = None) -> FileEntry:
        """What is at ``path`` (a final symlink is described, not followed)."""
        return await self._sb._t.call(_ops.stat(self._sb.id, path, user))

    async def exists(self, path: str, *, user: Union[str, int, None] = None) -> bool:
        """Whether anything is at ``path``."""
        try:
            await self.stat(path, user=user)
            return True
        except NotFound:
            return False

    async def remove(
        self, path: str, *, recursive: bool = False, user: Union[str, int, None] = None
    ) -> None:
        """Removes a file, or a directory (``recursive=True`` for a non-empty one)."""
        await self._sb._t.call(_ops.remove(self._sb.id, path, recursive, user))

    async def mkdir(
        self, path: str, *, parents: bool = True, user: Union[str, int, None] = None
    ) -> FileEntry:
        """Makes a directory (and missing parents, unless ``parents=False``)."""
        return await self._sb._t.call(_ops.mkdir(self._sb.id, path, parents, user))

    async def rename(self, src: str, dst: str, *, user: Union[str, int, None] = None) -> FileEntry:
        """Renames (moves) a path, making missing parents of ``dst``."""
        return await self._sb._t.call(_ops.rename(self._sb.id, src, dst, user))

    async def watch(
        self, path: str, *, recursive: bool = False, user: Union[str, int, None] = None
    ) -> int:
        """Starts watching directory ``path`` (and, ``recursive``, every directory below it,
        those made later included); returns the watch's id for :meth:`watch_events`."""
        return await self._sb._t.call(_ops.watch(self._sb.id, path, recursive, user))

    async def watch_events(self, watch_id: int, *, wait: Optional[float] = None) -> WatchEvents:
        """The watch's changes since the last call; with ``wait``, waits up to that many
        seconds (at most 60) for the first when there is none."""
        return await self._sb._t.call(_ops.watch_events(self._sb.id, watch_id, wait))

    async def unwatch(self, watch_id: int) -> None:
        """Stops a watch."""
        await self._sb._t.call(_ops.unwatch(self._sb.id, watch_id))

    async def upload_dir(
        self, local_dir: Union[str, Path], remote_dir: str, *, user: Union[str, int, None] = None
    ) -> Optional[FileEntry]:
        """Copies a local directory's contents into ``remote_dir`` as one tar stream."""
        tar = _tar.pack_dir(local_dir)
        return await self._sb._t.call(_ops.upload_tar(self._sb.id, remote_dir, tar, user))

    async def download_dir(
        self, remote_dir: str, local_dir: Union[str, Path], *, user: Union[str, int, None] = None
    ) -> Path:
        """Copies ``remote_dir``'s contents into a local directory as one tar stream."""
        data = await self._sb._t.call(_ops.download_tar(self._sb.id, remote_dir, user))
        return _tar.unpack(data, local_dir)


class AsyncNetwork:
    """A sandbox's network: ``sandbox.network`` (see :class:`warren.sandbox.Network`)."""

    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def get(self) -> NetworkStatus:
        """Its mode, addresses (``ipv4``, ``ipv6``, ``gateway``) and policy."""
        return await self._sb._t.call(_ops.get_network(self._sb.id))

    async def update(self, policy: NetworkArg) -> NetworkStatus:
        """Replaces its policy and returns the network as it now stands (see
        :meth:`warren.sandbox.Network.update`)."""
        return await self._sb._t.call(_ops.set_network(self._sb.id, policy))

    async def expose(self, ports: Sequence[int]) -> NetworkStatus:
        """Exposes exactly ``ports``, keeping the rest of its policy; ``[]`` unexposes every
        port (see :meth:`warren.sandbox.Network.expose`)."""
        want = v.expose_ports(ports)
        return await self.update(_ops.exposing(await self.get(), want))


class AsyncSandbox:
    """A handle on one sandbox (asyncio). See :class:`warren.sandbox.Sandbox`; the methods are
    the same, awaited. ``async with`` kills the sandbox on leaving."""

    def __init__(self, transport: AsyncTransport, info: SandboxInfo) -> None:
        self._t = transport
        self.id: str = info.id
        """The sandbox's id."""
        self.last_info: SandboxInfo = info
        """The sandbox as this handle last saw it; call :meth:`info` for how it is now."""
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.network = AsyncNetwork(self)
        """Its network: ``await network.get()``, ``await network.update(policy)``,
        ``await network.expose(ports)``."""

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r})"

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.kill()
        except (NotFound, SandboxGone):
            pass

    async def exec(
        self,
        cmd: Command,
        *,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        user: Union[str, int, None] = None,
        timeout: Optional[float] = None,
        stdin: Optional[Stdin] = None,
        max_output: Union[int, str, None] = None,
        role: Optional[str] = None,
    ) -> ExecResult:
        """Runs a command and waits for it (see :meth:`warren.sandbox.Sandbox.exec`)."""
        body = _ops.exec_body(
            cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin, max_output=max_output,
            role=role,
        )
        return await self._t.call(_ops.exec_(self.id, body))

    def exec_stream(
        self,
        cmd: Command,
        *,
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        user: Union[str, int, None] = None,
        timeout: Optional[float] = None,
        stdin: Optional[Stdin] = None,
        max_output: Union[int, str, None] = None,
        role: Optional[str] = None,
    ) -> AsyncEventStream:
        """Runs a command and yields its events as they happen (``async for ev in ...``)."""
        body = _ops.exec_body(
            cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin, max_output=max_output,
            role=role,
        )
        call = _ops.exec_stream(self.id, body)
        return AsyncEventStream(lambda: self._t.open(call), f"a command in sandbox {self.id}")

    def _seen(self, info: SandboxInfo) -> SandboxInfo:
        self.last_info = info
        return info

    async def info(self) -> SandboxInfo:
        """The sandbox as it is now."""
        return self._seen(await self._t.call(_ops.get(self.id)))

    async def pause(self) -> SandboxInfo:
        """Freezes the sandbox; any later operation resumes it."""
        return self._seen(await self._t.call(_ops.pause(self.id)))

    async def resume(self) -> SandboxInfo:
        """Thaws a paused sandbox."""
        return self._seen(await self._t.call(_ops.resume(self.id)))

    async def kill(self) -> None:
        """Kills the sandbox and releases everything it held."""
        await self._t.call(_ops.kill(self.id))

    async def set_timeout(self, seconds: int) -> SandboxInfo:
        """A new absolute lifetime counted from now."""
        return self._seen(await self._t.call(_ops.set_timeout(self.id, seconds)))

    async def get_host(self, port: int) -> str:
        """The address of exposed port ``port`` through the control plane,
        ``"<port>-<id>.<sandbox_domain>"`` (see :meth:`warren.sandbox.Sandbox.get_host`);
        :class:`~warren.NotFound` where the control plane has no ``sandbox_domain``."""
        p = v.port(port)
        if self._t.sandbox_domain is None:
            self._t.sandbox_domain = (await self._t.call(_ops.health())).sandbox_domain
        return _ops.host_of(self.id, p, self._t.sandbox_domain, self._t.url)

    async def connect_port(self, port: int) -> AsyncPortStream:
        """A TCP connection to exposed port ``port`` through the control plane (see
        :meth:`warren.sandbox.Sandbox.connect_port`)."""
        what = f"the stream to port {port} of sandbox {self.id}"
        opened = await self._t.open(_ops.connect_port(self.id, port))
        return await AsyncPortStream(opened, what)._check()

    async def metrics(self) -> SandboxMetrics:
        """What the sandbox uses now: CPU, memory and page cache, disk against its limits."""
        return await self._t.call(_ops.metrics(self.id))

    async def trajectory(self) -> List[TrajectoryEntry]:
        """The trajectory log, oldest first (sandboxes created with ``trajectory=True``)."""
        return await self._t.call(_ops.trajectory(self.id))

"""A handle on one sandbox (blocking): commands, background processes, files, network,
lifecycle.

The async twin, with the same methods to ``await``, is :mod:`warren.async_sandbox`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import httpx

from . import _http, _ops, _tar
from . import _validate as v
from .errors import (
    ArgumentTypeError,
    NotFound,
    ProtocolError,
    SandboxGone,
    Unavailable,
    WarrenError,
)
from .events import ExecEvent, Exit, parse
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
    from ._http import Opened, SyncTransport
    from .client import NetworkArg

Command = Union[str, Sequence[str]]
"""A shell command line (run by ``/bin/sh -c``), or a program and its arguments."""
Stdin = Union[str, bytes]
ProcessRef = Union[int, ProcessInfo]
"""A process id, or the :class:`ProcessInfo` of ``processes.start``."""


class EventStream:
    """The events of a streaming exec or of a process's output, as they happen.

    Iterate it (``for ev in stream``); it ends after :class:`~warren.events.Exit`, and closes
    its connection then, on ``close()``, or when used as a context manager and left. ``exit``
    holds the final status once seen.
    """

    def __init__(self, opened: Opened, what: str) -> None:
        self._opened: Optional[Opened] = opened
        self._resp = opened.response
        self._what = what
        self._lines = self._resp.iter_lines()
        self.exit: Optional[ExitStatus] = None
        self._done = False

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> ExecEvent:
        if self._done:
            raise StopIteration
        try:
            for line in self._lines:
                if not line.strip():
                    continue
                ev = parse(line)
                if isinstance(ev, Exit):
                    self.exit = ev.status
                    self.close()
                return ev
        except httpx.HTTPError as e:
            self.close()
            raise Unavailable(
                f"the event stream of {self._what} was cut: {e or type(e).__name__}"
            ) from None
        except WarrenError:
            self.close()
            raise
        self.close()
        raise ProtocolError(f"the event stream of {self._what} ended before its exit event")

    def close(self) -> None:
        """Stops reading and closes the connection (the command itself goes on)."""
        self._done = True
        if self._opened is not None:
            opened, self._opened = self._opened, None
            try:
                self._resp.close()
            finally:
                opened.release()

    def __del__(self) -> None:
        # Abandoned without being closed: at least stop counting its connection as busy.
        opened = getattr(self, "_opened", None)
        if opened is not None:
            self._opened = None
            opened.release()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PortStream:
    """A TCP connection to an exposed port of a sandbox, carried through Warren
    (``sandbox.connect_port``).

    Socket-like: :meth:`sendall` bytes, :meth:`recv` up to a number of bytes (``b""`` once the
    sandbox's side has closed), :meth:`settimeout`. It holds one connection of the client's
    pool until :meth:`close`; use it as a context manager::

        with sb.connect_port(8000) as s:
            s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
            answer = b"".join(iter(lambda: s.recv(65536), b""))
    """

    def __init__(self, opened: Opened, what: str) -> None:
        self._opened: Optional[Opened] = opened
        self._what = what
        self._timeout: Optional[float] = None
        try:
            self._stream = _http.upgraded_stream(opened.response, what)
        except BaseException:
            self.close()
            raise

    def settimeout(self, seconds: Optional[float]) -> None:
        """Seconds each :meth:`recv` or :meth:`sendall` may wait before it raises
        :class:`~warren.Timeout` (the stream stays usable); ``None``, the default: no limit."""
        self._timeout = v.seconds(seconds, "timeout", zero_ok=False)

    def gettimeout(self) -> Optional[float]:
        """What :meth:`settimeout` set."""
        return self._timeout

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._opened is None

    def _live(self) -> Any:
        if self._opened is None:
            raise Unavailable(f"{self._what}: the stream is closed")
        return self._stream

    def sendall(self, data: Union[bytes, bytearray, memoryview]) -> None:
        """Sends all of ``data``."""
        stream = self._live()
        try:
            stream.write(_stream_bytes(data), timeout=self._timeout)
        except _http.STREAM_ERRORS as e:
            raise _http.stream_error(e, self._what) from None

    def recv(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes, as soon as some have come; ``b""`` once the sandbox's side
        has closed the connection."""
        n = v.whole(max_bytes, "max_bytes", minimum=1)
        stream = self._live()
        try:
            data: bytes = stream.read(n, timeout=self._timeout)
        except _http.STREAM_ERRORS as e:
            raise _http.stream_error(e, self._what) from None
        return data

    def close(self) -> None:
        """Closes the connection (the service in the sandbox sees it close)."""
        if self._opened is not None:
            opened, self._opened = self._opened, None
            try:
                opened.response.close()  # closes the upgraded connection with it
            finally:
                opened.release()

    def __del__(self) -> None:
        # Abandoned without being closed: at least stop counting its connection as busy.
        opened = getattr(self, "_opened", None)
        if opened is not None:
            self._opened = None
            opened.release()

    def __enter__(self) -> PortStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PortStream({self._what}{', closed' if self.closed else ''})"


def _stream_bytes(data: Any) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        raise ArgumentTypeError("sendall takes bytes, not str: encode it (data.encode())")
    raise ArgumentTypeError(f"sendall takes bytes, not {type(data).__name__}")


class Processes:
    """Background processes of a sandbox: ``sandbox.processes``."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def start(
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
        """Starts a command in the background and returns at once. It runs until it exits, is
        signalled, or ``timeout`` seconds pass (no limit by default)."""
        body = _ops.exec_body(
            cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin, max_output=max_output,
            role=role,
        )
        _ops.interactive(body, stdin_open, pty)
        return self._sb._t.call(_ops.start_process(self._sb.id, body))

    def list(self) -> List[ProcessInfo]:
        """Running processes, and finished ones not yet forgotten, oldest first."""
        return self._sb._t.call(_ops.list_processes(self._sb.id))

    def get(self, process: ProcessRef) -> ProcessInfo:
        """One process, by the id ``start`` returned."""
        return self._sb._t.call(_ops.get_process(self._sb.id, process))

    def wait(self, process: ProcessRef, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits for a process to exit, at most ``timeout`` seconds (default: until it does);
        look at ``running`` to tell which."""
        return self._sb._t.call(_ops.wait_process(self._sb.id, process, timeout))

    def signal(self, process: ProcessRef, signal: Union[str, int] = "TERM") -> None:
        """Sends a signal (``"TERM"``, ``"KILL"``, ``"INT"``, a number, or a
        :class:`signal.Signals`) to the process and its process group."""
        self._sb._t.call(_ops.signal_process(self._sb.id, process, signal))

    def output(self, process: ProcessRef) -> EventStream:
        """The process's output from its start (what the sandbox kept), then live until it
        exits: ``Stdout``/``Stderr`` events, then ``Exit``. Use it to re-attach."""
        call = _ops.process_output(self._sb.id, process)
        return EventStream(self._sb._t.open(call), f"process {v.process_id(process)}")

    def forget(self, process: ProcessRef) -> None:
        """Forgets a process and its kept output (a running one keeps running)."""
        self._sb._t.call(_ops.forget_process(self._sb.id, process))

    def send_stdin(self, process: ProcessRef, data: Union[str, bytes]) -> None:
        """Writes ``data`` to the stdin (or terminal) of a process started with
        ``stdin_open=True`` (or ``pty``); returns once it is written."""
        self._sb._t.call(_ops.send_stdin(self._sb.id, process, data, False))

    def close_stdin(self, process: ProcessRef) -> None:
        """Closes the stdin of a process started with ``stdin_open=True``: it reads end of
        file. (A terminal is not closed: send it ``"\\x04"``, its end-of-file character.)"""
        self._sb._t.call(_ops.send_stdin(self._sb.id, process, b"", True))

    def resize(self, process: ProcessRef, cols: int, rows: int) -> None:
        """Changes the size of a process's terminal (one started with ``pty``)."""
        self._sb._t.call(_ops.resize_pty(self._sb.id, process, cols, rows))


class Files:
    """Files in a sandbox: ``sandbox.files``. Paths are absolute or relative to the acting
    user's home; every operation acts as ``user`` (default the sandbox's ``user``, uid 1000),
    so what it creates belongs to them."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def read(self, path: str, *, user: Union[str, int, None] = None) -> bytes:
        """A file's bytes."""
        return self._sb._t.call(_ops.read_file(self._sb.id, path, user))

    def read_text(
        self, path: str, *, user: Union[str, int, None] = None, encoding: str = "utf-8"
    ) -> str:
        """A file's contents as text."""
        return self.read(path, user=user).decode(encoding)

    def write(
        self,
        path: str,
        data: Union[str, bytes],
        *,
        mode: Optional[int] = None,
        user: Union[str, int, None] = None,
    ) -> FileEntry:
        """Writes a file (``str`` as UTF-8), replacing it and making missing parent directories.
        ``mode`` is permission bits such as ``0o755``."""
        return self._sb._t.call(_ops.write_file(self._sb.id, path, data, mode, user))

    def list(self, path: str = ".", *, user: Union[str, int, None] = None) -> List[FileEntry]:
        """A directory's entries, sorted by name."""
        return self._sb._t.call(_ops.list_dir(self._sb.id, path, user))

    def stat(self, path: str, *, user: Union[str, int, None] = None) -> FileEntry:
        """What is at ``path`` (a final symlink is described, not followed)."""
        return self._sb._t.call(_ops.stat(self._sb.id, path, user))

    def exists(self, path: str, *, user: Union[str, int, None] = None) -> bool:
        """Whether anything is at ``path``."""
        try:
            self.stat(path, user=user)
            return True
        except NotFound:
            return False

    def remove(
        self, path: str, *, recursive: bool = False, user: Union[str, int, None] = None
    ) -> None:
        """Removes a file, or a directory (``recursive=True`` for a non-empty one)."""
        self._sb._t.call(_ops.remove(self._sb.id, path, recursive, user))

    def mkdir(
        self, path: str, *, parents: bool = True, user: Union[str, int, None] = None
    ) -> FileEntry:
        """Makes a directory (and missing parents, unless ``parents=False``)."""
        return self._sb._t.call(_ops.mkdir(self._sb.id, path, parents, user))

    def rename(self, src: str, dst: str, *, user: Union[str, int, None] = None) -> FileEntry:
        """Renames (moves) a path, making missing parents of ``dst``."""
        return self._sb._t.call(_ops.rename(self._sb.id, src, dst, user))

    def watch(
        self, path: str, *, recursive: bool = False, user: Union[str, int, None] = None
    ) -> int:
        """Starts watching directory ``path`` (and, ``recursive``, every directory below it,
        those made later included); returns the watch's id for :meth:`watch_events`."""
        return self._sb._t.call(_ops.watch(self._sb.id, path, recursive, user))

    def watch_events(self, watch_id: int, *, wait: Optional[float] = None) -> WatchEvents:
        """The watch's changes since the last call; with ``wait``, waits up to that many
        seconds (at most 60) for the first when there is none."""
        return self._sb._t.call(_ops.watch_events(self._sb.id, watch_id, wait))

    def unwatch(self, watch_id: int) -> None:
        """Stops a watch."""
        self._sb._t.call(_ops.unwatch(self._sb.id, watch_id))

    def upload_dir(
        self, local_dir: Union[str, Path], remote_dir: str, *, user: Union[str, int, None] = None
    ) -> Optional[FileEntry]:
        """Copies a local directory's contents into ``remote_dir`` (made if missing), as one tar
        stream; the files belong to ``user``."""
        tar = _tar.pack_dir(local_dir)
        return self._sb._t.call(_ops.upload_tar(self._sb.id, remote_dir, tar, user))

    def download_dir(
        self, remote_dir: str, local_dir: Union[str, Path], *, user: Union[str, int, None] = None
    ) -> Path:
        """Copies ``remote_dir``'s contents into a local directory (made if missing), as one tar
        stream; returns the local directory."""
        data = self._sb._t.call(_ops.download_tar(self._sb.id, remote_dir, user))
        return _tar.unpack(data, local_dir)


class Network:
    """A sandbox's network: ``sandbox.network``."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def get(self) -> NetworkStatus:
        """Its mode, addresses (``ipv4``, ``ipv6``, ``gateway``) and policy."""
        return self._sb._t.call(_ops.get_network(self._sb.id))

    def update(self, policy: NetworkArg) -> NetworkStatus:
        """Replaces its policy with ``policy`` (a :class:`~warren.NetworkPolicy`, a dict of
        its JSON fields, or ``"none"``) and returns the network as it now stands. New
        connections follow it at once; an open connection it no longer allows is reset at its
        next packet. On a sandbox created with an interface, ``NetworkPolicy.none()`` denies
        everything (the interface stays); one created with mode ``none`` has no interface, so
        it takes no other policy (:class:`~warren.InvalidArgument`)."""
        return self._sb._t.call(_ops.set_network(self._sb.id, policy))

    def expose(self, ports: Sequence[int]) -> NetworkStatus:
        """Exposes exactly ``ports`` (TCP, at most 32), keeping the rest of its policy, and
        returns the network as it now stands: each port's ``host`` on its node is in
        ``exposed``. ``[]`` unexposes every port. A service must listen on ``0.0.0.0`` or
        ``::`` in the sandbox. (Reads the policy, then replaces it: a change made in between
        by someone else is lost.)"""
        want = v.expose_ports(ports)
        return self.update(_ops.exposing(self.get(), want))


class Sandbox:
    """A handle on one sandbox. Made by ``client.containers.create`` (or ``replay``) and
    ``client.sandboxes.get``; holds only the id, so it is cheap, and every method asks the server.

    A context manager: leaving the ``with`` block kills the sandbox.
    """

    def __init__(self, transport: SyncTransport, info: SandboxInfo) -> None:
        self._t = transport
        self.id: str = info.id
        """The sandbox's id."""
        self.last_info: SandboxInfo = info
        """The sandbox as this handle last saw it (from create, get, info, pause, resume or
        set_timeout); call :meth:`info` for how it is now."""
        self.files = Files(self)
        self.processes = Processes(self)
        self.network = Network(self)
        """Its network: ``network.get()``, ``network.update(policy)``,
        ``network.expose(ports)``."""

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except (NotFound, SandboxGone):
            pass

    def exec(
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
        """Runs a command and waits for it.

        Args:
            cmd: A ``str`` is a shell command line (run by ``/bin/sh -c``); a list is a program
                and its arguments (found on ``PATH``, no shell).
            env: Extra environment variables.
            cwd: Working directory (default the user's home).
            user: User name or uid (default ``user``, uid 1000; ``"root"`` has no capabilities).
            timeout: Seconds before the command's process group is killed (server default 600;
                0: no limit). A command that times out returns with ``timed_out`` set.
            stdin: Standard input, ``str`` or ``bytes``.
            max_output: Output kept per stream (default 64Mi); the rest is counted, not kept.
            role: ``"grader"`` runs it as the grader: a separate user that agent processes
                cannot signal, trace or read, with the image's pristine /usr, /bin, /lib, /etc
                (whatever the agent changed there) and the agent's /home/user and /workspace.
                Takes no ``user``.

        A program that does not exist gives exit code 127, not an exception.
        """
        body = _ops.exec_body(
            cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin, max_output=max_output,
            role=role,
        )
        return self._t.call(_ops.exec_(self.id, body))

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
    ) -> EventStream:
        """Runs a command and yields its events as they happen: ``Start``, ``Stdout``/``Stderr``
        chunks (bytes), then ``Exit``. Same arguments as :meth:`exec`."""
        body = _ops.exec_body(
            cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin, max_output=max_output,
            role=role,
        )
        return EventStream(
            self._t.open(_ops.exec_stream(self.id, body)), f"a command in sandbox {self.id}"
        )

    def _seen(self, info: SandboxInfo) -> SandboxInfo:
        self.last_info = info
        return info

    def info(self) -> SandboxInfo:
        """The sandbox as it is now (state, resources, expiry, ...)."""
        return self._seen(self._t.call(_ops.get(self.id)))

    def pause(self) -> SandboxInfo:
        """Freezes the sandbox: its processes stop, memory is kept. Any later operation on it
        resumes it first."""
        return self._seen(self._t.call(_ops.pause(self.id)))

    def resume(self) -> SandboxInfo:
        """Thaws a paused sandbox (a no-op on a running one)."""
        return self._seen(self._t.call(_ops.resume(self.id)))

    def kill(self) -> None:
        """Kills the sandbox and releases everything it held."""
        self._t.call(_ops.kill(self.id))

    def set_timeout(self, seconds: int) -> SandboxInfo:
        """A new absolute lifetime counted from now (extend or shorten it); a paused sandbox
        stays paused."""
        return self._seen(self._t.call(_ops.set_timeout(self.id, seconds)))

    def get_host(self, port: int) -> str:
        """The address of exposed port ``port`` through the control plane:
        ``"<port>-<id>.<sandbox_domain>"``, for ``http://`` or ``ws://`` (the control plane's
        port too, where it is not 80 or 443). It needs no API key: whoever reaches the control
        plane and knows the id reaches the port. The port must be exposed
        (``network.expose``); this does not check that it is, and a request to a port that is
        not gets 404. The first call asks ``/v1/health`` for the domain; the client keeps it.

        Raises:
            NotFound: The control plane has no ``[control] sandbox_domain``; then reach the
                port at its node's host port, ``network.get().exposed``.
        """
        p = v.port(port)
        if self._t.sandbox_domain is None:
            self._t.sandbox_domain = self._t.call(_ops.health()).sandbox_domain
        return _ops.host_of(self.id, p, self._t.sandbox_domain, self._t.url)

    def connect_port(self, port: int) -> PortStream:
        """A TCP connection to exposed port ``port``, through the control plane and its node
        (an HTTP upgrade on the API's address, so it needs no other route to the node); a
        paused sandbox is resumed first. See :class:`PortStream`.

        Raises:
            NotFound: The port is not exposed (or no such sandbox).
            Unavailable: Nothing in the sandbox accepts connections on the port (after the
                client's retries).
        """
        what = f"the stream to port {port} of sandbox {self.id}"
        return PortStream(self._t.open(_ops.connect_port(self.id, port)), what)

    def metrics(self) -> SandboxMetrics:
        """What the sandbox uses now: CPU, memory and page cache, disk against its limits."""
        return self._t.call(_ops.metrics(self.id))

    def trajectory(self) -> List[TrajectoryEntry]:
        """The trajectory log (sandboxes created with ``trajectory=True``): every exec and file
        write, oldest first. Save it with :func:`warren.trajectory.save`; replay it with
        ``client.containers.replay``."""
        return self._t.call(_ops.trajectory(self.id))

"""The events of a streaming exec and of a background process's output, in order::

    Start(process_id, pid)       the command started (streaming exec only)
    Stdout(data) / Stderr(data)  bytes it wrote, as they came
    Exit(status)                 it ended: always the last event

An ``error`` event from the server (the exec failed on its side) is raised as the matching
:class:`~warren.errors.WarrenError` instead of being yielded.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Union

from .errors import ProtocolError, from_error_object
from .types import ExitStatus


@dataclass(frozen=True)
class Start:
    """The command started."""

    process_id: int
    """Its id in the sandbox's process table (re-attach with ``processes.output``)."""
    pid: int
    """Its pid inside the sandbox."""
    replayed: bool = False
    """The events that follow are a replayed trajectory's recorded ones: the command did not run
    again (``process_id`` and ``pid`` are then 0)."""
    replay_ended: bool = False
    """The command did not match the replayed trajectory: replay ended, it runs live."""


@dataclass(frozen=True)
class Stdout:
    """Bytes the command wrote to stdout."""

    data: bytes

    @property
    def text(self) -> str:
        """The bytes as text (a chunk may end inside a UTF-8 character: decoded leniently)."""
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class Stderr:
    """Bytes the command wrote to stderr."""

    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class Exit:
    """The command ended."""

    status: ExitStatus

    @property
    def exit_code(self) -> int:
        return self.status.exit_code


ExecEvent = Union[Start, Stdout, Stderr, Exit]


def parse(line: Union[str, bytes]) -> ExecEvent:
    """One newline-delimited JSON event; an ``error`` event raises."""
    try:
        obj: Any = json.loads(line)
        kind = obj["type"]
        if kind == "stdout":
            return Stdout(base64.b64decode(obj["data"]))
        if kind == "stderr":
            return Stderr(base64.b64decode(obj["data"]))
        if kind == "start":
            return Start(
                process_id=int(obj["process_id"]),
                pid=int(obj["pid"]),
                replayed=bool(obj.get("replayed", False)),
                replay_ended=bool(obj.get("replay_ended", False)),
            )
        if kind == "exit":
            return Exit(ExitStatus.from_json(obj))
        if kind == "error":
            inner = obj.get("error", obj)
            err = from_error_object(inner)
        else:
            err = ProtocolError(f"unknown event type {kind!r} in Warren's stream")
    except (ValueError, KeyError, TypeError) as e:
        shown = line[:200] if isinstance(line, str) else line[:200].decode("utf-8", "replace")
        raise ProtocolError(f"could not understand an event from Warren ({e}): {shown}") from None
    raise err

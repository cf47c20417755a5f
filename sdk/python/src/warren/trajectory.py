"""Trajectory logs: every exec and file write of a sandbox created with ``trajectory=True``,
oldest first, as the server records them (``GET /v1/sandboxes/{id}/trajectory``).

An entry is the server's JSON object, kept as a ``dict`` so that it goes back to the server
exactly as it came (``{"op": "exec", "argv": [...], "user": ..., "result": {...}}`` or
``{"op": "write_file", "path": ..., "sha256": ..., "content_b64": ...}``). Logs travel as JSON
lines: :func:`dumps` / :func:`save` write them, :func:`loads` / :func:`load` read them back, and
``client.containers.replay(log, ...)`` takes any of these forms.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Union

from .errors import ArgumentTypeError, InvalidArgument

TrajectoryEntry = Dict[str, Any]
"""One operation of a log, as the server's JSON object."""

LogSource = Union[Iterable[Mapping[str, Any]], str, "os.PathLike[str]"]
"""A log: a list of entries, JSON lines text, or the path of a JSON lines file."""


def parse_jsonl(text: str) -> List[TrajectoryEntry]:
    """Entries from JSON lines text (blank lines are skipped)."""
    out: List[TrajectoryEntry] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise InvalidArgument(
                f"trajectory line {n} is not JSON ({e}): {line[:120]!r}"
            ) from None
        out.append(_entry(obj, f"trajectory line {n}"))
    return out


def _entry(obj: Any, where: str) -> TrajectoryEntry:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("op"), str):
        raise InvalidArgument(
            f'{where} is not a trajectory entry (an object with an "op"): {str(obj)[:120]}'
        )
    return dict(obj)


def loads(text: str) -> List[TrajectoryEntry]:
    """Entries from JSON lines text."""
    if not isinstance(text, str):
        raise ArgumentTypeError(f"a trajectory log text must be a str, not {type(text).__name__}")
    return parse_jsonl(text)


def load(source: LogSource) -> List[TrajectoryEntry]:
    """Entries from a list of entries, JSON lines text, or a path to a JSON lines file.

    A ``str`` is JSON lines text when it is empty or starts with ``{``, else a path.
    """
    if isinstance(source, os.PathLike):
        with open(source, encoding="utf-8") as f:
            return parse_jsonl(f.read())
    if isinstance(source, str):
        if not source.strip() or source.lstrip().startswith("{"):
            return parse_jsonl(source)
        with open(source, encoding="utf-8") as f:
            return parse_jsonl(f.read())
    if isinstance(source, (bytes, bytearray)):
        return parse_jsonl(bytes(source).decode("utf-8"))
    if isinstance(source, Mapping):
        raise ArgumentTypeError("a trajectory log is a list of entries, not one entry")
    try:
        items = list(source)
    except TypeError:
        raise ArgumentTypeError(
            "a trajectory log must be a list of entries, JSON lines text or a path, not "
            f"{type(source).__name__}"
        ) from None
    return [_entry(e, f"trajectory entry {i}") for i, e in enumerate(items)]


def dumps(entries: Iterable[Mapping[str, Any]]) -> str:
    """JSON lines text, one entry a line, as the server writes them."""
    return "".join(json.dumps(dict(e), separators=(",", ":")) + "\n" for e in entries)


def save(entries: Iterable[Mapping[str, Any]], path: Union[str, os.PathLike[str]]) -> None:
    """Writes a log as a JSON lines file (replaced whole, never left half-written)."""
    text = dumps(entries)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)

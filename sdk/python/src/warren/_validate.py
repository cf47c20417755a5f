"""Checks on what callers pass, made before any request so a mistake is named where it was
made. Each function returns the value as it goes on the wire, or raises
:class:`~warren.errors.InvalidArgument` / :class:`~warren.errors.ArgumentTypeError`."""

from __future__ import annotations

import math
import os
import re
import signal as _signal
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import ArgumentTypeError, InvalidArgument

if TYPE_CHECKING:
    from .types import NetRule

Size = Union[int, str]
"""Bytes: an ``int``, or a string with a binary suffix such as ``"512Mi"`` or ``"2G"``."""

_SIZE = re.compile(r"^\s*(\d+)\s*([KkMmGgTt]i?[Bb]?|[Bb])?\s*$")
_SHIFT = {"": 0, "b": 0, "k": 10, "m": 20, "g": 30, "t": 40}
_SANDBOX_ID = re.compile(r"^[a-z][a-z0-9]{19}$")
ON_IDLE = ("pause", "stop")
QOS = ("ls", "be")
STATES = ("running", "paused", "unknown")
EVENT_KINDS = (
    "seccomp",
    "management",
    "disk_quota",
    "output_truncated",
    "pids_limit",
    "oom_kill",
    "network",
    "create_queued",
)
NETWORK_MODES = ("filtered", "none")
PROTOCOLS = ("tcp", "udp")
#: Most rules in each of a policy's ``allow`` and ``deny`` (the server's limit).
MAX_NET_RULES = 4096
#: Most ports one sandbox may expose (the server's limit).
MAX_EXPOSED = 32
_PORTS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_RULE_FIELDS = ("cidr", "domain", "ports", "protocol")
_POLICY_FIELDS = ("mode", "allow", "deny", "expose")


def _type_name(v: Any) -> str:
    return type(v).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def string(v: Any, what: str, *, empty: bool = False) -> str:
    if not isinstance(v, str):
        raise ArgumentTypeError(f"{what} must be a str, not {_type_name(v)}")
    if not empty and not v.strip():
        raise InvalidArgument(f"{what} is empty")
    if "\0" in v:
        raise InvalidArgument(f"{what} contains a NUL character")
    return v


def opt_string(v: Any, what: str) -> Optional[str]:
    return None if v is None else string(v, what)


def user(v: Any) -> Optional[str]:
    """A user name or a numeric uid."""
    if v is None:
        return None
    if _is_int(v):
        if v < 0:
            raise InvalidArgument(f"user uid {v} is negative")
        return str(v)
    return string(v, "user")


def path(v: Any, what: str = "path") -> str:
    """A path in the sandbox: a ``str`` or a path object, absolute or relative to the home."""
    if isinstance(v, os.PathLike) and not isinstance(v, (bytes, bytearray)):
        v = os.fspath(v)
    if not isinstance(v, str):
        raise ArgumentTypeError(f"{what} must be a str or a path object, not {_type_name(v)}")
    return string(v, what)


def whole(v: Any, what: str, *, minimum: int) -> int:
    """A whole number at least ``minimum`` (a float with no fraction is accepted)."""
    if isinstance(v, float) and not isinstance(v, bool) and v.is_integer():
        v = int(v)
    if not _is_int(v):
        raise ArgumentTypeError(f"{what} must be an int, not {_type_name(v)} ({v!r})")
    if v < minimum:
        raise InvalidArgument(f"{what} must be at least {minimum}, got {v}")
    return int(v)


def opt_whole(v: Any, what: str, *, minimum: int) -> Optional[int]:
    return None if v is None else whole(v, what, minimum=minimum)


def seconds(v: Any, what: str, *, zero_ok: bool = True) -> Optional[float]:
    """A duration in seconds (``int`` or ``float``); ``None`` stays ``None``."""
    if v is None:
        return None
    if not _is_number(v):
        raise ArgumentTypeError(f"{what} must be a number of seconds, not {_type_name(v)}")
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        need = "zero or more" if zero_ok else "more than zero"
        raise InvalidArgument(f"{what} must be {need} seconds, got {v}")
    return float(v)


def size(v: Any, what: str) -> Optional[int]:
    """Bytes from an ``int`` or a string like ``"512Mi"``, ``"2G"``, ``"64MiB"`` (binary units)."""
    if v is None:
        return None
    if _is_int(v):
        if v < 0:
            raise InvalidArgument(f"{what} {v} is negative: a size is zero or more bytes")
        return int(v)
    if isinstance(v, str):
        m = _SIZE.match(v)
        if not m:
            raise InvalidArgument(
                f"{what} {v!r} is not a size: give bytes as an int or a string with a binary "
                "suffix, e.g. 512Mi or 2G"
            )
        unit = (m.group(2) or "").lower()[:1]
        return int(m.group(1)) << _SHIFT[unit]
    raise ArgumentTypeError(
        f"{what} must be an int (bytes) or a str like '512Mi', not {_type_name(v)}"
    )


def str_map(v: Any, what: str) -> Dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ArgumentTypeError(f"{what} must be a dict of str to str, not {_type_name(v)}")
    out: Dict[str, str] = {}
    for k, val in v.items():
        if not isinstance(k, str) or not k:
            raise InvalidArgument(f"{what}: every key must be a non-empty str, got {k!r}")
        if not isinstance(val, str):
            raise ArgumentTypeError(
                f"{what}[{k!r}] must be a str, not {_type_name(val)}; convert it with str()"
            )
        out[k] = val
    return out


def choice(v: Any, what: str, options: Sequence[str]) -> Optional[str]:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ArgumentTypeError(f"{what} must be a str, not {_type_name(v)}")
    if v not in options:
        raise InvalidArgument(f"{what} {v!r} is not one of {', '.join(map(repr, options))}")
    return v


def boolean(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise ArgumentTypeError(f"{what} must be True or False, not {_type_name(v)}")
    return v


def sandbox_id(v: Any) -> str:
    if not isinstance(v, str):
        raise ArgumentTypeError(f"a sandbox id must be a str, not {_type_name(v)}")
    s = v.strip()
    if not _SANDBOX_ID.match(s):
        raise InvalidArgument(
            f"{v[:64]!r} is not a sandbox id: ids are 20 lower-case letters and digits, as "
            "create returned them"
        )
    return s


def process_id(v: Any) -> int:
    pid = getattr(v, "process_id", v)
    if not _is_int(pid):
        raise ArgumentTypeError(
            f"a process id must be an int (ProcessInfo.process_id), not {_type_name(v)}"
        )
    if pid < 0:
        raise InvalidArgument(f"process id {pid} is negative")
    return int(pid)


def command(cmd: Any) -> Dict[str, Any]:
    """``{"cmd": ...}`` for a shell command line, ``{"argv": [...]}`` for a list."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InvalidArgument("the command is empty: give a shell command line or an argv list")
        if "\0" in cmd:
            raise InvalidArgument("the command contains a NUL character")
        return {"cmd": cmd}
    if isinstance(cmd, (bytes, bytearray)):
        raise ArgumentTypeError("the command must be a str or a list of str, not bytes; decode it")
    if isinstance(cmd, Sequence):
        argv: List[str] = []
        for a in cmd:
            if isinstance(a, os.PathLike):
                a = os.fspath(a)
            if not isinstance(a, str):
                raise ArgumentTypeError(
                    f"every argv item must be a str, got {_type_name(a)} ({a!r})"
                )
            if "\0" in a:
                raise InvalidArgument("an argv item contains a NUL character")
            argv.append(a)
        if not argv or not argv[0]:
            raise InvalidArgument("argv is empty: give at least the program to run")
        return {"argv": argv}
    raise ArgumentTypeError(
        f"the command must be a str (shell command line) or a list of str (argv), "
        f"not {_type_name(cmd)}"
    )


def stdin(v: Any) -> Dict[str, str]:
    """``stdin`` as text when it is, else ``stdin_b64``."""
    import base64

    if v is None:
        return {}
    if isinstance(v, str):
        return {"stdin": v}
    if isinstance(v, (bytes, bytearray, memoryview)):
        raw = bytes(v)
        try:
            return {"stdin": raw.decode("utf-8")}
        except UnicodeDecodeError:
            return {"stdin_b64": base64.b64encode(raw).decode("ascii")}
    raise ArgumentTypeError(f"stdin must be str or bytes, not {_type_name(v)}")


def signal_name(v: Any) -> str:
    """A signal as the API takes it: a name (``"TERM"``, ``"SIGKILL"``), a number, or a
    :class:`signal.Signals`."""
    if isinstance(v, _signal.Signals):
        return v.name
    if _is_int(v):
        if v <= 0 or v > 64:
            raise InvalidArgument(f"signal {v} is not a signal number (1 to 64)")
        return str(v)
    if isinstance(v, str):
        s = v.strip()
        if not s:
            raise InvalidArgument(
                "no signal given: name one, e.g. 'TERM' or 'KILL', or give its number"
            )
        return s
    raise ArgumentTypeError(
        f"signal must be a name like 'TERM', a number or a signal.Signals, not {_type_name(v)}"
    )


def mode(v: Any) -> Optional[str]:
    """Permission bits (``0o644``) as the octal string the API takes."""
    if v is None:
        return None
    if not _is_int(v):
        raise ArgumentTypeError(f"mode must be an int such as 0o644, not {_type_name(v)}")
    if not 0 <= v <= 0o7777:
        raise InvalidArgument(f"mode {v:o} is not permission bits (0 to 0o7777)")
    return format(v, "o")


def data(v: Any) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise ArgumentTypeError(f"data must be str or bytes, not {_type_name(v)}")


# Networks: light checks of what is plainly wrong; the server checks the rest (CIDR host bits,
# domain syntax, destinations no sandbox may reach) and names the rule it refuses.


def ports(v: Any, what: str) -> str:
    """A port (``443``, ``"443"``) or an inclusive range (``"8000-8100"``), as the API's
    string."""
    bad = f"{what}: ports {v!r} are not valid: give a port (1-65535) or a range such as 8000-8100"
    if _is_int(v):
        if not 1 <= v <= 65535:
            raise InvalidArgument(bad)
        return str(v)
    if not isinstance(v, str):
        raise ArgumentTypeError(
            f"{what}: ports must be an int or a str such as '8000-8100', not {_type_name(v)}"
        )
    m = _PORTS.match(v)
    if not m:
        raise InvalidArgument(bad)
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    if not (1 <= lo <= 65535 and 1 <= hi <= 65535):
        raise InvalidArgument(bad)
    if lo > hi:
        raise InvalidArgument(
            f"{what}: ports {v!r}: the range ends before it starts; write it low-high"
        )
    return str(lo) if lo == hi else f"{lo}-{hi}"


def port(v: Any, what: str = "port") -> int:
    """One TCP port, 1-65535."""
    if not _is_int(v):
        raise ArgumentTypeError(f"{what} must be an int (1-65535), not {_type_name(v)} ({v!r})")
    if not 1 <= v <= 65535:
        raise InvalidArgument(f"{what} {v} is not a port: give 1-65535")
    return int(v)


def expose_ports(v: Any, what: str = "expose") -> List[int]:
    """Ports to expose, as the API takes them: sorted, once each, at most
    :data:`MAX_EXPOSED`."""
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
        raise ArgumentTypeError(
            f"{what} must be a list of ports such as [8000], not {_type_name(v)} ({v!r})"
        )
    ports = sorted({port(p, f"{what}: port") for p in v})
    if len(ports) > MAX_EXPOSED:
        raise InvalidArgument(
            f"{what}: {len(ports)} ports is more than {MAX_EXPOSED}: expose fewer (one port can "
            "serve many paths through a reverse proxy in the sandbox)"
        )
    return ports


def port_spec(v: Any) -> Tuple[str, Optional[str]]:
    """``443``, ``"53/udp"``, ``"8000-8100/tcp"``: the ports and the protocol (``None``: both)."""
    if isinstance(v, str) and "/" in v:
        p, proto = v.rsplit("/", 1)
        if proto.strip().lower() not in PROTOCOLS:
            raise InvalidArgument(
                f"port {v!r}: protocol {proto!r} is not tcp or udp (write 443/tcp or 53/udp)"
            )
        return ports(p, f"port {v!r}"), proto.strip().lower()
    return ports(v, f"port {v!r}"), None


def net_rule_of(v: Any, what: str) -> NetRule:
    """A :class:`~warren.types.NetRule` from one, or from a dict of its fields."""
    from .types import NetRule

    if isinstance(v, NetRule):
        return v
    if isinstance(v, Mapping):
        unknown = [k for k in v if k not in _RULE_FIELDS]
        if unknown:
            raise InvalidArgument(
                f"{what}: unknown field {unknown[0]!r}: a rule has {', '.join(_RULE_FIELDS)}"
            )
        return NetRule(**{k: v[k] for k in _RULE_FIELDS if k in v})
    raise ArgumentTypeError(
        f"{what} must be a NetRule or a dict of its fields, not {_type_name(v)}"
    )


def net_rule(r: NetRule, what: str) -> Dict[str, Any]:
    """A rule as it goes on the wire, after the checks that need no server."""
    for name in ("cidr", "domain"):
        val = getattr(r, name)
        if val is not None:
            string(val, f"{what}: {name}")
    if r.cidr is not None and r.domain is not None:
        raise InvalidArgument(f"{what}: a rule names a cidr or a domain, not both: make two rules")
    out = r.to_json()
    if r.ports is not None:
        out["ports"] = ports(r.ports, what)
    if r.protocol is not None:
        if r.protocol not in PROTOCOLS:
            raise InvalidArgument(f"{what}: protocol {r.protocol!r} is not 'tcp' or 'udp'")
        if r.domain is not None and r.protocol == "udp":
            raise InvalidArgument(
                f"{what}: domain {r.domain!r} with protocol udp: a domain allows TCP only (QUIC "
                "and other UDP need a cidr rule)"
            )
    if r.cidr is None and r.domain is None and r.ports is None:
        raise InvalidArgument(
            f"{what}: a rule needs a cidr, a domain or ports: for every address use "
            "NetworkPolicy.internet() (cidr 0.0.0.0/0 and ::/0)"
        )
    return out


def network_policy(v: Any, what: str = "network") -> Optional[Dict[str, Any]]:
    """A network policy as the API takes it, from a :class:`~warren.types.NetworkPolicy`, a dict
    of its JSON fields (``{"mode": ..., "allow": [...], "deny": [...], "expose": [...]}``), or a
    mode's name (``"none"``, ``"filtered"``: no rules). ``None`` stays ``None``."""
    from .types import NetworkPolicy

    if v is None:
        return None
    if isinstance(v, str):
        if v not in NETWORK_MODES:
            raise InvalidArgument(
                f"{what} {v!r} is not 'none' or 'filtered': give a NetworkPolicy for rules"
            )
        return {"mode": v}
    if isinstance(v, Mapping):
        unknown = [k for k in v if k not in _POLICY_FIELDS]
        if unknown:
            raise InvalidArgument(
                f"{what}: unknown field {unknown[0]!r}: a policy has mode, allow, deny and expose"
            )
        for k in ("allow", "deny"):
            if isinstance(v.get(k), (str, Mapping)):
                raise ArgumentTypeError(f"{what}: {k} must be a list of rules")
        v = NetworkPolicy(
            v.get("mode", "filtered"),
            v.get("allow") or (),
            v.get("deny") or (),
            expose=expose_ports(
                [] if v.get("expose") is None else v["expose"], f"{what}: expose"
            ),
        )
    if not isinstance(v, NetworkPolicy):
        raise ArgumentTypeError(
            f"{what} must be a NetworkPolicy, a dict of its fields, or 'none', not {_type_name(v)}"
        )
    if v.mode is None:
        raise InvalidArgument(f"{what}: mode is None: give 'filtered' or 'none'")
    m = choice(v.mode, f"{what} mode", NETWORK_MODES)
    if m == "none" and (v.allow or v.deny):
        raise InvalidArgument(
            f"{what}: mode 'none' has no interface, so it takes no rules: use mode 'filtered' "
            "with the rules"
        )
    expose = expose_ports(v.expose, f"{what}: expose")
    if m == "none" and expose:
        raise InvalidArgument(
            f"{what}: mode 'none' has no interface, so it exposes no ports: use mode 'filtered' "
            "with expose"
        )
    out: Dict[str, Any] = {"mode": m}
    for name, rules in (("allow", v.allow), ("deny", v.deny)):
        if len(rules) > MAX_NET_RULES:
            raise InvalidArgument(
                f"{what}: {len(rules)} {name} rules is more than {MAX_NET_RULES}: use wider "
                "CIDRs or '*.' domains"
            )
        if rules:
            out[name] = [net_rule(r, f"{name}[{i}]") for i, r in enumerate(rules)]
    if expose:
        out["expose"] = expose
    return out

"""Warren's Python SDK: sandboxes for agentic RL.

::

    import warren

    with warren.Client() as client:                       # WARREN_URL, WARREN_API_KEY
        with client.containers.create(image="host", memory="512Mi") as sb:
            print(sb.exec("echo hello").stdout)

The same with ``warren.AsyncClient`` and ``await``. Errors are :class:`WarrenError` subclasses
(see :mod:`warren.errors`); results are dataclasses (:mod:`warren.types`); streaming events are
in :mod:`warren.events`; trajectory logs helpers in :mod:`warren.trajectory`.
"""

from . import events, trajectory
from ._version import __version__
from .async_client import AsyncClient
from .async_sandbox import AsyncEventStream, AsyncPortStream, AsyncSandbox
from .client import Client
from .errors import (
    ArgumentTypeError,
    AuthError,
    CapacityError,
    Conflict,
    InternalError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ProtocolError,
    SandboxGone,
    Timeout,
    Unauthenticated,
    Unavailable,
    WarrenError,
)
from .events import ExecEvent
from .sandbox import EventStream, PortStream, Sandbox
from .types import (
    BatchResult,
    CaseResult,
    ErrorInfo,
    FnCallResult,
    StepOutcome,
    ExecResult,
    ExitStatus,
    ExposedPort,
    FileEntry,
    FsEvent,
    Health,
    IncidentEvent,
    Listing,
    NetEvent,
    NetRule,
    NetworkPolicy,
    NetworkStatus,
    NodeFailure,
    NodeInfo,
    ProcessInfo,
    Resources,
    SandboxInfo,
    ApiKey,
    SandboxMetrics,
    TaskFailure,
    TaskInfo,
    TaskNetworkResult,
    TaskResult,
    WatchEvents,
)

__all__ = [
    "__version__",
    "Client",
    "AsyncClient",
    "Sandbox",
    "AsyncSandbox",
    "EventStream",
    "AsyncEventStream",
    "PortStream",
    "AsyncPortStream",
    "events",
    "trajectory",
    "ExecEvent",
    "IncidentEvent",
    "WarrenError",
    "InvalidArgument",
    "ArgumentTypeError",
    "PayloadTooLarge",
    "AuthError",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "SandboxGone",
    "CapacityError",
    "Timeout",
    "Unavailable",
    "InternalError",
    "ProtocolError",
    "ErrorInfo",
    "ExecResult",
    "ExitStatus",
    "ExposedPort",
    "FileEntry",
    "FsEvent",
    "Health",
    "Listing",
    "NetEvent",
    "NetRule",
    "NetworkPolicy",
    "NetworkStatus",
    "NodeFailure",
    "NodeInfo",
    "ProcessInfo",
    "Resources",
    "SandboxInfo",
    "ApiKey",
    "BatchResult",
    "CaseResult",
    "FnCallResult",
    "StepOutcome",
    "SandboxMetrics",
    "WatchEvents",
    "TaskFailure",
    "TaskInfo",
    "TaskNetworkResult",
    "TaskResult",
]

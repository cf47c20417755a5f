"""Exceptions: every error Warren answers with, and every way a request can fail, as one tree.

Everything the SDK raises about Warren is a :class:`WarrenError`; catch that to catch it all.
A server answer keeps the server's stable ``code`` (e.g. ``"sandbox_not_found"``), its
``message`` (which says what was wrong and what to do) and the HTTP ``status``::

    WarrenError
    ├── InvalidArgument (also ValueError)     invalid_argument 400; bad input the SDK refuses itself
    │   ├── ArgumentTypeError (also TypeError)   a value of the wrong type (SDK only)
    │   └── PayloadTooLarge                      payload_too_large 413
    ├── AuthError
    │   ├── Unauthenticated                      unauthenticated 401: no key or a wrong one
    │   └── PermissionDenied                     permission_denied 403
    ├── NotFound                                 sandbox_not_found, image_not_found,
    │                                            process_not_found, file_not_found, not_found 404
    ├── Conflict                                 conflict 409 (e.g. a directory is not empty)
    ├── SandboxGone                              sandbox_gone 410: it stopped while the request ran
    ├── CapacityError                            capacity 429: no room now; see .retry_after
    ├── Timeout (also TimeoutError)              timeout 504, and timeouts on the client's side
    ├── Unavailable (also ConnectionError)       unavailable 503, and Warren cannot be reached
    ├── InternalError                            internal 500 (and any other 5xx)
    └── ProtocolError                            an answer the SDK cannot understand

``conflict`` is not an :class:`InvalidArgument`: the request was well formed, the state of the
sandbox was not what it needed. ``payload_too_large`` is one: the request itself was wrong.

Every error also says whose fault it is (:attr:`WarrenError.fault`), so an RL trainer knows what
to do with the episode that saw it: ``"infrastructure"`` (the platform's: retry, and mask the
episode out of the loss rather than scoring it), ``"agent"`` (the sandbox's own doing: score it)
or ``"request"`` (the call itself was wrong). :attr:`WarrenError.retryable` is
``fault == "infrastructure"``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Type

FAULTS = ("infrastructure", "agent", "request")


class WarrenError(Exception):
    """Base of every error the SDK raises about Warren.

    Attributes:
        message: What was wrong and what to do, for people (the server's words when it answered).
        code: The server's stable error code (``"sandbox_not_found"``, ...); ``None`` when the
            error was found on the client's side.
        status: The HTTP status of the answer; ``None`` when there was no answer.
        fault: Whose fault it is: ``"infrastructure"``, ``"agent"`` or ``"request"`` (the
            server's word where it gave one, else what the error's kind implies).
    """

    _fault = "request"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        fault: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.fault = fault if fault in FAULTS else type(self)._fault

    @property
    def retryable(self) -> bool:
        """Whether the platform is at fault, so the same call may succeed later (and an RL
        trainer should mask the episode out rather than score it)."""
        return self.fault == "infrastructure"

    def __str__(self) -> str:
        if self.code and self.status:
            return f"{self.message} ({self.code}, HTTP {self.status})"
        if self.code:
            return f"{self.message} ({self.code})"
        return self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, code={self.code!r}, "
            f"status={self.status!r})"
        )


class InvalidArgument(WarrenError, ValueError):
    """The request was malformed or a value out of range (``invalid_argument``, 400).

    Also raised by the SDK itself, before any request, for a value it can tell is wrong.
    """


class ArgumentTypeError(InvalidArgument, TypeError):
    """A value of the wrong type, refused by the SDK before any request."""


class PayloadTooLarge(InvalidArgument):
    """The request body is larger than the server allows (``payload_too_large``, 413)."""


class AuthError(WarrenError):
    """The API key was missing, wrong, or may not do this."""


class Unauthenticated(AuthError):
    """No API key, or a wrong one (``unauthenticated``, 401)."""


class PermissionDenied(AuthError):
    """The key, or the acting user in the sandbox, may not do this (``permission_denied``, 403)."""


class NotFound(WarrenError):
    """The sandbox, image, process, file or route does not exist (404)."""


class Conflict(WarrenError):
    """The operation conflicts with the current state (``conflict``, 409)."""


class SandboxGone(WarrenError):
    """The sandbox stopped while the request ran (``sandbox_gone``, 410)."""


class CapacityError(WarrenError):
    """No node has room right now (``capacity``, 429).

    Attributes:
        retry_after: Seconds after which a retry may succeed, as the server said (``None`` if
            it did not say).
    """

    _fault = "infrastructure"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
        fault: Optional[str] = None,
    ) -> None:
        super().__init__(message, code=code, status=status, fault=fault)
        self.retry_after = retry_after


class Timeout(WarrenError, TimeoutError):
    """An operation did not finish in time: the server's ``timeout`` (504), or the client's own
    request timeout."""

    _fault = "infrastructure"


class Unavailable(WarrenError, ConnectionError):
    """Warren, or one of its nodes, cannot be reached (``unavailable``, 503, or no connection)."""

    _fault = "infrastructure"


class InternalError(WarrenError):
    """A bug or an unexpected failure of the host (``internal``, 500)."""

    _fault = "infrastructure"


class ProtocolError(WarrenError):
    """Warren's answer could not be understood (a version mismatch, or not Warren at all)."""

    _fault = "infrastructure"


_BY_CODE: Dict[str, Type[WarrenError]] = {
    "invalid_argument": InvalidArgument,
    "payload_too_large": PayloadTooLarge,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "sandbox_not_found": NotFound,
    "image_not_found": NotFound,
    "process_not_found": NotFound,
    "file_not_found": NotFound,
    "not_found": NotFound,
    "conflict": Conflict,
    "sandbox_gone": SandboxGone,
    "capacity": CapacityError,
    "timeout": Timeout,
    "unavailable": Unavailable,
    "internal": InternalError,
}

_BY_STATUS: Dict[int, str] = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "conflict",
    410: "sandbox_gone",
    413: "payload_too_large",
    422: "invalid_argument",
    429: "capacity",
    500: "internal",
    502: "unavailable",
    503: "unavailable",
    504: "timeout",
}


def _code_for_status(status: int) -> str:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return "internal" if status >= 500 else "invalid_argument"


def error_for(
    code: str,
    message: str,
    *,
    status: Optional[int],
    retry_after: Optional[float] = None,
    fault: Optional[str] = None,
) -> WarrenError:
    """The exception for a server error ``code``; an unknown code (a newer server) is typed by
    its HTTP status so it still lands in the right branch."""
    cls = _BY_CODE.get(code) or _BY_CODE[_code_for_status(status or 500)]
    if cls is CapacityError:
        return CapacityError(
            message, code=code, status=status, retry_after=retry_after, fault=fault
        )
    return cls(message, code=code, status=status, fault=fault)


def from_error_object(obj: Any, *, status: Optional[int] = None) -> WarrenError:
    """The exception for an ``{"code", "message"}`` object (an error event, a task failure)."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("code"), str):
        return ProtocolError(f"could not understand Warren's error: {str(obj)[:200]}")
    ra = obj.get("retry_after_secs")
    retry_after = float(ra) if isinstance(ra, (int, float)) and not isinstance(ra, bool) else None
    fault = obj.get("fault")
    return error_for(
        obj["code"],
        str(obj.get("message", "")),
        status=status,
        retry_after=retry_after,
        fault=fault if isinstance(fault, str) else None,
    )


def from_response(
    status: int, body: bytes, retry_after_header: Optional[str], *, key_hint: Optional[str] = None
) -> WarrenError:
    """The exception for an HTTP answer with a failure status.

    Warren always sends ``{"error": {"code", "message"}}``; anything else (a proxy's page,
    another program on the port) still becomes a typed error that shows the status and the start
    of the body.
    """
    header_wait: Optional[float] = None
    if retry_after_header:
        try:
            header_wait = max(0.0, float(retry_after_header.strip()))
        except ValueError:
            header_wait = None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("code"), str):
        err = from_error_object(inner, status=status)
        if isinstance(err, CapacityError) and err.retry_after is None:
            err.retry_after = header_wait
    else:
        text = body.decode("utf-8", "replace").strip()
        shown = text[:200] + ("…" if len(text) > 200 else "")
        if shown:
            message = f"the server answered HTTP {status}: {shown}"
        else:
            message = (
                f"the server answered HTTP {status} with no error body; "
                "is WARREN_URL the address of a Warren server?"
            )
        err = error_for(_code_for_status(status), message, status=status, retry_after=header_wait)
    if isinstance(err, Unauthenticated) and key_hint:
        err.message += f" (this client sent no API key: {key_hint})"
    return err

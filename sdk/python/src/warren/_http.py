"""The one place requests are sent: one connection pool per client (in shards, see
:class:`Shards`), errors made typed, and bounded retries with backoff.

Every operation is described by a :class:`Call` (built by ``_ops``), then sent by the sync or
the async transport, which share everything but the waiting.

Urgent calls (task pause, resume and stop; a sandbox's pause, resume and kill: the operations
that preempt work) go over connections of their own, :data:`URGENT_CONNECTIONS` or an eighth of
``max_connections`` if more, so they never wait for a connection behind the client's own
creates, execs and file transfers, however many are in flight. The async transport sends them
from threads of their own too, so a busy event loop does not hold them either.

Retries (at most ``max_retries``, exponential backoff with jitter, ``Retry-After`` honoured):

- a ``429`` (capacity) or ``503`` (unavailable) answer: the server did not do the operation, so
  every call is retried;
- a connection that could not be made (nothing was sent): every call is retried;
- a connection that broke after the request went out: only calls marked ``idempotent`` (reads,
  pause/resume/kill, and create, which always carries an ``Idempotency-Key``). A command, a file
  write or a process start is never repeated once it may have reached the server.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Optional, Tuple, TypeVar

import httpcore
import httpx

from ._version import __version__
from .errors import (
    CapacityError,
    InvalidArgument,
    ProtocolError,
    Timeout,
    Unavailable,
    WarrenError,
    from_response,
)

T = TypeVar("T")
P = TypeVar("P")

#: Sentinel: use the client's own timeout.
CLIENT_TIMEOUT: Any = object()
#: Seconds to wait for a TCP connection.
CONNECT_TIMEOUT = 10.0
#: The longest ``Retry-After`` honoured, seconds.
MAX_RETRY_AFTER = 60.0
#: Most connections in one httpx pool. httpcore's pool scans all its connections (and, for each
#: idle one, all of them again) on every request and every response, so one pool of 1,000
#: connections costs milliseconds of CPU per request under load. A client's pool is therefore
#: split into shards of this size, and each request goes to the shard with the fewest requests
#: in flight, so no request waits for a busy shard while another has a free connection.
SHARD_SIZE = 4
#: The fewest connections a client keeps for urgent calls (see :class:`Call`'s ``urgent``),
#: beside its ``max_connections``.
URGENT_CONNECTIONS = 8


def urgent_connections(max_connections: int) -> int:
    """How many connections a client of ``max_connections`` keeps for urgent calls: enough
    that a rollout's kills (urgent too) do not queue behind each other."""
    return max(URGENT_CONNECTIONS, max_connections // 8)


class Shards(Generic[P]):
    """The shards of a client's connection pool, and how many requests each has in flight.
    A shard's httpx client is made when it is first needed (ties go to the first shard, so a
    client used lightly makes one or two)."""

    def __init__(self, max_connections: int, make: Callable[[int], P]) -> None:
        n = math.ceil(max_connections / SHARD_SIZE)
        self._size = math.ceil(max_connections / n)
        self._make = make
        self._pools: List[Optional[P]] = [None] * n
        self._load = [0] * n
        self._lock = threading.Lock()

    @property
    def pools(self) -> List[P]:
        """The shards made so far."""
        return [p for p in self._pools if p is not None]

    def acquire(self) -> Tuple[int, P]:
        """The least busy shard, counted as one request busier."""
        with self._lock:
            i = min(range(len(self._load)), key=self._load.__getitem__)
            self._load[i] += 1
            pool = self._pools[i]
            if pool is None:
                pool = self._pools[i] = self._make(self._size)
        return i, pool

    def release(self, i: int) -> None:
        with self._lock:
            self._load[i] -= 1


@dataclass
class Opened:
    """A streaming answer, still open; ``close`` (or ``aclose``) it when done."""

    response: httpx.Response
    release: Callable[[], None]


def upgraded_stream(resp: httpx.Response, what: str) -> Any:
    """The connection of a ``101 Switching Protocols`` answer, as httpcore hands it over (its
    ``network_stream``, which first gives back any bytes read past the answer's headers)."""
    if resp.status_code != 101:
        raise ProtocolError(
            f"Warren answered {what} with HTTP {resp.status_code}, not 101 Switching Protocols: "
            "something between this client and Warren does not pass HTTP upgrades"
        )
    return resp.extensions["network_stream"]


def stream_error(e: Exception, what: str) -> WarrenError:
    """The error for a failed read or write on an upgraded connection (httpcore's errors)."""
    if isinstance(e, httpcore.TimeoutException):
        return Timeout(f"{what}: nothing could be read or written within the timeout set")
    return Unavailable(f"{what} broke: {e or type(e).__name__}")


#: What reading or writing an upgraded connection raises when it fails.
STREAM_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, OSError)


def _ignore(resp: httpx.Response) -> None:
    return None


def json_body(resp: httpx.Response) -> Any:
    """A successful answer's JSON body."""
    try:
        return json.loads(resp.content)
    except ValueError:
        text = resp.content[:200].decode("utf-8", "replace")
        raise ProtocolError(
            f"could not understand Warren's answer to {resp.request.method} "
            f"{resp.request.url.path} (HTTP {resp.status_code}, not JSON): {text!r}"
        ) from None


@dataclass
class Call(Generic[T]):
    """One API operation, as data; ``parse`` reads its successful answer."""

    method: str
    path: str
    params: Optional[Dict[str, str]] = None
    json: Any = None
    content: Optional[bytes] = None
    headers: Optional[Dict[str, str]] = None
    idempotent: bool = True
    """Safe to send again after a connection broke mid-request."""
    read_timeout: Any = CLIENT_TIMEOUT
    """Seconds to wait for the answer; ``None``: no limit; default the client's timeout."""
    parse: Callable[[httpx.Response], T] = _ignore  # type: ignore[assignment]
    urgent: bool = False
    """Sent over the client's connections for urgent calls, never behind its ordinary ones."""


class _Base:
    def __init__(
        self,
        url: str,
        api_key: Optional[str],
        key_hint: Optional[str],
        *,
        timeout: Optional[float],
        max_retries: int,
        backoff: float,
        backoff_max: float,
    ) -> None:
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidArgument(f"max_retries must be an int >= 0, got {max_retries!r}")
        for name, v in (("backoff", backoff), ("backoff_max", backoff_max)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise InvalidArgument(f"{name} must be a number of seconds >= 0, got {v!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            raise InvalidArgument(f"timeout must be None or seconds > 0, got {timeout!r}")
        self.url = url
        self.key_hint = key_hint
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.backoff_max = float(backoff_max)
        self.headers = {"User-Agent": f"warren-python/{__version__}"}
        self.sandbox_domain: Optional[str] = None
        """The server's ``sandbox_domain`` once ``/v1/health`` has named one (asked once per
        client, by the first ``sandbox.get_host``)."""
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _tls(self) -> Any:
        """What the pool shards are given as ``verify``: one TLS context shared by all of them
        for an https address (making one costs ~0.1 s), nothing to load for plain http."""
        if self.url.startswith("https://"):
            return httpx.create_ssl_context()
        return False  # plain http: no TLS, so no certificates to load

    def _pool_args(self, url: str, tls: Any, size: int) -> Dict[str, Any]:
        """The arguments of one pool shard (an ``httpx.Client`` or ``httpx.AsyncClient``)."""
        return dict(
            base_url=url,
            verify=tls,
            headers=self.headers,
            limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
            timeout=httpx.Timeout(self.timeout, connect=CONNECT_TIMEOUT, pool=None),
        )

    def _timeout(self, call: Call[Any]) -> httpx.Timeout:
        read = self.timeout if call.read_timeout is CLIENT_TIMEOUT else call.read_timeout
        if read is not None:
            read = None if self.timeout is None else max(read, self.timeout)
        connect = CONNECT_TIMEOUT if self.timeout is None else min(CONNECT_TIMEOUT, self.timeout)
        return httpx.Timeout(connect=connect, read=read, write=self.timeout, pool=None)

    def _build(self, http: Any, call: Call[Any]) -> httpx.Request:
        req: httpx.Request = http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.json,
            content=call.content,
            headers=call.headers,
            timeout=self._timeout(call),
        )
        return req

    def _failure(self, call: Call[Any], e: Exception) -> Tuple[WarrenError, bool]:
        """The error for an exception from httpx, and whether the call may be retried."""
        what = f"{call.method} {call.path}"
        if isinstance(e, (httpx.ConnectTimeout, httpx.PoolTimeout)):
            return (
                Timeout(
                    f"could not connect to Warren at {self.url} in time ({what}). Start the "
                    "platform with `warren up`, or set WARREN_URL to the address it listens on"
                ),
                True,
            )
        if isinstance(e, httpx.TimeoutException):
            return (
                Timeout(
                    f"Warren at {self.url} did not answer {what} within the client's timeout "
                    f"({type(e).__name__}); give the client a longer timeout= if this operation "
                    "is expected to take longer"
                ),
                False,
            )
        if isinstance(e, httpx.ConnectError):
            return (
                Unavailable(
                    f"could not connect to Warren at {self.url}: {e or type(e).__name__}. Start "
                    "the platform with `warren up`, or set WARREN_URL to the address it listens on"
                ),
                True,
            )
        if isinstance(e, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
            return InvalidArgument(f"cannot send {what} to {self.url}: {e}"), False
        return (
            Unavailable(
                f"the connection to Warren at {self.url} broke during {what}: "
                f"{e or type(e).__name__}"
            ),
            call.idempotent,
        )

    def _answer(
        self, resp: httpx.Response, body: bytes
    ) -> Tuple[WarrenError, bool, Optional[float]]:
        """The error for a failure answer, whether to retry it, and the wait asked for."""
        err = from_response(
            resp.status_code, body, resp.headers.get("retry-after"), key_hint=self.key_hint
        )
        wait: Optional[float] = None
        if isinstance(err, CapacityError):
            wait = err.retry_after
        else:
            try:
                wait = float(resp.headers.get("retry-after", ""))
            except ValueError:
                wait = None
        return err, resp.status_code in (429, 503), wait

    def _delay(self, attempt: int, retry_after: Optional[float]) -> float:
        if retry_after is not None and retry_after > 0:
            base = min(float(retry_after), MAX_RETRY_AFTER)
            return base + random.uniform(0.0, min(1.0, base * 0.25))
        step = min(self.backoff_max, self.backoff * 2.0**attempt)
        return step / 2 + random.uniform(0.0, step / 2)

    def _parse(self, call: Call[T], resp: httpx.Response) -> T:
        try:
            return call.parse(resp)
        except WarrenError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            text = resp.content[:200].decode("utf-8", "replace")
            raise ProtocolError(
                f"could not understand Warren's answer to {call.method} {call.path} "
                f"({type(e).__name__}: {e}): {text!r}"
            ) from None


class SyncTransport(_Base):
    """Blocking requests over the client's connection pool (thread-safe):
    ``max_connections`` keep-alive connections, in :class:`Shards`, and those kept for urgent
    calls."""

    def __init__(
        self,
        url: str,
        api_key: Optional[str],
        key_hint: Optional[str],
        *,
        max_connections: int,
        **kw: Any,
    ) -> None:
        super().__init__(url, api_key, key_hint, **kw)
        tls = self._tls()

        def make(size: int) -> httpx.Client:
            return httpx.Client(**self._pool_args(url, tls, size))

        self.shards = Shards(max_connections, make)
        self.urgent = Shards(urgent_connections(max_connections), make)

    def _lane(self, call: Call[Any]) -> Shards[httpx.Client]:
        """The shards ``call`` goes over: the urgent calls' own, or the ordinary ones."""
        return self.urgent if call.urgent else self.shards

    def _send(self, call: Call[Any], stream: bool) -> Tuple[httpx.Response, int]:
        """Sends with retries: a successful answer (open when ``stream``), and its shard (of
        :meth:`_lane`), which the caller releases."""
        shards = self._lane(call)
        attempt = 0
        while True:
            wait: Optional[float] = None
            i, http = shards.acquire()
            try:
                resp = http.send(self._build(http, call), stream=stream)
            except (httpx.HTTPError, httpx.InvalidURL) as e:
                shards.release(i)
                err, retry = self._failure(call, e)
            except BaseException:
                shards.release(i)
                raise
            else:
                if resp.status_code < 400:
                    return resp, i
                body = b""
                try:
                    body = resp.read()
                except httpx.HTTPError:
                    pass
                finally:
                    resp.close()
                    shards.release(i)
                err, retry, wait = self._answer(resp, body)
            if not retry or attempt >= self.max_retries:
                raise err
            time.sleep(self._delay(attempt, wait))
            attempt += 1

    def call(self, call: Call[T]) -> T:
        resp, i = self._send(call, stream=False)
        self._lane(call).release(i)
        return self._parse(call, resp)

    def open(self, call: Call[Any]) -> Opened:
        """A streaming answer (after retries), still open."""
        resp, i = self._send(call, stream=True)
        shards = self._lane(call)
        return Opened(resp, lambda: shards.release(i))

    def close(self) -> None:
        for pool in self.shards.pools + self.urgent.pools:
            pool.close()


class AsyncTransport(_Base):
    """Requests over the client's connection pool, safe under ``asyncio.gather``:
    ``max_connections`` keep-alive connections, in :class:`Shards`. Urgent calls go another way
    (see :meth:`call`)."""

    def __init__(
        self,
        url: str,
        api_key: Optional[str],
        key_hint: Optional[str],
        *,
        max_connections: int,
        **kw: Any,
    ) -> None:
        super().__init__(url, api_key, key_hint, **kw)
        tls = self._tls()

        def make(size: int) -> httpx.AsyncClient:
            return httpx.AsyncClient(**self._pool_args(url, tls, size))

        self.shards = Shards(max_connections, make)
        self._urgent_threads = urgent_connections(max_connections)
        self.urgent = SyncTransport(
            url, api_key, key_hint, max_connections=self._urgent_threads, **kw
        )
        """The urgent calls' own connections, used from threads of their own."""
        self._threads: Optional[ThreadPoolExecutor] = None

    async def _send(self, call: Call[Any], stream: bool) -> Tuple[httpx.Response, int]:
        attempt = 0
        while True:
            wait: Optional[float] = None
            i, http = self.shards.acquire()
            try:
                resp = await http.send(self._build(http, call), stream=stream)
            except (httpx.HTTPError, httpx.InvalidURL) as e:
                self.shards.release(i)
                err, retry = self._failure(call, e)
            except BaseException:  # cancelled while waiting
                self.shards.release(i)
                raise
            else:
                if resp.status_code < 400:
                    return resp, i
                body = b""
                try:
                    body = await resp.aread()
                except httpx.HTTPError:
                    pass
                finally:
                    await resp.aclose()
                    self.shards.release(i)
                err, retry, wait = self._answer(resp, body)
            if not retry or attempt >= self.max_retries:
                raise err
            await asyncio.sleep(self._delay(attempt, wait))
            attempt += 1

    async def call(self, call: Call[T]) -> T:
        """Sends ``call``. An urgent one is sent from a thread of its own over connections of
        its own: under a flood of requests this event loop is busy (a thousand connections
        opening, answers being read), and a call sent from it would wait its turn at every step
        of its exchange; from a thread it waits for the loop only to hand its answer back.
        Cancelling the caller does not stop an urgent call already sent."""
        if call.urgent:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(
                    self._urgent_threads, thread_name_prefix="warren-urgent"
                )
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._threads, self.urgent.call, call)
        resp, i = await self._send(call, stream=False)
        self.shards.release(i)
        return self._parse(call, resp)

    async def open(self, call: Call[Any]) -> Opened:
        """A streaming answer (after retries), still open."""
        resp, i = await self._send(call, stream=True)
        return Opened(resp, lambda: self.shards.release(i))

    async def close(self) -> None:
        for pool in self.shards.pools:
            await pool.aclose()
        self.urgent.close()
        if self._threads is not None:
            self._threads.shutdown(wait=False)

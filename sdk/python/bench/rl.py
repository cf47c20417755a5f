#!/usr/bin/env python3
"""A training step's load on one Warren node: a rollout of episodes with a reward call per
episode through the unmodified ``sandbox-fusion`` client, and a task pause in the middle,
beside the same rollout without reward calls; then Python calls through that client, 4 in
flight and a burst of 200 at once. Prints Markdown tables.

    python sdk/python/bench/rl.py                      # WARREN_URL / WARREN_API_KEY, or `make up`'s
    python sdk/python/bench/rl.py --episodes 200 --url http://127.0.0.1:7700

`warren-bench rl` makes a virtual environment with this SDK and ``sandbox-fusion``, starts its
own ``warren up`` and runs this. A benchmark, not a test: it asserts nothing about speed. It
checks every episode (each command's output, the file read back) and every reward (the
program's stdout), counts what failed and why, and stops its tasks even when interrupted.

An episode: create a container sandbox of image ``host`` in the rollout's task, write a
solution program to a file, run 5 commands (4 echoes and a checksum of the file), read the
file back, kill the sandbox; with rewards, then score the program read back through
``sandbox_fusion.run_code_async`` (stdin the episode's number, the expected stdout known).
Every episode starts at once, as a rollout's do; when half of the creates have answered, the
task is paused (then resumed after ``--pause-hold`` seconds).

Reward calls go the way verl's reward path sends them: at most ``--max-concurrent`` at a time
(verl's ``reward_model.sandbox_fusion.max_concurrent``, default 64), compile and run timeouts
of 10 s and a client timeout of their sum plus 10 s, a 504 sent again (3 attempts, 1 s then
2 s apart) and any other failure scored as a wrong answer (verl's -1). The client package
cannot send ``memory_limit_MB``; Warren then gives the call 1024 MiB, verl's default
``memory_limit_mb``. The burst uses the package's own retries (5 attempts, exponential back-off
on any failure), which is what a caller of ``run_code_async`` gets by default.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import re
import resource
import secrets
import signal
import statistics
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import httpx
import warren

# The package calls pydantic's `.dict()`, deprecated in pydantic 2: nothing to act on here.
warnings.filterwarnings("ignore", message="The `dict` method is deprecated")
from sandbox_fusion import RunCodeRequest, RunStatus, run_code_async, set_endpoint  # noqa: E402

PATH = "/home/user/solution.py"
EXECS = 5
# verl's reward path (verl/utils/reward_score/sandbox_fusion/utils.py): timeouts, attempts.
VERL_TIMEOUT = 10
VERL_ATTEMPTS = 3
VERL_API_TIMEOUT = 10
BURST = 200
PLAIN_CALLS = 200
PLAIN_IN_FLIGHT = 4


# ---------------------------------------------------------------------------------------------
# What one episode does and expects


def solution(ep: int) -> str:
    """The episode's program: what the agent wrote, and what the reward runs."""
    return f"n = int(input())\nprint(n * {ep % 97 + 2} + {ep})\n"


def solution_output(ep: int) -> str:
    return f"{ep * (ep % 97 + 2) + ep}\n"


def command(ep: int, j: int, program: str) -> Tuple[str, str]:
    """The episode's ``j``-th command and its expected stdout."""
    if j == EXECS - 1:
        digest = hashlib.sha256(program.encode()).hexdigest()
        return f"sha256sum {PATH}", f"{digest}  {PATH}\n"
    return f"echo {ep}.{j}", f"{ep}.{j}\n"


# ---------------------------------------------------------------------------------------------
# Measurements


def ms(v: float) -> str:
    return f"{v * 1000:,.1f}"


def pct(values: List[float], p: float) -> Optional[float]:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round((len(v) - 1) * p)))]


def p50_p99(values: List[float]) -> str:
    if not values:
        return "–"
    return f"{ms(statistics.median(values))} / {ms(pct(values, 0.99) or 0.0)}"


class Failures:
    """Failures counted by kind (stage and error), with the first message of each kind."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.first: Dict[str, str] = {}

    def add(self, kind: str, message: str) -> None:
        self.kinds[kind] += 1
        self.first.setdefault(kind, message[:300])

    def __len__(self) -> int:
        return sum(self.kinds.values())

    def lines(self, label: str, limit: int = 8) -> List[str]:
        out = []
        for kind, n in self.kinds.most_common(limit):
            out.append(f"- {label}: {n} × {kind}: {self.first[kind]}")
        if len(self.kinds) > limit:
            out.append(f"- {label}: ... {len(self.kinds) - limit} more kinds")
        return out


def error_kind(stage: str, e: BaseException) -> str:
    if isinstance(e, warren.WarrenError):
        return f"{stage}: {type(e).__name__} {e.status or ''}".rstrip()
    return f"{stage}: {type(e).__name__}"


@dataclass
class Rollout:
    name: str
    episodes: int
    rewards: bool
    ok: int = 0
    wall: float = 0.0
    episode: List[float] = field(default_factory=list)
    create: List[float] = field(default_factory=list)
    write: List[float] = field(default_factory=list)
    exec_: List[float] = field(default_factory=list)
    read: List[float] = field(default_factory=list)
    kill: List[float] = field(default_factory=list)
    creates_answered: int = 0
    pause: Optional[float] = None
    pause_result: Optional[warren.TaskResult] = None
    resume: Optional[float] = None
    pause_error: Optional[str] = None
    reward: List[float] = field(default_factory=list)
    reward_ok: int = 0
    reward_first: Optional[float] = None
    reward_last: Optional[float] = None
    reward_answers: Counter[str] = field(default_factory=Counter)
    sdk_answers: Counter[int] = field(default_factory=Counter)
    failures: Failures = field(default_factory=Failures)
    node_after: str = ""


class WrongResult(Exception):
    """An answer that came back but was not the right one."""


# ---------------------------------------------------------------------------------------------
# Counting every answer of 400 or more the SDK saw, retried ones included


class AnswerCounter:
    """Counts the HTTP statuses of Warren's failed answers, those the SDK's own retries hid
    included. The SDK has no hook for this; httpx's ``AsyncClient.send``, which every request
    of the SDK goes through, is wrapped instead (only the SDK uses httpx in this process: the
    ``sandbox-fusion`` package uses aiohttp)."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        send = httpx.AsyncClient.send
        counts = self

        async def counting_send(client: httpx.AsyncClient, request: Any, **kw: Any) -> Any:
            resp = await send(client, request, **kw)
            if resp.status_code >= 400:
                counts.counts[resp.status_code] += 1
            return resp

        httpx.AsyncClient.send = counting_send  # type: ignore[method-assign]

    def take(self) -> Counter[int]:
        out, self.counts = self.counts, Counter()
        return out


class RetryLog(logging.Handler):
    """Counts the failures the ``sandbox-fusion`` package retried or gave up on, by HTTP
    status, from its own log records (its retry wrapper logs each one)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "will retry" in msg:
            self.counts[answer_of(msg)] += 1

    def take(self) -> Counter[str]:
        out, self.counts = self.counts, Counter()
        return out


def answer_of(text: str) -> str:
    """``"429"``, ``"504"``, ... from the package's ``Faas api responded with code N`` error,
    else the kind of failure."""
    m = re.search(r"responded with code (\d{3})", text)
    if m:
        return m.group(1)
    if "Timeout" in text or "timeout" in text:
        return "client timeout"
    return "connection or other"


# ---------------------------------------------------------------------------------------------
# The reward call, as verl's reward path makes it


async def verl_reward(code: str, stdin: str, answers: Counter[str]) -> Any:
    """One reward through the package, with verl's policy around it: a 504 is sent again (3
    attempts, 1 s then 2 s apart), any other failure is final (verl scores it -1)."""
    req = RunCodeRequest(
        code=code,
        language="python",
        stdin=stdin,
        compile_timeout=VERL_TIMEOUT,
        run_timeout=VERL_TIMEOUT,
    )
    for attempt in range(VERL_ATTEMPTS):
        try:
            return await run_code_async(
                req, max_attempts=1, client_timeout=2 * VERL_TIMEOUT + VERL_API_TIMEOUT
            )
        except Exception as e:  # the package raises bare Exceptions
            what = answer_of(f"{type(e).__name__}: {e}")
            answers[what] += 1
            if what == "504" and attempt < VERL_ATTEMPTS - 1:
                await asyncio.sleep(attempt + 1)
                continue
            raise


# ---------------------------------------------------------------------------------------------
# The rollout


async def episode(
    ep: int,
    client: warren.AsyncClient,
    task: str,
    ro: Rollout,
    half: asyncio.Event,
    rewards: Optional[asyncio.Semaphore],
) -> None:
    t_ep = time.perf_counter()
    stage = "create"
    sb: Optional[warren.AsyncSandbox] = None
    try:
        t = time.perf_counter()
        try:
            sb = await client.containers.create(image="host", task=task)
        finally:
            ro.creates_answered += 1
            if ro.creates_answered >= ro.episodes // 2:
                half.set()
        ro.create.append(time.perf_counter() - t)
        program = solution(ep)
        stage = "write"
        t = time.perf_counter()
        await sb.files.write(PATH, program)
        ro.write.append(time.perf_counter() - t)
        stage = "exec"
        for j in range(EXECS):
            cmd, want = command(ep, j, program)
            t = time.perf_counter()
            r = await sb.exec(cmd)
            ro.exec_.append(time.perf_counter() - t)
            if r.exit_code != 0 or r.stdout != want:
                raise WrongResult(
                    f"{sb.id}: `{cmd}` answered {r.stdout!r} (exit {r.exit_code}, signal "
                    f"{r.signal}, stderr {r.stderr[:120]!r}), wanted {want!r}"
                )
        stage = "read"
        t = time.perf_counter()
        back = await sb.files.read(PATH)
        ro.read.append(time.perf_counter() - t)
        if back != program.encode():
            raise WrongResult(f"{sb.id}: read back {back[:80]!r}, wrote {program[:80]!r}")
        stage = "kill"
        t = time.perf_counter()
        await sb.kill()
        sb = None
        ro.kill.append(time.perf_counter() - t)
        if rewards is not None:
            stage = "reward"
            async with rewards:
                t = time.perf_counter()
                if ro.reward_first is None:
                    ro.reward_first = t
                resp = await verl_reward(back.decode(), f"{ep}\n", ro.reward_answers)
                ro.reward_last = time.perf_counter()
                ro.reward.append(ro.reward_last - t)
            want = solution_output(ep)
            if resp.status != RunStatus.Success or resp.run_result is None:
                raise WrongResult(f"episode {ep}: reward {resp.status.value}: {resp.message!r}")
            if resp.run_result.stdout != want:
                raise WrongResult(
                    f"episode {ep}: reward stdout {resp.run_result.stdout!r}, wanted {want!r}"
                )
            ro.reward_ok += 1
        ro.ok += 1
        ro.episode.append(time.perf_counter() - t_ep)
    except WrongResult as e:
        ro.failures.add(f"{stage}: wrong result", str(e))
    except Exception as e:  # noqa: BLE001 (every failure is counted, none ends the run)
        ro.failures.add(error_kind(stage, e), f"{type(e).__name__}: {e}")
    finally:
        if sb is not None:
            try:
                await sb.kill()
            except warren.WarrenError:
                pass  # the task is stopped at the end anyway


async def pause_in_the_middle(
    client: warren.AsyncClient, task: str, ro: Rollout, half: asyncio.Event, hold: float
) -> None:
    await half.wait()
    try:
        t = time.perf_counter()
        ro.pause_result = await client.tasks.pause(task)
        ro.pause = time.perf_counter() - t
        await asyncio.sleep(hold)
        t = time.perf_counter()
        await client.tasks.resume(task)
        ro.resume = time.perf_counter() - t
    except warren.WarrenError as e:
        ro.pause_error = f"{type(e).__name__}: {e}"


async def node_state(client: warren.AsyncClient) -> str:
    """The node's sandboxes, memory requests and FnCall workers, in one line."""
    try:
        nodes = await client.nodes()
    except warren.WarrenError as e:
        return f"(nodes not read: {e})"
    parts = []
    for n in nodes:
        idle = sum(int(p.get("idle", 0)) for p in n.fncall_pools)
        busy = sum(int(p.get("busy", 0)) for p in n.fncall_pools)
        parts.append(
            f"{n.sandboxes} sandboxes, memory requests {n.memory_reserved >> 20:,} of "
            f"{n.memory_allocatable >> 20:,} MiB, FnCall workers {idle} idle / {busy} busy"
        )
    return "; ".join(parts)


async def rollout(
    args: argparse.Namespace,
    client: warren.AsyncClient,
    counter: AnswerCounter,
    name: str,
    rewards: bool,
    tasks: List[str],
) -> Rollout:
    task = f"bench-rl-{secrets.token_hex(3)}"
    tasks.append(task)
    ro = Rollout(name, args.episodes, rewards)
    half = asyncio.Event()
    sem = asyncio.Semaphore(args.max_concurrent) if rewards else None
    counter.take()
    print(f"rl: {name}: {args.episodes} episodes in task {task}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    pauser = asyncio.create_task(pause_in_the_middle(client, task, ro, half, args.pause_hold))
    await asyncio.gather(
        *[episode(ep, client, task, ro, half, sem) for ep in range(args.episodes)]
    )
    ro.wall = time.perf_counter() - t0
    if not pauser.done():
        pauser.cancel()
        ro.pause_error = ro.pause_error or "the rollout ended before the pause was answered"
    await asyncio.gather(pauser, return_exceptions=True)
    ro.sdk_answers = counter.take()
    await client.tasks.stop(task)
    ro.node_after = await node_state(client)
    print(
        f"rl: {name}: {ro.ok}/{ro.episodes} correct in {ro.wall:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return ro


# ---------------------------------------------------------------------------------------------
# Calls through the package alone


@dataclass
class Calls:
    name: str
    calls: int
    wall: float = 0.0
    lat: List[float] = field(default_factory=list)
    ok: int = 0
    failures: Failures = field(default_factory=Failures)
    retried: Counter[str] = field(default_factory=Counter)


async def one_call(i: int, c: Calls, max_attempts: int) -> None:
    t = time.perf_counter()
    try:
        r = await run_code_async(
            RunCodeRequest(code=f"print({i} * 2)", language="python"), max_attempts=max_attempts
        )
    except Exception as e:  # noqa: BLE001
        c.failures.add(f"HTTP {answer_of(str(e))}", f"{type(e).__name__}: {e}")
        return
    c.lat.append(time.perf_counter() - t)
    if r.status != RunStatus.Success or r.run_result is None:
        c.failures.add(f"status {r.status.value}", r.message or str(r.run_result))
    elif r.run_result.stdout != f"{i * 2}\n":
        c.failures.add("wrong stdout", f"{r.run_result.stdout!r}, wanted {i * 2!r}")
    else:
        c.ok += 1


async def plain_rate(log: RetryLog) -> Calls:
    """The node's plain single-call rate: PLAIN_CALLS calls, PLAIN_IN_FLIGHT at a time."""
    for i in range(PLAIN_IN_FLIGHT):  # warm the pool's first workers
        await one_call(i, Calls("warm-up", 1), 5)
    log.take()
    c = Calls(f"{PLAIN_IN_FLIGHT} in flight", PLAIN_CALLS)
    next_i = iter(range(PLAIN_CALLS))

    async def worker() -> None:
        for i in next_i:
            await one_call(i, c, 1)

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(PLAIN_IN_FLIGHT)])
    c.wall = time.perf_counter() - t0
    c.retried = log.take()
    return c


async def burst(log: RetryLog) -> Calls:
    """BURST calls at once, with the package's default retries."""
    log.take()
    c = Calls(f"burst: {BURST} at once", BURST)
    t0 = time.perf_counter()
    await asyncio.gather(*[one_call(i, c, 5) for i in range(BURST)])
    c.wall = time.perf_counter() - t0
    c.retried = log.take()
    return c


# ---------------------------------------------------------------------------------------------
# The report


def ratio(a: Optional[float], b: Optional[float]) -> str:
    if not a or not b:
        return ""
    return f"{a / b:.2f}×"


def answers(c: Counter[Any]) -> str:
    get = lambda k: c.get(k, 0) + c.get(str(k), 0)  # noqa: E731
    other = sum(v for k, v in c.items() if str(k) not in ("429", "504"))
    return f"{get(429)} / {get(504)} / {other}"


def report(
    args: argparse.Namespace,
    plain: Rollout,
    rewarded: Rollout,
    four: Calls,
    bursted: Calls,
    total: float,
) -> List[str]:
    a, b = plain, rewarded
    out = [
        f"## RL rollout: {args.episodes} episodes, a task pause in the middle\n",
        f"One node (`warren up`), the client on the same machine ({os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}), total {total:.0f} s. An episode: create (image "
        f"`host`), write a file, {EXECS} execs, read the file back, kill; all episodes start at "
        f"once; the task is paused when half of the creates have answered and resumed "
        f"{args.pause_hold:g} s later. With rewards, each episode then scores its program "
        f"through the unmodified `sandbox-fusion` client (verl's policy: at most "
        f"{args.max_concurrent} in flight, a 504 retried, any other failure final). Latencies in "
        f"ms, p50 / p99.\n",
        "| measure | rollout alone | rollout + reward calls | ratio |",
        "|---|---:|---:|---:|",
    ]

    def row(label: str, x: str, y: str, r: str = "") -> None:
        out.append(f"| {label} | {x} | {y} | {r} |")

    def rate(ro: Rollout) -> float:
        return ro.ok / ro.wall if ro.wall else 0.0

    def median(v: List[float]) -> Optional[float]:
        return statistics.median(v) if v else None

    row("episodes correct", f"{a.ok} / {a.episodes}", f"{b.ok} / {b.episodes}")
    row("wall (s)", f"{a.wall:.1f}", f"{b.wall:.1f}", ratio(b.wall, a.wall))
    row("episodes/s", f"{rate(a):.1f}", f"{rate(b):.1f}", ratio(rate(b), rate(a)))
    row(
        "episode",
        p50_p99(a.episode),
        p50_p99(b.episode),
        ratio(median(b.episode), median(a.episode)),
    )
    for label, x, y in (
        ("create", a.create, b.create),
        ("write file", a.write, b.write),
        (f"exec ({EXECS} per episode)", a.exec_, b.exec_),
        ("read file", a.read, b.read),
        ("kill", a.kill, b.kill),
    ):
        row(label, p50_p99(x), p50_p99(y), ratio(median(y), median(x)))

    def paused(ro: Rollout) -> str:
        if ro.pause is None:
            return f"not done ({ro.pause_error})" if ro.pause_error else "not done"
        r = ro.pause_result
        if r is None:
            return ms(ro.pause)
        failed = f", {len(r.failed)} failed" if r.failed else ""
        return f"{ms(ro.pause)} ({r.succeeded} sandboxes{failed})"

    row("task pause", paused(a), paused(b), ratio(b.pause, a.pause))
    row(
        "task resume",
        ms(a.resume) if a.resume is not None else "not done",
        ms(b.resume) if b.resume is not None else "not done",
        ratio(b.resume, a.resume),
    )
    row(
        "Warren API answers 429 / 504 / other ≥ 400 (retried ones included)",
        answers(a.sdk_answers),
        answers(b.sdk_answers),
    )
    row("episodes failed", str(len(a.failures)), str(len(b.failures)))
    span = (b.reward_last or 0) - (b.reward_first or 0)
    row("reward calls correct", "–", f"{b.reward_ok} / {b.episodes}")
    row("reward calls/s", "–", f"{len(b.reward) / span:.1f}" if span > 0 else "–")
    row("reward call", "–", p50_p99(b.reward))
    row("reward answers 429 / 504 / other failures", "–", answers(b.reward_answers))
    row("node after (task stopped)", a.node_after, b.node_after)
    out.append("")
    for ro in (a, b):
        out += ro.failures.lines(ro.name)
    if a.pause_error or b.pause_error:
        out += [f"- {ro.name}: pause: {ro.pause_error}" for ro in (a, b) if ro.pause_error]

    out += [
        "",
        "## Python calls through the unmodified `sandbox-fusion` client\n",
        f"`run_code_async` of `print(i * 2)`, checked. The peer: the node's plain single-call "
        f"rate, {PLAIN_IN_FLIGHT} in flight (one attempt each); the burst: {BURST} at once, with "
        f"the package's default retries (5 attempts, exponential back-off). Latencies in ms.\n",
        "| run | calls | wall (s) | calls/s | p50 | p99 | non-Success "
        "| answers retried 429 / 504 / other |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in (four, bursted):
        out.append(
            f"| {c.name} | {c.calls} | {c.wall:.2f} | {c.ok / c.wall if c.wall else 0:,.0f} | "
            f"{ms(statistics.median(c.lat)) if c.lat else '–'} | "
            f"{ms(pct(c.lat, 0.99) or 0) if c.lat else '–'} | {c.calls - c.ok} | "
            f"{answers(c.retried)} |"
        )
    out.append("")
    for c in (four, bursted):
        out += c.failures.lines(c.name)

    burst_rate = bursted.ok / bursted.wall if bursted.wall else 0.0
    four_rate = four.ok / four.wall if four.wall else 0.0

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    pauses = [ro.pause for ro in (a, b) if ro.pause is not None]
    out += [
        "",
        "## Against the targets\n",
        "| target | figure | |",
        "|---|---|---|",
        f"| every episode correct | {a.ok} / {a.episodes} alone, {b.ok} / {b.episodes} with "
        f"rewards | {met(a.ok == a.episodes and b.ok == b.episodes)} |",
        f"| every reward correct | {b.reward_ok} / {b.episodes} "
        f"| {met(b.reward_ok == b.episodes)} |",
        f"| task pause ≤ 1 s under the rollout | "
        + (" and ".join(f"{p:.2f} s" for p in pauses) if pauses else "not done")
        + f" | {met(len(pauses) == 2 and max(pauses) <= 1.0)} |",
        f"| burst ≥ 400 calls/s | {burst_rate:,.0f} calls/s ({ratio(burst_rate, four_rate)} the "
        f"plain rate at {PLAIN_IN_FLIGHT} in flight, {four_rate:,.0f}/s) "
        f"| {met(burst_rate >= 400)} |",
        f"| the reward path leaves the rollout its pace (the peer) "
        f"| {ratio(rate(b), rate(a)) or '–'} the episodes/s without rewards | |",
    ]
    return out


# ---------------------------------------------------------------------------------------------


def with_key(url: str, key: str) -> str:
    """``http://fncall:KEY@host:port``: HTTP Basic credentials, the only way the package can
    carry a key (docs/fncall.md)."""
    u = urlsplit(url)
    return urlunsplit((u.scheme, f"fncall:{key}@{u.netloc}", u.path, "", ""))


def api_key(given: Optional[str]) -> str:
    """The key, found as the SDK finds it: given, ``WARREN_API_KEY``, or the data dir's
    ``admin.key``. The reward calls need it in their URL."""
    key = given or os.environ.get("WARREN_API_KEY", "").strip()
    if not key:
        path = os.path.join(os.environ.get("WARREN_DATA_DIR") or "/var/lib/warren", "admin.key")
        try:
            with open(path, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as e:
            raise SystemExit(f"rl.py: no API key: give --api-key or WARREN_API_KEY ({e})")
    return key


async def run(args: argparse.Namespace) -> List[str]:
    t_start = time.perf_counter()
    log = RetryLog()
    sf_log = logging.getLogger("sandbox_fusion")
    sf_log.addHandler(log)
    sf_log.setLevel(logging.DEBUG)
    sf_log.propagate = False
    counter = AnswerCounter()
    tasks: List[str] = []
    key = api_key(args.api_key)
    # One client, as a trainer has: the pause goes through the client the rollout floods. The
    # SDK sends task operations over connections of their own (urgent calls), so the pause's
    # figure is the server's answer, not a wait for a connection behind the rollout's requests.
    async with warren.AsyncClient(
        args.url, key, timeout=600, max_connections=args.connections
    ) as client:
        set_endpoint(with_key(client.url, key))
        try:
            plain = await rollout(args, client, counter, "rollout alone", False, tasks)
            rewarded = await rollout(args, client, counter, "rollout + rewards", True, tasks)
            print("rl: calls, 4 in flight and a burst", file=sys.stderr, flush=True)
            four = await plain_rate(log)
            bursted = await burst(log)
        finally:
            for task in tasks:
                try:
                    await client.tasks.stop(task)
                except warren.WarrenError as e:
                    print(f"rl: could not stop task {task}: {e}", file=sys.stderr)
    return report(args, plain, rewarded, four, bursted, time.perf_counter() - t_start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=1000, help="episodes per rollout (1000)")
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=64,
        help="reward calls in flight (verl's reward_model.sandbox_fusion.max_concurrent, 64)",
    )
    p.add_argument("--pause-hold", type=float, default=0.5, help="seconds paused (0.5)")
    p.add_argument("--connections", type=int, default=1000, help="the rollout's connection pool")
    p.add_argument("--url", default=None, help="default WARREN_URL or http://127.0.0.1:7700")
    p.add_argument("--api-key", default=None, help="default WARREN_API_KEY or admin.key")
    args = p.parse_args()
    if args.episodes < 2 or args.max_concurrent < 1:
        p.error("--episodes must be at least 2 and --max-concurrent at least 1")

    # One socket per request in flight (the rollout's, and one per reward call).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, args.connections * 2 + args.max_concurrent + BURST + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    loop = asyncio.new_event_loop()
    main_task = loop.create_task(run(args))
    # SIGTERM as SIGINT: cancel the run, so its `finally` stops the tasks.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main_task.cancel)
    try:
        lines = loop.run_until_complete(main_task)
    except asyncio.CancelledError:
        print("rl: interrupted; its tasks were stopped", file=sys.stderr)
        return 130
    finally:
        loop.close()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

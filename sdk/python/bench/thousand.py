#!/usr/bin/env python3
"""A thousand sandboxes from one asyncio process: create them all at once, run commands in all
of them, then pause, resume and stop their task. Prints a Markdown table.

    python sdk/python/bench/thousand.py          # WARREN_URL / WARREN_API_KEY, or `make up`'s
    python sdk/python/bench/thousand.py -n 200 --execs 5 --url http://127.0.0.1:7700

A benchmark, not a test: it asserts nothing about speed. It counts failures, and stops the task
even when interrupted. "client CPU" is this process's own CPU time in the phase: on a small
machine the client and the platform share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Awaitable, List, Optional, TypeVar

import warren

T = TypeVar("T")


@dataclass
class Phase:
    name: str
    ops: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    latencies: List[float] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)

    def row(self) -> str:
        rate = self.ops / self.wall if self.wall else 0.0
        if self.latencies:
            lat = sorted(self.latencies)
            p50 = f"{statistics.median(lat) * 1000:.1f}"
            p99 = f"{lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000:.1f}"
        else:
            p50 = p99 = "–"
        failed = f"{len(self.failures)}" if self.failures else "0"
        return (
            f"| {self.name} | {self.ops} | {self.wall:.2f} | {rate:,.0f} | {p50} | {p99} "
            f"| {self.cpu:.1f} | {failed} |"
        )


async def timed(phase: Phase, op: Awaitable[T]) -> Optional[T]:
    t0 = time.perf_counter()
    try:
        out = await op
    except warren.WarrenError as e:
        phase.failures.append(f"{type(e).__name__}: {e}")
        return None
    phase.latencies.append(time.perf_counter() - t0)
    return out


async def run(args: argparse.Namespace) -> List[Phase]:
    task = f"bench-thousand-{secrets.token_hex(3)}"
    phases: List[Phase] = []
    async with warren.AsyncClient(
        args.url, args.api_key, max_connections=args.connections, timeout=600
    ) as client:
        try:
            size = f"memory {args.memory}" if args.memory else "default sizes"
            create = Phase(f"create {args.n} ({size})")
            phases.append(create)
            t0, c0 = time.perf_counter(), time.process_time()
            made = await asyncio.gather(
                *[
                    timed(
                        create,
                        client.containers.create(image="host", task=task, memory=args.memory),
                    )
                    for _ in range(args.n)
                ]
            )
            create.wall, create.cpu = time.perf_counter() - t0, time.process_time() - c0
            sbs = [sb for sb in made if sb is not None]
            create.ops = len(sbs)

            execs = Phase(f"exec × {args.execs} each (`echo $i`)")
            phases.append(execs)

            async def episode(sb: warren.AsyncSandbox) -> None:
                for i in range(args.execs):
                    r = await timed(execs, sb.exec(f"echo {i}"))
                    if r is not None and r.stdout != f"{i}\n":
                        execs.failures.append(
                            f"{sb.id}: wrong output {r.stdout!r} (exit {r.exit_code}, "
                            f"signal {r.signal}, stderr {r.stderr[:200]!r})"
                        )

            t0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*[episode(sb) for sb in sbs])
            execs.wall, execs.cpu = time.perf_counter() - t0, time.process_time() - c0
            execs.ops = len(execs.latencies)

            for action in ("pause", "resume", "stop"):
                ph = Phase(f"task {action} ({len(sbs)} sandboxes, one call)")
                phases.append(ph)
                t0, c0 = time.perf_counter(), time.process_time()
                res = await timed(ph, getattr(client.tasks, action)(task))
                ph.wall, ph.cpu = time.perf_counter() - t0, time.process_time() - c0
                ph.latencies = []  # one call: its wall time is the number
                if res is not None:
                    ph.ops = res.succeeded
                    ph.failures += [
                        f"{f.id}: {f.error.code}: {f.error.message}" for f in res.failed
                    ]
        finally:
            await client.tasks.stop(task)
    return phases


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=1000, help="sandboxes (default 1000)")
    p.add_argument("--execs", type=int, default=10, help="commands per sandbox (default 10)")
    p.add_argument(
        "--memory",
        default=None,
        help="memory request per sandbox (default: the node's, 64Mi; the limit stays the default)",
    )
    p.add_argument("--connections", type=int, default=1000, help="connection pool size")
    p.add_argument("--url", default=None, help="default WARREN_URL or http://127.0.0.1:7700")
    p.add_argument("--api-key", default=None, help="default WARREN_API_KEY or the admin.key file")
    args = p.parse_args()

    # One socket per concurrent request: make sure the process may open that many.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, args.connections * 2 + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    t0 = time.perf_counter()
    phases = asyncio.run(run(args))
    total = time.perf_counter() - t0

    print(
        f"Warren Python SDK, one asyncio process (Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs), {args.n} sandboxes, total {total:.1f} s\n"
    )
    print("| phase | ops | wall (s) | ops/s | p50 (ms) | p99 (ms) | client CPU (s) | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for ph in phases:
        print(ph.row())
    failures = [f for ph in phases for f in ph.failures]
    for f in failures[:10]:
        print(f"- {f}")
    if len(failures) > 10:
        print(f"- ... {len(failures) - 10} more")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

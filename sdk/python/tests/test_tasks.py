"""Task-level pause, resume and stop over 200 sandboxes."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List

import warren

from .conftest import Server

N = 200
TASK = "pytest-task-200"


async def test_task_pause_resume_stop(server: Server):
    async with server.aclient() as c:
        sbs = await asyncio.gather(
            *[c.containers.create(image="host", task=TASK, memory="64Mi") for _ in range(N)]
        )
        try:
            (t,) = [t for t in await c.tasks.list() if t.name == TASK]
            assert (t.sandboxes, t.running, t.paused) == (N, N, 0)

            res = await c.tasks.pause(TASK)
            assert (res.task, res.action, res.succeeded, res.failed) == (TASK, "pause", N, [])
            assert res.ok
            paused = await c.sandboxes.list(task=TASK, state="paused")
            assert len(paused) == N
            (t,) = [t for t in await c.tasks.list() if t.name == TASK]
            assert (t.running, t.paused) == (0, N)

            # Any operation resumes a paused sandbox of the task by itself.
            r = await sbs[0].exec("echo thawed")
            assert r.stdout == "thawed\n"
            assert (await sbs[0].info()).state == "running"

            res = await c.tasks.resume(TASK)
            assert res.action == "resume" and res.succeeded == N and res.ok
            assert len(await c.sandboxes.list(task=TASK, state="running")) == N
            rs = await asyncio.gather(*[sb.exec("true") for sb in sbs[:20]])
            assert all(r.ok for r in rs)

            res = await c.tasks.stop(TASK)
            assert res.action == "stop" and res.succeeded == N and res.ok
            assert await c.sandboxes.list(task=TASK) == []
            assert TASK not in [t.name for t in await c.tasks.list()]
        finally:
            await c.tasks.stop(TASK)


def test_task_of_no_sandboxes_is_zero_work(client: warren.Client):
    res = client.tasks.pause("pytest-empty-task")
    assert res.succeeded == 0 and res.failed == []


URGENT_TASK = "pytest-urgent"
#: Commands that hold the client's ordinary connections: each says it started, then runs
#: until long after the test ends (the sandbox's kill ends it).
HOLD = "touch /tmp/started && sleep 600"


async def _started(c: warren.AsyncClient, sbs: List[warren.AsyncSandbox]) -> None:
    for sb in sbs:
        s = await c.sandboxes.get(sb.id)
        while not await s.files.exists("/tmp/started"):
            await asyncio.sleep(0.05)


async def test_urgent_calls_never_wait_behind_the_clients_own_requests(server: Server):
    """A task's pause, resume and stop, and a sandbox's pause, resume and kill, are sent while
    every ordinary connection of the client is busy: they have connections of their own."""
    async with server.aclient(max_connections=2) as c, server.aclient() as watcher:
        sbs = [await c.containers.create(image="host", task=URGENT_TASK) for _ in range(3)]
        held: List[asyncio.Future] = []  # type: ignore[type-arg]
        try:
            held = [asyncio.ensure_future(sb.exec(HOLD)) for sb in sbs[:2]]
            await asyncio.wait_for(_started(watcher, sbs[:2]), 60)
            # Each bounded only so that a client that queues them fails instead of hanging.
            for op in (
                c.tasks.pause(URGENT_TASK),
                c.tasks.resume(URGENT_TASK),
                sbs[2].pause(),
                sbs[2].resume(),
                sbs[2].kill(),
            ):
                await asyncio.wait_for(op, 60)
            assert not any(h.done() for h in held), "the held commands ended first"
            res = await asyncio.wait_for(c.tasks.stop(URGENT_TASK), 60)
            assert res.succeeded == 2 and res.ok, res
        finally:
            await watcher.tasks.stop(URGENT_TASK)
            await asyncio.gather(*held, return_exceptions=True)


def test_urgent_calls_never_wait_behind_the_clients_own_requests_sync(server: Server):
    """The same through the blocking client, its ordinary connections held by threads."""
    task = URGENT_TASK + "-sync"
    with server.client(max_connections=2) as c, server.client() as watcher:
        sbs = [c.containers.create(image="host", task=task) for _ in range(3)]
        pool = ThreadPoolExecutor(4)
        try:
            held = [pool.submit(sb.exec, HOLD) for sb in sbs[:2]]
            for sb in sbs[:2]:
                while not watcher.sandboxes.get(sb.id).files.exists("/tmp/started"):
                    time.sleep(0.05)
            for op in (
                lambda: c.tasks.pause(task),
                lambda: c.tasks.resume(task),
                sbs[2].pause,
                sbs[2].resume,
                sbs[2].kill,
            ):
                pool.submit(op).result(timeout=60)
            assert not any(h.done() for h in held), "the held commands ended first"
            assert pool.submit(c.tasks.stop, task).result(timeout=60).ok
        finally:
            watcher.tasks.stop(task)
            pool.shutdown()

"""Task-level pause, resume and stop over 200 sandboxes."""

from __future__ import annotations

import asyncio

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

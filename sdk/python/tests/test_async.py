"""The asyncio client: the same handle methods, awaited, and many sandboxes under gather."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import warren
from warren import events

from .conftest import Server


async def test_many_sandboxes_under_gather(server: Server):
    async with server.aclient() as c:
        sbs = await asyncio.gather(
            *[
                c.containers.create(image="host", task="pytest-async", memory="64Mi")
                for _ in range(30)
            ]
        )
        assert len({sb.id for sb in sbs}) == 30
        rs = await asyncio.gather(*[sb.exec(f"echo $((20+{i}))") for i, sb in enumerate(sbs)])
        assert [r.stdout for r in rs] == [f"{20 + i}\n" for i in range(30)]
        (task,) = [t for t in await c.tasks.list() if t.name == "pytest-async"]
        assert task.sandboxes == task.running == 30
        res = await c.tasks.stop("pytest-async")
        assert res.succeeded == 30 and res.ok
        assert await c.sandboxes.list(task="pytest-async") == []


async def test_every_handle_method(server: Server, tmp_path: Path):
    async with server.aclient() as c:
        async with await c.containers.create(image="host", memory="64Mi", env={"A": "1"}) as sb:
            assert isinstance(sb, warren.AsyncSandbox)
            r = await sb.exec("echo $A; exit 2", cwd="/tmp")
            assert (r.stdout, r.exit_code) == ("1\n", 2)
            assert (await sb.exec(["cat"], stdin=b"bytes")).stdout == "bytes"

            got = [ev async for ev in sb.exec_stream("echo a; echo b >&2")]
            assert isinstance(got[0], events.Start) and isinstance(got[-1], events.Exit)
            assert [e.data for e in got if isinstance(e, events.Stdout)] == [b"a\n"]
            assert [e.data for e in got if isinstance(e, events.Stderr)] == [b"b\n"]
            async with sb.exec_stream("exit 5") as s:
                async for _ in s:
                    pass
            assert s.exit is not None and s.exit.exit_code == 5
            stream = await sb.exec_stream("echo awaited")
            assert b"awaited\n" in b"".join(
                [e.data async for e in stream if isinstance(e, events.Stdout)]
            )

            p = await sb.processes.start("echo bg; sleep 30")
            assert (await sb.processes.get(p)).running
            assert [q.process_id for q in await sb.processes.list()] == [p.process_id]
            assert (await sb.processes.wait(p, timeout=0.1)).running
            await sb.processes.signal(p, "KILL")
            done = await sb.processes.wait(p)
            assert done.exit is not None and done.exit.signal == 9
            out = [e async for e in sb.processes.output(p)]
            assert out[0] == events.Stdout(b"bg\n") and isinstance(out[-1], events.Exit)
            await sb.processes.forget(p)
            assert await sb.processes.list() == []

            q = await sb.processes.start("tr a-z A-Z", stdin_open=True)
            await sb.processes.send_stdin(q, "async\n")
            await sb.processes.close_stdin(q)
            assert (await sb.processes.wait(q)).exit.exit_code == 0  # type: ignore[union-attr]
            t = await sb.processes.start("read x; stty size", pty=(81, 25))
            await sb.processes.resize(t, 82, 26)
            await sb.processes.send_stdin(t, "\n")
            await sb.processes.wait(t)
            text = b"".join(
                [e.data async for e in sb.processes.output(t) if isinstance(e, events.Stdout)]
            )
            assert b"26 82" in text, text
            assert (await sb.metrics()).memory_limit == 64 << 20

            f = sb.files
            await f.write("a/b.txt", "text", mode=0o600)
            assert await f.read("a/b.txt") == b"text"
            assert await f.read_text("a/b.txt") == "text"
            assert (await f.stat("a/b.txt")).mode & 0o777 == 0o600
            assert [e.name for e in await f.list("a")] == ["b.txt"]
            await f.mkdir("c/d")
            await f.rename("a/b.txt", "c/d/e.txt")
            assert await f.exists("c/d/e.txt") and not await f.exists("a/b.txt")
            w = await f.watch("c")
            await f.write("c/new.txt", "n")
            got = await f.watch_events(w, wait=5)
            assert ("create", "new.txt") in [(e.kind, e.path) for e in got.events], got
            await f.unwatch(w)
            await f.remove("c", recursive=True)
            assert not await f.exists("c")

            (tmp_path / "up").mkdir()
            (tmp_path / "up" / "x.txt").write_text("x")
            await f.upload_dir(tmp_path / "up", "up")
            assert await f.read("up/x.txt") == b"x"
            local = await f.download_dir("up", tmp_path / "down")
            assert (local / "x.txt").read_text() == "x"

            assert (await sb.pause()).state == "paused"
            assert (await sb.info()).state == "paused"
            assert (await sb.resume()).state == "running"
            before = sb.last_info.expires_at
            assert (await sb.set_timeout(120)).expires_at < before
            again = await c.sandboxes.get(sb.id)
            assert (await again.exec("echo same")).stdout == "same\n"
            sid = sb.id
        with pytest.raises(warren.NotFound):
            await c.sandboxes.get(sid)
        assert (await c.health()).status == "ok"
        assert len(await c.nodes()) == 1


async def test_async_errors_are_typed(server: Server):
    async with server.aclient() as c:
        with pytest.raises(warren.NotFound) as e:
            await c.containers.create(image="no-such-image", memory="64Mi")
        assert e.value.code == "image_not_found"
    async with warren.AsyncClient(server.url, "wrong-key") as bad:
        with pytest.raises(warren.Unauthenticated):
            await bad.sandboxes.list()


async def test_more_requests_than_connections_wait_their_turn(server: Server):
    async with server.aclient(max_connections=3) as c:
        sb = await c.containers.create(image="host", memory="64Mi")
        try:
            rs = await asyncio.gather(*[sb.exec(f"sleep 0.2; echo {i}") for i in range(12)])
            assert [r.stdout for r in rs] == [f"{i}\n" for i in range(12)]
        finally:
            await sb.kill()

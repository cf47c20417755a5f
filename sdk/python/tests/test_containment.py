"""Containment through the SDK: incident events (a denied system call, an attack on the guest
agent), the disk quota, and the grader role, sync and async."""

from __future__ import annotations

import asyncio
import time

import pytest

import warren

from .conftest import Server

DENY = "import ctypes; l = ctypes.CDLL(None); [l.syscall(165, 0, 0, 0, 0, 0) for _ in range(50)]; l.kill(1, 9)"


def _wait(fetch, ok, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fetch()
        if ok(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_events_sync(server: Server):
    with server.client() as c:
        with c.containers.create(image="host", task="pytest-events") as sb:
            r = sb.exec(["python3", "-c", DENY])
            assert r.exit_code == 0, r.stderr
            evs = _wait(
                lambda: c.events.list(sandbox=sb.id),
                lambda e: {x.kind for x in e} >= {"seccomp", "management"},
            )
            mount = [e for e in evs if e.kind == "seccomp" and e.detail == "mount"]
            assert mount and mount[0].count == 50, evs
            assert mount[0].comm == "python3" and mount[0].task == "pytest-events"
            assert isinstance(mount[0], warren.IncidentEvent)
            mgmt = c.events.list(sandbox=sb.id, kind="management")
            assert mgmt and all(e.kind == "management" for e in mgmt)
            assert c.events.list(task="pytest-events", since="10m")
            assert c.events.list(task="pytest-events", since="2000-01-01T00:00:00Z")
            sid = sb.id
        # Events outlive the sandbox.
        assert c.events.list(sandbox=sid)
        with pytest.raises(warren.InvalidArgument):
            c.events.list(kind="nonsense")
        with pytest.raises(warren.InvalidArgument):
            c.events.list(since="yesterday-ish")


async def test_events_async(server: Server):
    async with server.aclient() as c:
        sb = await c.containers.create(image="host")
        try:
            await sb.exec(["python3", "-c", DENY])
            deadline = time.monotonic() + 5
            while True:
                evs = await c.events.list(sandbox=sb.id, kind="seccomp")
                if evs or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert any(e.detail == "mount" for e in evs), evs
        finally:
            await sb.kill()


def test_disk_quota(server: Server):
    with server.client() as c:
        with c.containers.create(image="host", disk="32Mi") as sb:
            assert sb.info().resources.disk == 32 << 20
            r = sb.exec("dd if=/dev/zero of=$HOME/f bs=1M count=100 2>&1")
            assert r.exit_code != 0 and "Disk quota exceeded" in r.stdout, r.stdout
            evs = _wait(
                lambda: c.events.list(sandbox=sb.id, kind="disk_quota"), lambda e: bool(e)
            )
            assert evs and evs[0].kind == "disk_quota"


def test_grader_role(server: Server):
    with server.client() as c:
        with c.containers.create(image="host") as sb:
            sb.exec("echo 42 > /home/user/answer")
            r = sb.exec("id -u; cat /home/user/answer", role="grader")
            assert (r.exit_code, r.stdout) == (0, "61000\n42\n"), r.stderr
            with pytest.raises(warren.InvalidArgument):
                sb.exec("true", role="grader", user="root")
            with pytest.raises(warren.InvalidArgument):
                sb.exec("true", role="judge")


async def test_grader_role_async(server: Server):
    async with server.aclient() as c:
        sb = await c.containers.create(image="host")
        try:
            r = await sb.exec(["id", "-u"], role="grader")
            assert r.stdout == "61000\n"
        finally:
            await sb.kill()

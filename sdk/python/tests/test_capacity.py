"""Retries on a full node, against a second `warren up` that admits two sandboxes."""

from __future__ import annotations

import threading
import time
from typing import Iterator, List

import pytest

import warren

from .conftest import Server, start_server, why_no_server

SMALL = '[node]\nmax_sandboxes = 2\nmax_upload = "1Mi"\n'


@pytest.fixture(scope="module")
def small() -> Iterator[Server]:
    why = why_no_server()
    if why:
        pytest.skip(why)
    s = start_server(SMALL)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def full(small: Server) -> Iterator[List[warren.Sandbox]]:
    """The small node filled: its two sandboxes."""
    with small.client() as c:
        for info in c.sandboxes.list():
            c.sandboxes.get(info.id).kill()
        sbs = [c.containers.create(image="host", memory="64Mi") for _ in range(2)]
        try:
            yield sbs
        finally:
            for info in c.sandboxes.list():
                c.sandboxes.get(info.id).kill()


def test_full_node_refuses_with_retry_after(small: Server, full):
    with small.client(max_retries=0) as c:
        with pytest.raises(warren.CapacityError) as e:
            c.containers.create(image="host", memory="64Mi")
    err = e.value
    assert err.code == "capacity" and err.status == 429
    assert err.retry_after is not None and err.retry_after > 0
    assert "max_sandboxes" in err.message
    # The platform's fault: retry, and mask the episode rather than score it.
    assert err.fault == "infrastructure" and err.retryable


def test_create_retries_until_room_is_made(small: Server, full):
    # Another sandbox is killed while the create is being retried with backoff.
    killer = threading.Timer(1.5, full[0].kill)
    killer.start()
    with small.client(max_retries=8) as c:
        t0 = time.monotonic()
        sb = c.containers.create(image="host", memory="64Mi")
        killer.join()
        waited = time.monotonic() - t0
        assert waited >= 1.4, "the create should have waited for room"
        assert sb.id not in (full[0].id, full[1].id)
        assert sb.exec("echo in").stdout == "in\n"
        assert len(c.sandboxes.list()) == 2, "one create, one sandbox, despite the retries"


def test_create_gives_up_when_it_stays_full(small: Server, full):
    with small.client(max_retries=2) as c:
        t0 = time.monotonic()
        with pytest.raises(warren.CapacityError) as e:
            c.containers.create(image="host", memory="64Mi")
        waited = time.monotonic() - t0
    # Two retries, each after the server's Retry-After (1 s).
    assert e.value.retry_after is not None
    assert 2 * e.value.retry_after <= waited < 10


async def test_async_create_retries_too(small: Server, full):
    killer = threading.Timer(1.0, full[1].kill)
    killer.start()
    try:
        async with small.aclient(max_retries=8) as c:
            sb = await c.containers.create(image="host", memory="64Mi")
            assert (await sb.exec("echo ok")).stdout == "ok\n"
    finally:
        # The kill must not outlive the fixture's client (it would fail on a closed client).
        killer.join()


def test_payload_too_large(small: Server, full):
    with pytest.raises(warren.PayloadTooLarge) as e:
        full[0].files.write("big", b"\0" * (2 << 20))
    assert e.value.status == 413 and isinstance(e.value, warren.InvalidArgument)
    assert "max_upload" in e.value.message

"""Idle timeouts (pause, then transparent resume; stop) and set_timeout."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

import warren


def _at(rfc3339: str) -> float:
    return datetime.strptime(rfc3339[:19], "%Y-%m-%dT%H:%M:%S").timestamp()


def _wait_for(pred, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def test_idle_pause_then_transparent_resume(client: warren.Client):
    with client.containers.create(
        image="host", memory="64Mi", idle_timeout=1, on_idle="pause"
    ) as sb:
        assert sb.last_info.idle_timeout == 1 and sb.last_info.on_idle == "pause"
        sb.files.write("state.txt", "kept")
        time.sleep(2)
        assert _wait_for(lambda: sb.info().state == "paused", 3)
        # The next operation resumes it by itself; memory and files were kept.
        r = sb.exec("cat state.txt")
        assert r.stdout == "kept" and r.ok
        assert sb.info().state == "running"


def test_idle_stop(client: warren.Client):
    sb = client.containers.create(image="host", memory="64Mi", idle_timeout=1, on_idle="stop")
    time.sleep(2)

    def gone() -> bool:
        try:
            sb.info()
            return False
        except warren.NotFound:
            return True

    assert _wait_for(gone, 3)


def test_set_timeout_extends_and_shortens(client: warren.Client):
    sb = client.containers.create(image="host", memory="64Mi", timeout=60)
    first = _at(sb.last_info.expires_at)
    longer = sb.set_timeout(7200)
    assert _at(longer.expires_at) - first > 7000
    sb.pause()
    shorter = sb.set_timeout(1)
    assert shorter.state == "paused", "set_timeout leaves a paused sandbox paused"
    assert _at(shorter.expires_at) < first
    time.sleep(1.5)
    with pytest.raises(warren.NotFound):
        _wait_for(lambda: sb.info() is None, 3)

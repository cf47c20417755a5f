"""Sandbox lifecycle through the gateway with the unmodified `e2b` SDK, sync and async:
create, info, is_running, timeouts, list (metadata and state filters, pagination, order),
pause and connect (resume), kill, and the errors the SDK maps (unknown sandbox, bad key)."""

from __future__ import annotations

import os
import secrets
import stat
import time
from datetime import datetime, timezone

import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)


def run_id() -> str:
    return secrets.token_hex(4)


def test_the_key_file_is_private_and_of_e2b_form(gateway):
    path = gateway.data_dir / "e2b.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_text().strip()
    assert key.startswith("e2b_") and len(key) == 44
    int(key[4:], 16)


def test_create_info_timeout_and_kill(gateway):
    run = run_id()
    sb = Sandbox.create("base", timeout=120, metadata={"run": run})
    try:
        assert sb.sandbox_id.isalnum() and sb.sandbox_id == sb.sandbox_id.lower()
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id
        assert info.template_id == "base"
        assert info.metadata == {"run": run}
        assert info.state == SandboxState.RUNNING
        lifetime = (info.end_at - info.started_at).total_seconds()
        assert 119 <= lifetime <= 121, lifetime
        assert info.started_at <= datetime.now(timezone.utc)
        assert sb.is_running()
        # The gateway made a Warren sandbox of the base template's image, with the metadata as
        # labels and the internet allowed (E2B's default).
        w = gateway.warren("GET", f"/v1/sandboxes/{sb.sandbox_id}").json()
        assert w["image"] == "host" and w["labels"] == {"run": run}
        assert w["network"]["mode"] == "filtered"
        cidrs = sorted(r.get("cidr") for r in w["network"]["allow"])
        assert cidrs == ["0.0.0.0/0", "::/0"], w["network"]

        sb.set_timeout(600)
        lifetime = (sb.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
        assert 590 <= lifetime <= 601, lifetime
    finally:
        assert sb.kill() is True
    assert sb.kill() is False, "a second kill finds nothing"
    assert Sandbox.kill(sb.sandbox_id) is False
    assert not sb.is_running()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sb.sandbox_id)


def test_no_internet_when_asked(gateway):
    sb = Sandbox.create("base", timeout=60, allow_internet_access=False)
    try:
        w = gateway.warren("GET", f"/v1/sandboxes/{sb.sandbox_id}").json()
        assert w["network"]["mode"] == "filtered" and w["network"]["allow"] == [], w["network"]
    finally:
        sb.kill()


def test_list_filters_pages_and_orders(gateway):
    run = run_id()
    made = [Sandbox.create("base", timeout=120, metadata={"run": run, "i": str(i)}) for i in range(3)]
    try:
        mine = SandboxQuery(metadata={"run": run})
        ids = [s.sandbox_id for s in Sandbox.list(query=mine).next_items()]
        assert sorted(ids) == sorted(s.sandbox_id for s in made)
        one = SandboxQuery(metadata={"run": run, "i": "1"})
        assert [s.sandbox_id for s in Sandbox.list(query=one).next_items()] == [made[1].sandbox_id]
        assert Sandbox.list(query=SandboxQuery(metadata={"run": "x" + run})).next_items() == []
        # Pages of one, oldest first, then newest first.
        pages = Sandbox.list(query=mine, limit=1, order="asc")
        seen = []
        while pages.has_next:
            items = pages.next_items()
            assert len(items) <= 1
            seen += [s.sandbox_id for s in items]
        assert seen == [s.sandbox_id for s in made]
        newest = Sandbox.list(query=mine, limit=2, order="desc").next_items()
        assert [s.sandbox_id for s in newest] == [made[2].sandbox_id, made[1].sandbox_id]
        listed = newest[0]
        assert listed.template_id == "base" and listed.metadata["run"] == run
        assert listed.state == SandboxState.RUNNING

        # Pause one: the state filter sees it, is_running does not; connect resumes it.
        made[0].pause()
        paused = SandboxQuery(metadata={"run": run}, state=[SandboxState.PAUSED])
        assert [s.sandbox_id for s in Sandbox.list(query=paused).next_items()] == [made[0].sandbox_id]
        assert not made[0].is_running()
        assert Sandbox.get_info(made[0].sandbox_id).state == SandboxState.PAUSED
        again = Sandbox.connect(made[0].sandbox_id)
        assert again.is_running()
        assert Sandbox.get_info(made[0].sandbox_id).state == SandboxState.RUNNING
        running = SandboxQuery(metadata={"run": run}, state=[SandboxState.RUNNING])
        assert len(Sandbox.list(query=running).next_items()) == 3
    finally:
        for s in made:
            s.kill()


def test_unknown_sandboxes_and_bad_keys(gateway):
    with pytest.raises(NotFoundException):
        Sandbox.connect("abcdefghij0123456789")
    with pytest.raises(NotFoundException):
        Sandbox.get_info("abcdefghij0123456789")
    with pytest.raises(AuthenticationException):
        Sandbox.create("base", api_key="e2b_" + "0" * 40)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "1" * 40).next_items()


async def test_async_lifecycle(gateway):
    run = run_id()
    sb = await AsyncSandbox.create("base", timeout=60, metadata={"run": run})
    try:
        assert await sb.is_running()
        info = await sb.get_info()
        assert info.metadata == {"run": run}
        listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"run": run})).next_items()
        assert [s.sandbox_id for s in listed] == [sb.sandbox_id]
        await sb.set_timeout(120)
        await sb.pause()
        assert not await sb.is_running()
        back = await AsyncSandbox.connect(sb.sandbox_id)
        assert await back.is_running()
        [m] = await back.get_metrics()
        assert m.mem_total > 0 and m.cpu_count >= 1
    finally:
        assert await sb.kill() is True
    assert not await sb.is_running()


def test_metrics_are_measured_now(gateway):
    import datetime

    from e2b import Sandbox

    s = Sandbox.create("base", timeout=60)
    try:
        s.commands.run(
            "end=$(($(date +%s%N) + 400000000)); while [ $(date +%s%N) -lt $end ]; do :; done"
        )
        [m] = s.get_metrics()
        assert m.cpu_count >= 1 and m.cpu_used_pct > 0, m
        assert 0 < m.mem_used <= m.mem_total, m
        assert m.mem_cache <= m.mem_used if hasattr(m, "mem_cache") else True
        assert m.disk_used <= m.disk_total or m.disk_total == 0, m
        now = datetime.datetime.now(datetime.timezone.utc)
        assert abs((m.timestamp - now).total_seconds()) < 60
        # A window that ended before now holds no sample (Warren keeps no history).
        past = now - datetime.timedelta(hours=1)
        assert s.get_metrics(start=past - datetime.timedelta(hours=1), end=past) == []
    finally:
        s.kill()
    with pytest.raises(Exception):
        Sandbox.get_metrics(s.sandbox_id)


def _rules(gateway, sandbox_id):
    net = gateway.warren("GET", f"/v1/sandboxes/{sandbox_id}").json()["network"]
    name = lambda r: (r.get("cidr") or r.get("domain") or "").removesuffix("/32")  # noqa: E731
    return sorted(map(name, net["allow"])), sorted(map(name, net["deny"]))


def test_network_lists_and_updates(gateway):
    from e2b import ALL_TRAFFIC

    sb = Sandbox.create(
        "base",
        timeout=60,
        network={"deny_out": [ALL_TRAFFIC], "allow_out": ["198.51.100.7", "pypi.org"]},
    )
    try:
        assert _rules(gateway, sb.sandbox_id) == (["198.51.100.7", "pypi.org"], [])
        sb.update_network({"deny_out": ["203.0.113.0/24"]})
        assert _rules(gateway, sb.sandbox_id) == (["0.0.0.0/0", "::/0"], ["203.0.113.0/24"])
        sb.update_network({"deny_out": [ALL_TRAFFIC]})
        assert _rules(gateway, sb.sandbox_id) == ([], [])
        with pytest.raises(Exception) as e:
            sb.update_network({"deny_out": ["example.com"]})
        assert "not an IP address" in str(e.value)
        assert _rules(gateway, sb.sandbox_id) == ([], []), "a refused update changes nothing"
    finally:
        sb.kill()


def test_templates_are_warren_images(gateway):
    from e2b import Template

    assert Template.exists("base")
    assert Template.exists("host")
    assert not Template.exists("no/such-image:v1")
    # An image imported into Warren is a template of that name.
    _import_image(gateway, "e2b/t:v1")
    assert Template.exists("e2b/t:v1")


def test_a_retried_create_with_one_idempotency_key_makes_one_sandbox(gateway):
    import httpx

    body = {"templateID": "base", "timeout": 60, "metadata": {"idem": run_id()}}
    headers = {"X-API-KEY": gateway.key, "Idempotency-Key": "retry-" + run_id()}
    a = httpx.post(gateway.url + "/v2/sandboxes", json=body, headers=headers, timeout=60)
    b = httpx.post(gateway.url + "/v2/sandboxes", json=body, headers=headers, timeout=60)
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    assert a.json()["sandboxID"] == b.json()["sandboxID"]
    Sandbox.kill(a.json()["sandboxID"])


def _import_image(gateway, name: str) -> None:
    """Imports a tiny root file system into Warren as `name`."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = b"from warren\n"
        info = tarfile.TarInfo("etc/marker")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    r = gateway.warren("POST", "/v1/images", params={"name": name}, content=buf.getvalue())
    assert r.status_code in (200, 201), r.text


def test_snapshots_keep_the_file_system(gateway):
    base = f"e2b/snapbase-{run_id()}:v1"
    _import_image(gateway, base)
    sb = Sandbox.create(base, timeout=60)
    try:
        sb.files.write("/data/state.txt", "kept", user="root")
        snap = sb.create_snapshot()
        assert snap.snapshot_id.startswith("e2b-snapshots/" + sb.sandbox_id)
        ids = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items()]
        assert ids == [snap.snapshot_id]
        named = sb.create_snapshot(name=f"mine-{run_id()}")
        assert named.snapshot_id.startswith("e2b-snapshots/mine-")
    finally:
        sb.kill()
    again = Sandbox.create(snap.snapshot_id, timeout=60)
    try:
        assert again.files.read("/data/state.txt", user="root") == "kept"
        assert again.files.read("/etc/marker", user="root") == "from warren\n"
    finally:
        again.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(named.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert Sandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items() == []


def test_get_host_names_warrens_route_to_an_exposed_port(gateway):
    import httpx
    from e2b import Sandbox

    from conftest import SANDBOX_DOMAIN

    s = Sandbox.create("base", timeout=60)
    try:
        host = s.get_host(8000)
        assert host == f"8000-{s.sandbox_id}.{SANDBOX_DOMAIN}"
        # Ports are exposed through Warren's own API (E2B's create cannot name them); an E2B
        # network update keeps them.
        path = f"/v1/sandboxes/{s.sandbox_id}/network"
        net = gateway.warren("GET", path).json()
        r = gateway.warren(
            "PUT", path, json={"mode": net["mode"], "allow": net["allow"], "deny": net["deny"], "expose": [8000]}
        )
        assert r.status_code == 200, r.text
        s.update_network({"deny_out": ["203.0.113.0/24"]})
        assert [p["port"] for p in gateway.warren("GET", path).json()["exposed"]] == [8000]
        s.files.write("/home/user/www/index.html", "served from the sandbox")
        s.commands.run("cd /home/user/www && python3 -m http.server 8000 --bind 0.0.0.0", background=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                r = httpx.get(gateway.warren_url + "/index.html", headers={"Host": host}, timeout=5)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, r.text
            time.sleep(0.2)
        assert r.text == "served from the sandbox"
    finally:
        s.kill()

"""E2B keys that are Warren identities: a key made with `form: e2b` for a project, used by the
real `e2b` SDK through the gateway, acts with that key's project and role."""

from __future__ import annotations

import httpx
import pytest


def _warren(gateway, method: str, path: str, **kw):
    r = httpx.request(
        method,
        gateway.warren_url + path,
        headers={"Authorization": f"Bearer {gateway.admin_key}"},
        timeout=30,
        **kw,
    )
    r.raise_for_status()
    return r.json() if r.content else None


def test_an_e2b_key_acts_as_its_warren_identity(gateway):
    from e2b import Sandbox
    from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException

    _warren(gateway, "POST", "/v1/projects", json={"path": "root/e2b-job"})
    key = _warren(
        gateway,
        "POST",
        "/v1/keys",
        json={"name": "e2b-job", "project": "root/e2b-job", "role": "runner", "form": "e2b"},
    )
    secret = key["secret"]
    assert secret.startswith("e2b_") and len(secret) == 44
    sb = Sandbox.create("base", timeout=120, api_key=secret)
    try:
        assert sb.commands.run("echo hi").stdout == "hi\n"
        # Warren records it in the key's project.
        info = _warren(gateway, "GET", f"/v1/sandboxes/{sb.sandbox_id}")
        assert info["project"] == "root/e2b-job"
        # The gateway's own key's sandboxes (project root) are not the job key's to see.
        other = Sandbox.create("base", timeout=120)
        try:
            page = Sandbox.list(api_key=secret)
            items = page.next_items() if hasattr(page, "next_items") else page
            ids = [s.sandbox_id for s in items]
            assert other.sandbox_id not in ids
            assert sb.sandbox_id in ids
            with pytest.raises((NotFoundException, SandboxException)):
                Sandbox.connect(other.sandbox_id, api_key=secret)
        finally:
            other.kill()
    finally:
        sb.kill()
    # A viewer's E2B key sees sandboxes but gets no envd access token: no commands or files.
    viewer = _warren(
        gateway,
        "POST",
        "/v1/keys",
        json={"name": "e2b-viewer", "project": "root/e2b-job", "role": "viewer", "form": "e2b"},
    )
    sb2 = Sandbox.create("base", timeout=120, api_key=secret)
    try:
        r = httpx.get(
            f"{gateway.url}/sandboxes/{sb2.sandbox_id}",
            headers={"X-API-KEY": viewer["secret"]},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert not r.json().get("envdAccessToken"), r.json()
        r = httpx.get(
            f"{gateway.url}/sandboxes/{sb2.sandbox_id}",
            headers={"X-API-KEY": secret},
            timeout=30,
        )
        assert r.json().get("envdAccessToken"), r.json()
    finally:
        sb2.kill()
    # Revoked: the gateway refuses it.
    _warren(gateway, "DELETE", f"/v1/keys/{key['id']}")
    with pytest.raises((AuthenticationException, SandboxException)):
        Sandbox.create("base", timeout=60, api_key=secret)
    # Revoked, and never made: both are the caller's mistake, a 401 that says which keys work.
    for bad in (secret, "e2b_" + "0" * 40):
        r = httpx.get(f"{gateway.url}/v2/sandboxes", headers={"X-API-KEY": bad}, timeout=30)
        assert r.status_code == 401, r.text
        assert "invalid API key" in r.json()["message"], r.text


def _envd(gateway, sandbox_id: str, token: str, method: str, body: dict) -> httpx.Response:
    """A unary envd call made by hand, as the SDK makes it (its routing headers, the token)."""
    return httpx.post(
        f"{gateway.url}/{method}",
        headers={
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": token,
            "Content-Type": "application/json",
            "Connect-Protocol-Version": "1",
        },
        json=body,
        timeout=30,
    )


def _ran(gateway, sandbox_id: str, path: str) -> bool:
    """Whether `path` exists in the sandbox, asked of Warren with the admin key."""
    r = _warren(
        gateway,
        "POST",
        f"/v1/sandboxes/{sandbox_id}/exec",
        json={"cmd": f"test -e {path} && echo yes || echo no", "user": "root"},
    )
    return r["stdout"].strip() == "yes"


def test_envd_tokens_die_with_their_key_and_name_it_in_the_audit_log(gateway):
    """An envd access token is bound to the key it was answered to: its commands are audited
    as that key, it opens no other sandbox, and once the key is revoked it runs nothing."""
    from e2b import Sandbox

    _warren(gateway, "POST", "/v1/projects", json={"path": "root/e2b-revoke"})
    key = _warren(
        gateway,
        "POST",
        "/v1/keys",
        json={"name": "e2b-revoke", "project": "root/e2b-revoke", "role": "runner", "form": "e2b"},
    )
    secret = key["secret"]
    a = Sandbox.create("base", timeout=120, api_key=secret)
    b = Sandbox.create("base", timeout=120, api_key=secret)
    try:
        token = a._envd_access_token
        assert token, "a runner key gets an envd access token"
        assert a.commands.run("echo hi").stdout == "hi\n"
        # The exec is in the audit log under the caller's key, not the gateway's.
        entries = _warren(gateway, "GET", "/v1/audit?limit=1000")["entries"]
        mine = [e for e in entries if e.get("key_id") == key["id"] and a.sandbox_id in e["target"]]
        assert any(e["action"] == "sandbox.exec" for e in mine), entries[:10]
        # A's token does not open B.
        r = _envd(gateway, b.sandbox_id, token, "process.Process/List", {})
        assert r.status_code == 401, r.text
        assert _envd(gateway, a.sandbox_id, token, "process.Process/List", {}).status_code == 200
        # Revoked: the old token is refused and runs nothing.
        _warren(gateway, "DELETE", f"/v1/keys/{key['id']}")
        r = _envd(gateway, a.sandbox_id, token, "process.Process/List", {})
        assert r.status_code == 401, r.text
        assert "revoked" in r.json()["message"], r.text
        with pytest.raises(Exception):
            a.commands.run("touch /tmp/ran-after-revoke", user="root")
        assert not _ran(gateway, a.sandbox_id, "/tmp/ran-after-revoke")
        with pytest.raises(Exception):
            a.files.write("/tmp/written-after-revoke", "x")
        assert not _ran(gateway, a.sandbox_id, "/tmp/written-after-revoke")
    finally:
        for s in (a, b):
            _warren(gateway, "DELETE", f"/v1/sandboxes/{s.sandbox_id}")

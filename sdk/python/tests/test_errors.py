"""Each exception type, from a real server's answer (or a real client-side failure)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import warren
from warren._http import Call

from .conftest import Server


def test_not_found_kinds(client: warren.Client, sandbox: warren.Sandbox):
    cases = [
        (lambda: client.containers.create(image="no-such-image", memory="64Mi"), "image_not_found"),
        (lambda: client.sandboxes.get("abcdefghij0123456789"), "sandbox_not_found"),
        (lambda: sandbox.processes.wait(99999), "process_not_found"),
        (lambda: sandbox.files.stat("/no/such/file"), "file_not_found"),
        (lambda: client._t.call(Call("GET", "/v1/no-such-route")), "not_found"),
    ]
    for op, code in cases:
        with pytest.raises(warren.NotFound) as e:
            op()
        assert e.value.code == code and e.value.status == 404, e.value
        assert e.value.message  # the server's words, for people


def test_invalid_argument_from_the_server(client: warren.Client, sandbox: warren.Sandbox):
    # In range for the SDK, out of range for the node: the server's message names the range.
    with pytest.raises(warren.InvalidArgument) as e:
        client.containers.create(image="host", cpu=5, qos="ls")
    assert e.value.code == "invalid_argument" and e.value.status == 400
    assert "out of range" in e.value.message
    assert isinstance(e.value, ValueError)
    # The caller's fault: retrying the same call gives the same answer.
    assert e.value.fault == "request" and not e.value.retryable
    with pytest.raises(warren.InvalidArgument, match="does not record its trajectory"):
        sandbox.trajectory()
    with pytest.raises(warren.InvalidArgument, match="not a signal"):
        sandbox.processes.signal(sandbox.processes.start("sleep 5"), "BOGUS")


def test_auth_errors(server: Server, sandbox: warren.Sandbox):
    with warren.Client(server.url, "wk_wrong", max_retries=0) as bad:
        with pytest.raises(warren.Unauthenticated) as e:
            bad.sandboxes.list()
    assert e.value.status == 401 and isinstance(e.value, warren.AuthError)
    with warren.Client(server.url, "", max_retries=0) as none:
        with pytest.raises(warren.Unauthenticated, match="sent no API key"):
            none.sandboxes.list()
        assert none.health().status == "ok"  # health needs no key
    sandbox.exec("echo secret > /tmp/private; chmod 600 /tmp/private", user="root")
    with pytest.raises(warren.PermissionDenied) as pd:
        sandbox.files.read("/tmp/private")
    assert pd.value.code == "permission_denied" and pd.value.status == 403


def test_conflict(sandbox: warren.Sandbox):
    sandbox.files.write("full/f", "x")
    with pytest.raises(warren.Conflict) as e:
        sandbox.files.remove("full")
    assert e.value.status == 409 and "recursive" in e.value.message
    with pytest.raises(warren.Conflict):
        sandbox.files.mkdir("full/f")


def test_sandbox_killed_during_exec_is_sandbox_gone(client: warren.Client):
    sb = client.containers.create(image="host", memory="64Mi")
    killer = threading.Timer(1.0, sb.kill)
    killer.start()
    with pytest.raises(warren.SandboxGone) as e:
        sb.exec("sleep 10")
    killer.join()
    assert e.value.status == 410


def test_client_timeout(server: Server, sandbox: warren.Sandbox):
    # A FIFO is refused at once (the guest never waits on one), a clear 400.
    sandbox.exec("mkfifo /tmp/fifo")
    with pytest.raises(warren.InvalidArgument, match="FIFO"):
        sandbox.files.read("/tmp/fifo")
    # A server that takes the request and never answers: the client gives up.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        url = "http://127.0.0.1:%d" % silent.getsockname()[1]
        with warren.Client(url, server.key, timeout=1, max_retries=0) as c:
            t0 = time.monotonic()
            with pytest.raises(warren.Timeout, match="timeout") as e:
                c.sandboxes.get(sandbox.id).files.read("/etc/hostname")
            assert 0.9 < time.monotonic() - t0 < 10
    finally:
        silent.close()
    assert isinstance(e.value, TimeoutError) and e.value.status is None


def test_an_answer_that_is_not_what_was_asked_is_a_protocol_error(client: warren.Client):
    # The OpenAPI document is JSON, but not a sandbox.
    from warren._ops import _info

    with pytest.raises(warren.ProtocolError, match="could not understand"):
        client._t.call(Call("GET", "/v1/openapi.json", parse=_info))

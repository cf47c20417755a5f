"""What the SDK decides without a server: bad input refused before any request, configuration,
how answers become exceptions, trajectory files. (The "no server" test talks to a real closed
port.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

import warren
from warren import _validate, errors, trajectory

# A client whose every request would fail: nothing listens on port 1. Bad input must be
# refused before that matters.
NOWHERE = "http://127.0.0.1:1"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def offline() -> warren.Client:
    with warren.Client(NOWHERE, "k", max_retries=0) as c:
        yield c


def fake_sandbox(c: warren.Client) -> warren.Sandbox:
    info = warren.SandboxInfo(
        id="abcdef0123456789wxyz",
        node="abcdef",
        backend="container",
        image="host",
        state="running",
        resources=warren.Resources(1000, 1 << 29, 1024),
        created_at="",
        expires_at="",
    )
    return warren.Sandbox(c._t, info)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(image=""), warren.InvalidArgument, "image is empty"),
        (dict(image=3), warren.ArgumentTypeError, "image must be a str"),
        (dict(image="host", cpu=-1), warren.InvalidArgument, "cpu must be at least 0"),
        (dict(image="host", qos="gold"), warren.InvalidArgument, "qos 'gold' is not one of"),
        (dict(image="host", cpu_limit=0), warren.InvalidArgument, "cpu_limit must be at least 1"),
        (dict(image="host", cpu="1000"), warren.ArgumentTypeError, "cpu must be an int"),
        (dict(image="host", cpu=True), warren.ArgumentTypeError, "cpu must be an int"),
        (dict(image="host", memory=-5), warren.InvalidArgument, "negative"),
        (dict(image="host", memory="lots"), warren.InvalidArgument, "not a size"),
        (dict(image="host", memory="1.5G"), warren.InvalidArgument, "not a size"),
        (dict(image="host", memory=1.5), warren.ArgumentTypeError, "memory must be an int"),
        (dict(image="host", timeout=0), warren.InvalidArgument, "timeout must be at least 1"),
        (dict(image="host", timeout=1.5), warren.ArgumentTypeError, "timeout must be an int"),
        (dict(image="host", idle_timeout=-3), warren.InvalidArgument, "idle_timeout"),
        (dict(image="host", idle_timeout=5, on_idle="sleep"), warren.InvalidArgument, "on_idle"),
        (dict(image="host", on_idle="stop"), warren.InvalidArgument, "needs an idle_timeout"),
        (dict(image="host", labels={"a": 1}), warren.ArgumentTypeError, "labels['a']"),
        (dict(image="host", labels=["a"]), warren.ArgumentTypeError, "labels must be a dict"),
        (dict(image="host", env={"": "x"}), warren.InvalidArgument, "non-empty str"),
        (dict(image="host", trajectory="yes"), warren.ArgumentTypeError, "True or False"),
        (dict(image="host", idempotency_key="é"), warren.InvalidArgument, "printable ASCII"),
        (dict(image="host", expose=[0]), warren.InvalidArgument, "expose: port 0 is not a port"),
        (dict(image="host", expose="8000"), warren.ArgumentTypeError, "expose must be a list"),
        (dict(image="host", expose=range(1, 34)), warren.InvalidArgument, "more than 32"),
        (
            dict(image="host", network="none", expose=[8000]),
            warren.InvalidArgument,
            "with network 'none'",
        ),
    ],
)
def test_create_refuses_bad_input_before_any_request(offline, kwargs, exc, words):
    with pytest.raises(exc, match=words.replace("[", r"\[").replace("]", r"\]")):
        offline.containers.create(**kwargs)


def test_sdk_errors_are_also_builtin_errors():
    assert issubclass(warren.InvalidArgument, ValueError)
    assert issubclass(warren.ArgumentTypeError, TypeError)
    assert issubclass(warren.ArgumentTypeError, warren.InvalidArgument)
    assert issubclass(warren.Timeout, TimeoutError)
    assert issubclass(warren.Unavailable, ConnectionError)
    for cls in (
        warren.NotFound,
        warren.CapacityError,
        warren.AuthError,
        warren.Conflict,
        warren.SandboxGone,
        warren.ProtocolError,
        warren.InternalError,
    ):
        assert issubclass(cls, warren.WarrenError)


@pytest.mark.parametrize(
    "cmd, exc, words",
    [
        ("", warren.InvalidArgument, "command is empty"),
        ("   ", warren.InvalidArgument, "command is empty"),
        ([], warren.InvalidArgument, "argv is empty"),
        ([""], warren.InvalidArgument, "argv is empty"),
        (["echo", 3], warren.ArgumentTypeError, "argv item must be a str"),
        (b"echo", warren.ArgumentTypeError, "not bytes"),
        (42, warren.ArgumentTypeError, "command must be a str"),
        ("a\0b", warren.InvalidArgument, "NUL"),
    ],
)
def test_exec_refuses_bad_commands(offline, cmd, exc, words):
    sb = fake_sandbox(offline)
    with pytest.raises(exc, match=words):
        sb.exec(cmd)
    with pytest.raises(exc, match=words):
        sb.exec_stream(cmd)
    with pytest.raises(exc, match=words):
        sb.processes.start(cmd)


def test_exec_and_process_arguments_are_checked(offline):
    sb = fake_sandbox(offline)
    with pytest.raises(warren.InvalidArgument, match="timeout"):
        sb.exec("true", timeout=-1)
    with pytest.raises(warren.ArgumentTypeError, match="stdin"):
        sb.exec("cat", stdin=123)
    with pytest.raises(warren.InvalidArgument, match="max_output"):
        sb.exec("true", max_output="a lot")
    with pytest.raises(warren.ArgumentTypeError, match="env"):
        sb.exec("true", env={"A": 1})
    with pytest.raises(warren.ArgumentTypeError, match="signal"):
        sb.processes.signal(1, 1.5)
    with pytest.raises(warren.InvalidArgument, match="no signal"):
        sb.processes.signal(1, " ")
    with pytest.raises(warren.InvalidArgument, match="not a signal number"):
        sb.processes.signal(1, 0)
    with pytest.raises(warren.ArgumentTypeError, match="process id"):
        sb.processes.wait("1")
    with pytest.raises(warren.InvalidArgument, match="timeout"):
        sb.processes.wait(1, timeout=-2)
    with pytest.raises(warren.ArgumentTypeError, match="mode"):
        sb.files.write("f", "x", mode="755")
    with pytest.raises(warren.InvalidArgument, match="permission bits"):
        sb.files.write("f", "x", mode=0o17777)
    with pytest.raises(warren.ArgumentTypeError, match="data"):
        sb.files.write("f", 12)
    with pytest.raises(warren.InvalidArgument, match="path is empty"):
        sb.files.read("")
    with pytest.raises(warren.InvalidArgument, match="not a local directory"):
        sb.files.upload_dir("/nonexistent/dir", "x")
    with pytest.raises(warren.InvalidArgument, match="timeout"):
        sb.set_timeout(0)


def test_signal_names_numbers_and_enums():
    assert _validate.signal_name("TERM") == "TERM"
    assert _validate.signal_name(9) == "9"
    assert _validate.signal_name(signal.SIGKILL) == "SIGKILL"
    with pytest.raises(warren.ArgumentTypeError):
        _validate.signal_name(True)


def test_sizes_parse_like_the_server():
    assert _validate.size("512Mi", "m") == 512 << 20
    assert _validate.size("512M", "m") == 512 << 20
    assert _validate.size("64MiB", "m") == 64 << 20
    assert _validate.size("2G", "m") == 2 << 30
    assert _validate.size("1 gb", "m") == 1 << 30
    assert _validate.size(1024, "m") == 1024
    for bad in ["", "-1", "1.5G", "12X", "G"]:
        with pytest.raises(warren.InvalidArgument):
            _validate.size(bad, "m")


def test_stdin_is_text_when_it_can_be():
    assert _validate.stdin("hi") == {"stdin": "hi"}
    assert _validate.stdin(b"hi") == {"stdin": "hi"}
    assert _validate.stdin(b"\xff\x00") == {"stdin_b64": "/wA="}


def test_sandbox_ids_are_checked_before_they_reach_a_url(offline):
    for bad in ["../../v1/nodes", "ABCDEF0123456789WXYZ", "short", ""]:
        with pytest.raises(warren.InvalidArgument, match="not a sandbox id"):
            offline.sandboxes.get(bad)
    with pytest.raises(warren.ArgumentTypeError):
        offline.sandboxes.get(12)
    with pytest.raises(warren.InvalidArgument, match="state"):
        offline.sandboxes.list(state="frozen")
    with pytest.raises(warren.InvalidArgument, match="label filter"):
        offline.sandboxes.list(labels={"a,b": "1"})
    with pytest.raises(warren.InvalidArgument, match="task name is empty"):
        offline.tasks.pause("")


def test_configuration_from_arguments_and_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("WARREN_API_KEY", raising=False)
    monkeypatch.setenv("WARREN_URL", "10.1.2.3:7777/")
    monkeypatch.setenv("WARREN_DATA_DIR", str(tmp_path))
    (tmp_path / "admin.key").write_text("wk_from_file\n")
    c = warren.Client()
    assert c.url == "http://10.1.2.3:7777"
    assert c._t.headers["Authorization"] == "Bearer wk_from_file"
    monkeypatch.setenv("WARREN_API_KEY", "wk_env")
    assert warren.Client()._t.headers["Authorization"] == "Bearer wk_env"
    c = warren.Client("http://h:1", "wk_arg")
    assert c.url == "http://h:1" and c._t.headers["Authorization"] == "Bearer wk_arg"
    monkeypatch.delenv("WARREN_API_KEY")
    monkeypatch.delenv("WARREN_URL")
    (tmp_path / "admin.key").unlink()
    c = warren.Client()
    assert c.url == "http://127.0.0.1:7700"
    assert "Authorization" not in c._t.headers
    assert "admin.key does not exist" in (c._t.key_hint or "")
    for bad in ["ftp://h", "http://", "http://h:99999", "http://h/?x=1"]:
        with pytest.raises(warren.InvalidArgument):
            warren.Client(bad)
    with pytest.raises(warren.InvalidArgument, match="max_retries"):
        warren.Client(NOWHERE, max_retries=-1)


def test_no_server_is_unavailable_with_what_to_do():
    port = closed_port()
    with warren.Client(f"http://127.0.0.1:{port}", "k", max_retries=2, backoff=0.01) as c:
        t0 = time.monotonic()
        with pytest.raises(warren.Unavailable) as e:
            c.health()
        assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "warren up" in msg and "WARREN_URL" in msg and str(port) in msg
    assert isinstance(e.value, ConnectionError)


async def test_no_server_is_unavailable_async_too():
    port = closed_port()
    async with warren.AsyncClient(f"http://127.0.0.1:{port}", "k", max_retries=0) as c:
        with pytest.raises(warren.Unavailable, match="warren up"):
            await c.health()


def test_answers_become_typed_errors():
    def err(status, body, retry_after=None, hint=None):
        return errors.from_response(status, body, retry_after, key_hint=hint)

    e = err(404, b'{"error": {"code": "sandbox_not_found", "message": "gone: list them"}}')
    assert isinstance(e, warren.NotFound) and e.code == "sandbox_not_found" and e.status == 404
    assert e.message == "gone: list them"
    e = err(429, b'{"error": {"code": "capacity", "message": "full", "retry_after_secs": 3}}', "9")
    assert isinstance(e, warren.CapacityError) and e.retry_after == 3
    e = err(429, b'{"error": {"code": "capacity", "message": "full"}}', "9")
    assert e.retry_after == 9
    # A code this SDK does not know yet is typed by its status.
    e = err(409, b'{"error": {"code": "brand_new", "message": "new"}}')
    assert isinstance(e, warren.Conflict) and e.code == "brand_new"
    # Not Warren at all: still typed, and the status and body are shown.
    e = err(502, b"<html>Bad Gateway</html>")
    assert isinstance(e, warren.Unavailable) and "HTTP 502: <html>Bad Gateway" in str(e)
    e = err(404, b"")
    assert isinstance(e, warren.NotFound) and "WARREN_URL" in str(e)
    e = err(500, b"{not json")
    assert isinstance(e, warren.InternalError)
    e = err(401, b'{"error": {"code": "unauthenticated", "message": "no key"}}', hint="why")
    assert isinstance(e, warren.Unauthenticated) and "sent no API key: why" in str(e)


def test_events_parse_and_error_events_raise():
    from warren import events

    assert events.parse('{"type":"start","process_id":3,"pid":9}') == events.Start(3, 9)
    assert events.parse('{"type":"stdout","data":"aGk="}') == events.Stdout(b"hi")
    ex = events.parse(
        '{"type":"exit","exit_code":2,"stdout_bytes":1,"stderr_bytes":0,"duration_ms":5}'
    )
    assert isinstance(ex, events.Exit) and ex.exit_code == 2
    with pytest.raises(warren.SandboxGone):
        events.parse('{"type":"error","code":"sandbox_gone","message":"stopped"}')
    with pytest.raises(warren.ProtocolError):
        events.parse("not json")


def test_exec_results_keep_exact_bytes():
    r = warren.ExecResult.from_json(
        {
            "exit_code": 0,
            "stdout_bytes": 2,
            "stderr_bytes": 0,
            "duration_ms": 1,
            "stdout": "/wA=",
            "stdout_encoding": "base64",
            "stderr": "é",
        }
    )
    assert r.stdout_data == b"\xff\x00" and r.stdout_encoding == "base64"
    assert r.stderr == "é" and r.stderr_data == "é".encode()


def test_trajectory_files_round_trip(tmp_path: Path):
    log = [
        {
            "op": "exec",
            "argv": ["sh", "-c", "date"],
            "user": "user",
            "result": {
                "exit_code": 0,
                "stdout": "x\n",
                "stderr": "",
                "stdout_bytes": 2,
                "stderr_bytes": 0,
                "duration_ms": 1,
            },
        },
        {"op": "write_file", "path": "f", "user": "user", "sha256": "00", "content_b64": ""},
    ]
    text = trajectory.dumps(log)
    assert text.count("\n") == 2 and json.loads(text.splitlines()[0]) == log[0]
    assert trajectory.loads(text) == log
    trajectory.save(log, tmp_path / "t.jsonl")
    assert trajectory.load(tmp_path / "t.jsonl") == log
    assert trajectory.load(str(tmp_path / "t.jsonl")) == log
    assert trajectory.load(text) == log
    assert trajectory.load(log) == log
    assert trajectory.load("") == []
    with pytest.raises(warren.InvalidArgument, match="line 2"):
        trajectory.loads('{"op": "exec"}\n[1]\n')
    with pytest.raises(warren.ArgumentTypeError):
        trajectory.load(42)


async def test_async_create_checks_arguments_before_any_request():
    async with warren.AsyncClient(NOWHERE, "k", max_retries=0) as c:
        with pytest.raises(warren.InvalidArgument, match="cpu"):
            await c.containers.create(image="host", cpu=-1)
        # A task, as trainers make them: create is a coroutine.
        task = asyncio.create_task(c.containers.create(image="host", on_idle="stop"))
        with pytest.raises(warren.InvalidArgument, match="idle_timeout"):
            await task


def _tar_of(entries) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, kind, link in entries:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.linkname = link
            ti.size = len(data)
            ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
            tar.addfile(ti, io.BytesIO(data) if data else None)
    return buf.getvalue()


@pytest.mark.parametrize("filters", [True, False], ids=["tarfile-filters", "no-filters"])
def test_downloaded_tars_stay_in_their_directory(tmp_path: Path, monkeypatch, filters):
    import tarfile

    from warren import _tar

    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    ok = _tar_of(
        [
            ("./d", b"", tarfile.DIRTYPE, ""),
            ("./d/f.txt", b"hi", tarfile.REGTYPE, ""),
            ("./l", b"", tarfile.SYMTYPE, "d/f.txt"),
        ]
    )
    out = _tar.unpack(ok, tmp_path / "ok")
    assert (out / "d" / "f.txt").read_bytes() == b"hi" and (out / "l").is_symlink()
    for bad in (
        [("../evil", b"x", tarfile.REGTYPE, "")],
        [("l", b"", tarfile.SYMTYPE, "/etc/passwd")],
        [("l", b"", tarfile.SYMTYPE, "../../outside")],
    ):
        with pytest.raises(warren.ProtocolError):
            _tar.unpack(_tar_of(bad), tmp_path / "bad")
    assert not (tmp_path / "evil").exists()
    # An absolute name is refused, or (tarfile's filter) made relative: it never lands at /.
    name = f"/warren-sdk-test-{os.getpid()}"
    try:
        _tar.unpack(_tar_of([(name, b"x", tarfile.REGTYPE, "")]), tmp_path / "abs")
        assert (tmp_path / "abs" / name.lstrip("/")).exists()
    except warren.ProtocolError:
        pass
    assert not Path(name).exists()
    with pytest.raises(warren.ProtocolError, match="could not read"):
        _tar.unpack(b"not a tar at all" * 64, tmp_path / "junk")


def test_directories_are_packed_relative_and_anonymous(tmp_path: Path):
    import io
    import tarfile

    from warren import _tar

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c.txt").write_text("c")
    (tmp_path / "top.txt").write_text("t")
    with tarfile.open(fileobj=io.BytesIO(_tar.pack_dir(tmp_path))) as tar:
        names = sorted(tar.getnames())
        assert names == ["a", "a/b", "a/b/c.txt", "top.txt"]
        assert all(m.uid == 0 and m.uname == "" for m in tar.getmembers())


def test_pool_shards_go_to_the_least_busy_and_are_made_lazily():
    from warren._http import SHARD_SIZE, Shards

    made = []
    shards = Shards(10 * SHARD_SIZE, lambda size: made.append(size) or f"pool{len(made)}")
    assert shards.pools == [] and made == []
    i, p = shards.acquire()
    shards.release(i)
    j, q = shards.acquire()
    assert (i, p) == (j, q) == (0, "pool1"), "light use stays on one shard (keep-alive)"
    k, r = shards.acquire()  # shard 0 is busy: the next one
    assert k == 1 and r == "pool2" and made == [SHARD_SIZE, SHARD_SIZE]
    shards.release(j)
    assert shards.acquire()[0] == 0


def test_image_lists_are_joined_bottom_first_and_checked():
    from warren import _ops
    from warren.errors import ArgumentTypeError, InvalidArgument

    call = _ops.create("container", image=["base/py:3.12", "tk/agent:v3"])
    assert call.json["image"] == "base/py:3.12,tk/agent:v3"
    with pytest.raises(InvalidArgument):
        _ops.create("container", image=[])
    with pytest.raises(InvalidArgument):
        _ops.create("container", image=["a,b"])
    with pytest.raises(ArgumentTypeError):
        _ops.create("container", image=[1])


def test_gathered_answers_name_the_nodes_that_did_not_answer():
    import httpx

    from warren import _ops

    sandbox = {
        "id": "abcdef0123456789wxyz",
        "node": "abcdef",
        "backend": "container",
        "image": "host",
        "state": "running",
        "resources": {"cpu": 1000, "memory": 1 << 29, "pids": 1024},
        "created_at": "",
        "expires_at": "",
    }
    down = {"node": "nodebb", "error": {"code": "unavailable", "message": "no answer within 30 s"}}
    got = _ops.list_sandboxes().parse(
        httpx.Response(200, json={"sandboxes": [sandbox], "unreachable": [down]})
    )
    # Still a list of the sandboxes that were found...
    assert isinstance(got, list) and [s.id for s in got] == ["abcdef0123456789wxyz"]
    # ...that says which node's are missing.
    assert not got.complete
    assert got.unreachable == [
        warren.NodeFailure("nodebb", warren.ErrorInfo("unavailable", "no answer within 30 s"))
    ]
    assert "unreachable=[nodebb]" in repr(got)
    # An answer from every node, or from a Warren that predates `unreachable`, is complete.
    tasks = _ops.list_tasks().parse(httpx.Response(200, json={"tasks": []}))
    assert tasks == [] and tasks.complete and tasks.unreachable == []
    events = _ops.list_events().parse(
        httpx.Response(200, json={"events": [], "unreachable": [down]})
    )
    assert [f.node for f in events.unreachable] == ["nodebb"]
    nodes = _ops.nodes().parse(httpx.Response(200, json={"nodes": [], "unreachable": [down]}))
    assert not nodes.complete
    r = _ops.task_action("t", "stop").parse(
        httpx.Response(
            200,
            json={
                "task": "t",
                "action": "stop",
                "succeeded": 2,
                "failed": [],
                "unreachable": [down],
            },
        )
    )
    assert r.succeeded == 2 and r.unreachable[0].node == "nodebb" and not r.ok
    r = _ops.task_action("t", "stop").parse(
        httpx.Response(200, json={"task": "t", "action": "stop", "succeeded": 2})
    )
    assert r.ok and r.unreachable == []

"""Every method of the blocking handle, against a real Warren."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import warren
from warren import events


def test_create_exec_and_kill(client: warren.Client):
    sb = client.containers.create(
        image="host",
        task="pytest",
        cpu=500,
        memory="64Mi",
        pids=128,
        timeout=600,
        labels={"suite": "sync"},
        env={"GREETING": "hello"},
    )
    try:
        info = sb.last_info
        assert info.id == sb.id and info.state == "running" and info.backend == "container"
        assert info.guest and info.guest.startswith("sha256:") and not info.builder
        # disk: the node's default quota (10Gi, or the disk pool's size where that is smaller:
        # half the free disk), or none where the node has no disk pool.
        r = info.resources
        assert (r.cpu, r.memory, r.pids) == (500, 64 << 20, 128)
        assert r.disk is None or (16 << 20) <= r.disk <= (10 << 30), r
        assert info.labels == {"suite": "sync"} and info.task == "pytest"
        r = sb.exec("echo $GREETING; echo oops >&2; exit 3")
        assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("hello\n", "oops\n", 3, False)
        assert r.stdout_bytes == 6 and r.stderr_bytes == 5 and r.duration_ms >= 0
        assert not r.replayed and not r.replay_ended
        r = sb.exec(["printf", "%s|", "a b", "$HOME"])
        assert r.stdout == "a b|$HOME|" and r.ok
    finally:
        sb.kill()
    with pytest.raises(warren.NotFound) as e:
        sb.info()
    assert e.value.code == "sandbox_not_found" and e.value.status == 404


def test_exec_options(sandbox: warren.Sandbox):
    r = sandbox.exec("pwd; id -un", cwd="/tmp")
    assert r.stdout == "/tmp\nuser\n"
    assert sandbox.exec("id -u", user="root").stdout == "0\n"
    assert sandbox.exec("id -u", user=0).stdout == "0\n"
    assert sandbox.exec("echo $X$Y", env={"X": "1", "Y": "2"}).stdout == "12\n"
    assert sandbox.exec("cat", stdin="text in").stdout == "text in"
    r = sandbox.exec("od -An -tx1", stdin=b"\xff\x00")
    assert r.stdout.split() == ["ff", "00"]
    r = sandbox.exec("head -c 3 /dev/zero | tr '\\0' '\\377'")
    assert r.stdout_encoding == "base64" and r.stdout_data == b"\xff\xff\xff"
    r = sandbox.exec("sleep 5", timeout=0.5)
    assert r.timed_out and r.exit_code != 0
    r = sandbox.exec("yes | head -c 100000", max_output=1000)
    assert r.stdout_truncated and len(r.stdout) == 1000 and r.stdout_bytes == 100000
    assert sandbox.exec(["no-such-program"]).exit_code == 127


def test_exec_stream(sandbox: warren.Sandbox):
    got = list(sandbox.exec_stream("echo out; echo err >&2; exit 4"))
    assert isinstance(got[0], events.Start) and got[0].pid > 0
    assert isinstance(got[-1], events.Exit) and got[-1].exit_code == 4
    out = b"".join(e.data for e in got if isinstance(e, events.Stdout))
    err = b"".join(e.data for e in got if isinstance(e, events.Stderr))
    assert (out, err) == (b"out\n", b"err\n")
    with sandbox.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.1; done"]) as s:
        chunks = [e.data for e in s if isinstance(e, events.Stdout)]
    assert b"".join(chunks) == b"1\n2\n3\n" and s.exit is not None and s.exit.exit_code == 0


def test_processes(sandbox: warren.Sandbox):
    p = sandbox.processes.start("echo started; sleep 30")
    assert p.running and p.process_id >= 0 and p.user == "user"
    assert any(q.process_id == p.process_id for q in sandbox.processes.list())
    assert sandbox.processes.get(p.process_id).running
    w = sandbox.processes.wait(p, timeout=0.2)
    assert w.running
    sandbox.processes.signal(p, "TERM")
    done = sandbox.processes.wait(p.process_id)
    assert not done.running and done.exit is not None and done.exit.signal == signal.SIGTERM
    out = list(sandbox.processes.output(p))
    assert b"".join(e.data for e in out if isinstance(e, events.Stdout)) == b"started\n"
    assert isinstance(out[-1], events.Exit)
    sandbox.processes.forget(p)
    with pytest.raises(warren.NotFound) as e:
        sandbox.processes.get(p)
    assert e.value.code == "process_not_found"

    q = sandbox.processes.start(["sh", "-c", "cat; exit 7"], stdin="in")
    r = sandbox.processes.wait(q, timeout=10)
    assert r.exit is not None and r.exit.exit_code == 7
    k = sandbox.processes.start("sleep 30")
    sandbox.processes.signal(k, signal.SIGKILL)
    assert sandbox.processes.wait(k).exit.signal == 9  # type: ignore[union-attr]


def test_stdin_terminals_metrics_and_watches(sandbox: warren.Sandbox):
    p = sandbox.processes.start("cat", stdin_open=True)
    assert p.stdin_open and not p.pty
    sandbox.processes.send_stdin(p, "one\n")
    sandbox.processes.send_stdin(p, b"\xff\n")
    sandbox.processes.close_stdin(p)
    assert sandbox.processes.wait(p, timeout=10).exit.exit_code == 0  # type: ignore[union-attr]
    out = list(sandbox.processes.output(p))
    assert b"".join(e.data for e in out if isinstance(e, events.Stdout)) == b"one\n\xff\n"
    with pytest.raises(warren.InvalidArgument):
        sandbox.processes.send_stdin(sandbox.processes.start("sleep 5"), "x")

    t = sandbox.processes.start("read line; stty size; echo got:$line", pty=(100, 30))
    assert t.pty
    sandbox.processes.resize(t, 120, 40)
    sandbox.processes.send_stdin(t, "hi\n")
    assert sandbox.processes.wait(t, timeout=10).exit.exit_code == 0  # type: ignore[union-attr]
    text = b"".join(e.data for e in sandbox.processes.output(t) if isinstance(e, events.Stdout))
    assert b"40 120" in text and b"got:hi" in text, text
    with pytest.raises(warren.InvalidArgument):
        sandbox.processes.start("true", pty=(0, 24))

    m = sandbox.metrics()
    assert m.memory_limit > 0 and m.memory_used > 0 and m.cpu_limit > 0

    sandbox.files.mkdir("watched")
    w = sandbox.files.watch("watched", recursive=True)
    sandbox.files.write("watched/a.txt", b"a")
    got = sandbox.files.watch_events(w, wait=5)
    assert ("create", "a.txt") in [(e.kind, e.path) for e in got.events], got
    sandbox.files.unwatch(w)
    with pytest.raises(warren.NotFound):
        sandbox.files.watch_events(w)


def test_files(sandbox: warren.Sandbox):
    f = sandbox.files
    e = f.write("dir/a.txt", "héllo\n", mode=0o640)
    assert e.path == "/home/user/dir/a.txt" and e.size == len("héllo\n".encode())
    assert e.mode & 0o777 == 0o640 and e.uid == 1000 and e.is_file
    assert f.read("dir/a.txt") == "héllo\n".encode()
    assert f.read_text("/home/user/dir/a.txt") == "héllo\n"
    f.write("dir/b.bin", bytes(range(256)))
    assert f.read("dir/b.bin") == bytes(range(256))
    assert [x.name for x in f.list("dir")] == ["a.txt", "b.bin"]
    assert f.stat("dir").is_dir and f.exists("dir/a.txt") and not f.exists("dir/zzz")
    assert f.mkdir("x/y/z").is_dir
    with pytest.raises(warren.NotFound):
        f.mkdir("p/q", parents=False)
    with pytest.raises(warren.Conflict):
        f.mkdir("dir/b.bin")
    moved = f.rename("dir/a.txt", "x/moved.txt")
    assert moved.path == "/home/user/x/moved.txt" and not f.exists("dir/a.txt")
    with pytest.raises(warren.Conflict):
        f.remove("x")
    f.remove("x", recursive=True)
    assert not f.exists("x")
    f.write("/tmp/root-owned", "r", user="root")
    assert f.stat("/tmp/root-owned").uid == 0
    assert f.read("/tmp/root-owned", user="root") == b"r"
    with pytest.raises(warren.NotFound) as nf:
        f.read("nope")
    assert nf.value.code == "file_not_found"


def test_upload_and_download_dir(sandbox: warren.Sandbox, tmp_path: Path):
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("X = 1\n")
    (src / "pkg" / "sub" / "data.bin").write_bytes(b"\x00\x01\xff")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("run.sh")
    sandbox.files.upload_dir(src, "proj")
    assert (
        sandbox.exec("cd proj && ./run.sh && python3 -c 'import pkg; print(pkg.X)'").stdout
        == "ran\n1\n"
    )
    assert sandbox.files.stat("proj/pkg/sub/data.bin").uid == 1000
    assert sandbox.files.stat("proj/link").kind == "symlink"
    sandbox.exec("cd proj && echo new > pkg/new.txt")
    dst = sandbox.files.download_dir("proj", tmp_path / "dst")
    assert (dst / "pkg" / "new.txt").read_text() == "new\n"
    assert (dst / "pkg" / "sub" / "data.bin").read_bytes() == b"\x00\x01\xff"
    assert (dst / "run.sh").stat().st_mode & 0o111
    assert (dst / "link").is_symlink()


def test_lifecycle_and_reattach(client: warren.Client, sandbox: warren.Sandbox):
    assert sandbox.pause().state == "paused"
    assert sandbox.info().state == "paused"
    assert sandbox.resume().state == "running"
    again = client.sandboxes.get(sandbox.id)
    assert again.id == sandbox.id and again.exec("echo hi").stdout == "hi\n"
    ids = [s.id for s in client.sandboxes.list(task="pytest")]
    assert sandbox.id in ids
    sandbox.pause()
    assert sandbox.id in [s.id for s in client.sandboxes.list(state="paused")]
    assert sandbox.id not in [s.id for s in client.sandboxes.list(state="running")]
    # Any operation resumes a paused sandbox.
    assert sandbox.exec("echo back").stdout == "back\n"
    assert sandbox.info().state == "running"


def test_labels_filter(client: warren.Client):
    with (
        client.containers.create(image="host", memory="64Mi", labels={"k": "v1", "z": "1"}) as a,
        client.containers.create(image="host", memory="64Mi", labels={"k": "v2"}) as b,
    ):
        got = [s.id for s in client.sandboxes.list(labels={"k": "v1"})]
        assert a.id in got and b.id not in got
        assert [s.id for s in client.sandboxes.list(labels={"k": "v2"})] == [b.id]
    # Leaving the with blocks killed both.
    assert not [s for s in client.sandboxes.list() if s.id in (a.id, b.id)]


def test_idempotent_create(client: warren.Client):
    a = client.containers.create(image="host", memory="64Mi", idempotency_key="pytest-idem-1")
    try:
        b = client.containers.create(image="host", memory="64Mi", idempotency_key="pytest-idem-1")
        assert a.id == b.id
        c = client.containers.create(image="host", memory="64Mi")
        d = client.containers.create(image="host", memory="64Mi")
        assert len({a.id, c.id, d.id}) == 3
        c.kill()
        d.kill()
    finally:
        a.kill()


def test_health_and_nodes(client: warren.Client):
    h = client.health()
    assert h.status == "ok" and h.nodes_up == h.nodes == 1
    (node,) = client.nodes()
    assert node.max_sandboxes > 0 and node.cgroups in ("v1", "v2", "hybrid")
    assert node.guest and node.guest.startswith("sha256:")


def test_cordon_keeps_new_sandboxes_off_until_uncordoned(server, client: warren.Client):
    (node,) = client.nodes()
    assert not node.cordoned and node.reachable and node.pool == "default"
    c = client.cordon(node.id)
    assert c.cordoned and c.id == node.id
    try:
        assert client.nodes()[0].cordoned
        # The only node is cordoned: a create is refused at once, not retried into a hang.
        with server.client(max_retries=0) as quick:
            with pytest.raises(warren.Unavailable) as e:
                quick.containers.create(image="host")
            assert "cordoned" in str(e.value)
    finally:
        assert not client.uncordon(node.id).cordoned
    sb = client.containers.create(image="host")
    sb.kill()
    with pytest.raises(warren.NotFound):
        client.cordon("zzzzzz")
    with pytest.raises(warren.InvalidArgument):
        client.cordon("not a node")

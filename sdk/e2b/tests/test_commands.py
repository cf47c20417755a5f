"""Commands through the gateway with the unmodified `e2b` SDK: foreground runs with streamed
output, exit codes, environment and working directory, users, timeouts, background commands
with wait, list and kill, re-attaching by pid, stdin (send, stream, close) and terminals."""

from __future__ import annotations

import time

import pytest
from e2b import AsyncSandbox, CommandExitException, TimeoutException


def test_run_foreground_with_streamed_output(sb):
    r = sb.commands.run("echo $((6*7))")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "42\n", "")
    out, err = [], []
    r = sb.commands.run(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.05; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "out1\nout2\nout3\n" and "".join(err) == "err1\nerr2\nerr3\n"
    assert r.stdout == "out1\nout2\nout3\n"


def test_exit_codes_env_cwd_and_users(sb):
    with pytest.raises(CommandExitException) as e:
        sb.commands.run("echo partial; echo bad >&2; exit 3")
    assert (e.value.exit_code, e.value.stdout, e.value.stderr) == (3, "partial\n", "bad\n")
    r = sb.commands.run("echo $A-$B; pwd", envs={"A": "1", "B": "two"}, cwd="/tmp")
    assert r.stdout == "1-two\n/tmp\n"
    assert sb.commands.run("id -un").stdout == "user\n"
    assert sb.commands.run("id -un", user="root").stdout == "root\n"
    # Bytes that are not UTF-8 arrive replaced, never as an error.
    assert sb.commands.run("printf 'a\\377b'").stdout == "a\ufffdb"


def test_timeouts_kill_the_command(sb):
    t = time.monotonic()
    with pytest.raises(TimeoutException):
        sb.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - t < 10
    # The client gives up at its timeout and the sandbox kills the command at the same
    # lifetime counted from its start, a moment later: gone within a few seconds.
    deadline = time.monotonic() + 5
    while "sleep 30" in sb.commands.run("ps -eo args").stdout:
        assert time.monotonic() < deadline, "the command outlived its timeout"
        time.sleep(0.1)


def test_background_wait_list_kill_and_connect(sb):
    h = sb.commands.run("sleep 0.3; echo done", background=True)
    assert h.pid > 0
    assert h.wait().stdout == "done\n"

    long = sb.commands.run("echo started; sleep 60", background=True)
    pids = [p.pid for p in sb.commands.list()]
    assert long.pid in pids
    listed = next(p for p in sb.commands.list() if p.pid == long.pid)
    assert listed.cmd == "/bin/bash" and "sleep 60" in " ".join(listed.args)
    again = sb.commands.connect(long.pid)
    assert again.pid == long.pid
    assert long.kill() is True
    with pytest.raises(CommandExitException):
        again.wait()
    assert long.pid not in [p.pid for p in sb.commands.list()]
    assert sb.commands.kill(long.pid) is False, "nothing left to kill"


def test_stdin_send_and_close(sb):
    h = sb.commands.run("cat; echo closed", background=True, stdin=True)
    sb.commands.send_stdin(h.pid, "one\n")
    sb.commands.send_stdin(h.pid, b"two\n")
    sb.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "one\ntwo\nclosed\n"
    # A command started without stdin takes none: the SDK's error, never a hang.
    h = sb.commands.run("sleep 30", background=True)
    with pytest.raises(Exception):
        sb.commands.send_stdin(h.pid, "x")
    h.kill()


def test_stdin_streamed(sb):
    if not hasattr(sb.commands, "stream_input"):
        pytest.skip("this SDK version has no stream_input")
    h = sb.commands.run("wc -c", background=True, stdin=True)
    sb.commands.stream_input(h.pid, (b"x" * 1000 for _ in range(300)))
    sb.commands.close_stdin(h.pid)
    assert h.wait().stdout.strip() == "300000"


def test_pty_create_input_resize_and_kill(sb):
    from e2b import PtySize

    out = bytearray()
    t = sb.pty.create(size=PtySize(rows=30, cols=100), envs={"PS1": "$ "})
    assert t.pid > 0
    events = iter(t)

    def read_until(want: bytes) -> None:
        while want not in out:
            _, _, pty = next(events)
            if pty:
                out.extend(pty)

    sb.pty.send_stdin(t.pid, b"stty size; tty; echo $TERM\n")
    read_until(b"xterm-256color\r\n")
    # Resized only once the first `stty size` has answered.
    sb.pty.resize(t.pid, PtySize(rows=40, cols=120))
    sb.pty.send_stdin(t.pid, b"stty size\n")
    read_until(b"40 120")
    sb.pty.send_stdin(t.pid, b"exit 3\n")
    with pytest.raises(CommandExitException) as e:
        t.wait(on_pty=out.extend)
    assert e.value.exit_code == 3
    text = out.decode(errors="replace")
    for want in ["30 100", "/dev/pts/", "xterm-256color", "40 120"]:
        assert want in text, (want, text)
    assert text.index("30 100") < text.index("40 120"), text

    # Connect to a running terminal, interrupt with ^C, and kill it.
    t = sb.pty.create(size=PtySize(rows=24, cols=80))
    again = sb.pty.connect(t.pid)
    seen = bytearray()
    sb.pty.send_stdin(t.pid, b"sleep 100\n")
    time.sleep(0.3)
    sb.pty.send_stdin(t.pid, b"\x03echo after-interrupt\n")
    deadline = time.monotonic() + 10
    for stdout, stderr, pty in again:
        if pty:
            seen.extend(pty)
        if b"after-interrupt\r\n" in seen.split(b"echo after-interrupt", 1)[-1] or time.monotonic() > deadline:
            break
    assert b"after-interrupt" in seen
    assert sb.pty.kill(t.pid) is True
    assert sb.pty.kill(t.pid) is False


async def test_async_commands(gateway):
    sb = await AsyncSandbox.create("base", timeout=60)
    try:
        r = await sb.commands.run("echo hi; echo there >&2")
        assert (r.stdout, r.stderr) == ("hi\n", "there\n")
        h = await sb.commands.run("sleep 0.2; exit 4", background=True)
        with pytest.raises(CommandExitException) as e:
            await h.wait()
        assert e.value.exit_code == 4
        h = await sb.commands.run("tr a-z A-Z", background=True, stdin=True)
        await sb.commands.send_stdin(h.pid, "async\n")
        await sb.commands.close_stdin(h.pid)
        assert (await h.wait()).stdout == "ASYNC\n"
        from e2b import PtySize

        t = await sb.pty.create(size=PtySize(rows=24, cols=80), on_data=lambda d: None)
        await sb.pty.resize(t.pid, PtySize(rows=25, cols=81))
        await sb.pty.send_stdin(t.pid, b"exit\n")
        assert (await t.wait()).exit_code == 0
    finally:
        await sb.kill()


def test_a_sandbox_killed_mid_command_ends_its_stream(gateway):
    from e2b import Sandbox

    s = Sandbox.create("base", timeout=60)
    h = s.commands.run("sleep 30", background=True)
    s.kill()
    t = time.monotonic()
    with pytest.raises(Exception):
        h.wait()
    assert time.monotonic() - t < 10, "the stream ended with the sandbox, not at the command's end"


def test_the_base_template_has_what_e2b_base_has(sb):
    """User `user` (home and cwd /home/user), root, bash, python3, curl, git with its daemon,
    and `user.*` extended attributes. (No sudo: see docs/e2b.md.)"""
    r = sb.commands.run("id -un; echo $HOME; pwd; echo $SHELL")
    assert r.stdout == "user\n/home/user\n/home/user\n/bin/bash\n"
    assert sb.commands.run("id -un", user="root").stdout == "root\n"
    for tool in ["bash --version", "python3 --version", "curl --version", "git --version"]:
        sb.commands.run(tool)
    # git daemon serves a repository over git:// on the sandbox's own loopback.
    r = sb.commands.run(
        "set -e; git init -q -b main repo && cd repo && git -c user.name=u -c user.email=u@x "
        "commit -q --allow-empty -m first && cd .. && touch repo/.git/git-daemon-export-ok && "
        "(git daemon --reuseaddr --base-path=/home/user --port=19418 --listen=127.0.0.1 "
        "--export-all >/dev/null 2>&1 &) && sleep 0.5 && "
        "git clone -q git://127.0.0.1:19418/repo/.git copy && git -C copy log --format=%s",
        timeout=30,
    )
    assert r.stdout.endswith("first\n"), r
    r = sb.commands.run(
        "touch x && python3 -c \"import os; os.setxattr('x', 'user.k', b'v'); "
        "print(os.getxattr('x', 'user.k').decode())\""
    )
    assert r.stdout == "v\n"

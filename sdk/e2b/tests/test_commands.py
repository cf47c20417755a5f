"""Commands through the gateway with the unmodified `e2b` SDK: foreground runs with streamed
output, exit codes, environment and working directory, users, timeouts, background commands
with wait, list and kill, and re-attaching by pid."""

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
    assert "sleep 30" not in sb.commands.run("ps -eo args").stdout


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


def test_features_not_there_yet_say_so(sb):
    with pytest.raises(Exception) as e:
        sb.pty.create(size=__import__("e2b").PtySize(rows=24, cols=80))
    assert "not supported" in str(e.value)


async def test_async_commands(gateway):
    sb = await AsyncSandbox.create("base", timeout=60)
    try:
        r = await sb.commands.run("echo hi; echo there >&2")
        assert (r.stdout, r.stderr) == ("hi\n", "there\n")
        h = await sb.commands.run("sleep 0.2; exit 4", background=True)
        with pytest.raises(CommandExitException) as e:
            await h.wait()
        assert e.value.exit_code == 4
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

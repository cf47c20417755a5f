"""Trajectory recording and replay (fast-forward) of commands whose results differ run to run."""

from __future__ import annotations

from pathlib import Path

import warren
from warren import events, trajectory

from .conftest import Server

DATE = "date +%s%N > f; cat f"
COUNTER = "c=$(cat n 2>/dev/null || echo 0); echo $((c+1)) > n; cat n"


def record(client: warren.Client):
    """Three rounds of date and counter, a file write and a read, then the log; the sandbox is
    killed, as a preempted rollout's would be."""
    sb = client.containers.create(image="host", memory="64Mi", trajectory=True)
    outs = []
    for _ in range(3):
        outs.append(sb.exec(DATE).stdout)
        outs.append(sb.exec(COUNTER).stdout)
    sb.files.write("notes.txt", "step 7\n")
    outs.append(sb.exec(["cat", "notes.txt"]).stdout)
    log = sb.trajectory()
    sb.kill()
    assert outs[1::2][:3] == ["1\n", "2\n", "3\n"]
    assert len({outs[0], outs[2], outs[4]}) == 3, "date gives a new answer each time"
    return outs, log


def replay_same(sb: warren.Sandbox):
    outs, flags = [], []
    for _ in range(3):
        for cmd in (DATE, COUNTER):
            r = sb.exec(cmd)
            outs.append(r.stdout)
            flags.append((r.replayed, r.replay_ended))
    sb.files.write("notes.txt", "step 7\n")
    r = sb.exec(["cat", "notes.txt"])
    outs.append(r.stdout)
    flags.append((r.replayed, r.replay_ended))
    return outs, flags


def test_replay_gives_the_recorded_results_then_runs_live(client: warren.Client, tmp_path: Path):
    outs, log = record(client)
    assert [e["op"] for e in log] == ["exec"] * 6 + ["write_file", "exec"]

    # Through a JSON lines file, as a trainer would keep it across a restart.
    trajectory.save(log, tmp_path / "episode.jsonl")
    with client.containers.replay(tmp_path / "episode.jsonl", image="host", memory="64Mi") as sb:
        assert sb.last_info.trajectory
        again, flags = replay_same(sb)
        assert again == outs
        assert flags == [(True, False)] * 7
        # The log is used up: what follows runs live, on the rebuilt state (n was 3).
        r = sb.exec(COUNTER)
        assert (r.stdout, r.replayed) == ("4\n", False)
        # The new sandbox records its own trajectory: the replayed steps and the live one.
        assert len(sb.trajectory()) == len(log) + 1


def test_a_different_command_ends_the_replay(client: warren.Client):
    outs, log = record(client)
    with client.containers.replay(trajectory.dumps(log), image="host", memory="64Mi") as sb:
        r1 = sb.exec(DATE)
        r2 = sb.exec(COUNTER)
        assert (r1.stdout, r2.stdout) == (outs[0], outs[1])
        assert r1.replayed and r2.replayed
        r = sb.exec("echo a new step; cat n")
        assert r.replay_ended and not r.replayed
        assert r.stdout == "a new step\n3\n", "it ran live on the state rebuilt from the log"
        r = sb.exec(DATE)  # matched the log's third entry once, but replay is over
        assert not r.replayed and not r.replay_ended and r.stdout != outs[2]


async def test_async_replay_and_streamed_replay(server: Server):
    async with server.aclient() as c:
        sb = await c.containers.create(image="host", memory="64Mi", trajectory=True)
        first = (await sb.exec(DATE)).stdout
        log = await sb.trajectory()
        await sb.kill()
        async with await c.containers.replay(log, image="host", memory="64Mi") as rb:
            got = [ev async for ev in rb.exec_stream(DATE)]
            assert isinstance(got[0], events.Start) and got[0].replayed
            out = b"".join(e.data for e in got if isinstance(e, events.Stdout))
            assert out.decode() == first

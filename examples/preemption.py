#!/usr/bin/env python3
"""Preemption on Warren: pause a training task's sandboxes when the trainer is told to stop,
resume them when it comes back, and replay a rollout's trajectory after a restart.

A trainer on a preemptible machine gets SIGTERM before it is taken away (or SIGUSR1 from a
scheduler that wants the CPUs for a while). This script runs rollouts in a task of sandboxes
that record their trajectories and:

- on SIGUSR1: pauses the whole task (one call; memory kept), waits, resumes it, goes on;
- on SIGTERM: pauses the task, saves each rollout's trajectory and exits;
- `restore`: after the restart, replays each saved trajectory into a new sandbox. The restarted
  rollout repeats its steps from the beginning and gets the recorded answers back at once
  (`replayed`), even for commands that never give the same answer twice, then goes on live.

    make up                                            # in another terminal
    python examples/preemption.py demo                 # all of it, signalling itself
    python examples/preemption.py run --state DIR      # then: kill -USR1 / kill -TERM <pid>
    python examples/preemption.py restore --state DIR

Signal handlers only set a flag: the rollout loop acts on it between steps, never in the middle
of a request.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional

import warren
from warren import trajectory

# A rollout's steps: each gives a different answer every time it really runs.
STEPS = [
    "date +%s%N > stamp; cat stamp",
    "c=$(cat n 2>/dev/null || echo 0); echo $((c+1)) > n; cat n",
    "head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo",
    "c=$(cat n); echo $((c+1)) > n; cat n",
    "date +%s%N >> stamp; wc -l < stamp",
    "c=$(cat n); echo $((c+1)) > n; cat n",
]

pending: List[int] = []  # signals received, handled by the loop


def on_signal(signum: int, frame: object) -> None:
    pending.append(signum)


def step(sb: warren.Sandbox, i: int) -> warren.ExecResult:
    r = sb.exec(STEPS[i])
    tag = "replayed" if r.replayed else ("live, replay ended" if r.replay_ended else "live")
    print(f"  {sb.id} step {i}: {r.stdout.strip():<22} ({tag})")
    return r


def handle_signals(
    client: warren.Client, task: str, sbs: List[warren.Sandbox], state: Path, pause_seconds: float
) -> bool:
    """Acts on the signals received; True when the program should stop."""
    while pending:
        signum = pending.pop(0)
        if signum == signal.SIGUSR1:
            r = client.tasks.pause(task)
            print(
                f"SIGUSR1: paused task {task} ({r.succeeded} sandboxes); "
                f"resuming in {pause_seconds:g} s"
            )
            time.sleep(pause_seconds)
            r = client.tasks.resume(task)
            print(f"resumed task {task} ({r.succeeded} sandboxes)")
        elif signum == signal.SIGTERM:
            r = client.tasks.pause(task)
            print(f"SIGTERM: paused task {task} ({r.succeeded} sandboxes); saving trajectories")
            save(sbs, task, state)
            return True
    return False


def save(sbs: List[warren.Sandbox], task: str, state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    rollouts: List[Dict[str, str]] = []
    for n, sb in enumerate(sbs):
        path = state / f"rollout-{n}.jsonl"
        trajectory.save(sb.trajectory(), path)
        rollouts.append({"sandbox": sb.id, "log": path.name})
    (state / "index.json").write_text(json.dumps({"task": task, "rollouts": rollouts}, indent=2))
    print(f"saved {len(sbs)} trajectories in {state}")


def run(
    client: warren.Client,
    state: Path,
    rollouts: int,
    stop_after: Optional[int],
    pause_seconds: float,
    demo: bool,
) -> None:
    """Rollouts until done or told to stop; in demo mode it signals itself along the way."""
    task = f"preemptible-{secrets.token_hex(3)}"
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    sbs = [
        client.containers.create(image="host", task=task, memory="128Mi", trajectory=True)
        for _ in range(rollouts)
    ]
    print(f"task {task}: {rollouts} sandboxes recording their trajectories (pid {os.getpid()})")
    for i in range(len(STEPS)):
        for sb in sbs:
            step(sb, i)
        if demo and i == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        if demo and stop_after is not None and i + 1 == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)
        if not demo:
            time.sleep(1)  # room to send signals by hand
        if handle_signals(client, task, sbs, state, pause_seconds):
            print(
                f"stopping after step {i}; restart with: {Path(__file__).name} restore "
                f"--state {state}"
            )
            return
    print("all steps done")
    client.tasks.stop(task)


def restore(client: warren.Client, state: Path) -> None:
    """After a restart: replay every saved rollout into a new sandbox and carry on."""
    index = json.loads((state / "index.json").read_text())
    old_task = index["task"]
    task = f"{old_task}-restored"
    restored = []
    for r in index["rollouts"]:
        log = trajectory.load(state / r["log"])
        t0 = time.perf_counter()
        sb = client.containers.replay(log, image="host", task=task, memory="128Mi")
        print(
            f"replayed {len(log)} operations of {r['sandbox']} into {sb.id} "
            f"in {time.perf_counter() - t0:.2f} s"
        )
        restored.append((sb, log))
    # The old sandboxes may still be paused there (or gone with their machine): let them go.
    client.tasks.stop(old_task)
    # The restarted rollouts run their steps from the beginning: the recorded prefix is answered
    # from the log, exactly as before; the rest runs live.
    for i in range(len(STEPS)):
        for sb, log in restored:
            r = step(sb, i)
            if i < len(log):
                recorded = log[i]["result"]["stdout"]
                assert r.replayed and r.stdout == recorded, (r, recorded)
    client.tasks.stop(task)
    print("restored rollouts finished; task stopped")


def main() -> None:
    p = argparse.ArgumentParser(description="Pause on SIGTERM/SIGUSR1, replay after a restart.")
    p.add_argument("mode", choices=["demo", "run", "restore"], nargs="?", default="demo")
    p.add_argument("--state", type=Path, default=None, help="where trajectories are saved")
    p.add_argument("--rollouts", type=int, default=3)
    p.add_argument("--pause-seconds", type=float, default=1.0)
    args = p.parse_args()
    state = args.state or Path(f"/tmp/warren-preemption-{os.getuid()}")
    with warren.Client() as client:
        if args.mode == "restore":
            restore(client, state)
        elif args.mode == "run":
            run(client, state, args.rollouts, None, args.pause_seconds, demo=False)
        else:
            run(client, state, args.rollouts, 3, args.pause_seconds, demo=True)
            print("--- the trainer restarts ---")
            restore(client, state)


if __name__ == "__main__":
    try:
        main()
    except warren.Unavailable as e:
        raise SystemExit(f"preemption: {e}") from None

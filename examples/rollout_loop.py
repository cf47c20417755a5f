#!/usr/bin/env python3
"""An RL rollout loop on Warren: one sandbox per episode, agent steps, grading, kill.

Each episode gets a fresh sandbox holding a tiny repository with a failing test. The "agent"
(a random policy standing in for a model) reads the code, proposes patches and runs the tests
until they pass or it runs out of steps; the grader then runs the tests once more in the same
sandbox and the episode's reward is 1 or 0. Episodes run concurrently from one asyncio process,
as a trainer's rollout workers would.

    make up                                   # in another terminal
    pip install ./sdk/python
    python examples/rollout_loop.py --episodes 16 --concurrency 8

WARREN_URL / WARREN_API_KEY point it elsewhere (defaults: `make up`'s address and key file).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import time
from dataclasses import dataclass
from typing import List

import warren

MODULE = '''def total(xs):
    """The sum of a list of numbers."""
    s = 0
    for x in xs[1:]:
        s += x
    return s
'''

TESTS = """import unittest
from mathlib import total

class TotalTest(unittest.TestCase):
    def test_total(self):
        self.assertEqual(total([1, 2, 3]), 6)
        self.assertEqual(total([]), 0)

if __name__ == "__main__":
    unittest.main()
"""

# What the stand-in policy may propose: one right fix, several wrong ones.
PATCHES = [
    MODULE.replace("xs[1:]", "xs"),  # right
    MODULE.replace("s = 0", "s = 1"),  # wrong
    MODULE.replace("xs[1:]", "xs[:-1]"),  # wrong
    MODULE.replace("s += x", "s = x"),  # wrong
]


@dataclass
class Episode:
    index: int
    sandbox: str
    steps: int
    reward: float
    seconds: float


def policy(observation: str, rng: random.Random) -> str:
    """A stand-in for the model: look at the test output, pick a patch."""
    del observation  # a real agent would condition on it
    return rng.choice(PATCHES)


async def run_episode(
    client: warren.AsyncClient, task: str, index: int, max_steps: int, seed: int
) -> Episode:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    # One sandbox per episode, killed when the block ends (also on an exception).
    async with await client.containers.create(
        image="host",
        task=task,
        memory="256Mi",
        timeout=900,
        idle_timeout=300,
        labels={"episode": str(index)},
    ) as sb:
        # Environment reset: the repository the agent works on.
        await sb.files.write("repo/mathlib.py", MODULE)
        await sb.files.write("repo/test_mathlib.py", TESTS)

        observation = (await sb.exec("cat mathlib.py", cwd="repo")).stdout
        steps = 0
        while steps < max_steps:
            steps += 1
            # Agent step: act (edit a file), then observe (run the tests).
            await sb.files.write("repo/mathlib.py", policy(observation, rng))
            r = await sb.exec(
                ["python3", "-m", "unittest", "-q", "test_mathlib"], cwd="repo", timeout=60
            )
            observation = r.stderr + r.stdout
            if r.ok:
                break

        # Grading, in the same sandbox, from the grader's own copy of the tests.
        await sb.files.write("/tmp/grader/test_mathlib.py", TESTS)
        graded = await sb.exec(
            "cp /tmp/grader/test_mathlib.py . && python3 -m unittest -q test_mathlib",
            cwd="repo",
            timeout=60,
        )
        return Episode(index, sb.id, steps, 1.0 if graded.ok else 0.0, time.perf_counter() - t0)


async def main(args: argparse.Namespace) -> None:
    task = f"rollouts-{secrets.token_hex(3)}"
    limit = asyncio.Semaphore(args.concurrency)

    async with warren.AsyncClient() as client:

        async def worker(i: int) -> Episode:
            async with limit:
                return await run_episode(client, task, i, args.max_steps, args.seed + i)

        t0 = time.perf_counter()
        try:
            episodes: List[Episode] = await asyncio.gather(
                *[worker(i) for i in range(args.episodes)]
            )
        finally:
            # Whatever happened, leave nothing running: one call for the whole task.
            await client.tasks.stop(task)
        wall = time.perf_counter() - t0

    for e in episodes:
        print(
            f"episode {e.index:3d}  sandbox {e.sandbox}  steps {e.steps}  "
            f"reward {e.reward:.0f}  {e.seconds:.2f} s"
        )
    mean = sum(e.reward for e in episodes) / len(episodes)
    print(f"{len(episodes)} episodes in {wall:.1f} s, mean reward {mean:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="An RL rollout loop on Warren sandboxes.")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    try:
        asyncio.run(main(p.parse_args()))
    except warren.Unavailable as e:
        raise SystemExit(f"rollout_loop: {e}") from None

"""Exec round trip through the E2B gateway against Warren's own API, in one run.

Starts its own `warren up` (as the tests do: own data dir, ports, cgroup parent; run it with
sdk/e2b/run-tests.sh's environment, or as root in a network namespace of your own), then, on
one sandbox each, times N runs of `true` one at a time, the two arms alternated in rounds:

- e2b: `Sandbox.commands.run("true")` through the gateway (bash -l -c, a Connect stream);
- warren: Warren's Python SDK `sandbox.exec(["/bin/bash", "-l", "-c", "true"])` on the REST API,
  the same command line.

Prints a Markdown table of p50/p99 and the ratio of medians (the issue's goal: at most 1.3x).

    # as root, in a network namespace of its own, with a venv holding e2b, pytest and sdk/python:
    ip netns add b; ip -n b link set lo up
    nsenter --net=/run/netns/b VENV/bin/python sdk/e2b/bench/exec_latency.py [N]; ip netns del b
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import conftest  # noqa: E402  (the tests' server start)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    gw = conftest.start_gateway()
    try:
        from e2b import Sandbox
        import warren

        e2b_sb = Sandbox.create("base", timeout=600)
        client = warren.Client(gw.warren_url, gw.admin_key)
        w_sb = client.containers.create(image="host", timeout=600)
        arms = {
            "e2b SDK through the gateway": lambda: e2b_sb.commands.run("true"),
            "Warren's Python SDK on its REST API": lambda: w_sb.exec(["/bin/bash", "-l", "-c", "true"]),
        }
        times = {k: [] for k in arms}
        for f in arms.values():
            for _ in range(20):
                f()
        rounds = 10
        for _ in range(rounds):
            for k, f in arms.items():
                for _ in range(n // rounds):
                    t = time.perf_counter()
                    f()
                    times[k].append((time.perf_counter() - t) * 1000)
        print(f"Exec round trip of `true` (bash -l -c), one at a time, {n} each, arms alternated:\n")
        print("| path | p50 | p99 |\n|---|---|---|")
        for k, xs in times.items():
            print(f"| {k} | {statistics.median(xs):.2f} ms | {pct(xs, 99):.2f} ms |")
        a, b = (statistics.median(v) for v in times.values())
        print(f"\nThrough the gateway: {a / b:.2f}x Warren's own API at the median (goal <= 1.3x).")
        e2b_sb.kill()
        w_sb.kill()
    finally:
        gw.stop()


if __name__ == "__main__":
    main()

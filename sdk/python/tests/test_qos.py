"""Requests and limits, QoS classes, whose fault an error is, and what pausing frees."""

from __future__ import annotations

import warren


def test_requests_limits_and_class_round_trip(client: warren.Client):
    with client.containers.create(
        image="host",
        cpu=250,
        cpu_limit=1000,
        memory="128Mi",
        memory_limit="512Mi",
        qos="ls",
        task="pytest-qos",
    ) as sb:
        r = sb.last_info.resources
        assert (r.cpu, r.cpu_limit, r.memory, r.memory_limit, r.qos) == (
            250,
            1000,
            128 << 20,
            512 << 20,
            "ls",
        )
    # The defaults serve RL: a small request, a generous limit, best-effort.
    with client.containers.create(image="host") as sb:
        r = sb.info().resources
        assert r.qos == "be" and r.cpu == 10 and r.memory == 64 << 20
        assert r.memory_limit >= r.memory and r.cpu_limit >= 10


def test_the_sdk_refuses_an_unknown_class_before_asking():
    with warren.Client("http://127.0.0.1:9", "wk_x", max_retries=0) as c:
        try:
            c.containers.create(image="host", qos="gold")
        except warren.InvalidArgument as e:
            assert "qos" in e.message and e.fault == "request"
        else:
            raise AssertionError("qos='gold' was sent")


def test_nodes_report_requests_use_and_kernel_support(client: warren.Client):
    with client.containers.create(image="host", cpu=100, qos="ls"):
        n = client.nodes()[0]
        assert n.cpu_requested >= 100 and n.cpu_allocatable == n.cpu_cores * 8000
        assert n.memory_total > 0
        assert n.qos is not None
        assert set(n.qos) >= {"cpu_idle", "smt", "core_scheduling", "psi", "memory_reclaim"}
        # The create queue: creates starting out of the start slots, waiting, the longest wait.
        assert n.create_slots >= 1 and n.creates_starting <= n.create_slots
        assert n.creates_waiting >= 0 and n.create_wait_ms >= 0


def test_exec_results_say_when_the_agent_failed(sandbox: warren.Sandbox):
    assert sandbox.exec("true").fault is None
    assert sandbox.exec("exit 3").fault == "agent"
    assert sandbox.exec("sleep 5", timeout=0.5).fault == "agent"


def test_pausing_a_task_says_what_it_freed(client: warren.Client):
    with client.containers.create(image="host", task="pytest-reclaim") as sb:
        sb.exec("head -c 33554432 /dev/urandom > $HOME/f && sync && cat $HOME/f >/dev/null")
        r = client.tasks.pause("pytest-reclaim")
        assert r.succeeded == 1 and r.memory_freed is not None
        assert r.memory_freed >= 16 << 20, r
        assert client.tasks.resume("pytest-reclaim").memory_freed is None
        assert sb.exec("wc -c < $HOME/f").stdout.strip() == "33554432"

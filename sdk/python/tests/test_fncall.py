"""Function calls through the Python SDK, and SandboxFusion's `/run_code` through the public
`sandbox-fusion` client package, unmodified: verl and other frameworks that call SandboxFusion
point at Warren by changing one URL."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import pytest

import warren

from .conftest import Server


def test_a_program_runs_once_and_says_how_it_ended(client: warren.Client) -> None:
    r = client.fncall.run(language="python", code="print(int(input()) * 2)", stdin="21\n")
    assert r.ok and r.stdout == "42\n", r
    assert r.run is not None and r.run.exit_code == 0 and r.run.peak_memory > 0
    r = client.fncall.run(
        language="c",
        code='#include <stdio.h>\nint main(){FILE*f=fopen("out.txt","w");fputs("hi",f);return 0;}',
        fetch_files=["out.txt", "nope.txt"],
    )
    assert r.ok and r.compile is not None, r
    assert r.files == {"out.txt": b"hi"} and "nope.txt" in r.missing_files
    r = client.fncall.run(language="python", code="while True: pass", timeout=0.3)
    assert r.status == "timeout", r
    r = client.fncall.run(language="c", code="int main( {")
    assert r.status == "compile_error" and r.run is None, r
    with pytest.raises(warren.InvalidArgument):
        client.fncall.run(language="cobol", code="x")
    # The node reports the pool the calls ran on.
    (node,) = client.nodes()
    pools = [p for p in node.fncall_pools if p["image"] == "host"]
    assert pools and sum(p["calls"] for p in pools) >= 4, node.fncall_pools
    assert all(p["busy"] == 0 and p["keep"] >= 8 for p in pools), pools
    # The node's FnCall budget, and nothing held once the calls are done.
    assert node.fncall_budget > 0 and node.fncall_held == 0, node
    # A call may bound how long it waits for a worker; a bad bound is refused here.
    r = client.fncall.run(language="bash", code="echo waited", queue_timeout=30)
    assert r.ok and r.stdout == "waited\n", r
    with pytest.raises(warren.InvalidArgument):
        client.fncall.run(language="bash", code="echo", queue_timeout=-1)


def test_a_batch_judges_every_case(client: warren.Client) -> None:
    r = client.fncall.batch(
        language="python",
        code="print(int(input()) ** 2)",
        cases=[("2", "4"), ("3", "9\n"), ("4", "17"), {"stdin": "5", "expected": None}],
        checker="whitespace",
    )
    assert r.status == "ok" and r.passed == 2, r
    assert [c.passed for c in r.cases] == [True, True, False, None]
    assert r.cases[3].run.stdout == "25\n"


def test_the_async_client_runs_calls_side_by_side(server: Server) -> None:
    async def main() -> list:
        async with server.aclient() as c:
            return await asyncio.gather(
                *(c.fncall.run(language="bash", code=f"echo {i}") for i in range(6))
            )

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]


def _with_key(url: str, key: str) -> str:
    """`http://fncall:KEY@host:port`: HTTP Basic credentials, the only way the
    `sandbox-fusion` client can carry a key."""
    u = urlsplit(url)
    return urlunsplit((u.scheme, f"fncall:{key}@{u.netloc}", u.path, "", ""))


def test_the_sandbox_fusion_client_runs_against_warren(server: Server) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code, run_code_async, set_endpoint

    set_endpoint(_with_key(server.url, server.key))
    r = run_code(
        RunCodeRequest(code="print(input()[::-1])", language="python", stdin="abc\n"),
        max_attempts=1,
        client_timeout=120,
    )
    assert r.status == RunStatus.Success, r
    assert r.run_result.stdout == "cba\n" and r.run_result.return_code == 0
    assert r.compile_result is None
    # SandboxFusion's language names: cpp, nodejs; its compile step and its failure.
    r = run_code(
        RunCodeRequest(code="#include <cstdio>\nint main(){puts(\"ok\");}", language="cpp"),
        max_attempts=1,
    )
    assert r.status == RunStatus.Success and r.compile_result.return_code == 0, r
    assert r.run_result.stdout == "ok\n"
    r = run_code(RunCodeRequest(code="console.log(6*7)", language="nodejs"), max_attempts=1)
    assert r.run_result.stdout == "42\n", r
    r = run_code(RunCodeRequest(code="int main( {", language="cpp"), max_attempts=1)
    assert r.status == RunStatus.Failed and r.run_result is None, r
    assert r.compile_result.return_code != 0 and r.compile_result.stderr
    r = run_code(
        RunCodeRequest(code="import time; time.sleep(10)", language="python", run_timeout=0.5),
        max_attempts=1,
    )
    assert r.status == RunStatus.Failed, r
    assert r.run_result.status.value == "TimeLimitExceeded" and r.run_result.return_code is None
    r = run_code(
        RunCodeRequest(code="import sys; sys.exit(3)", language="python"), max_attempts=1
    )
    assert r.status == RunStatus.Failed and r.run_result.return_code == 3, r
    # Files in and out, as base64.
    import base64

    r = run_code(
        RunCodeRequest(
            code="open('b.txt','w').write(open('a.txt').read() * 2)",
            language="python",
            files={"a.txt": base64.b64encode(b"xy").decode()},
            fetch_files=["b.txt"],
        ),
        max_attempts=1,
    )
    assert base64.b64decode(r.files["b.txt"]) == b"xyxy", r
    # The async client too.
    r = asyncio.run(
        run_code_async(RunCodeRequest(code="echo hi", language="bash"), max_attempts=1)
    )
    assert r.run_result.stdout == "hi\n", r
    # No key, or a wrong one: refused (the client raises after its one attempt).
    set_endpoint(server.url)
    with pytest.raises(Exception, match="401"):
        run_code(RunCodeRequest(code="print(1)", language="python"), max_attempts=1)
    set_endpoint(_with_key(server.url, "wrn_" + "0" * 32))
    with pytest.raises(Exception, match="401"):
        run_code(RunCodeRequest(code="print(1)", language="python"), max_attempts=1)


def test_a_burst_larger_than_the_pool_is_answered_success_without_retries(server: Server) -> None:
    """verl's reward path: many calls at once through the unmodified client, each sent once
    (``max_attempts=1``: a 429 would be a wrong answer to it). Calls past the node's idle
    workers and its FnCall budget wait for a worker; every one is a Success."""
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code_async, set_endpoint

    set_endpoint(_with_key(server.url, server.key))

    async def main() -> list:
        return await asyncio.gather(
            *[
                run_code_async(
                    RunCodeRequest(code=f"print({i} * 3)", language="python"),
                    max_attempts=1,
                    client_timeout=120,
                )
                for i in range(120)
            ],
            return_exceptions=True,
        )

    results = asyncio.run(main())
    bad = [
        (i, r)
        for i, r in enumerate(results)
        if isinstance(r, BaseException)
        or r.status != RunStatus.Success
        or r.run_result.stdout != f"{i * 3}\n"
    ]
    assert not bad, f"{len(bad)} of 120 not a Success; first: {bad[0]}"


def test_verls_request_shape_is_answered(server: Server) -> None:
    """What verl's reward path posts (`memory_limit_MB`, ints for timeouts, a Bearer-less
    JSON body with the key in Basic credentials) and the fields it reads."""
    import httpx

    body = {
        "compile_timeout": 10,
        "run_timeout": 10,
        "code": "print(sum(map(int, input().split())))",
        "stdin": "1 2 3",
        "memory_limit_MB": 1024,
        "language": "python",
        "files": {},
        "fetch_files": [],
    }
    u = urlsplit(server.url)
    r = httpx.post(
        f"{server.url}/run_code",
        json=body,
        auth=("fncall", server.key),
        headers={"Accept": "application/json"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["status"] == "Success" and j["message"] == "" and u.netloc
    assert j["run_result"]["status"] == "Finished"
    assert j["run_result"]["stdout"].rstrip("\n") == "6"
    assert isinstance(j["run_result"]["stderr"], str)
    assert isinstance(j["run_result"]["execution_time"], float)

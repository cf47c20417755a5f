"""Sandbox networks through the SDK: the default (an interface, everything denied), loopback only,
run-time policy changes for a sandbox and a task, the server's refusals, refused connections as
events, exposed ports (the node's host ports, the control plane's TCP streams and its
`<port>-<id>.sb.test` host route); and what the SDK checks itself before any request.

The node's sandbox network needs a network namespace of the tests' own: run-tests.sh makes one.
Nothing here leaves the node: every destination is the node's gateway, a documentation range
(198.51.100.0/24) that no policy change here connects to, or, for exposed ports, 127.0.0.1 of
the tests' own namespace.
"""

from __future__ import annotations

import asyncio
import time
from typing import Iterator, List

import httpx
import pytest

import warren
from warren import NetRule, NetworkPolicy, _ops
from warren import _validate as v

from .conftest import SANDBOX_DOMAIN, Server, start_server, why_no_server

NOWHERE = "http://127.0.0.1:1"
DOC = "198.51.100.0/24"


@pytest.fixture
def net(server: Server) -> Server:
    """The session's node, when it has the sandbox network."""
    if not server.network:
        pytest.skip(
            "the node has no sandbox network: these tests run only in a network namespace of "
            "their own (sdk/python/run-tests.sh makes one)"
        )
    return server


@pytest.fixture
def nclient(net: Server) -> Iterator[warren.Client]:
    with net.client() as c:
        yield c


def _connect(gateway: str, port: int) -> str:
    """Python for the sandbox: one TCP connection, what became of it and how long it took."""
    return (
        "import socket, time\n"
        "t = time.monotonic()\n"
        "try:\n"
        f"    socket.create_connection(('{gateway}', {port}), 2); print('connected')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except OSError as e: print(type(e).__name__)\n"
        "print(round(time.monotonic() - t, 3))\n"
    )


def _network_events(
    c: warren.Client, sid: str, ok, timeout: float = 5.0
) -> List[warren.IncidentEvent]:
    # Refused attempts are gathered for a fraction of a second before they are stored.
    deadline = time.monotonic() + timeout
    while True:
        evs = c.events.list(sandbox=sid, kind="network")
        if ok(evs) or time.monotonic() > deadline:
            return list(evs)
        time.sleep(0.2)


# Against the node.


def test_default_network_is_filtered_with_an_interface(nclient: warren.Client):
    with nclient.containers.create(image="host", memory="64Mi") as sb:
        st = sb.last_info.network
        assert isinstance(st, warren.NetworkStatus)
        assert st.mode == "filtered" and st.allow == [] and st.deny == []
        assert st.ipv4 and st.gateway and st.ipv4 != st.gateway
        assert sb.network.get() == st
        assert sb.info().network == st
        (listed,) = [s for s in nclient.sandboxes.list() if s.id == sb.id]
        assert listed.network == st
        # The interface is there, beside loopback.
        ifs = sb.exec("ls /sys/class/net").stdout.split()
        assert "lo" in ifs and len(ifs) == 2, ifs


def test_none_is_loopback_only(nclient: warren.Client):
    for given in (NetworkPolicy.none(), "none", {"mode": "none"}):
        with nclient.containers.create(image="host", memory="64Mi", network=given) as sb:
            st = sb.last_info.network
            assert st is not None and st.mode == "none", given
            assert (st.ipv4, st.ipv6, st.gateway) == (None, None, None)
            assert sb.network.get().mode == "none"
            assert sb.exec("ls /sys/class/net").stdout.split() == ["lo"]


def test_create_with_rules_and_update_then_get(nclient: warren.Client):
    setup = NetworkPolicy(allow_domains=["pypi.org", "*.pythonhosted.org"])
    with nclient.containers.create(image="host", memory="64Mi", network=setup) as sb:
        assert sb.last_info.network.allow == [
            NetRule(domain="pypi.org"),
            NetRule(domain="*.pythonhosted.org"),
        ]
        policy = NetworkPolicy(
            allow_cidrs=[DOC], allow_ports=["53/udp"], deny_cidrs=["198.51.100.7"]
        )
        st = sb.network.update(policy)
        assert st.mode == "filtered" and st.gateway == sb.last_info.network.gateway
        want_allow = [NetRule(cidr=DOC), NetRule(ports="53", protocol="udp")]
        assert st.allow == want_allow and st.deny == [NetRule(cidr="198.51.100.7")]
        got = sb.network.get()
        assert got == st and got.policy == policy
        # A dict of the API's fields does the same; a port given as an int goes as a string.
        st = sb.network.update({"allow": [{"cidr": DOC, "ports": 443, "protocol": "tcp"}]})
        assert st.allow == [NetRule(cidr=DOC, ports="443", protocol="tcp")] and st.deny == []
        # The whole policy is replaced: no rules, everything denied again.
        assert sb.network.update(NetworkPolicy()).allow == []
        assert sb.network.get().allow == []
        # `none` on a sandbox with an interface: everything denied, the interface kept.
        st = sb.network.update(NetworkPolicy.none())
        assert st.mode == "none" and st.ipv4 == sb.last_info.network.ipv4
        assert sb.network.update(NetworkPolicy(allow_cidrs=[DOC])).allow == [NetRule(cidr=DOC)]


def test_an_invalid_rule_is_the_servers_invalid_argument(nclient: warren.Client):
    with nclient.containers.create(
        image="host", memory="64Mi", network=NetworkPolicy(allow_cidrs=[DOC])
    ) as sb:
        with pytest.raises(warren.InvalidArgument) as e:
            sb.network.update(NetworkPolicy(allow_cidrs=["10.0.0.1/8"]))
        err = e.value
        assert (err.code, err.status) == ("invalid_argument", 400)
        assert "allow[0]" in err.message and "did you mean 10.0.0.0/8" in err.message, err
        # Refused as a whole: the policy it had is kept.
        assert sb.network.get().allow == [NetRule(cidr=DOC)]
        gw = sb.last_info.network.gateway
        with pytest.raises(warren.InvalidArgument, match="no sandbox on this node may reach"):
            sb.network.update(NetworkPolicy(allow_cidrs=[f"{gw}/32"]))
    # At create: refused, and no sandbox made.
    labels = {"pytest": "network-refused"}
    with pytest.raises(warren.InvalidArgument, match=r"deny\[0\].*did you mean 10\.0\.0\.0/8"):
        nclient.containers.create(
            image="host", labels=labels, network=NetworkPolicy(deny_cidrs=["10.0.0.1/8"])
        )
    assert nclient.sandboxes.list(labels=labels) == []


def test_a_loopback_only_sandbox_takes_no_filtered_policy(nclient: warren.Client):
    with nclient.containers.create(image="host", memory="64Mi", network="none") as sb:
        for policy in (NetworkPolicy(allow_cidrs=[DOC]), NetworkPolicy()):
            with pytest.raises(warren.InvalidArgument) as e:
                sb.network.update(policy)
            assert e.value.status == 400 and "no network interface" in e.value.message
        assert sb.network.get().mode == "none"
        # Loopback only is what it has: asking for that is fine.
        assert sb.network.update(NetworkPolicy.none()).mode == "none"


def test_task_set_network(nclient: warren.Client):
    task = "pytest-network-task"
    setup = NetworkPolicy(allow_cidrs=[DOC])
    outsider = nclient.containers.create(image="host", memory="64Mi", network=setup)
    try:
        a = nclient.containers.create(image="host", task=task, memory="64Mi", network=setup)
        b = nclient.containers.create(image="host", task=task, memory="64Mi")
        lo = nclient.containers.create(image="host", task=task, memory="64Mi", network="none")

        # The agent phase: nothing reachable for the whole task, in one request (the
        # loopback-only sandbox takes `none` as it is).
        r = nclient.tasks.set_network(task, NetworkPolicy.none())
        assert isinstance(r, warren.TaskNetworkResult)
        assert (r.task, r.succeeded, r.unreachable, r.failed) == (task, 3, [], [])
        assert r.ok
        for sb in (a, b):
            st = sb.network.get()
            assert (st.mode, st.allow) == ("none", []), sb
        # The sandbox outside the task kept its own policy.
        assert outsider.network.get().allow == [NetRule(cidr=DOC)]

        # A policy with rules: the loopback-only sandbox has no interface to filter.
        phase = NetworkPolicy(allow_cidrs=[DOC], allow_ports=[443])
        r = nclient.tasks.set_network(task, phase)
        assert r.succeeded == 2 and [f.id for f in r.failed] == [lo.id] and not r.ok
        assert r.failed[0].error.code == "invalid_argument"
        assert "no network interface" in r.failed[0].error.message
        for sb in (a, b):
            assert sb.network.get().allow == [NetRule(cidr=DOC), NetRule(ports="443")]

        with pytest.raises(warren.InvalidArgument, match=r"allow\[0\].*did you mean"):
            nclient.tasks.set_network(task, NetworkPolicy(allow_cidrs=["10.0.0.1/8"]))
        r = nclient.tasks.set_network("pytest-network-no-such-task", NetworkPolicy.none())
        assert (r.succeeded, r.failed) == (0, [])
    finally:
        nclient.tasks.stop(task)
        outsider.kill()


def test_a_refused_connection_is_a_network_event(nclient: warren.Client):
    task = "pytest-network-events"
    with nclient.containers.create(image="host", task=task, memory="64Mi") as sb:
        gw = sb.last_info.network.gateway

        def at_gw(evs):
            return [e for e in evs if e.network and e.network.destination == gw]

        assert at_gw(nclient.events.list(sandbox=sb.id, kind="network")) == []

        r = sb.exec(["python3", "-c", _connect(gw, 22)])
        outcome, took = r.stdout.split()
        # A reset from the node, not a connection that hangs until its timeout (2 s).
        assert outcome == "refused" and float(took) < 1.0, (r.stdout, r.stderr)

        (e,) = at_gw(_network_events(nclient, sb.id, at_gw))
        assert isinstance(e.network, warren.NetEvent)
        assert (e.kind, e.sandbox, e.task) == ("network", sb.id, task)
        assert (e.network.protocol, e.network.ports, e.network.port_count) == ("tcp", "22", 1)
        assert e.network.domain is None and e.count >= 1


async def test_async_update_get_and_set_network(net: Server):
    task = "pytest-network-async"
    async with net.aclient() as c:
        try:
            sbs = await asyncio.gather(
                c.containers.create(image="host", task=task, memory="64Mi"),
                c.containers.create(
                    image="host", task=task, memory="64Mi", network={"allow": [{"cidr": DOC}]}
                ),
                c.containers.create(image="host", task=task, memory="64Mi", network="none"),
            )
            a, b, lo = sbs
            assert isinstance(a.network, warren.async_sandbox.AsyncNetwork)
            assert (await b.network.get()).allow == [NetRule(cidr=DOC)]
            st = await a.network.update(NetworkPolicy(allow_ports=["8000-8100/tcp"]))
            assert st.allow == [NetRule(ports="8000-8100", protocol="tcp")]
            assert await a.network.get() == st
            with pytest.raises(warren.InvalidArgument, match="did you mean 10.0.0.0/8"):
                await a.network.update(NetworkPolicy(deny_cidrs=["10.0.0.1/8"]))
            with pytest.raises(warren.InvalidArgument, match="no network interface"):
                await lo.network.update(NetworkPolicy(allow_cidrs=[DOC]))

            r = await c.tasks.set_network(task, NetworkPolicy.none())
            assert (r.task, r.succeeded, r.failed) == (task, 3, [])
            for sb in (a, b):
                assert (await sb.network.get()).mode == "none"
        finally:
            await c.tasks.stop(task)


# Exposed ports: from the node's host, through the control plane, and the host route.


def _http_server(port: int) -> List[str]:
    """An HTTP server on ``port`` of every address of the sandbox (its home's listing)."""
    return ["python3", "-m", "http.server", str(port), "--bind", "0.0.0.0"]


def _wait_for(port: int) -> List[str]:
    """Prints ``up`` once something in the sandbox accepts connections on ``port``."""
    return [
        "python3",
        "-c",
        "import socket, time\n"
        "for _ in range(100):\n"
        f"    try: socket.create_connection(('127.0.0.1', {port}), 1); print('up'); break\n"
        "    except OSError: time.sleep(0.1)\n",
    ]


def _serve_http(sb: warren.Sandbox, port: int) -> None:
    sb.processes.start(_http_server(port))
    r = sb.exec(_wait_for(port))
    assert r.stdout.strip() == "up", (r.stdout, r.stderr)


def _status(url: str, **kw) -> int:
    return httpx.get(url, timeout=10, **kw).status_code


def _http_through(stream) -> bytes:
    stream.settimeout(10)
    stream.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    return b"".join(iter(lambda: stream.recv(4096), b""))


def test_an_exposed_port_is_reachable_from_the_nodes_host(nclient: warren.Client):
    with nclient.containers.create(image="host", memory="64Mi", expose=[8000]) as sb:
        st = sb.last_info.network
        (e,) = st.exposed
        assert isinstance(e, warren.ExposedPort) and e.port == 8000
        # The node's expose_address (loopback by default) and a port of its expose_ports.
        addr, host_port = e.host.rsplit(":", 1)
        assert addr == "127.0.0.1" and 28000 <= int(host_port) <= 29999, e
        assert st.policy == NetworkPolicy(expose=[8000]) and sb.network.get() == st
        _serve_http(sb, 8000)
        assert _status(f"http://{e.host}/") == 200

        # A TCP stream through the control plane, on the API's address.
        with sb.connect_port(8000) as s:
            assert isinstance(s, warren.PortStream)
            assert _http_through(s).startswith(b"HTTP/1.0 200 ")
        assert s.closed
        with pytest.raises(warren.Unavailable, match="closed"):
            s.recv()
        with pytest.raises(warren.NotFound, match="not exposed"):
            sb.connect_port(8001)

        # Unexposed: the host port closes at once.
        st = sb.network.expose([])
        assert st.exposed == [] and st.policy == NetworkPolicy()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{e.host}/", timeout=10)
        with pytest.raises(warren.NotFound, match="not exposed"):
            sb.connect_port(8000)


def test_expose_keeps_the_rest_of_the_policy(nclient: warren.Client):
    setup = NetworkPolicy(allow_cidrs=[DOC], deny_ports=[25])
    with nclient.containers.create(image="host", memory="64Mi", network=setup) as sb:
        assert sb.last_info.network.exposed == []
        st = sb.network.expose([8002, 8000, 8002])
        assert [e.port for e in st.exposed] == [8000, 8002]
        assert len({e.host for e in st.exposed}) == 2
        assert st.allow == [NetRule(cidr=DOC)] and st.deny == [NetRule(ports="25")]
        assert st.policy == NetworkPolicy(allow_cidrs=[DOC], deny_ports=[25], expose=[8000, 8002])
        # An update without expose unexposes, as it replaces the whole policy.
        assert sb.network.update(setup).exposed == []
    # A policy's own expose and create's are joined.
    policy = NetworkPolicy(allow_cidrs=[DOC], expose=[9000])
    with nclient.containers.create(
        image="host", memory="64Mi", network=policy, expose=[8000]
    ) as sb:
        assert [e.port for e in sb.last_info.network.exposed] == [8000, 9000]


def test_the_host_route_reaches_an_exposed_port(net: Server):
    with net.client() as c:
        assert c.health().sandbox_domain == SANDBOX_DOMAIN
        with c.containers.create(image="host", memory="64Mi", expose=[8000]) as sb:
            host = sb.get_host(8000)
            assert host == f"8000-{sb.id}.{SANDBOX_DOMAIN}"
            assert c._t.sandbox_domain == SANDBOX_DOMAIN  # asked once, then kept
            _serve_http(sb, 8000)
            # To the control plane's address, with that Host; no API key needed.
            assert _status(net.url + "/", headers={"Host": host}) == 200
            # A port it does not expose: the route has no such port.
            assert _status(net.url + "/", headers={"Host": sb.get_host(8001)}) == 404
            # A paused sandbox (its task preempted, say) is not thawed by whoever knows its
            # address: 409, and it stays paused; an authenticated stream resumes it.
            sb.pause()
            assert _status(net.url + "/", headers={"Host": host}) == 409
            assert sb.info().state == "paused"
            sb.connect_port(8000).close()
            assert sb.info().state == "running"


def test_exposed_ports_the_server_refuses(nclient: warren.Client):
    """What the SDK refuses itself, sent as it is: the server refuses it too, with its words,
    and keeps the policy it had."""
    with nclient.containers.create(image="host", memory="64Mi", expose=[8000]) as sb:
        path = f"/v1/sandboxes/{sb.id}/network"
        for body, words in (
            ({"expose": [0]}, "port 0"),
            ({"expose": [70000]}, "expose[0]"),
            ({"expose": list(range(1, 34))}, "more than 32"),
            ({"mode": "none", "expose": [8000]}, "exposes no ports"),
        ):
            with pytest.raises(warren.InvalidArgument) as e:
                nclient._t.call(_ops.Call("PUT", path, json=body))
            assert e.value.status == 400 and words in e.value.message, e.value
        assert [x.port for x in sb.network.get().exposed] == [8000]
    # At create, a loopback-only sandbox has no interface to expose ports on.
    labels = {"pytest": "expose-refused"}
    body = {"image": "host", "labels": labels, "network": {"mode": "none", "expose": [8000]}}
    with pytest.raises(warren.InvalidArgument, match="exposes no ports"):
        nclient._t.call(_ops.Call("POST", "/v1/sandboxes", json=body))
    assert nclient.sandboxes.list(labels=labels) == []


async def test_async_expose_get_host_and_connect_port(net: Server):
    async with net.aclient() as c:
        async with await c.containers.create(image="host", memory="64Mi", expose=[8000]) as sb:
            (e,) = sb.last_info.network.exposed
            assert e.port == 8000
            assert await sb.get_host(8000) == f"8000-{sb.id}.{SANDBOX_DOMAIN}"
            await sb.processes.start(_http_server(8000))
            assert (await sb.exec(_wait_for(8000))).stdout.strip() == "up"
            async with await sb.connect_port(8000) as s:
                assert isinstance(s, warren.AsyncPortStream)
                s.settimeout(10)
                await s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                got = b""
                while chunk := await s.recv(4096):
                    got += chunk
                assert got.startswith(b"HTTP/1.0 200 "), got[:40]
            with pytest.raises(warren.NotFound, match="not exposed"):
                await sb.connect_port(8001)
            st = await sb.network.expose([])
            assert st.exposed == [] and (await sb.network.get()).exposed == []


def test_get_host_needs_a_sandbox_domain():
    why = why_no_server()
    if why:
        pytest.skip(why)
    plain = start_server()  # no [control] sandbox_domain, no sandbox network
    try:
        with plain.client() as c:
            assert c.health().sandbox_domain is None
            with c.containers.create(image="host", memory="64Mi") as sb:
                with pytest.raises(warren.NotFound) as e:
                    sb.get_host(8000)
                msg = e.value.message
                assert "[control] sandbox_domain" in msg and "network.get().exposed" in msg
                assert c._t.sandbox_domain is None
    finally:
        plain.stop()


# Without a server: what the SDK checks and how it reads answers.


@pytest.fixture
def offline() -> Iterator[warren.Client]:
    with warren.Client(NOWHERE, "k", max_retries=0) as c:
        yield c


FAKE = warren.SandboxInfo(
    id="abcdef0123456789wxyz",
    node="abcdef",
    backend="container",
    image="host",
    state="running",
    resources=warren.Resources(1000, 1 << 29, 1024),
    created_at="",
    expires_at="",
)


def _fake(c: warren.Client) -> warren.Sandbox:
    return warren.Sandbox(c._t, FAKE)


BAD = [
    (NetworkPolicy(allow=[NetRule(ports=0)]), warren.InvalidArgument, r"allow\[0\]: ports 0"),
    (NetworkPolicy(allow=[NetRule(ports="70000")]), warren.InvalidArgument, "1-65535"),
    (NetworkPolicy(deny=[NetRule(ports="10-5")]), warren.InvalidArgument, r"deny\[0\].*low-high"),
    (NetworkPolicy(allow=[NetRule(ports="http")]), warren.InvalidArgument, "ports 'http'"),
    (NetworkPolicy(allow=[NetRule(ports=1.5)]), warren.ArgumentTypeError, "ports must be"),
    (
        NetworkPolicy(allow=[NetRule(cidr=DOC, domain="pypi.org")]),
        warren.InvalidArgument,
        "cidr or a domain, not both",
    ),
    (
        NetworkPolicy(allow=[NetRule(domain="pypi.org", protocol="udp")]),
        warren.InvalidArgument,
        "TCP only",
    ),
    (NetworkPolicy(allow=[NetRule(cidr=DOC, protocol="icmp")]), warren.InvalidArgument, "tcp"),
    (NetworkPolicy(allow=[NetRule()]), warren.InvalidArgument, "needs a cidr, a domain or ports"),
    (NetworkPolicy(allow=[NetRule(cidr="")]), warren.InvalidArgument, "cidr is empty"),
    (NetworkPolicy(allow=[NetRule(domain=7)]), warren.ArgumentTypeError, "domain must be a str"),
    (NetworkPolicy("none", allow_cidrs=[DOC]), warren.InvalidArgument, "takes no rules"),
    (NetworkPolicy("open"), warren.InvalidArgument, "mode 'open'"),
    (NetworkPolicy(allow_cidrs=[DOC] * 4097), warren.InvalidArgument, "more than 4096"),
    ("internet", warren.InvalidArgument, "not 'none' or 'filtered'"),
    ({"mode": "none", "alow": []}, warren.InvalidArgument, "unknown field 'alow'"),
    ({"alow": []}, warren.InvalidArgument, "a policy has mode, allow, deny and expose"),
    (NetworkPolicy(expose=[0]), warren.InvalidArgument, "expose: port 0 is not a port"),
    (NetworkPolicy(expose=[8000, 70000]), warren.InvalidArgument, "port 70000 is not a port"),
    (NetworkPolicy(expose=range(1, 34)), warren.InvalidArgument, "33 ports is more than 32"),
    (NetworkPolicy(expose=["8000"]), warren.ArgumentTypeError, "port must be an int"),
    (NetworkPolicy("none", expose=[8000]), warren.InvalidArgument, "exposes no ports"),
    ({"mode": "none", "expose": [8000]}, warren.InvalidArgument, "exposes no ports"),
    ({"expose": 8000}, warren.ArgumentTypeError, "expose must be a list of ports"),
    ({"expose": [0]}, warren.InvalidArgument, "port 0"),
    ({"allow": [{"cidr": DOC, "port": 80}]}, warren.InvalidArgument, "unknown field 'port'"),
    ({"allow": {"cidr": DOC}}, warren.ArgumentTypeError, "list of rules"),
    ({"allow": ["pypi.org"]}, warren.ArgumentTypeError, "NetRule or a dict"),
    (["pypi.org"], warren.ArgumentTypeError, "must be a NetworkPolicy"),
]


@pytest.mark.parametrize("policy, exc, words", BAD)
def test_bad_policies_are_refused_before_any_request(offline, policy, exc, words):
    # Nothing listens at NOWHERE: a request would raise Unavailable, not these.
    with pytest.raises(exc, match=words):
        offline.containers.create(image="host", network=policy)
    with pytest.raises(exc, match=words):
        _fake(offline).network.update(policy)
    with pytest.raises(exc, match=words):
        offline.tasks.set_network("t", policy)


async def test_bad_policies_are_refused_before_any_request_async():
    async with warren.AsyncClient(NOWHERE, "k", max_retries=0) as c:
        with pytest.raises(warren.InvalidArgument, match="takes no rules"):
            await c.containers.create(
                image="host", network=NetworkPolicy("none", allow_cidrs=[DOC])
            )
        with pytest.raises(warren.InvalidArgument, match="task name is empty"):
            await c.tasks.set_network("", NetworkPolicy.none())
        with pytest.raises(warren.InvalidArgument, match="no network policy given"):
            await c.tasks.set_network("t", None)


def test_exposed_ports_are_checked_before_any_request(offline):
    # Nothing listens at NOWHERE: a request would raise Unavailable, not these.
    for kwargs, exc, words in (
        (dict(expose=[0]), warren.InvalidArgument, "expose: port 0"),
        (dict(expose=[65536]), warren.InvalidArgument, "port 65536"),
        (dict(expose=list(range(1, 34))), warren.InvalidArgument, "more than 32"),
        (dict(expose=8000), warren.ArgumentTypeError, "expose must be a list"),
        (dict(expose=[8000.0]), warren.ArgumentTypeError, "must be an int"),
        (dict(network="none", expose=[8000]), warren.InvalidArgument, "with network 'none'"),
        (dict(network=NetworkPolicy.none(), expose=[8000]), warren.InvalidArgument, "'none'"),
        # Joined with the policy's own, they are still at most 32.
        (
            dict(network=NetworkPolicy(expose=range(1, 20)), expose=range(20, 34)),
            warren.InvalidArgument,
            "33 ports is more than 32",
        ),
    ):
        with pytest.raises(exc, match=words):
            offline.containers.create(image="host", **kwargs)
    sb = _fake(offline)
    for ports, exc, words in (
        ([0], warren.InvalidArgument, "port 0"),
        (list(range(1, 34)), warren.InvalidArgument, "more than 32"),
        (8000, warren.ArgumentTypeError, "list of ports"),
        ([True], warren.ArgumentTypeError, "not bool"),
    ):
        with pytest.raises(exc, match=words):
            sb.network.expose(ports)
    for bad, exc in (
        (0, warren.InvalidArgument),
        (70000, warren.InvalidArgument),
        ("8000", warren.ArgumentTypeError),
    ):
        with pytest.raises(exc, match="port"):
            sb.get_host(bad)
        with pytest.raises(exc, match="port"):
            sb.connect_port(bad)
    with pytest.raises(warren.ArgumentTypeError, match=r"write expose=\[8000\]"):
        NetworkPolicy(expose=8000)


async def test_exposed_ports_are_checked_before_any_request_async():
    async with warren.AsyncClient(NOWHERE, "k", max_retries=0) as c:
        sb = warren.AsyncSandbox(c._t, FAKE)
        with pytest.raises(warren.InvalidArgument, match="with network 'none'"):
            await c.containers.create(image="host", network="none", expose=[8000])
        with pytest.raises(warren.InvalidArgument, match="port 0"):
            await sb.network.expose([0])
        with pytest.raises(warren.InvalidArgument, match="port 70000"):
            await sb.get_host(70000)
        with pytest.raises(warren.InvalidArgument, match="port 0"):
            await sb.connect_port(0)


def test_exposed_ports_go_on_the_wire_joined_and_sorted():
    def sent(**kwargs):
        return _ops.create("container", image="host", **kwargs).json.get("network")

    assert sent(expose=[8001, 8000, 8001]) == {"mode": "filtered", "expose": [8000, 8001]}
    assert sent(
        network=NetworkPolicy(allow_domains=["pypi.org"], expose=[9000]), expose=[8000, 9000]
    ) == {"mode": "filtered", "allow": [{"domain": "pypi.org"}], "expose": [8000, 9000]}
    assert sent(network={"expose": [8000]}, expose=[]) == {"mode": "filtered", "expose": [8000]}
    # No ports: the policy as given, or none at all (the node's default).
    assert sent(expose=[]) is None and sent(network="none", expose=[]) == {"mode": "none"}
    p = NetworkPolicy(expose=(8001, 8000, 8000))
    assert p.expose == [8000, 8001] and p == NetworkPolicy(expose=[8000, 8001])
    assert p.to_json() == {"mode": "filtered", "expose": [8000, 8001]}
    assert NetworkPolicy.internet(expose=[22]).to_json()["expose"] == [22]
    assert v.network_policy(NetworkPolicy(allow_cidrs=[DOC])) == {
        "mode": "filtered",
        "allow": [{"cidr": DOC}],
    }

    st = warren.NetworkStatus(
        "filtered",
        allow=[NetRule(cidr=DOC)],
        exposed=[warren.ExposedPort(8000, "127.0.0.1:28000")],
    )
    assert _ops.exposing(st, [9000]) == NetworkPolicy(allow_cidrs=[DOC], expose=[9000])
    assert _ops.exposing(st, []) == NetworkPolicy(allow_cidrs=[DOC])

    call = _ops.connect_port(FAKE.id, 8000)
    assert (call.method, call.path) == ("GET", f"/v1/sandboxes/{FAKE.id}/ports/8000/connect")
    assert call.headers == {"Connection": "upgrade", "Upgrade": "tcp"} and call.idempotent

    assert _ops.host_of(FAKE.id, 8000, "sb.example.", "u") == f"8000-{FAKE.id}.sb.example"
    with pytest.raises(warren.NotFound, match=r"\[control\] sandbox_domain"):
        _ops.host_of(FAKE.id, 8000, None, "http://127.0.0.1:7700")


def test_a_connect_answer_that_is_not_an_upgrade_is_a_protocol_error():
    released = []
    resp = httpx.Response(200, json={}, request=httpx.Request("GET", "http://x/"))
    opened = warren._http.Opened(resp, lambda: released.append(1))
    with pytest.raises(warren.ProtocolError, match="HTTP 200, not 101 Switching Protocols"):
        warren.PortStream(opened, "the stream to port 8000 of sandbox x")
    assert released == [1]


def test_policies_are_built_from_keyword_lists():
    p = NetworkPolicy(
        allow_domains=["pypi.org", "*.pythonhosted.org"],
        allow_cidrs=["10.1.0.0/16"],
        allow_ports=["443/tcp", "53/udp", 8080, "8000-8100"],
        deny_cidrs=["10.1.2.0/24"],
        deny_ports=["25"],
    )
    assert v.network_policy(p) == {
        "mode": "filtered",
        "allow": [
            {"domain": "pypi.org"},
            {"domain": "*.pythonhosted.org"},
            {"cidr": "10.1.0.0/16"},
            {"ports": "443", "protocol": "tcp"},
            {"ports": "53", "protocol": "udp"},
            {"ports": "8080"},
            {"ports": "8000-8100"},
        ],
        "deny": [{"cidr": "10.1.2.0/24"}, {"ports": "25"}],
    }
    # Rules given as objects or dicts come first, then the keyword lists.
    p = NetworkPolicy(allow=[{"cidr": "10.0.0.0/8", "ports": 22}], allow_domains=["a.org"])
    assert p.allow == [NetRule(cidr="10.0.0.0/8", ports=22), NetRule(domain="a.org")]
    assert v.network_policy(p)["allow"][0] == {"cidr": "10.0.0.0/8", "ports": "22"}
    assert v.network_policy(NetworkPolicy.none()) == {"mode": "none"}
    assert v.network_policy(NetworkPolicy()) == {"mode": "filtered"}
    assert v.network_policy("filtered") == {"mode": "filtered"}
    assert v.network_policy(None) is None
    assert NetworkPolicy.internet() == NetworkPolicy(allow_cidrs=["0.0.0.0/0", "::/0"])
    assert v.network_policy(NetworkPolicy.internet(deny_cidrs=["10.0.0.0/8"])) == {
        "mode": "filtered",
        "allow": [{"cidr": "0.0.0.0/0"}, {"cidr": "::/0"}],
        "deny": [{"cidr": "10.0.0.0/8"}],
    }
    assert NetRule.port(" 8000 - 8100/UDP") == NetRule(ports="8000-8100", protocol="udp")
    assert NetRule.port(53, protocol="udp") == NetRule(ports="53", protocol="udp")
    # Mistakes in the keyword lists are named as they are built.
    with pytest.raises(warren.InvalidArgument, match="protocol 'icmp' is not tcp or udp"):
        NetworkPolicy(allow_ports=["1/icmp"])
    with pytest.raises(warren.InvalidArgument, match="ports '0'"):
        NetworkPolicy(deny_ports=["0/tcp"])
    with pytest.raises(warren.InvalidArgument, match="says tcp"):
        NetRule.port("443/tcp", protocol="udp")
    with pytest.raises(warren.ArgumentTypeError, match=r"write allow_domains=\['pypi.org'\]"):
        NetworkPolicy(allow_domains="pypi.org")
    with pytest.raises(warren.ArgumentTypeError, match="NetRule or a dict"):
        NetworkPolicy(deny=[42])


def test_network_answers_parse_tolerantly():
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
    # A node older than networks says nothing about them.
    assert warren.SandboxInfo.from_json(sandbox).network is None
    info = warren.SandboxInfo.from_json(
        dict(
            sandbox,
            network={
                "mode": "filtered",
                "ipv4": "10.200.0.3",
                "gateway": "10.200.0.1",
                "allow": [{"domain": "pypi.org"}, {"ports": "53", "protocol": "udp"}],
                "deny": [],
            },
        )
    )
    st = info.network
    assert st == warren.NetworkStatus(
        mode="filtered",
        ipv4="10.200.0.3",
        gateway="10.200.0.1",
        allow=[NetRule(domain="pypi.org"), NetRule(ports="53", protocol="udp")],
    )
    assert st.ipv6 is None
    assert st.policy == NetworkPolicy(allow=st.allow)
    assert warren.NetworkStatus.from_json({"mode": "none"}) == warren.NetworkStatus("none")
    # Exposed ports, from servers that have them; none from those older.
    assert st.exposed == [] and st.policy.expose == []
    st = warren.NetworkStatus.from_json(
        {
            "mode": "filtered",
            "exposed": [
                {"port": 8000, "host": "127.0.0.1:28000"},
                {"port": 9000, "host": "127.0.0.1:28001"},
            ],
        }
    )
    assert st.exposed == [
        warren.ExposedPort(8000, "127.0.0.1:28000"),
        warren.ExposedPort(9000, "127.0.0.1:28001"),
    ]
    assert st.policy == NetworkPolicy(expose=[8000, 9000])
    health = {"status": "ok", "version": "0.1.0", "nodes_up": 1, "nodes": 1}
    assert warren.Health.from_json(health).sandbox_domain is None
    h = warren.Health.from_json(dict(health, sandbox_domain="sb.example"))
    assert h.sandbox_domain == "sb.example"

    got = _ops.get_network("abcdef0123456789wxyz").parse(
        httpx.Response(200, json={"mode": "none", "allow": [], "deny": []})
    )
    assert got == warren.NetworkStatus("none")

    ev = {
        "id": "e1",
        "node": "abcdef",
        "sandbox": "abcdef0123456789wxyz",
        "kind": "network",
        "detail": "tcp to 10.200.0.1 refused",
        "count": 299,
        "first_at": "",
        "last_at": "",
        "network": {
            "protocol": "tcp",
            "destination": "10.200.0.1",
            "ports": "1-52,54-300",
            "port_count": 299,
        },
    }
    events = _ops.list_events(kind="network").parse(httpx.Response(200, json={"events": [ev]}))
    (e,) = events
    assert e.network == warren.NetEvent("tcp", "10.200.0.1", "1-52,54-300", 299, None)
    lookup = dict(ev, network={"protocol": "dns", "destination": "10.200.0.1", "domain": "x.org"})
    e = warren.IncidentEvent.from_json(lookup)
    assert (e.network.ports, e.network.port_count, e.network.domain) == ("", 0, "x.org")
    ev.pop("network")
    assert warren.IncidentEvent.from_json(ev).network is None

    down = {"node": "nodebb", "error": {"code": "unavailable", "message": "no answer"}}
    call = _ops.task_network("t/1", NetworkPolicy.none())
    assert (call.method, call.path) == ("PUT", "/v1/tasks/t%2F1/network")
    assert call.json == {"mode": "none"}
    r = call.parse(
        httpx.Response(
            200,
            json={
                "task": "t/1",
                "succeeded": 2,
                "failed": [
                    {"id": "x", "error": {"code": "invalid_argument", "message": "no interface"}}
                ],
                "unreachable": [down],
            },
        )
    )
    assert (r.task, r.succeeded, [f.id for f in r.failed]) == ("t/1", 2, ["x"])
    assert r.failed[0].error == warren.ErrorInfo("invalid_argument", "no interface")
    assert r.unreachable[0].node == "nodebb" and not r.ok
    r = call.parse(httpx.Response(200, json={"task": "t/1", "succeeded": 0}))
    assert r.ok and r.failed == [] and r.unreachable == []
    put = _ops.set_network("abcdef0123456789wxyz", "none")
    assert (put.method, put.path) == ("PUT", "/v1/sandboxes/abcdef0123456789wxyz/network")

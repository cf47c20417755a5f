"""Sandbox networks through the SDK: the default (an interface, everything denied), loopback only,
run-time policy changes for a sandbox and a task, the server's refusals, refused connections as
events; and what the SDK checks itself before any request.

The node's sandbox network needs a network namespace of the tests' own: run-tests.sh makes one.
Nothing here leaves the node: every destination is the node's gateway or a documentation range
(198.51.100.0/24) that no policy change here connects to.
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

from .conftest import Server

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


# Without a server: what the SDK checks and how it reads answers.


@pytest.fixture
def offline() -> Iterator[warren.Client]:
    with warren.Client(NOWHERE, "k", max_retries=0) as c:
        yield c


def _fake(c: warren.Client) -> warren.Sandbox:
    info = warren.SandboxInfo(
        id="abcdef0123456789wxyz",
        node="abcdef",
        backend="container",
        image="host",
        state="running",
        resources=warren.Resources(1000, 1 << 29, 1024),
        created_at="",
        expires_at="",
    )
    return warren.Sandbox(c._t, info)


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

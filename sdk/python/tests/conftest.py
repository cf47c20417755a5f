"""A real Warren for the tests: `warren up` on its own data dir, port and cgroup parent, started
once per session and stopped (SIGTERM, sandboxes killed) at the end. No mocked server.

The binary: $WARREN_BIN, else the newer of target/debug/warren and target/release/warren of the
repository this SDK lives in (`make test` builds the debug one just before). Tests that need a
server are skipped, saying why, when not root or when no binary is built.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

import httpx
import pytest

import warren

REPO = Path(__file__).resolve().parents[3]


def find_binary() -> Optional[Path]:
    env = os.environ.get("WARREN_BIN")
    if env:
        return Path(env)
    built = [REPO / "target" / p / "warren" for p in ("debug", "release")]
    built = [b for b in built if b.is_file() and (b.parent / "warren-guest").is_file()]
    return max(built, key=lambda b: b.stat().st_mtime) if built else None


def why_no_server() -> Optional[str]:
    if os.geteuid() != 0:
        return "these tests run a real `warren up`, which needs root (run them as root)"
    b = find_binary()
    if b is None:
        return f"no warren binary: build it (`cargo build --workspace` in {REPO}) or set WARREN_BIN"
    if not b.is_file():
        return f"WARREN_BIN={b} does not exist"
    if not (b.parent / "warren-guest").is_file():
        return f"{b.parent}/warren-guest is missing (it must sit beside warren)"
    return None


def in_own_netns() -> bool:
    """Whether these tests run in the network namespace `run-tests.sh` made for them (its name in
    $WARREN_PYTEST_NETNS), not the machine's own. Only then does the session's node get a
    sandbox network: that adds interfaces, routes and an nftables table to its namespace."""
    name = os.environ.get("WARREN_PYTEST_NETNS")
    if not name:
        return False
    try:
        ours = os.stat("/proc/self/ns/net")
        made = os.stat(f"/run/netns/{name}")
    except OSError:
        return False
    return (ours.st_dev, ours.st_ino) == (made.st_dev, made.st_ino)


#: The domain of the session's `<port>-<id>.<domain>` route to exposed ports (`sandbox.get_host`).
#: It changes only requests whose Host names such an address, which no other test sends.
SANDBOX_DOMAIN = "sb.test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, however it dies, so a
    killed test run never leaves a `warren up` behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _mounts_under(path: str) -> List[str]:
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p == path or p.startswith(path + "/")]


@dataclass
class Server:
    """One running `warren up`."""

    url: str
    key: str
    data_dir: Path
    cgroup_parent: str
    proc: subprocess.Popen  # type: ignore[type-arg]
    network: bool = False
    """Whether its sandboxes get networks (``[node.network]`` enabled)."""

    def client(self, **kw: object) -> warren.Client:
        return warren.Client(self.url, self.key, **kw)  # type: ignore[arg-type]

    def aclient(self, **kw: object) -> warren.AsyncClient:
        return warren.AsyncClient(self.url, self.key, **kw)  # type: ignore[arg-type]

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = (self.data_dir / "warren.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._remove_cgroups()
        if _mounts_under(str(self.data_dir)):
            print(f"warning: mounts left under {self.data_dir}; not removing it")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _remove_cgroups(self) -> None:
        # Our own parent cgroup (a unique name) in each hierarchy, once empty; deepest first.
        for root in Path("/sys/fs/cgroup").iterdir():
            top = root / self.cgroup_parent
            if not top.is_dir():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in dirs + [top]:
                try:
                    d.rmdir()
                except OSError:
                    pass


def start_server(config: Optional[str] = None, *, network: bool = False) -> Server:
    """Starts a `warren up`. Only one node per network namespace may have the sandbox network
    (a second one fails to start), and the session's main node has it when the tests run in a
    namespace of their own. So unless ``network`` is asked for, or ``config`` has a
    ``[node.network]`` table of its own (then say ``network=True`` if it enables it), the node
    gets ``[node.network] enabled = false``."""
    if network and not in_own_netns():
        pytest.fail("a node with the sandbox network runs only in run-tests.sh's network namespace")
    if not network and "[node.network]" not in (config or ""):
        config = (config or "") + "\n[node.network]\nenabled = false\n"
    binary = find_binary()
    assert binary is not None
    data_dir = Path(tempfile.mkdtemp(prefix="warren-pytest-"))
    port = free_port()
    cgroup = f"warren-pytest-{secrets.token_hex(4)}"
    args = [
        str(binary),
        "up",
        "--data-dir",
        str(data_dir),
        "--listen",
        f"127.0.0.1:{port}",
        "--cgroup-parent",
        cgroup,
        "--kill-sandboxes-on-exit",
        # Sessions run several servers: none takes the E2B gateway's default port.
        "--e2b-listen",
        "off",
    ]
    if config is not None:
        cfg = data_dir / "config.toml"
        cfg.write_text(config)
        args += ["--config", str(cfg)]
    env = dict(os.environ)
    for var in (
        "WARREN_URL",
        "WARREN_API_KEY",
        "WARREN_DATA_DIR",
        "WARREN_CONFIG",
        "WARREN_LISTEN",
        "WARREN_CGROUP_PARENT",
        "WARREN_E2B_LISTEN",
    ):
        env.pop(var, None)
    log = open(data_dir / "warren.log", "wb")
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    server = Server(
        url=url, key="", data_dir=data_dir, cgroup_parent=cgroup, proc=proc, network=network
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = server.log_tail()
            server.stop()
            pytest.fail(f"warren up exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(url + "/v1/health", timeout=2).status_code == 200:
                key_file = data_dir / "admin.key"
                if key_file.is_file() and key_file.read_text().strip():
                    server.key = key_file.read_text().strip()
                    return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    tail = server.log_tail()
    server.stop()
    pytest.fail(f"warren up did not answer /v1/health within 90 s:\n{tail}")


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    why = why_no_server()
    if why:
        pytest.skip(why)
    # The sandbox network only in a network namespace of the tests' own (run-tests.sh makes
    # one), never the machine's.
    s = start_server(
        f'[control]\nsandbox_domain = "{SANDBOX_DOMAIN}"\n', network=in_own_netns()
    )
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[warren.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def sandbox(client: warren.Client) -> Iterator[warren.Sandbox]:
    with client.containers.create(image="host", task="pytest", memory="64Mi") as sb:
        yield sb

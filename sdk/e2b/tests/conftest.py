"""A real `warren up` with its E2B gateway for the tests: its own data dir, ports and cgroup
parent, started once per session and stopped (SIGTERM, sandboxes killed) at the end, and the
environment the `e2b` SDK reads pointed at it. No mocked server.

The binary: $WARREN_BIN, else the newer of target/debug/warren and target/release/warren.
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
from typing import Iterator, Optional

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]


def find_binary() -> Optional[Path]:
    env = os.environ.get("WARREN_BIN")
    if env:
        return Path(env)
    built = [REPO / "target" / p / "warren" for p in ("debug", "release")]
    built = [b for b in built if b.is_file() and (b.parent / "warren-guest").is_file()]
    return max(built, key=lambda b: b.stat().st_mtime) if built else None


def in_own_netns() -> bool:
    name = os.environ.get("WARREN_E2B_NETNS")
    if not name:
        return False
    try:
        ours = os.stat("/proc/self/ns/net")
        made = os.stat(f"/run/netns/{name}")
    except OSError:
        return False
    return (ours.st_dev, ours.st_ino) == (made.st_dev, made.st_ino)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclass
class Gateway:
    url: str
    key: str
    warren_url: str
    admin_key: str
    data_dir: Path
    cgroup_parent: str
    proc: subprocess.Popen  # type: ignore[type-arg]

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = (self.data_dir / "warren.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def warren(self, method: str, path: str, **kw: object) -> httpx.Response:
        """A call to Warren's own API (to check what the gateway did)."""
        return httpx.request(
            method,
            self.warren_url + path,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
            **kw,  # type: ignore[arg-type]
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for root in Path("/sys/fs/cgroup").iterdir():
            top = root / self.cgroup_parent
            if top.is_dir():
                dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
                for d in dirs + [top]:
                    try:
                        d.rmdir()
                    except OSError:
                        pass
        with open("/proc/self/mounts") as f:
            left = [line.split()[1] for line in f if str(self.data_dir) in line.split()[1]]
        if left:
            print(f"warning: mounts left under {self.data_dir}; not removing it")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)


SANDBOX_DOMAIN = "sb.warren.test"


def start_gateway() -> Gateway:
    """Starts `warren up` with its gateway on free ports and points the `e2b` SDK's
    environment at it. Raises RuntimeError when it cannot."""
    if os.geteuid() != 0:
        raise RuntimeError("a real `warren up` needs root")
    binary = find_binary()
    if binary is None:
        raise RuntimeError(f"no warren binary: build it (`cargo build --workspace` in {REPO})")
    data_dir = Path(tempfile.mkdtemp(prefix="warren-e2b-"))
    port, e2b_port = free_port(), free_port()
    cgroup = f"warren-e2b-{secrets.token_hex(4)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARREN_", "E2B_"))}
    log = open(data_dir / "warren.log", "wb")
    # A sandbox domain, so that `get_host(port)` names a route Warren's API serves.
    config = data_dir / "warren.toml"
    config.write_text(f'[control]\nsandbox_domain = "{SANDBOX_DOMAIN}"\n')
    proc = subprocess.Popen(
        [
            str(binary), "up",
            "--config", str(config),
            "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{port}",
            "--e2b-listen", f"127.0.0.1:{e2b_port}",
            "--cgroup-parent", cgroup,
            "--kill-sandboxes-on-exit",
        ],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True, preexec_fn=_die_with_parent,
    )
    log.close()
    url = f"http://127.0.0.1:{e2b_port}"
    gw = Gateway(url, "", f"http://127.0.0.1:{port}", "", data_dir, cgroup, proc)
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            tail = gw.log_tail()
            gw.stop()
            raise RuntimeError(f"warren up exited with {proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            tail = gw.log_tail()
            gw.stop()
            raise RuntimeError(f"the gateway did not answer within 90 s:\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 204:
                gw.key = (data_dir / "e2b.key").read_text().strip()
                gw.admin_key = (data_dir / "admin.key").read_text().strip()
                break
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.2)
    os.environ["E2B_API_KEY"] = gw.key
    os.environ["E2B_API_URL"] = url
    os.environ["E2B_SANDBOX_URL"] = url
    return gw


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    if os.geteuid() != 0:
        pytest.skip("these tests run a real `warren up`, which needs root")
    if find_binary() is None:
        pytest.skip(f"no warren binary: build it (`cargo build --workspace` in {REPO})")
    if not in_own_netns():
        pytest.fail("run these tests with sdk/e2b/run-tests.sh (a network namespace of their own)")
    try:
        gw = start_gateway()
    except RuntimeError as e:
        pytest.fail(str(e))
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def sb(gateway: Gateway):
    """A fresh `base` sandbox through the gateway, killed after the test."""
    from e2b import Sandbox

    s = Sandbox.create("base", timeout=120)
    try:
        yield s
    finally:
        s.kill()

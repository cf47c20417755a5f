"""Every API operation as a :class:`~warren._http.Call`: its route, its checked body, how it may
be retried and how its answer is read. The sync and async handles only send these, so both
behave the same by construction."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Mapping, Optional
from urllib.parse import quote

import httpx

from . import _validate as v
from ._http import Call, json_body
from .errors import InvalidArgument, NotFound
from .trajectory import TrajectoryEntry, parse_jsonl
from .types import (
    ApiKey,
    ExecResult,
    BatchResult,
    FnCallResult,
    FileEntry,
    Health,
    IncidentEvent,
    Listing,
    NetworkPolicy,
    NetworkStatus,
    NodeInfo,
    ProcessInfo,
    SandboxInfo,
    SandboxMetrics,
    TaskInfo,
    TaskNetworkResult,
    TaskResult,
    WatchEvents,
    unreachable_from_json,
)

#: The server's default exec timeout, seconds (the answer may take this long).
DEFAULT_EXEC_TIMEOUT = 600.0
#: Extra seconds to wait for an answer beyond a command's own timeout.
ANSWER_MARGIN = 30.0
#: Seconds a task-level operation may take to answer (it acts on every sandbox of the task).
TASK_TIMEOUT = 600.0


def _info(resp: httpx.Response) -> SandboxInfo:
    return SandboxInfo.from_json(json_body(resp))


def _entry(resp: httpx.Response) -> FileEntry:
    return FileEntry.from_json(json_body(resp))


def _process(resp: httpx.Response) -> ProcessInfo:
    return ProcessInfo.from_json(json_body(resp))


def _task_result(resp: httpx.Response) -> TaskResult:
    return TaskResult.from_json(json_body(resp))


def _bytes(resp: httpx.Response) -> bytes:
    return resp.content


# Sandboxes.


def _image(image: Any) -> str:
    """One image name, or a list of names (bottom layer first) joined with commas."""
    if isinstance(image, (list, tuple)):
        if not image:
            raise InvalidArgument("image: the list of images is empty")
        names = [v.string(i, "image") for i in image]
        for n in names:
            if "," in n:
                raise InvalidArgument(f"image: {n!r} contains a comma; give each name alone")
        return ",".join(names)
    return v.string(image, "image")


def create(
    backend: str,
    *,
    image: Any,
    task: Any = None,
    project: Any = None,
    cpu: Any = None,
    memory: Any = None,
    pids: Any = None,
    cpu_limit: Any = None,
    memory_limit: Any = None,
    qos: Any = None,
    disk: Any = None,
    timeout: Any = None,
    idle_timeout: Any = None,
    on_idle: Any = None,
    labels: Any = None,
    node_selector: Any = None,
    env: Any = None,
    trajectory: Any = False,
    network: Any = None,
    expose: Any = None,
    idempotency_key: Any = None,
    replay: Optional[List[TrajectoryEntry]] = None,
) -> Call[SandboxInfo]:
    """``POST /v1/sandboxes``, always with an ``Idempotency-Key`` (one per create, kept across
    its retries) so a retried create never makes two sandboxes. ``expose`` joins the ports of
    the policy (``network``, or a ``filtered`` one with no rules)."""
    assert backend == "container", backend
    body: Dict[str, Any] = {"image": _image(image), "backend": backend}
    if task is not None:
        body["task"] = v.string(task, "task")
    if project is not None:
        body["project"] = v.string(project, "project")
    for name, val, minimum in (
        ("cpu", cpu, 0),
        ("cpu_limit", cpu_limit, 1),
        ("pids", pids, 1),
        ("timeout", timeout, 1),
        ("idle_timeout", idle_timeout, 1),
    ):
        n = v.opt_whole(val, name, minimum=minimum)
        if n is not None:
            body[name] = n
    mem = v.size(memory, "memory")
    if mem is not None:
        body["memory"] = mem
    mem_limit = v.size(memory_limit, "memory_limit")
    if mem_limit is not None:
        body["memory_limit"] = mem_limit
    if qos is not None:
        body["qos"] = v.choice(qos, "qos", v.QOS)
    dsk = v.size(disk, "disk")
    if dsk is not None:
        body["disk"] = dsk
    if on_idle is not None:
        body["on_idle"] = v.choice(on_idle, "on_idle", v.ON_IDLE)
        if idle_timeout is None:
            raise InvalidArgument("on_idle needs an idle_timeout (seconds without activity)")
    lab = v.str_map(labels, "labels")
    if lab:
        body["labels"] = lab
    sel = v.str_map(node_selector, "node_selector")
    if sel:
        body["node_selector"] = sel
    envs = v.str_map(env, "env")
    if envs:
        body["env"] = envs
    if v.boolean(trajectory, "trajectory"):
        body["trajectory"] = True
    net = _with_exposed(v.network_policy(network), expose)
    if net is not None:
        body["network"] = net
    if replay is not None:
        body["replay"] = replay
    key = (
        str(uuid.uuid4())
        if idempotency_key is None
        else v.string(idempotency_key, "idempotency_key")
    )
    if len(key) > 256 or not key.isprintable() or not key.isascii():
        raise InvalidArgument("idempotency_key must be 1 to 256 printable ASCII characters")
    return Call(
        "POST",
        "/v1/sandboxes",
        json=body,
        headers={"Idempotency-Key": key},
        idempotent=True,
        parse=_info,
    )


def _with_exposed(net: Optional[Dict[str, Any]], expose: Any) -> Optional[Dict[str, Any]]:
    """The policy to send with ``expose``'s ports joined to its own."""
    if expose is None:
        return net
    ports = v.expose_ports(expose)
    if not ports:
        return net
    if net is None:
        net = {"mode": "filtered"}
    if net["mode"] == "none":
        raise InvalidArgument(
            f"expose={ports} with network 'none': a loopback-only sandbox has no interface to "
            "expose ports on; leave network out, or give a filtered NetworkPolicy"
        )
    net["expose"] = v.expose_ports(sorted(set(net.get("expose", [])) | set(ports)))
    return net


def list_sandboxes(
    task: Any = None, labels: Any = None, state: Any = None
) -> Call[Listing[SandboxInfo]]:
    params: Dict[str, str] = {}
    if task is not None:
        params["task"] = v.string(task, "task")
    lab = v.str_map(labels, "labels")
    if lab:
        for k, val in lab.items():
            if "," in k or "=" in k or "," in val:
                raise InvalidArgument(
                    f"label filter {k!r}={val!r} cannot be sent: keys without ',' or '=', "
                    "values without ','"
                )
        params["label"] = ",".join(f"{k}={val}" for k, val in lab.items())
    st = v.choice(state, "state", v.STATES)
    if st is not None:
        params["state"] = st

    def parse(resp: httpx.Response) -> Listing[SandboxInfo]:
        d = json_body(resp)
        return Listing([SandboxInfo.from_json(s) for s in d["sandboxes"]], unreachable_from_json(d))

    return Call("GET", "/v1/sandboxes", params=params or None, parse=parse)


def _sb(sid: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{sid}{rest}"


def get(sid: str) -> Call[SandboxInfo]:
    return Call("GET", _sb(sid), parse=_info)


def kill(sid: str) -> Call[None]:
    return Call("DELETE", _sb(sid), urgent=True)


def pause(sid: str) -> Call[SandboxInfo]:
    return Call("POST", _sb(sid, "/pause"), parse=_info, urgent=True)


def resume(sid: str) -> Call[SandboxInfo]:
    return Call("POST", _sb(sid, "/resume"), parse=_info, urgent=True)


def set_timeout(sid: str, seconds: Any) -> Call[SandboxInfo]:
    n = v.whole(seconds, "timeout", minimum=1)
    return Call("POST", _sb(sid, "/timeout"), json={"timeout": n}, parse=_info)


def _network(resp: httpx.Response) -> NetworkStatus:
    return NetworkStatus.from_json(json_body(resp))


def get_network(sid: str) -> Call[NetworkStatus]:
    return Call("GET", _sb(sid, "/network"), parse=_network)


def set_network(sid: str, policy: Any) -> Call[NetworkStatus]:
    """``PUT``: the whole new policy replaces the old one, so sending it twice is the same."""
    if policy is None:
        raise InvalidArgument("no network policy given: NetworkPolicy.none() denies everything")
    body = v.network_policy(policy, "policy")
    return Call("PUT", _sb(sid, "/network"), json=body, parse=_network)


def exposing(status: NetworkStatus, ports: List[int]) -> NetworkPolicy:
    """``status``'s policy with exactly ``ports`` exposed."""
    p = status.policy
    return NetworkPolicy(p.mode, p.allow, p.deny, expose=ports)


def connect_port(sid: str, port: Any) -> Call[None]:
    """``GET .../ports/{port}/connect``, an HTTP upgrade to a TCP stream (``101``). Nothing
    happens in the sandbox until the answer, so a broken attempt may be made again."""
    p = v.port(port)
    return Call(
        "GET",
        _sb(sid, f"/ports/{p}/connect"),
        headers={"Connection": "upgrade", "Upgrade": "tcp"},
    )


def host_of(sid: str, port: Any, domain: Optional[str], url: str) -> str:
    """``<port>-<id>.<domain>``, or why there is none."""
    if not domain:
        raise NotFound(
            f"Warren at {url} has no host route to exposed ports: set [control] sandbox_domain "
            "in its configuration (and point a wildcard DNS record *.<domain> at it), or connect "
            "to the node's host port in sandbox.network.get().exposed"
        )
    return f"{v.port(port)}-{sid}.{domain.strip().strip('.')}"


def trajectory(sid: str) -> Call[List[TrajectoryEntry]]:
    def parse(resp: httpx.Response) -> List[TrajectoryEntry]:
        return parse_jsonl(resp.content.decode("utf-8"))

    return Call("GET", _sb(sid, "/trajectory"), parse=parse)


# Commands and processes.


def exec_body(
    cmd: Any,
    *,
    env: Any,
    cwd: Any,
    user: Any,
    timeout: Any,
    stdin: Any,
    max_output: Any,
    role: Any = None,
) -> Dict[str, Any]:
    body = v.command(cmd)
    r = v.choice(role, "role", ("agent", "grader"))
    if r is not None:
        if r == "grader" and user is not None:
            raise InvalidArgument("a grader command runs as the grader: leave user out")
        body["role"] = r
    envs = v.str_map(env, "env")
    if envs:
        body["env"] = envs
    if cwd is not None:
        body["cwd"] = v.path(cwd, "cwd")
    u = v.user(user)
    if u is not None:
        body["user"] = u
    t = v.seconds(timeout, "timeout")
    if t is not None:
        body["timeout"] = t
    body.update(v.stdin(stdin))
    mo = v.size(max_output, "max_output")
    if mo is not None:
        body["max_output"] = mo
    return body


def _answer_timeout(body: Mapping[str, Any]) -> Optional[float]:
    t = body.get("timeout", DEFAULT_EXEC_TIMEOUT)
    return None if t == 0 else t + ANSWER_MARGIN


def exec_(sid: str, body: Dict[str, Any]) -> Call[ExecResult]:
    def parse(resp: httpx.Response) -> ExecResult:
        return ExecResult.from_json(json_body(resp))

    return Call(
        "POST",
        _sb(sid, "/exec"),
        json=body,
        idempotent=False,
        read_timeout=_answer_timeout(body),
        parse=parse,
    )


def exec_stream(sid: str, body: Dict[str, Any]) -> Call[None]:
    return Call(
        "POST",
        _sb(sid, "/exec"),
        json=dict(body, stream=True),
        idempotent=False,
        headers={"Accept": "application/x-ndjson"},
        read_timeout=None,
    )


def interactive(body: Dict[str, Any], stdin_open: Any, pty: Any) -> Dict[str, Any]:
    """``body`` with an open stdin and/or a terminal (``pty``: ``(cols, rows)``)."""
    if stdin_open:
        body["stdin_open"] = True
    if pty is not None:
        if isinstance(pty, bool) and pty:
            pty = (80, 24)
        try:
            cols, rows = pty
        except (TypeError, ValueError):
            raise InvalidArgument("pty is (cols, rows), e.g. (80, 24)") from None
        body["pty"] = {
            "cols": v.whole(cols, "pty cols", minimum=1),
            "rows": v.whole(rows, "pty rows", minimum=1),
        }
    return body


def send_stdin(sid: str, pid: Any, data: Any, close: bool) -> Call[None]:
    import base64

    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument("stdin data is str or bytes")
    body: Dict[str, Any] = {}
    if data:
        body["data_b64"] = base64.b64encode(bytes(data)).decode("ascii")
    if close:
        body["close"] = True
    return Call(
        "POST", _sb(sid, f"/processes/{v.process_id(pid)}/stdin"), json=body, idempotent=False
    )


def resize_pty(sid: str, pid: Any, cols: Any, rows: Any) -> Call[None]:
    body = {
        "cols": v.whole(cols, "cols", minimum=1),
        "rows": v.whole(rows, "rows", minimum=1),
    }
    return Call("POST", _sb(sid, f"/processes/{v.process_id(pid)}/resize"), json=body)


def metrics(sid: str) -> Call[SandboxMetrics]:
    return Call("GET", _sb(sid, "/metrics"), parse=lambda r: SandboxMetrics.from_json(json_body(r)))


def watch(sid: str, path: Any, recursive: Any, user: Any) -> Call[int]:
    body: Dict[str, Any] = {"path": v.path(path), "recursive": bool(recursive)}
    u = v.user(user)
    if u is not None:
        body["user"] = u
    return Call(
        "POST",
        _sb(sid, "/watches"),
        json=body,
        idempotent=False,
        parse=lambda r: int(json_body(r)["watch_id"]),
    )


def watch_events(sid: str, watch_id: Any, wait: Any) -> Call[WatchEvents]:
    params = {}
    w = v.seconds(wait, "wait")
    if w is not None:
        params["wait"] = str(min(w, 60))
    wid = v.whole(watch_id, "watch_id", minimum=0)
    return Call(
        "GET",
        _sb(sid, f"/watches/{wid}/events"),
        params=params,
        read_timeout=(w or 0) + ANSWER_MARGIN,
        parse=lambda r: WatchEvents.from_json(json_body(r)),
    )


def unwatch(sid: str, watch_id: Any) -> Call[None]:
    return Call("DELETE", _sb(sid, f"/watches/{v.whole(watch_id, 'watch_id', minimum=0)}"))


def start_process(sid: str, body: Dict[str, Any]) -> Call[ProcessInfo]:
    return Call("POST", _sb(sid, "/processes"), json=body, idempotent=False, parse=_process)


def list_processes(sid: str) -> Call[List[ProcessInfo]]:
    def parse(resp: httpx.Response) -> List[ProcessInfo]:
        return [ProcessInfo.from_json(p) for p in json_body(resp)["processes"]]

    return Call("GET", _sb(sid, "/processes"), parse=parse)


def get_process(sid: str, pid: Any) -> Call[ProcessInfo]:
    return Call("GET", _sb(sid, f"/processes/{v.process_id(pid)}"), parse=_process)


def wait_process(sid: str, pid: Any, timeout: Any) -> Call[ProcessInfo]:
    t = v.seconds(timeout, "timeout")
    params = None if t is None else {"timeout": repr(t)}
    return Call(
        "POST",
        _sb(sid, f"/processes/{v.process_id(pid)}/wait"),
        params=params,
        read_timeout=None if t is None else t + ANSWER_MARGIN,
        parse=_process,
    )


def signal_process(sid: str, pid: Any, signal: Any) -> Call[None]:
    return Call(
        "POST",
        _sb(sid, f"/processes/{v.process_id(pid)}/signal"),
        json={"signal": v.signal_name(signal)},
    )


def forget_process(sid: str, pid: Any) -> Call[None]:
    return Call("DELETE", _sb(sid, f"/processes/{v.process_id(pid)}"))


def process_output(sid: str, pid: Any) -> Call[None]:
    return Call("GET", _sb(sid, f"/processes/{v.process_id(pid)}/output"), read_timeout=None)


# Files.


def _file_params(path: Any, user: Any, what: str = "path") -> Dict[str, str]:
    params = {"path": v.path(path, what)}
    u = v.user(user)
    if u is not None:
        params["user"] = u
    return params


def read_file(sid: str, path: Any, user: Any) -> Call[bytes]:
    return Call("GET", _sb(sid, "/files"), params=_file_params(path, user), parse=_bytes)


def write_file(sid: str, path: Any, data: Any, mode: Any, user: Any) -> Call[FileEntry]:
    params = _file_params(path, user)
    m = v.mode(mode)
    if m is not None:
        params["mode"] = m
    return Call(
        "PUT",
        _sb(sid, "/files"),
        params=params,
        content=v.data(data),
        headers={"Content-Type": "application/octet-stream"},
        idempotent=False,
        parse=_entry,
    )


def list_dir(sid: str, path: Any, user: Any) -> Call[List[FileEntry]]:
    def parse(resp: httpx.Response) -> List[FileEntry]:
        return [FileEntry.from_json(e) for e in json_body(resp)["entries"]]

    return Call("GET", _sb(sid, "/files/list"), params=_file_params(path, user), parse=parse)


def stat(sid: str, path: Any, user: Any) -> Call[FileEntry]:
    return Call("GET", _sb(sid, "/files/stat"), params=_file_params(path, user), parse=_entry)


def remove(sid: str, path: Any, recursive: Any, user: Any) -> Call[None]:
    params = _file_params(path, user)
    if v.boolean(recursive, "recursive"):
        params["recursive"] = "true"
    return Call("DELETE", _sb(sid, "/files"), params=params, idempotent=False)


def mkdir(sid: str, path: Any, parents: Any, user: Any) -> Call[FileEntry]:
    body: Dict[str, Any] = {"path": v.path(path), "parents": v.boolean(parents, "parents")}
    u = v.user(user)
    if u is not None:
        body["user"] = u
    return Call("POST", _sb(sid, "/files/mkdir"), json=body, idempotent=False, parse=_entry)


def rename(sid: str, src: Any, dst: Any, user: Any) -> Call[FileEntry]:
    body: Dict[str, Any] = {"from": v.path(src, "src"), "to": v.path(dst, "dst")}
    u = v.user(user)
    if u is not None:
        body["user"] = u
    return Call("POST", _sb(sid, "/files/rename"), json=body, idempotent=False, parse=_entry)


def upload_tar(sid: str, remote_dir: Any, tar: bytes, user: Any) -> Call[Optional[FileEntry]]:
    def parse(resp: httpx.Response) -> Optional[FileEntry]:
        return FileEntry.from_json(json_body(resp)) if resp.content.strip() else None

    return Call(
        "PUT",
        _sb(sid, "/files/tar"),
        params=_file_params(remote_dir, user, "remote_dir"),
        content=tar,
        headers={"Content-Type": "application/x-tar"},
        idempotent=False,
        parse=parse,
    )


def download_tar(sid: str, remote_dir: Any, user: Any) -> Call[bytes]:
    return Call(
        "GET",
        _sb(sid, "/files/tar"),
        params=_file_params(remote_dir, user, "remote_dir"),
        parse=_bytes,
    )


# Tasks and the platform.


def cordon(node: Any, on: bool) -> Call[NodeInfo]:
    n = v.string(node, "node id")
    return Call(
        "POST",
        f"/v1/nodes/{quote(n, safe='')}/{'cordon' if on else 'uncordon'}",
        parse=lambda resp: NodeInfo.from_json(json_body(resp)),
    )


def task_action(name: Any, action: str) -> Call[TaskResult]:
    task = v.string(name, "task name")
    return Call(
        "POST",
        f"/v1/tasks/{quote(task, safe='')}/{action}",
        read_timeout=TASK_TIMEOUT,
        parse=_task_result,
        urgent=True,
    )


def task_network(name: Any, policy: Any) -> Call[TaskNetworkResult]:
    task = v.string(name, "task name")
    if policy is None:
        raise InvalidArgument("no network policy given: NetworkPolicy.none() denies everything")
    body = v.network_policy(policy, "policy")

    def parse(resp: httpx.Response) -> TaskNetworkResult:
        return TaskNetworkResult.from_json(json_body(resp))

    return Call(
        "PUT",
        f"/v1/tasks/{quote(task, safe='')}/network",
        json=body,
        read_timeout=TASK_TIMEOUT,
        parse=parse,
    )


def list_tasks() -> Call[Listing[TaskInfo]]:
    def parse(resp: httpx.Response) -> Listing[TaskInfo]:
        d = json_body(resp)
        return Listing([TaskInfo.from_json(t) for t in d["tasks"]], unreachable_from_json(d))

    return Call("GET", "/v1/tasks", parse=parse)


def list_events(
    sandbox: Any = None, task: Any = None, kind: Any = None, since: Any = None
) -> Call[Listing[IncidentEvent]]:
    params: Dict[str, str] = {}
    if sandbox is not None:
        params["sandbox"] = v.sandbox_id(sandbox)
    if task is not None:
        params["task"] = v.string(task, "task")
    k = v.choice(kind, "kind", v.EVENT_KINDS)
    if k is not None:
        params["kind"] = k
    if since is not None:
        params["since"] = v.string(since, "since")

    def parse(resp: httpx.Response) -> Listing[IncidentEvent]:
        d = json_body(resp)
        return Listing([IncidentEvent.from_json(e) for e in d["events"]], unreachable_from_json(d))

    return Call("GET", "/v1/events", params=params, parse=parse)


def health() -> Call[Health]:
    def parse(resp: httpx.Response) -> Health:
        return Health.from_json(json_body(resp))

    return Call("GET", "/v1/health", parse=parse)


def nodes() -> Call[Listing[NodeInfo]]:
    def parse(resp: httpx.Response) -> Listing[NodeInfo]:
        d = json_body(resp)
        return Listing([NodeInfo.from_json(n) for n in d["nodes"]], unreachable_from_json(d))

    return Call("GET", "/v1/nodes", parse=parse)


def create_project(path: Any) -> Call[str]:
    p = v.string(path, "project path")
    return Call("POST", "/v1/projects", json={"path": p}, parse=lambda r: json_body(r)["path"])


def create_key(
    name: Any, project: Any, role: Any, identity: Any, expires_in: Any
) -> Call[ApiKey]:
    body: Dict[str, Any] = {"name": v.string(name, "name"), "role": v.string(role, "role")}
    if project is not None:
        body["project"] = v.string(project, "project")
    if identity is not None:
        body["identity"] = v.string(identity, "identity")
    n = v.opt_whole(expires_in, "expires_in", minimum=1)
    if n is not None:
        body["expires_in"] = n
    return Call("POST", "/v1/keys", json=body, parse=lambda r: ApiKey.from_json(json_body(r)))


def revoke_key(key_id: Any) -> Call[None]:
    k = v.string(key_id, "key id")
    return Call("DELETE", f"/v1/keys/{quote(k, safe='')}")


def whoami() -> Call[Dict[str, Any]]:
    return Call("GET", "/v1/whoami", parse=json_body)


def fncall(
    language: Any,
    code: Any,
    *,
    stdin: Any = None,
    files: Any = None,
    timeout: Any = None,
    compile_timeout: Any = None,
    memory: Any = None,
    max_output: Any = None,
    fetch_files: Any = None,
    image: Any = None,
    project: Any = None,
    queue_timeout: Any = None,
) -> Call[FnCallResult]:
    import base64

    body: Dict[str, Any] = {
        "language": v.string(language, "language"),
        "code": v.string(code, "code", empty=True),
    }
    if stdin is not None:
        body["stdin"] = v.data(stdin).decode("utf-8", "surrogateescape")
    if files:
        if not isinstance(files, Mapping):
            raise InvalidArgument("files must be a dict of path to str or bytes")
        body["files"] = {
            v.string(k, "file path"): base64.b64encode(v.data(d)).decode()
            for k, d in files.items()
        }
    for name, val in (
        ("timeout", timeout),
        ("compile_timeout", compile_timeout),
        ("queue_timeout", queue_timeout),
    ):
        s = v.seconds(val, name, zero_ok=False)
        if s is not None:
            body[name] = s
    for name, val in (("memory", memory), ("max_output", max_output)):
        n = v.size(val, name)
        if n is not None:
            body[name] = n
    if fetch_files:
        body["fetch_files"] = [v.string(f, "fetch_files entry") for f in fetch_files]
    if image is not None:
        body["image"] = v.string(image, "image")
    if project is not None:
        body["project"] = v.string(project, "project")
    own = (body.get("timeout") or 10.0) + (body.get("compile_timeout") or 30.0)
    # It may wait for a worker (queue_timeout, default its own timeouts) before it runs.
    wait = own + body.get("queue_timeout", own) + 120.0
    return Call(
        "POST",
        "/v1/fncall/run",
        json=body,
        read_timeout=wait,
        parse=lambda r: FnCallResult.from_json(json_body(r)),
    )


def fncall_batch(
    language: Any,
    code: Any,
    cases: Any,
    *,
    checker: Any = None,
    files: Any = None,
    timeout: Any = None,
    compile_timeout: Any = None,
    memory: Any = None,
    max_output: Any = None,
    image: Any = None,
    project: Any = None,
    queue_timeout: Any = None,
) -> Call[BatchResult]:
    single = fncall(
        language,
        code,
        files=files,
        timeout=timeout,
        compile_timeout=compile_timeout,
        memory=memory,
        max_output=max_output,
        image=image,
        project=project,
        queue_timeout=queue_timeout,
    )
    body = dict(single.json)
    out = []
    for c in cases:
        if isinstance(c, Mapping):
            case = {"stdin": v.string(c.get("stdin", ""), "case stdin", empty=True)}
            if c.get("expected") is not None:
                case["expected"] = v.string(c["expected"], "case expected", empty=True)
        elif isinstance(c, (tuple, list)) and len(c) == 2:
            case = {"stdin": v.string(c[0], "case stdin", empty=True)}
            if c[1] is not None:
                case["expected"] = v.string(c[1], "case expected", empty=True)
        else:
            raise InvalidArgument("each case is (stdin, expected) or {'stdin', 'expected'}")
        out.append(case)
    body["cases"] = out
    if checker is not None:
        if isinstance(checker, str):
            checker = {"kind": checker}
        if not isinstance(checker, Mapping):
            raise InvalidArgument("checker is 'exact', 'whitespace', or a dict such as "
                                  "{'kind': 'float', 'tolerance': 1e-6}")
        body["checker"] = dict(checker)
    own = (body.get("timeout") or 10.0) * len(out) + (body.get("compile_timeout") or 30.0)
    wait = 2 * own + 300 if "queue_timeout" not in body else own + body["queue_timeout"] + 300
    return Call(
        "POST",
        "/v1/fncall/batch",
        json=body,
        read_timeout=wait,
        parse=lambda r: BatchResult.from_json(json_body(r)),
    )

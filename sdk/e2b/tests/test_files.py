"""Files through the gateway with the unmodified `e2b` SDK: write (one and many), read (text,
bytes, stream), exists, get_info, list with depth, make_dir, rename, remove, relative paths
under the user's home, and what the SDK maps from errors (missing file, existing directory)."""

from __future__ import annotations

import time

import pytest
from e2b import AsyncSandbox, FileType, NotFoundException


def test_write_read_exists_and_info(sb):
    info = sb.files.write("/home/user/x.txt", "hello")
    assert info.path == "/home/user/x.txt"
    assert sb.files.read("/home/user/x.txt") == "hello"
    assert bytes(sb.files.read("/home/user/x.txt", format="bytes")) == b"hello"
    assert b"".join(sb.files.read("/home/user/x.txt", format="stream")) == b"hello"
    assert sb.files.exists("/home/user/x.txt")
    assert not sb.files.exists("/home/user/nope")
    e = sb.files.get_info("/home/user/x.txt")
    assert (e.name, e.type, e.size, e.owner) == ("x.txt", FileType.FILE, 5, "user")
    assert e.permissions.startswith("-rw")
    # Relative paths are under the user's home; binary content round-trips.
    sb.files.write("rel.bin", b"\x00\xff\x10")
    assert bytes(sb.files.read("/home/user/rel.bin", format="bytes")) == b"\x00\xff\x10"
    assert sb.commands.run("stat -c %U /home/user/rel.bin").stdout == "user\n"
    with pytest.raises(NotFoundException):
        sb.files.read("/home/user/nope")


def test_many_files_dirs_list_rename_remove(sb):
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    sb.files.write_files(
        [WriteEntry(path="/home/user/d/a.txt", data="A"), WriteEntry(path="/home/user/d/s/b.txt", data="B")]
    )
    assert sb.commands.run("cat /home/user/d/a.txt /home/user/d/s/b.txt").stdout == "AB"
    top = sorted((e.name, e.type) for e in sb.files.list("/home/user/d"))
    assert top == [("a.txt", FileType.FILE), ("s", FileType.DIR)]
    deep = sorted(e.path for e in sb.files.list("/home/user/d", depth=2))
    assert deep == ["/home/user/d/a.txt", "/home/user/d/s", "/home/user/d/s/b.txt"]
    assert sb.files.make_dir("/home/user/new/sub") is True
    assert sb.files.make_dir("/home/user/new/sub") is False, "already there"
    assert sb.files.get_info("/home/user/new/sub").type == FileType.DIR
    moved = sb.files.rename("/home/user/d/a.txt", "/home/user/new/a.txt")
    assert moved.path == "/home/user/new/a.txt"
    assert sb.files.read("/home/user/new/a.txt") == "A"
    sb.files.remove("/home/user/d")
    assert not sb.files.exists("/home/user/d")
    assert not sb.files.exists("/home/user/d/s/b.txt")


def test_large_files_stream_both_ways(sb):
    data = bytes(range(256)) * (40 << 12)  # 40 MiB
    sb.files.write("/home/user/big.bin", data)
    assert sb.commands.run("stat -c %s /home/user/big.bin").stdout == f"{len(data)}\n"
    assert bytes(sb.files.read("/home/user/big.bin", format="bytes")) == data


def test_octet_stream_and_gzip_uploads(sb):
    import io

    data = bytes(range(256)) * 4096  # 1 MiB
    sb.files.write("/home/user/o.bin", data, use_octet_stream=True)
    assert bytes(sb.files.read("/home/user/o.bin", format="bytes")) == data
    info = sb.files.write("/home/user/g.bin", data, gzip=True)
    assert info.path == "/home/user/g.bin"
    assert bytes(sb.files.read("/home/user/g.bin", format="bytes")) == data
    # A file-like object is streamed (octet-stream by default).
    sb.files.write("/home/user/f.txt", io.BytesIO(b"from a file object"))
    assert sb.files.read("/home/user/f.txt") == "from a file object"


def test_a_broken_gzip_upload_is_a_400_and_changes_nothing(gateway, sb):
    import httpx

    sb.files.write("/home/user/keep.txt", "kept")
    headers = {
        "E2b-Sandbox-Id": sb.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sb._envd_access_token,
        "Content-Type": "application/octet-stream",
        "Content-Encoding": "gzip",
    }
    r = httpx.post(
        gateway.url + "/files",
        params={"path": "/home/user/keep.txt"},
        headers=headers,
        content=b"not gzip at all" * 100,
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert "gzip" in r.json()["message"]
    assert sb.files.read("/home/user/keep.txt") == "kept"


def test_files_as_root(sb):
    sb.files.write("/root/secret", "r", user="root")
    assert sb.files.read("/root/secret", user="root") == "r"
    assert sb.commands.run("stat -c %U /root/secret", user="root").stdout == "root\n"
    with pytest.raises(Exception):
        sb.files.read("/root/secret")


async def test_async_files(gateway):
    sb = await AsyncSandbox.create("base", timeout=60)
    try:
        await sb.files.write("/tmp/a", "async")
        assert await sb.files.read("/tmp/a") == "async"
        assert await sb.files.exists("/tmp/a")
        assert not await sb.files.exists("/tmp/b")
    finally:
        await sb.kill()


def test_signed_urls_of_a_secure_sandbox(gateway):
    """`download_url`/`upload_url` carry a signature instead of the token. Made under
    `E2B_SANDBOX_URL` they carry no sandbox id either: the request names the sandbox with the
    routing headers the SDK sends on its own calls, and the gateway checks the signature
    against that sandbox's tokens only. Without them it is refused at once (it used to make
    the gateway search every sandbox)."""
    import httpx
    from e2b import Sandbox

    s = Sandbox.create("base", timeout=60, secure=True)
    route = {"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": "49983"}
    try:
        s.files.write("/home/user/signed.txt", "signed content")
        url = s.download_url("/home/user/signed.txt")
        assert "signature=" in url
        r = httpx.get(url, headers=route, timeout=30)
        assert (r.status_code, r.text) == (200, "signed content")
        r = httpx.get(url, timeout=30)
        assert r.status_code == 400 and "E2b-Sandbox-Id" in r.json()["message"], r.text
        # Under another sandbox's name it matches nothing.
        other = Sandbox.create("base", timeout=60, secure=True)
        try:
            r = httpx.get(
                url,
                headers={"E2b-Sandbox-Id": other.sandbox_id, "E2b-Sandbox-Port": "49983"},
                timeout=30,
            )
            assert r.status_code == 401, r.text
        finally:
            other.kill()
        # A user named beside the signature is not the signed one: ignored (as root, the
        # relative path would be /root/secret).
        s.files.write("/root/secret", "root only", user="root")
        r = httpx.get(
            s.download_url("secret"),
            headers={**route, "Authorization": "Basic cm9vdDo="},
            timeout=30,
        )
        assert r.status_code == 404, r.text
        # Another path under the same signature, or a write with a read's, is refused.
        r = httpx.get(url.replace("signed.txt", "other.txt"), headers=route, timeout=30)
        assert r.status_code == 401, r.text
        r = httpx.post(url, headers=route, files={"file": ("x", b"x")}, timeout=30)
        assert r.status_code == 401, r.text
        up = s.upload_url("/home/user/up.txt", use_signature_expiration=60)
        r = httpx.post(up, headers=route, files={"file": ("up.txt", b"uploaded")}, timeout=30)
        assert r.status_code == 200, r.text
        assert s.files.read("/home/user/up.txt") == "uploaded"
        # An expired one.
        old = s.download_url("/home/user/signed.txt", use_signature_expiration=-5)
        r = httpx.get(old, headers=route, timeout=30)
        assert r.status_code == 401 and "expired" in r.json()["message"], r.text
    finally:
        s.kill()


def test_watch_dir_sync(sb):
    from e2b import FilesystemEventType

    sb.files.make_dir("/home/user/watched/sub")
    h = sb.files.watch_dir("/home/user/watched", recursive=True)
    sb.files.write("/home/user/watched/a.txt", "a")
    sb.files.write("/home/user/watched/sub/b.txt", "b")
    sb.files.rename("/home/user/watched/a.txt", "/home/user/watched/c.txt")
    sb.files.remove("/home/user/watched/sub")
    seen = []
    deadline = time.monotonic() + 10
    want = {
        ("a.txt", FilesystemEventType.CREATE),
        ("sub/b.txt", FilesystemEventType.CREATE),
        ("a.txt", FilesystemEventType.RENAME),
        ("c.txt", FilesystemEventType.CREATE),
        ("sub", FilesystemEventType.REMOVE),
    }
    while not want <= {(e.name, e.type) for e in seen} and time.monotonic() < deadline:
        seen.extend(h.get_new_events())
        time.sleep(0.1)
    assert want <= {(e.name, e.type) for e in seen}, seen
    h.stop()
    with pytest.raises(Exception):
        h.get_new_events()
    with pytest.raises(Exception):
        sb.files.watch_dir("/home/user/nowhere")
    # With entries (envd 0.6.3), and network mounts allowed (0.6.4: nothing to refuse here).
    h = sb.files.watch_dir("/home/user/watched", include_entry=True, allow_network_mounts=True)
    sb.files.write("/home/user/watched/e.txt", "12345")
    deadline = time.monotonic() + 10
    seen = []
    while not any(e.name == "e.txt" and e.entry for e in seen) and time.monotonic() < deadline:
        seen.extend(h.get_new_events())
        time.sleep(0.1)
    entry = next(e.entry for e in seen if e.name == "e.txt" and e.entry)
    assert entry.size == 5 and entry.path == "/home/user/watched/e.txt", entry
    h.stop()


async def test_watch_dir_async(gateway):
    import asyncio

    from e2b import FilesystemEventType

    sb = await AsyncSandbox.create("base", timeout=60)
    try:
        await sb.files.make_dir("/home/user/w")
        got = []
        h = await sb.files.watch_dir("/home/user/w", on_event=got.append, recursive=True)
        await sb.files.write("/home/user/w/x.txt", "x")
        await sb.commands.run("mkdir /home/user/w/d && sleep 0.3 && touch /home/user/w/d/y")
        for _ in range(100):
            names = {(e.name, e.type) for e in got}
            if ("d/y", FilesystemEventType.CREATE) in names:
                break
            await asyncio.sleep(0.1)
        names = {(e.name, e.type) for e in got}
        assert ("x.txt", FilesystemEventType.CREATE) in names, got
        assert ("d", FilesystemEventType.CREATE) in names, got
        assert ("d/y", FilesystemEventType.CREATE) in names, got
        await h.stop()
    finally:
        await sb.kill()


def test_file_metadata(sb):
    info = sb.files.write("/home/user/m.txt", "m", metadata={"Author": "agent-7", "run": "42"})
    assert info.metadata == {"author": "agent-7", "run": "42"}
    got = sb.files.get_info("/home/user/m.txt")
    assert got.metadata == {"author": "agent-7", "run": "42"}
    assert [e.metadata for e in sb.files.list("/home/user") if e.name == "m.txt"] == [got.metadata]
    # Set inside the sandbox under envd's names: seen too.
    sb.commands.run(
        "python3 -c \"import os; os.setxattr('m.txt', 'user.e2b.tool', b'vim')\""
    )
    assert sb.files.get_info("m.txt").metadata == {"author": "agent-7", "run": "42", "tool": "vim"}
    # Multipart uploads of several files carry it too; a rewrite without it clears it.
    sb.files.write_files(
        [{"path": "/home/user/p.txt", "data": "p"}, {"path": "/home/user/q.txt", "data": "q"}],
        metadata={"k": "v"},
    )
    assert sb.files.get_info("q.txt").metadata == {"k": "v"}
    sb.files.write("/home/user/m.txt", "again")
    assert sb.files.get_info("m.txt").metadata is None

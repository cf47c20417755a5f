#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (fuzz/corpus/<target>/): small valid inputs of each
format, so the fuzzer starts from the parsers' deep paths. Run again after a format changes;
the files are checked in (a few KB per target)."""
import io, json, os, shutil, ssl, struct, tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def client_hello(server, alpn=None):
    """The first flight of Python's (OpenSSL's) TLS client."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(inc, out, server_hostname=server)
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def records(hello, size):
    """A hello's handshake message cut into records of `size` bytes."""
    msg = hello[5:]
    return b"".join(b"\x16\x03\x01" + struct.pack(">H", len(msg[i:i + size])) + msg[i:i + size]
                    for i in range(0, len(msg), size))


def tls():
    h = client_hello("pypi.org")
    write("tls_client_hello", "pypi", b"\x00" + h)
    write("tls_client_hello", "pypi-reads-of-7", b"\x07" + h)
    write("tls_client_hello", "alpn-three-records", b"\x00" + records(client_hello("files.pythonhosted.org", ["h2", "http/1.1"]), 200))
    write("tls_client_hello", "no-sni", b"\x00" + client_hello(None))


def http():
    reqs = {
        "get": b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "keepalive-bodies": b"POST /a HTTP/1.1\r\nHost: example.com:8080\r\nContent-Length: 5\r\n\r\nhello"
                            b"\r\nGET /b HTTP/1.1\r\nhost: EXAMPLE.com\r\n\r\n",
        "chunked-trailers": b"POST /up HTTP/1.1\r\nHost: pypi.org\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"5;ext=1\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\nGET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        "absolute-form": b"GET http://example.org:80/x?y HTTP/1.1\r\nHost: example.org\r\n\r\n",
        "upgrade": b"GET /ws HTTP/1.1\r\nHost: a.b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x05hello",
        "http10-lf": b"\r\nGET / HTTP/1.0\nHost: a.b\n\n",
    }
    for i, (name, r) in enumerate(reqs.items()):
        write("http_requests", name, bytes([0 if i % 2 == 0 else 3]) + r)


def dns_name(n):
    return b"".join(bytes([len(l)]) + l.encode() for l in n.split(".") if l) + b"\x00"


def dns_header(id, flags, qd=1, an=0, ns=0, ar=0):
    return struct.pack(">HHHHHH", id, flags, qd, an, ns, ar)


OPT = b"\x00" + struct.pack(">HHIH", 41, 1232, 0, 0)


def rr(name, typ, data, ttl=300):
    return name + struct.pack(">HHIH", typ, 1, ttl, len(data)) + data


def dns():
    q = lambda n, t, c=1: dns_name(n) + struct.pack(">HH", t, c)
    write("dns_message", "a", dns_header(0x1234, 0x0100) + q("pypi.org", 1))
    write("dns_message", "aaaa-edns", dns_header(0x4321, 0x0100, ar=1) + q("Files.PythonHosted.org", 28) + OPT)
    write("dns_message", "edns-v1", dns_header(7, 0x0100, ar=1) + q("a.b", 1) + b"\x00" + struct.pack(">HHIH", 41, 4096, 0x00010000, 0))
    write("dns_message", "chaos", dns_header(8, 0x0100) + q("version.bind", 16, 3))
    write("dns_message", "notify", dns_header(9, 0x2000) + q("a.b", 6))
    # Answers: a CNAME chain (compressed names), addresses in and out of the never ranges.
    name = dns_name("www.example.com")
    ans = (rr(b"\xc0\x0c", 5, dns_name("cdn.example.net"))
           + rr(dns_name("cdn.example.net"), 1, bytes([93, 184, 216, 34]))
           + rr(dns_name("cdn.example.net"), 1, bytes([10, 0, 0, 1]))
           + rr(dns_name("other.example"), 1, bytes([1, 2, 3, 4])))
    write("dns_message", "answer-chain", dns_header(0x55, 0x8180, an=4, ar=1) + name + struct.pack(">HH", 1, 1) + ans + OPT)
    ans6 = rr(b"\xc0\x0c", 28, bytes(15) + b"\x01") + rr(b"\xc0\x0c", 28, b"\x26\x06" + bytes(13) + b"\x01")
    write("dns_message", "answer-aaaa", dns_header(0x56, 0x8180, an=2) + q("v6.example", 28) + ans6)
    write("dns_message", "answer-loop", dns_header(0x57, 0x8180, an=2) + q("a.example", 5)
          + rr(b"\xc0\x0c", 5, dns_name("b.example")) + rr(dns_name("b.example"), 5, b"\xc0\x0c"))


def envelope(flags, payload):
    return bytes([flags]) + struct.pack(">I", len(payload)) + payload


def connect():
    start = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/home/user"}}).encode()
    write("connect_envelope", "start", b"\x00\x00" + envelope(0, start))
    write("connect_envelope", "stream-in-chunks", b"\x03\x00" + envelope(0, b'{"input":{"stdin":"aGk="}}') + envelope(0, b"{}") + envelope(2, b"{}"))
    write("connect_envelope", "end-error", b"\x00\x01" + envelope(2, b'{"error":{"code":"canceled","message":"x"}}'))
    write("connect_envelope", "compressed", b"\x00\x00" + envelope(1, b"\x1f\x8b"))


def frame(kind, payload):
    return struct.pack(">I", len(payload) + 1) + bytes([kind]) + payload


def guest():
    msg = lambda o: frame(1, json.dumps(o).encode())
    exec_spec = {"argv": ["/bin/sh", "-c", "echo hi"], "env": [["A", "1"]], "user": "user", "max_output": 65536, "timeout_ms": 1000}
    write("guest_frames", "exec-stdin", msg({"protocol": 1, "op": {"op": "exec", **exec_spec, "stdin": "open"}}) + frame(4, b"input\n") + frame(4, b""))
    write("guest_frames", "hello-pong", msg({"protocol": 1, "agent": "0.1.0"}) + msg({"reply": "pong", "uptime_ms": 5, "processes": 1}))
    write("guest_frames", "ping-data", msg({"protocol": 1, "op": {"op": "ping"}}) + frame(5, b"file content") + frame(5, b"") + frame(2, b"out") + frame(3, b"err"))
    write("guest_frames", "started-attach", msg({"reply": "started", "process": 3, "pid": 42}) + msg({"protocol": 1, "op": {"op": "attach", "process": 3}}))


def tar_of(entries, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for info, data in entries:
            info.mtime = 1700000000
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def ti(name, typ=tarfile.REGTYPE, size=0, mode=0o644, link="", uid=0, pax=None, devmajor=0, devminor=0):
    i = tarfile.TarInfo(name)
    i.type, i.size, i.mode, i.linkname, i.uid, i.gid = typ, size, mode, link, uid, uid
    i.devmajor, i.devminor = devmajor, devminor
    if pax:
        i.pax_headers = pax
    return i


def images():
    layer = tar_of([
        (ti("etc/", tarfile.DIRTYPE, mode=0o755), None),
        (ti("etc/hosts", size=10, pax={"SCHILY.xattr.user.note": "x"}), b"127.0.0.1\n"),
        (ti("bin/", tarfile.DIRTYPE, mode=0o755), None),
        (ti("bin/sh", tarfile.SYMTYPE, link="busybox"), None),
        (ti("bin/busybox", size=4, mode=0o4755, uid=1000), b"\x7fELF"),
        (ti("bin/ls", tarfile.LNKTYPE, link="bin/busybox"), None),
        (ti("usr/lib/.wh.gone"), b""),
        (ti("var/cache/.wh..wh..opq"), b""),
        (ti("dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3), None),
        (ti("tmp/fifo", tarfile.FIFOTYPE), None),
    ])
    write("image_unpack", "layer", b"\x01" + layer)
    write("image_unpack", "gnu-longname", b"\x01" + tar_of([(ti("d/" + "n" * 120, size=2), b"hi")], tarfile.GNU_FORMAT))
    blob = tar_of([(ti("a", size=1), b"a")])
    oci = tar_of([
        (ti("oci-layout", size=30), b'{"imageLayoutVersion":"1.0.0"}'),
        (ti("index.json", size=2), b"{}"),
        (ti("blobs/sha256/", tarfile.DIRTYPE, mode=0o755), None),
        (ti("blobs/sha256/" + "0" * 64, size=len(blob)), blob),
    ])
    write("image_unpack", "oci-layout", b"\x00" + oci)
    docker = tar_of([
        (ti("manifest.json", size=2), b"[]"),
        (ti("abc/layer.tar", size=len(blob)), blob),
        (ti("def/layer.tar", tarfile.SYMTYPE, link="../abc/layer.tar"), None),
    ], tarfile.USTAR_FORMAT)
    write("image_unpack", "docker-save", b"\x00" + docker)


def seccomp():
    os.makedirs(os.path.join(OUT, "seccomp_policy"), exist_ok=True)
    src = os.path.join(HERE, "..", "crates", "warren-guest", "seccomp", "agent.json")
    shutil.copy(src, os.path.join(OUT, "seccomp_policy", "agent.json"))
    small = {
        "agent": {"default_action": {"trace": 0x5741}, "filter_action": "allow", "filter": [
            {"syscall": "read"},
            {"syscall": "ioctl", "args": [{"index": 1, "type": "dword", "op": "eq", "val": 21505}]},
            {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": {"masked_eq": 0xff}, "val": 1}]},
        ]},
        "enosys": {"default_action": "allow", "filter_action": {"errno": 38}, "filter": [{"syscall": "clone3"}]},
    }
    write("seccomp_policy", "small", json.dumps(small, indent=1).encode())


def image_import():
    import gzip, hashlib
    sha = lambda b: "sha256:" + hashlib.sha256(b).hexdigest()
    layer = tar_of([(ti("etc/", tarfile.DIRTYPE, mode=0o755), None), (ti("etc/os-release", size=8), b"ID=fuzz\n"),
                    (ti("bin/sh", tarfile.SYMTYPE, link="busybox"), None), (ti("old/.wh.x"), b"")])
    write("image_import", "tar", layer)
    write("image_import", "tar-gzip", gzip.compress(layer, mtime=0))
    layer_gz = gzip.compress(layer, mtime=0)
    config = json.dumps({"config": {"Env": ["PATH=/bin", "A=1"], "User": "1000", "WorkingDir": "/w"}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config), "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(layer_gz), "size": len(layer_gz)}]}).encode()
    inner = json.dumps({"manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(manifest),
                                       "platform": {"architecture": "amd64", "os": "linux"}},
                                      {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(b"x"),
                                       "platform": {"architecture": "unknown", "os": "unknown"}}]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": sha(inner)}]}).encode()
    blobs = [(ti("blobs/sha256/" + sha(b)[7:], size=len(b)), b) for b in (config, manifest, inner, layer_gz)]
    oci = tar_of([(ti("oci-layout", size=30), b'{"imageLayoutVersion":"1.0.0"}'), (ti("index.json", size=len(index)), index)] + blobs)
    write("image_import", "oci-layout", oci)
    dm = json.dumps([{"Config": "cfg.json", "Layers": ["a/layer.tar", "b/layer.tar"]}]).encode()
    docker = tar_of([(ti("manifest.json", size=len(dm)), dm), (ti("cfg.json", size=len(config)), config),
                     (ti("a/layer.tar", size=len(layer)), layer), (ti("b/layer.tar", tarfile.SYMTYPE, link="../a/layer.tar"), None)])
    write("image_import", "docker-save", gzip.compress(docker, mtime=0))
    write("image_import", "erofs", bytes(1024) + b"\xe2\xe1\xf5\xe0" + bytes(60))


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    tls(); http(); dns(); connect(); guest(); images(); image_import(); seccomp()

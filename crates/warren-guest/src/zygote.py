# The Python zygote of a function-call worker (see call.rs): the image's own python3, started
# once by the call server with only CAP_SETUID and CAP_SETGID (root without the rest), already
# under the agent's Landlock ruleset and system-call filter, isolated (-I) and without `site`
# (-S: no .pth file or sitecustomize of the image runs here), which forks one child per Python
# step. The child becomes the grader's uid (which drops those two), takes the step's limits
# (the ruleset and the filter it has from the zygote), runs `site`, and runs the program as
# `python3 main.py ARGS` would, in an interpreter already started.
#
# argv: the server's socket (SOCK_SEQPACKET), the grader's uid.
# Each step comes as one message with five descriptors: a memfd with its request (read by the
# child only), its stdin, stdout and stderr, and the pipe the zygote reports on.
import atexit
import builtins
import ctypes
import importlib.machinery
import io
import json
import os
import resource
import site  # under -S, importing it runs nothing: each child calls site.main()
import socket
import sys
import traceback
import types
import weakref

# What programs often import, so that they find it loaded (no module that starts a thread).
import bisect  # noqa: F401
import collections  # noqa: F401
import dataclasses  # noqa: F401
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import math  # noqa: F401
import random  # noqa: F401
import re  # noqa: F401
import string  # noqa: F401
import typing  # noqa: F401

libc = ctypes.CDLL(None, use_errno=True)
REAL_OPEN = io.open
OPENED = []
PR_SET_DUMPABLE, PR_SET_NAME = 4, 15

def limit(v):
    return resource.RLIM_INFINITY if v >= 1 << 63 else v


def confine(req):
    os.setgroups([])
    os.setgid(GRADER)
    os.setuid(GRADER)  # from root: every capability goes
    for res, soft, hard in req["rlimits"]:
        resource.setrlimit(res, (limit(soft), limit(hard)))


def main_frames(tb, path):
    # The traceback from the program's own frames on (not this program's).
    t = tb
    while t is not None and t.tb_frame.f_code.co_filename != path:
        t = t.tb_next
    return t or tb


def run_main(path, argv):
    # As `python3 main.py ARGS` runs it: a new __main__ module, the file's code compiled with
    # none of this program's flags, sys.argv as given.
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins
    main.__spec__ = None
    sys.modules["__main__"] = main
    sys.argv = list(argv)
    exec(code, main.__dict__)


def child(fds):
    # Runs in the fork, as root until confine(): nothing of the call's is imported or run
    # before it, and the call's request is read here, never by the zygote.
    try:
        request, stdin, out, err, status = fds
        os.close(status)
        with os.fdopen(request, "rb") as f:
            req = json.loads(f.read())
        for fd, to in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, to)
            os.close(fd)
        confine(req)
        os.closerange(3, 2**31 - 1)
        os.chdir("/work")
        os.environ.clear()
        os.environ.update(req["env"])
        # What these two ask of an interpreter's start, done here (the server sends no other
        # PYTHON* variable to the zygote).
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):
            sys.dont_write_bytecode = True
        if os.environ.get("PYTHONUNBUFFERED"):
            for fd, name in ((1, "stdout"), (2, "stderr")):
                old = getattr(sys, name)
                new = io.TextIOWrapper(
                    io.FileIO(fd, "w", closefd=False),
                    encoding=old.encoding,
                    errors=old.errors,
                    write_through=True,
                )
                setattr(sys, name, new)
                setattr(sys, "__" + name + "__", new)
        # What `site` does at an interpreter's start (site-packages on the path, their .pth
        # files, sitecustomize), done here, confined, as the grader: never in the zygote.
        site.main()
        argv = req["argv"]
        path = os.path.abspath(argv[1])
        sys.path.insert(0, os.path.dirname(path))
    except BaseException as e:
        os.write(2, f"warren: the step could not start: {e}\n".encode())
        os._exit(126)
    builtins.open = io.open = tracking_open
    try:
        run_main(path, argv[1:])
        code = 0
    except SystemExit as e:
        c = e.code
        if c is None:
            code = 0
        elif isinstance(c, int):
            code = c & 0xFF
        else:
            print(c, file=sys.stderr)
            code = 1
    except BaseException as e:
        tb = main_frames(e.__traceback__, path)
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        code = 1
    leave(code)


def tracking_open(*args, **kwargs):
    f = REAL_OPEN(*args, **kwargs)
    try:
        OPENED.append(weakref.ref(f))
    except TypeError:
        pass
    return f


def leave(code):
    # What an interpreter's exit does that a program can see: threads joined, atexit handlers
    # run, every file it opened and the standard streams flushed. (The rest of a full
    # finalization, which costs milliseconds, is skipped.)
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for r in OPENED:
        f = r()
        if f is not None:
            try:
                if not f.closed:
                    f.flush()
            except BaseException:
                pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 120
    os._exit(code)


def serve():
    global GRADER
    sock = int(sys.argv[1])
    GRADER = int(sys.argv[2])
    # `-c` put the working directory first on the path: a child imports nothing from there.
    if sys.path and sys.path[0] == "":
        sys.path.pop(0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_NAME, b"warren-zygote", 0, 0, 0)
    srv = socket.socket(fileno=sock)
    sys.stdout.flush()
    sys.stderr.flush()
    srv.send(b"ready")
    while True:
        msg, fds, _, _ = socket.recv_fds(srv, 16, 5)
        if not msg:
            return
        if len(fds) != 5:
            for f in fds:
                os.close(f)
            continue
        pid = os.fork()
        if pid == 0:
            srv.detach()
            child(fds)
        for f in fds[:4]:
            os.close(f)
        while True:
            _, st, ru = os.wait4(pid, 0)
            # A child that traces itself stops, and its parent hears of it: it waits on (the
            # step's limits end it).
            if not os.WIFSTOPPED(st):
                break
        report = {
            "cpu_us": int((ru.ru_utime + ru.ru_stime) * 1e6),
            "max_rss": ru.ru_maxrss * 1024,
        }
        if os.WIFEXITED(st):
            report["exit_code"] = os.WEXITSTATUS(st)
        elif os.WIFSIGNALED(st):
            report["signal"] = os.WTERMSIG(st)
        try:
            os.write(fds[4], json.dumps(report).encode())
        except OSError:
            pass  # the server stopped reading (the step's limits): it needs no report
        os.close(fds[4])


serve()

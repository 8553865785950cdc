"""The tests' gcloud without its start-up: the real Cloud SDK imported once, forked per command.

Each ``gcloud`` the product runs costs about 0.5-1 s of CPU, most of it Python importing the
Cloud SDK (``googlecloudsdk.gcloud_main`` and some 840 modules) before it reads its command
line. A test session runs gcloud hundreds of times with a handful of environments, so here:

- the **dispatcher** (``python gcloud_zygote.py serve SOCKET``, started by conftest.py) listens
  on a Unix socket (0600, in the session's private scratch dir);
- a **zygote** is the SDK's own Python, started as the real ``gcloud`` wrapper would start it
  (bin/gcloud's environment, its interpreter and flags), that runs gcloud.py's own steps up to
  and including ``import googlecloudsdk.gcloud_main`` and then waits; while it imports, it
  records everything the import read from outside: each environment variable (present or
  not), each file or directory it opened, listed or stat'ed, the cwd if asked, and refuses to
  serve at all if the import wrote anything or started a program it cannot account for;
- the **shim**, ``tests/gcloud_zygote_bin/gcloud``, first on the tests' PATH, sends its argv,
  environment (as bin/gcloud exports it), cwd, and its own stdin/stdout/stderr (the fds
  themselves, SCM_RIGHTS) to the dispatcher, which hands them to a zygote whose recorded
  reads are all the same for this call (same value of every variable it read, every file it
  read unchanged), starting one when none is. The zygote forks; the child takes the call's
  fds as 0/1/2, its cwd and environment, and runs the real ``gcloud.main()`` with its argv:
  the Cloud SDK's own code parses and runs every command line. Its exit status (or the signal
  that ended it) comes back, and the shim exits with it (or dies of it).

What a forked child does not share with a fresh gcloud is only what the recording shows the
import did not read. A call the zygote cannot answer exactly goes to the real gcloud (the shim
execs the next ``gcloud`` on PATH): a terminal on any of its fds or a controlling terminal,
``CLOUDSDK_PYTHON`` set, no dispatcher, or ``MULTIHOST_TEST_GCLOUD_ZYGOTE=0`` (the off switch:
conftest.py then leaves PATH alone too).

The stand-in cloud's VMs (the fleet's hosts, each a Unix user of its own) run gcloud too,
from their startup scripts: where the dispatcher runs as root it also listens on a second
socket those users can reach (``vm_path``, with the shim beside it). A call there is served
as its caller, known from the socket's peer credentials: its zygote imports under that user's
ids (real and effective: as a fresh gcloud of theirs would) and returns to root once imported,
so that no process of the user's outlives the calls; each child drops to the user's ids for
good before it runs the command.

Nothing outlives its caller: the child is in a session and process group of its own; the
shim forwards the signals a caller sends it (TERM, INT, HUP, QUIT, USR1, USR2) to the child;
when the shim itself ends (SIGKILL of its process group by the product's timeout), the zygote
sees its socket close and kills the child's whole group. Children, zygotes and the
dispatcher die with their parents (PR_SET_PDEATHSIG) and the dispatcher is the pytest
process's child, so every CPU second is counted where benchmarks/suite_cpu.py looks.

This file runs under the tests' Python (dispatcher) and under the Cloud SDK's bundled Python
(zygote): standard library only.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

OFF_ENV = "MULTIHOST_TEST_GCLOUD_ZYGOTE"  # "0": plain gcloud for the whole session
SOCKET_ENV = "MULTIHOST_TEST_GCLOUD_ZYGOTE_SOCKET"  # where the shim finds the dispatcher
BIN_DIR = Path(__file__).resolve().parent / "gcloud_zygote_bin"  # the shim, named ``gcloud``
MAX_ZYGOTES = 12  # zygotes kept (about 100 MB each); the least recently used goes first
VM_DIR_ENV = "MULTIHOST_TEST_GCLOUD_ZYGOTE_VM"  # the fleet's hosts' way in (see vm_path)
_PR_SET_PDEATHSIG = 1
# What Python's own start-up reads (before any code of ours runs): a zygote serves only calls
# with the same values. tput(1), which the SDK runs at import for the terminal's size, reads
# the terminal ones.
_STARTUP_PREFIXES = ("PYTHON", "LC_")
_STARTUP_KEYS = ("HOME", "TZ", "LANG", "LANGUAGE", "TERM", "TERMINFO", "TERMINFO_DIRS", "TERMCAP")
_STARTUP_KEYS += ("LINES", "COLUMNS", "CLOUDSDK_ROOT_DIR")


# -- what bin/gcloud does before it execs the SDK's Python ------------------------------------
def sdk_root(gcloud: str) -> str:
    """``CLOUDSDK_ROOT_DIR`` as bin/gcloud works it out from its own path (``$0``): symlinks
    followed as written (``/usr/bin/gcloud`` gives ``/usr/bin/../lib/google-cloud-sdk``)."""
    path, is_dir = gcloud, False
    while True:
        while True:
            try:
                link = os.readlink(path)
            except OSError:
                break
            path = link if link.startswith("/") else f"{os.path.dirname(path)}/{link}"
        if is_dir or os.path.isdir(path):
            break
        is_dir, path = True, os.path.dirname(path)
    while path.endswith(("/", "/.")) and len(path) > 1:
        path = os.path.dirname(path + "/.") if path.endswith("/") else os.path.dirname(path)
    return os.path.dirname(path) if path.endswith("/bin") else path


def wrapper_env(env: dict[str, str], gcloud: str) -> dict[str, str] | None:
    """The environment bin/gcloud (Cloud SDK 528, found at ``gcloud``) gives gcloud.py when it
    runs its bundled Python, or None where it would not (``CLOUDSDK_PYTHON`` set, none
    bundled): those calls go to the real gcloud. tests/test_gcloud_zygote.py runs bin/gcloud
    itself to check this against it."""
    root = sdk_root(gcloud)
    python = f"{root}/platform/bundledpythonunix/bin/python3"
    if env.get("CLOUDSDK_PYTHON") or not os.access(python, os.X_OK):
        return None
    out = dict(env)
    out.pop("PYTHONHOME", None)
    out["CLOUDSDK_PYTHON_SITEPACKAGES"] = "1"  # the bundled Python's branch sets it so
    args = out.get("CLOUDSDK_PYTHON_ARGS")
    while args is not None and " -S " in f" {args} ":  # its loop: ${A%%-S*}' '${A#*-S}
        first = args.index("-S")
        args = f"{args[:first]} {args[first + 2 :]}"
    if args is not None:  # exported, but an unset one stays unset
        out["CLOUDSDK_PYTHON_ARGS"] = args
    for key in ("CLOUDSDK_GSUTIL_PYTHON", "CLOUDSDK_BQ_PYTHON"):
        if not out.get(key):
            out[key] = python
    encoding = out.get("CLOUDSDK_ENCODING") or out.get("PYTHONIOENCODING") or "UTF-8"
    out["CLOUDSDK_ENCODING"] = encoding
    out["PYTHONIOENCODING"] = encoding
    out["CLOUDSDK_ROOT_DIR"] = root
    return out


# -- messages: a length-prefixed JSON header, fds alongside -----------------------------------
def send_msg(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    payload = struct.pack("!I", len(data)) + data
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([payload], anc)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def recv_msg(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """One message and the fds that came with it; None at EOF."""
    fds = array.array("i")
    head, anc, _, _ = sock.recvmsg(4, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if not head:
        return None
    while len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            return None
        head += more
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        more = sock.recv(size - len(body))
        if not more:
            return None
        body += more
    return json.loads(body), list(fds)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def file_sig(path: str, how: str) -> Any:
    """What the import could have learnt from ``path`` by the way it looked at it: its type
    (stat'ed), its names (listed), or its inode, size and mtime (opened); None: not there."""
    try:
        st = os.stat(path)
        if how == "list" and os.path.isdir(path):
            return sorted(os.listdir(path))
    except OSError:
        return None
    if how == "open":
        return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode]
    return st.st_mode & 0o170000


# -- the zygote (runs under the SDK's Python) ---------------------------------------------------
class _Recorder:
    """What an import reads from outside the SDK's own install: variables, paths, the cwd."""

    def __init__(self) -> None:
        self.env: dict[str, str | None] = {}
        self.paths: dict[str, str] = {}  # path -> how it was looked at: stat, list, open
        self.cwd = False
        self.whole_env = False
        self.unsafe: list[str] = []
        self.on = False
        root = os.path.realpath(os.environ["CLOUDSDK_ROOT_DIR"])
        installed = {f"{root}/lib", f"{root}/platform", sys.prefix, sys.base_prefix}
        self.ignore = tuple(os.path.realpath(p) + os.sep for p in installed)
        self.ignore += ("/proc/", "/dev/", "/sys/")

    def key(self, key: object) -> None:
        if not self.on:
            return
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name not in self.env:
            self.on = False  # the look-up below is ours, not the import's
            try:
                self.env[name] = os.environ.get(name)
            finally:
                self.on = True

    def path(self, path: object, how: str = "stat") -> None:
        if not self.on or isinstance(path, int):
            return
        with contextlib.suppress(Exception):
            p = os.path.abspath(os.fsdecode(path))  # type: ignore[arg-type]
            if not p.startswith(self.ignore) and p + os.sep not in self.ignore:
                if how != "stat" and self.paths.get(p) != "open":
                    self.paths[p] = how
                self.paths.setdefault(p, how)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.on:
            return
        if event == "open":
            path, mode, flags = args
            writes = (mode and any(c in str(mode) for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            if writes and not str(path).startswith("/dev/"):
                self.unsafe.append(f"opened {path} to write")
            self.path(path, "open")
        elif event in ("os.listdir", "os.scandir"):
            self.path(args[0] if args[0] is not None else ".", "list")
        elif event in (
            "os.mkdir",
            "os.rename",
            "os.remove",
            "os.rmdir",
            "os.chmod",
            "shutil.rmtree",
        ):
            self.unsafe.append(f"{event} {args[0]}")
        elif event == "subprocess.Popen":
            exe, argv = args[0], args[1]
            name = os.path.basename(os.fsdecode(exe or (argv[0] if argv else "")))
            if name != "tput":  # any other program's reads are not known here
                self.whole_env = True


def _as_user(creds: list[Any] | None) -> None:
    """This process's ids become the caller's (``[uid, gid, groups]``), the saved ones kept
    (root) so that ``_as_root`` can come back."""
    if creds:
        uid, gid, groups = creds
        os.setgroups(groups)
        os.setresgid(gid, gid, 0)
        os.setresuid(uid, uid, 0)


def _as_root(creds: list[Any] | None) -> None:
    if creds:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)
        os.setgroups([])


def _drop_to(creds: list[Any] | None) -> None:
    """For good: a child serving a fleet user's call."""
    if creds:
        uid, gid, groups = creds
        os.setgroups(groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)


def _zygote_main() -> None:
    """Started as bin/gcloud starts gcloud.py (its Python, flags and environment), fd 3 the
    dispatcher: import as gcloud.py does, say what the import read, then fork per call.
    ``argv[3]``, where given: the caller's ids, under which the import runs."""
    control = socket.socket(fileno=int(sys.argv[2]))
    creds = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    _as_user(creds)
    rec = _Recorder()
    env_class = type(os.environ)

    class _Watched(env_class):  # type: ignore[misc, valid-type]
        def __getitem__(self, key: Any) -> Any:
            rec.key(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            rec.key(key)
            return super().__contains__(key)

        def __iter__(self) -> Iterator[Any]:
            if rec.on:
                rec.whole_env = True
            return super().__iter__()

    wrapped: dict[str, Callable[..., Any]] = {}

    def watch(name: str) -> None:
        real = getattr(os, name)
        wrapped[name] = real

        def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
            rec.path(path)
            return real(path, *args, **kwargs)

        setattr(os, name, stat)

    def getcwd() -> str:
        rec.cwd = rec.cwd or rec.on
        return wrapped["getcwd"]()

    sys.addaudithook(rec.audit)
    for name in ("stat", "lstat", "access"):
        watch(name)
    wrapped["getcwd"] = os.getcwd
    os.getcwd = getcwd  # type: ignore[assignment]
    os.environ.__class__ = _Watched
    os.environb.__class__ = _Watched
    # gcloud.py's own steps before its main(), gcloud.py loaded as the script it is: from the
    # path bin/gcloud gives, its directory (symlinks resolved) first on sys.path
    gcloud_py = f"{os.environ['CLOUDSDK_ROOT_DIR']}/lib/gcloud.py"
    sys.path[0] = os.path.dirname(os.path.realpath(gcloud_py))
    sys.argv = [gcloud_py]
    rec.on = True
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("gcloud", gcloud_py)
        assert spec is not None
        assert spec.loader is not None
        gcloud = importlib.util.module_from_spec(spec)
        sys.modules["gcloud"] = gcloud
        spec.loader.exec_module(gcloud)

        sys.path = gcloud.reorder_sys_path(sys.path)
        from googlecloudsdk.core.util import encoding  # type: ignore[import-not-found]  # noqa: F401

        gcloud._fix_google_module()
        gcloud_main = gcloud._import_gcloud_main()
    finally:
        rec.on = False
        os.environ.__class__ = env_class
        os.environb.__class__ = env_class
        for name, real in wrapped.items():
            setattr(os, name, real)
        _as_root(creds)
    env = dict(rec.env)
    for key in os.environ:
        if key.startswith(_STARTUP_PREFIXES) or key in _STARTUP_KEYS:
            env[key] = os.environ[key]
    for key in _STARTUP_KEYS:
        env.setdefault(key, None)
    signature = {
        "env": None if rec.whole_env else env,
        "whole_env": dict(os.environ) if rec.whole_env else None,
        "files": {p: [how, file_sig(p, how)] for p, how in sorted(rec.paths.items())},
        "cwd": os.getcwd() if rec.cwd else None,
        "unsafe": rec.unsafe,
        "threads": threading.active_count(),
    }
    send_msg(control, signature)
    os.chdir("/")  # holds no caller's directory; each child goes to its own
    if rec.unsafe or threading.active_count() != 1:
        return
    _serve_forks(control, gcloud, gcloud_main, creds)


def _serve_forks(
    control: socket.socket, gcloud: Any, gcloud_main: Any, creds: list[Any] | None = None
) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()  # the children's refcounts then touch fewer of the zygote's pages
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ, "control")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}  # pid -> the shim's connection
    open_control = True
    while open_control or children:
        for key, _ in sel.select():
            if key.data == "control":
                got = recv_msg(control)
                if got is None:
                    sel.unregister(control)
                    open_control = False
                    continue
                request, fds = got
                conn = socket.socket(fileno=fds[0])
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, gcloud, gcloud_main, creds)  # never returns
                for fd in fds[1:]:
                    os.close(fd)
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            elif key.data == "wake":
                os.read(wake_r, 512)
                _reap(children, sel)
            else:
                pid = key.data
                conn = key.fileobj  # type: ignore[assignment]
                try:
                    data = conn.recv(64)
                except OSError:
                    data = b""
                if data:
                    for line in data.decode().split():
                        with contextlib.suppress(ProcessLookupError, ValueError):
                            os.kill(pid, int(line))
                else:  # the shim is gone: so is its gcloud, and what that started
                    sel.unregister(conn)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
        _reap(children, sel)


def _reap(children: dict[int, socket.socket], sel: selectors.BaseSelector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        with contextlib.suppress(OSError):
            conn.sendall(f"E {os.waitstatus_to_exitcode(status)}\n".encode())
        conn.close()


def _child(
    request: dict[str, Any],
    fds: list[int],
    gcloud: Any,
    gcloud_main: Any,
    creds: list[Any] | None = None,
) -> None:
    """The call, in a fork of the imported SDK: its caller's ids, fds, cwd, umask,
    environment and argv, then gcloud.py's ``main()``, then what the interpreter does on its
    way out."""
    code = 1
    try:
        os.setsid()
        _drop_to(creds)
        _die_with_parent()  # after the ids changed (a change clears it)
        if isinstance(request.get("umask"), int):
            os.umask(request["umask"])
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds[1:4]):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") < 65536 else 65536)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [f"{request['env']['CLOUDSDK_ROOT_DIR']}/lib/gcloud.py", *request["argv"]]
        gcloud_main.START_TIME = time.time()  # when this gcloud started, for its metrics
    except BaseException:
        with contextlib.suppress(Exception):
            import traceback

            os.write(2, f"gcloud zygote: {traceback.format_exc()}".encode())
        os._exit(1)
    try:
        gcloud.main()
        code = 0
    except SystemExit as exit:
        code = _exit_status(exit.code)
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    code = _finish() or code
    os._exit(code)


def _exit_status(code: object) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _finish() -> int:
    """The interpreter's way out: non-daemon threads joined, atexit, stdio flushed (a failed
    flush of stdout is exit 120, as in Python)."""
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    import atexit

    atexit._run_exitfuncs()
    status = 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120 if stream is sys.stdout else status
    return status


# -- the dispatcher (runs under the tests' Python, in its own process) -------------------------
class _Zygote:
    def __init__(self, request: dict[str, Any]) -> None:
        self.creds: list[Any] | None = request.get("creds")
        self.key = (json.dumps(request["env"], sort_keys=True), request["cwd"], str(self.creds))
        self.signature: dict[str, Any] | None = None
        self.ready = threading.Event()
        self.used = time.monotonic()
        mine, theirs = socket.socketpair()
        self.control = mine
        env = request["env"]
        python = f"{env['CLOUDSDK_ROOT_DIR']}/platform/bundledpythonunix/bin/python3"
        args = env.get("CLOUDSDK_PYTHON_ARGS", "").split()  # unquoted in bin/gcloud
        with open(os.devnull, "r+b") as null:
            ids = [json.dumps(self.creds)] if self.creds else []
            self.proc = subprocess.Popen(
                [python, *args, __file__, "zygote", str(theirs.fileno()), *ids],
                env=request["env"],
                cwd=request["cwd"],
                stdin=null,
                stdout=null,
                stderr=null,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        theirs.close()
        threading.Thread(target=self._hello, daemon=True).start()

    def _hello(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            got = recv_msg(self.control)
            if got is not None:
                self.signature = got[0]
        self.ready.set()

    def usable(self) -> bool:
        sig = self.signature
        return bool(sig and not sig["unsafe"] and sig["threads"] == 1 and self.proc.poll() is None)

    def serves(self, request: dict[str, Any]) -> bool:
        """Every outside thing the import read is the same for this call."""
        sig = self.signature
        if not self.usable() or sig is None or request.get("creds") != self.creds:
            return False
        env = request["env"]
        if sig["whole_env"] is not None and sig["whole_env"] != env:
            return False
        if sig["env"] is not None and any(env.get(k) != v for k, v in sig["env"].items()):
            return False
        if sig["cwd"] is not None and sig["cwd"] != request["cwd"]:
            return False
        return all(file_sig(p, how) == was for p, (how, was) in sig["files"].items())

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.control.close()  # it finishes the calls it has, then exits


class _Dispatcher:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.zygotes: list[_Zygote] = []
        self.stats = {"forked": 0, "zygotes": 0, "refused": 0}

    def handle(self, conn: socket.socket, creds: list[Any] | None = None) -> None:
        with conn:
            got = recv_msg(conn)
            if got is None:
                return
            request, fds = got
            if creds:
                request["creds"] = creds
            try:
                env = wrapper_env(request["env"], request["gcloud"])
                zygote = None if env is None else self._zygote_for({**request, "env": env})
                if zygote is None:
                    self.stats["refused"] += 1
                    conn.sendall(b"F\n")  # the shim runs the real gcloud
                    return
                with self.lock:
                    send_msg(zygote.control, {"argv": request["argv"], "env": env,
                                              "cwd": request["cwd"],
                                              "umask": request.get("umask")},
                             [conn.fileno(), *fds])  # fmt: skip
                    self.stats["forked"] += 1
                    if creds:
                        self.stats["vm"] = self.stats.get("vm", 0) + 1
            except OSError:
                with contextlib.suppress(OSError):
                    conn.sendall(b"F\n")
            finally:
                for fd in fds:
                    os.close(fd)

    def _zygote_for(self, request: dict[str, Any]) -> _Zygote | None:
        """One that serves this call: a new one when none does. An import that wrote (a
        fresh config dir made) is not served from: it is started again, and the second import
        finds what the first made, as the next plain gcloud would."""
        key = (
            json.dumps(request["env"], sort_keys=True),
            request["cwd"],
            str(request.get("creds")),
        )
        for attempt in range(3):
            with self.lock:
                for z in self.zygotes:
                    if z.ready.is_set() and not z.usable():
                        z.stop()
                self.zygotes = [z for z in self.zygotes if not z.ready.is_set() or z.usable()]
                starting = [z for z in self.zygotes if not z.ready.is_set() and z.key == key]
            for z in starting:
                z.ready.wait(120)
            with self.lock:
                for z in self.zygotes:
                    if z.ready.is_set() and z.serves(request):
                        z.used = time.monotonic()
                        return z
                if attempt == 2:
                    return None
                zygote = _Zygote(request)
                self.stats["zygotes"] += 1
                self.zygotes.append(zygote)
                while len(self.zygotes) > MAX_ZYGOTES:
                    old = min(self.zygotes, key=lambda z: z.used)
                    self.zygotes.remove(old)
                    old.stop()
            zygote.ready.wait(120)
        return None


def _peer(conn: socket.socket) -> list[Any] | None:
    """The ids of the process at the other end (``[uid, gid, groups]``); None: this one's."""
    _, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid == os.getuid():
        return None
    import pwd

    name = pwd.getpwuid(uid).pw_name
    return [uid, gid, sorted(set(os.getgrouplist(name, gid)))]


def _serve_vms(dispatcher: _Dispatcher, vm_dir: str) -> None:
    """The fleet users' socket: each call served as its caller."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock = f"{vm_dir}/gcloud.sock"
    listener.bind(sock)
    os.chmod(sock, 0o666)
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        try:
            creds = _peer(conn)
        except (OSError, KeyError):
            conn.close()
            continue
        threading.Thread(target=dispatcher.handle, args=(conn, creds), daemon=True).start()


def serve(path: str, vm_dir: str | None = None) -> None:
    """The dispatcher: one thread per call; ends when its parent (pytest) does or at EOF of
    stdin."""
    _die_with_parent()
    dispatcher = _Dispatcher()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    listener.bind(path)
    os.umask(old)
    listener.listen(64)
    if vm_dir:
        threading.Thread(target=_serve_vms, args=(dispatcher, vm_dir), daemon=True).start()

    def watch_stdin() -> None:
        with contextlib.suppress(OSError):
            sys.stdin.buffer.read()
        with contextlib.suppress(OSError):
            Path(path + ".stats").write_text(json.dumps(dispatcher.stats))
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=dispatcher.handle, args=(conn,), daemon=True).start()


@contextlib.contextmanager
def running(directory: Path, vm_dir: Path | None = None) -> Iterator[Path]:
    """The dispatcher, listening in ``directory`` (private to this process's user) for as
    long as the block runs; yields the socket's path. ``vm_dir`` (an empty directory, as
    root): the fleet users' way in is made there too (``vm_path``)."""
    path = directory / "gcloud.sock"
    if vm_dir is not None:
        (vm_dir / "bin").mkdir(parents=True)
        shutil.copy(BIN_DIR / "gcloud", vm_dir / "bin" / "gcloud")
        for d in (vm_dir, vm_dir / "bin"):
            d.chmod(0o711)
        (vm_dir / "bin" / "gcloud").chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-S", __file__, "serve", str(path), *([str(vm_dir)] if vm_dir else [])],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        ready = [path] + ([vm_path(vm_dir)[1]] if vm_dir else [])
        while not all(map(os.path.exists, ready)) and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        yield path
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # it exits, its zygotes and their children with it
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def vm_path(vm_dir: Path) -> tuple[Path, Path]:
    """A fleet host's way to the zygotes: the shim's directory (first on its PATH) and the
    socket (its ``SOCKET_ENV``)."""
    return vm_dir / "bin", vm_dir / "gcloud.sock"


def stats(path: Path) -> dict[str, int]:
    """What a dispatcher that has ended did: calls forked, zygotes started, calls refused."""
    try:
        data: dict[str, int] = json.loads(Path(str(path) + ".stats").read_text())
        return data
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        _zygote_main()
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)

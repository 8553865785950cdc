"""multihost's warm process: one long-lived Python per host, many pieces of work run in it.

Run by a warm set's run (``multihost.warm``) as ``PYTHON $MULTIHOST_RUN_DIR/warm_server.py`` in
the staged code, in the run's process group: what stops a run stops it. Standard library, and
jax when the job has it. It makes two FIFOs in the run's directory, warm.in and warm.out
(the runner's channel, ``warm_channel.sh``, holds them open), joins the run's JAX job once (the
staged hook joins it), says ``ready``, then runs one piece at a time: ``script`` (as ``python
SCRIPT ARGS``: ``__main__``, a fresh namespace, its ``sys.argv``; ``SystemExit`` honoured),
``module`` (``python -m``), ``main`` (a bundled payload's ``main(ARGS)``) or ``call`` (a
function by value). Its fd 1 and 2 go back as ``out`` frames, then ``done`` (exit code, what it
raised, value, memory). ``sys.argv``, ``sys.path``, the working directory and ``os.environ``
are put back after a piece; modules, JAX's config and caches are not. A piece's
``jax.distributed.initialize()`` is a no-op once joined, ``shutdown()`` always.

Frames: ``KIND LENGTH\n`` then LENGTH bytes; in: ``work`` (JSON line, call bytes), ``quit``;
out: ``ready``, ``out``, ``done`` (JSON line, value bytes), ``bye``. It leaves on ``quit``
(exit 0, after leaving the JAX job with the others, bounded); when the channel closes without
one (the runner is gone); when nobody opens it within ``MULTIHOST_WARM_WAIT`` s (exit 1).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import importlib
import json
import os
import queue
import runpy
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

CHUNK = 65536  # bytes of output per frame
GONE = 1  # the exit code when the runner's channel is gone
Outcome = dict[str, Any]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Channel:
    """The two FIFOs: frames in (read by one thread) and out (one writer at a time)."""

    def __init__(self, run_dir: str) -> None:
        self.inbox = os.path.join(run_dir, "warm.in")
        self.outbox = os.path.join(run_dir, "warm.out")
        for path in (self.inbox, self.outbox):
            os.mkfifo(path, 0o600)
        # never blocks; and poll() says POLLHUP only once a writer has come and gone (Linux)
        self._in = os.open(self.inbox, os.O_RDONLY | os.O_NONBLOCK)
        self._out = -1
        self._lock = threading.Lock()
        self._buffer = bytearray()

    def open_out(self, deadline: float) -> None:
        """Wait for the runner's channel to hold the outbox (no reader: ENXIO)."""
        while True:
            try:
                fd = os.open(self.outbox, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError("no runner opened the channel")
            time.sleep(0.05)
        os.set_blocking(fd, True)
        self._out = fd

    def send(self, kind: str, data: bytes = b"") -> None:
        with self._lock:
            _write_all(self._out, b"%s %d\n" % (kind.encode(), len(data)) + data)

    def _more(self) -> bytes:
        poller = select.poll()
        poller.register(self._in, select.POLLIN)
        while True:
            poller.poll()
            with contextlib.suppress(BlockingIOError):
                data = os.read(self._in, CHUNK)
                if not data:
                    raise EOFError("the runner's channel closed")
                return data

    def receive(self) -> tuple[str, bytes]:
        """The next frame (EOFError: the channel is gone)."""
        while b"\n" not in self._buffer[:65]:
            if len(self._buffer) > 64:
                raise EOFError(f"not a frame: {bytes(self._buffer[:64])!r}")
            self._buffer += self._more()
        head, _, rest = self._buffer.partition(b"\n")
        kind, size = head.decode().split(" ")
        while len(rest) < int(size):
            rest += self._more()
        self._buffer = rest[int(size) :]
        return kind, bytes(rest[: int(size)])


LOG: list[int] = []  # the run's log's fd once the pump holds fd 1 and 2


def say(text: str) -> None:
    """A line in the run's log (its fd was saved before the pump took fd 1 and 2)."""
    with contextlib.suppress(OSError):
        _write_all(LOG[0] if LOG else 2, f"multihost warm: {text}\n".encode())


def read_requests(channel: Channel, requests: queue.Queue[tuple[str, bytes]]) -> None:
    """The reader thread: frames into ``requests``; the channel's end without ``quit`` means
    the runner is gone, and so is this process, whatever it is running."""
    while True:
        try:
            kind, data = channel.receive()
        except (EOFError, OSError, ValueError) as exc:
            say(f"{exc}: leaving")
            os._exit(GONE)
        requests.put((kind, data))
        if kind == "quit":
            return


class Pump:
    """fd 1 and 2 into a pipe that a thread reads: a piece's output goes back as ``out``
    frames, anything else (between pieces, startup) to the run's log."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.log = os.dup(1)
        LOG.append(self.log)
        self.read, write = os.pipe()
        os.set_blocking(self.read, False)
        self.wake_read, self.wake_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self.piece = False
        self.drained = threading.Event()
        threading.Thread(target=self._loop, name="multihost-warm-pump", daemon=True).start()

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self.read, select.POLLIN)
        poller.register(self.wake_read, select.POLLIN)
        while True:
            for fd, _event in poller.poll():
                if fd == self.wake_read:
                    os.read(self.wake_read, 64)
                    self._forward()
                    self.drained.set()
                else:
                    self._forward()

    def _forward(self) -> None:
        while True:
            try:
                data = os.read(self.read, CHUNK)
            except BlockingIOError:
                return
            if not data:
                return
            try:
                if self.piece:
                    self.channel.send("out", data)
                else:
                    _write_all(self.log, data)
            except OSError:  # the runner's channel is gone: the reader thread ends us
                return

    def drain(self) -> None:
        """Everything written so far has been passed on when this returns."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a piece may have replaced or closed them
                stream.flush()
        self.drained.clear()
        os.write(self.wake_write, b"x")
        self.drained.wait()

    def during(self, fn: Callable[[], tuple[Outcome, bytes]]) -> tuple[Outcome, bytes]:
        self.drain()
        self.piece = True
        try:
            return fn()
        finally:
            self.drain()
            self.piece = False


def warm_up() -> dict[str, Any]:
    """JAX imported and the job joined, once; what the runner is told with ``ready``."""
    os.environ["MULTIHOST_WARM"] = "1"  # bundled payloads end with SystemExit, not os._exit
    info: dict[str, Any] = {"pid": os.getpid(), "python": list(sys.version_info[:2])}
    try:
        import jax
    except ImportError:
        return info  # a warm Python without JAX still runs pieces that need none
    _keep_joined(jax)
    if os.environ.get("MULTIHOST_JAX_INIT", "1").strip().lower() not in ("0", "off", "no", "false"):
        devices = jax.devices()  # the staged hook joins the run's JAX job before the first one
        info.update(
            jax=jax.__version__,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            devices=len(devices),
        )
    # multihost stops a run with SIGTERM: gone at once, even in the middle of a collective
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return info


def _keep_joined(jax: Any) -> None:
    """A piece's ``jax.distributed.initialize()`` is a no-op once the process is in its job
    (joined, or its backend made); ``shutdown()`` always is: the job outlives the piece."""
    from jax._src import distributed, xla_bridge

    own = distributed.initialize
    SHUTDOWN.append(distributed.shutdown)

    def initialize(*args: Any, **kwargs: Any) -> None:
        if distributed.global_state.client is not None or xla_bridge.backends_are_initialized():
            return
        own(*args, **kwargs)

    for module in (distributed, jax.distributed):
        setattr(module, "initialize", initialize)  # noqa: B010 (a module jax typed)
        setattr(module, "shutdown", lambda: None)  # noqa: B010


SHUTDOWN: list[Callable[[], None]] = []  # jax.distributed's own shutdown, for the end


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with (a message is printed, as it prints it)."""
    if exc.code is None or isinstance(exc.code, int):
        return (exc.code or 0) & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _memory() -> dict[str, Any]:
    """RSS, and JAX's live arrays once it has a backend (never made here)."""
    stats: dict[str, Any] = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        rss = [line.split()[1] for line in f if line.startswith("VmRSS:")]
        stats["rss_bytes"] = int(rss[0]) * 1024 if rss else None
    jax = sys.modules.get("jax")
    with contextlib.suppress(Exception):
        if jax is not None and sys.modules["jax._src.xla_bridge"].backends_are_initialized():
            arrays = jax.live_arrays()
            stats.update(live_arrays=len(arrays), live_bytes=sum(a.nbytes for a in arrays))
    return stats


def _call(work: dict[str, Any], blob: bytes) -> bytes:
    here = tuple(sys.version_info[:2])
    if here != tuple(work["python"]):
        raise RuntimeError(
            f"Python version mismatch: this host runs {'.'.join(map(str, here))} "
            f"({sys.executable}) but the function was pickled by Python "
            f"{'.'.join(map(str, work['python']))}; cloudpickle needs the same minor version "
            "(python= picks the interpreter)"
        )
    try:
        import cloudpickle
    except ImportError:
        raise RuntimeError(
            f"cloudpickle is not installed for {sys.executable} on this host "
            "(pip install cloudpickle)"
        ) from None
    fn, args, kwargs = cloudpickle.loads(blob)
    value = fn(*args, **kwargs)
    return bytes(cloudpickle.dumps(value))


def _traceback(exc: BaseException) -> str:
    """The traceback as the interpreter prints it for the program: without this server's
    frames and runpy's in front of the piece's own."""
    tb = exc.__traceback__
    ours = (os.path.abspath(__file__), os.path.abspath(runpy.__file__ or "runpy"))
    while tb is not None and tb.tb_next is not None:
        name = tb.tb_frame.f_code.co_filename
        if os.path.abspath(name) not in ours and not name.startswith("<frozen runpy"):
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def run_piece(work: dict[str, Any], blob: bytes) -> tuple[Outcome, bytes]:
    """One piece; the process is as it was before, less what the piece imported or set in
    modules (see the module's docstring)."""
    argv, path, cwd, env = list(sys.argv), list(sys.path), os.getcwd(), dict(os.environ)
    kind, args = work["kind"], list(work.get("args", ()))
    started = time.time()
    value = b""
    outcome: Outcome = {"exit": 0, "error": None, "traceback": ""}
    try:
        if kind == "call":
            value = _call(work, blob)
        elif kind == "module":
            sys.argv = [work["target"], *args]
            sys.path.insert(0, cwd)
            runpy.run_module(work["target"], run_name="__main__", alter_sys=True)
        else:
            target = work["target"]
            sys.argv = [target, *args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            if kind == "main":
                importlib.import_module(work["module"]).main(args)
            else:
                runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        outcome["exit"] = _exit_code(exc)
    except BaseException as exc:
        text = _traceback(exc)
        sys.stderr.write(text)
        outcome.update(exit=1, error=f"{type(exc).__name__}: {exc}", traceback=text)
    finally:
        sys.argv[:] = argv
        sys.path[:] = path
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        if dict(os.environ) != env:
            os.environ.clear()
            os.environ.update(env)
    _collect()  # what the piece made and dropped (its arrays) is freed before the next
    outcome.update(started=started, ended=time.time(), **_memory())
    return outcome, value


def _collect() -> None:
    """Garbage collected, then what lives on (jax, the modules pieces imported) frozen: the next
    collection looks only at what came after, in milliseconds, not a tenth of a second."""
    gc.collect()
    gc.freeze()


def leave() -> None:
    """Every host leaves the JAX job together (bounded: a peer may be gone), then exits."""
    if SHUTDOWN and sys.modules["jax._src.distributed"].global_state.client is not None:
        done = threading.Thread(target=SHUTDOWN[0], daemon=True)
        done.start()
        done.join(timeout=10)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]  # the run's directory: nothing there for a piece to import
    run_dir = os.environ["MULTIHOST_RUN_DIR"]
    deadline = time.monotonic() + float(os.environ.get("MULTIHOST_WARM_WAIT") or 600)
    channel = Channel(run_dir)
    info = warm_up()
    with contextlib.suppress(ImportError):
        import cloudpickle  # noqa: F401 (imported once here, not by the first call)
    _collect()
    try:
        channel.open_out(deadline)
    except TimeoutError as exc:
        say(f"{exc} within its wait: leaving")
        os._exit(GONE)
    pump = Pump(channel)
    requests: queue.Queue[tuple[str, bytes]] = queue.Queue()
    threading.Thread(
        target=read_requests, args=(channel, requests), name="multihost-warm-in", daemon=True
    ).start()
    channel.send("ready", json.dumps(info).encode())
    while (request := requests.get())[0] != "quit":
        head, _, blob = request[1].partition(b"\n")
        work = json.loads(head)
        outcome, value = pump.during(functools.partial(run_piece, work, blob))
        outcome["id"] = work.get("id")
        try:
            channel.send("done", json.dumps(outcome).encode() + b"\n" + value)
        except OSError:
            os._exit(GONE)
    channel.send("bye")
    leave()


if __name__ == "__main__":
    main()

"""The hook's step watch: how far each JAX process is, for ``multihost top`` and ``plot``.

What a step is, seen from outside a program that was not changed for it: JAX runs a jitted
step asynchronously, and a training loop waits for its results once per step (``float(loss)``
to log it, ``block_until_ready``, ``jax.device_get``). Those waits are the only per-step
moments Python can see cheaply: the C++ fast path of a jitted call has no Python hook. So

- a *step* ends each time the program waits for results at the place in its code where it
  waits most often (its "site": the first frame outside jax). A program that marks its steps
  with ``jax.profiler.StepTraceAnnotation`` is counted by those instead: a step begins at each
  annotation. A program that waits only every k steps is seen to take one step per k.
- a step's *time* is the wall time from the end of one step to the end of the next;
- its *own time* is that time less the time spent waiting for results (inside
  ``block_until_ready``, a transfer to host, ``jax.device_get``): the host's Python and
  dispatch. In an SPMD job every host's step ends together (collectives wait for the slowest
  process), so a slow host is not the one with the longest step but the one that waits least,
  and so has the longest own time.

Several waits in a row at one place with no Python time between them (``[float(v) for v in
metrics]``) are one. Per wait the cost is two clock reads and a look at the caller's frames.

A daemon thread writes ``$MULTIHOST_STACK_DIR/<pid>.watch`` (one JSON line, replaced
atomically) every second, and appends the steps that ended since to ``<pid>.steps`` (``index
boottime seconds own_seconds`` lines; beyond ``LOG_LINES`` lines only every 2nd, then 4th, ...
step, so the file stays small however long the run). Times are ``CLOCK_BOOTTIME`` seconds,
which ``/proc/uptime`` counts too, so a reader on the host needs no clock of its own.

Staged as part of the hook's ONE file (see ``commands.hook_text``): everything below the
marker line goes into ``sitecustomize.py``. Only the standard library, imported where used; a
failure here leaves the program as it would run without the hook.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import CodeType, FrameType, ModuleType

# hook_text: the staged hook gets everything below this line

STEPS_API = "jax._src.api"  # once it is loaded, so are jax's arrays and profiler
WATCH_EVERY_S = 1.0  # how often <pid>.watch is rewritten (and <pid>.steps appended to)
RECENT = 32  # steps kept in <pid>.watch
LOG_LINES = 100_000  # lines of <pid>.steps at each stride before the stride doubles
BURST_S = 1e-4  # a wait at the same site within this of the last one's end is the same wait
ANNOTATION = "annotation"  # the site of jax.profiler.StepTraceAnnotation
STEPS_OFF = "MULTIHOST_STEPS"  # "0": no step watch in this run's processes


class _Thread:
    """One thread's steps (the writer reports the thread with the most)."""

    __slots__ = (
        "busy",
        "count",
        "first",
        "gap",
        "last",
        "last_boot",
        "lead",
        "leader",
        "log",
        "own",
        "period",
        "prev",
        "since",
        "sites",
        "stride",
        "waited",
        "written",
    )

    def __init__(self) -> None:
        self.busy = False  # inside a wait already: a nested one is the same wait
        self.since = 0.0  # perf_counter when the current wait began (0: not waiting)
        self.sites: dict[object, int] = {}  # site -> waits there
        self.leader: object = None  # the site whose waits end steps
        self.lead = 0  # waits at the leader
        self.prev: object = None  # the site of the last wait, and when it ended
        self.gap = 0.0
        self.last = 0.0  # perf_counter at the last step's end (0: none yet)
        self.waited = 0.0  # seconds waited since then
        self.count = 0  # steps done
        self.first = 0.0  # boottime of the first step's end
        self.last_boot = 0.0  # boottime of the last step's end
        self.period: list[float] = []  # the last RECENT steps' times and own times
        self.own: list[float] = []
        self.log: list[tuple[int, float, float, float]] = []  # <pid>.steps lines to write
        self.stride = 1  # every how many steps a line is logged
        self.written = 0  # lines logged at this stride


_threads: "dict[int, _Thread]" = {}


def _boottime() -> float:
    """Seconds since boot, suspend included: what ``/proc/uptime`` says on the host."""
    import time

    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _watch_steps() -> None:
    """Wrap jax's waits as soon as jax is imported (only in a run's processes with a hook dir,
    never twice, and not when ``MULTIHOST_STEPS=0``)."""
    where = os.environ.get("MULTIHOST_STACK_DIR")
    if not where or not os.path.isdir(where) or os.environ.get(STEPS_OFF, "1") == "0":
        return
    if STEPS_API in sys.modules or any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AfterImport(STEPS_API, lambda api: _on_api(api, where)))


class _AfterImport:
    """A meta path finder that lets the real finder load one module, runs ``action`` on it
    once it has been executed, and removes itself."""

    def __init__(self, name: str, action: "Callable[[ModuleType], None]") -> None:
        self.name, self.action = name, action

    def find_spec(
        self, name: str, path: "Sequence[str] | None", target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if name != self.name:
            return None
        try:
            sys.meta_path.remove(self)
            import importlib.util

            spec = importlib.util.find_spec(name)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            load, action = loader.exec_module, self.action

            def exec_module(module: "ModuleType") -> None:
                load(module)
                try:
                    action(module)
                except Exception:  # jax changed: the program runs as without the watch
                    return

            loader.exec_module = exec_module
            return spec
        except Exception:
            return None


def _on_api(api: "ModuleType", where: str) -> None:
    """Wrap the waits: an array's ``block_until_ready`` and ``_value`` (every transfer to
    host: ``float()``, ``np.asarray``, ``print``), ``jax.block_until_ready`` and
    ``jax.device_get`` (one wait for a whole tree); and count ``StepTraceAnnotation``s. Then
    start the writer."""
    import threading
    import time

    arrays = sys.modules["jax._src.array"].ArrayImpl
    profiler = sys.modules["jax._src.profiler"]
    jax_dir = os.path.dirname(os.path.dirname(os.path.abspath(str(api.__file__)))) + os.sep
    lib = sys.modules.get("jaxlib")
    skip = (jax_dir,) + ((os.path.dirname(lib.__file__) + os.sep,) if lib and lib.__file__ else ())
    clock, ident, getframe = time.perf_counter, threading.get_ident, sys._getframe
    threads = _threads

    def state() -> _Thread:
        t = threads.get(ident())
        if t is None:
            t = threads[ident()] = _Thread()
        return t

    def site(frame: "FrameType | None") -> "tuple[CodeType, int] | None":
        while frame is not None and frame.f_code.co_filename.startswith(skip):
            frame = frame.f_back
        return None if frame is None else (frame.f_code, frame.f_lineno)

    def wrap(wait: "Callable[..., object]") -> "Callable[..., object]":
        def waiting(*args: object, **kwargs: object) -> object:
            t = state()
            if t.busy:
                return wait(*args, **kwargs)
            t.busy, t.since = True, clock()
            try:
                return wait(*args, **kwargs)
            finally:
                end = clock()
                t.busy = False
                try:
                    start, t.since = t.since, 0.0
                    t.waited += end - start
                    _ended(t, site(getframe(1)), start, end)
                except Exception:
                    pass

        for name in ("__name__", "__qualname__", "__doc__", "__module__"):
            value = getattr(wait, name, None)
            if isinstance(value, str):  # a C++ method's may be no string
                setattr(waiting, name, value)
        waiting.__wrapped__ = wait  # type: ignore[attr-defined]
        return waiting

    value = arrays.__dict__["_value"]
    arrays.block_until_ready = wrap(arrays.block_until_ready)
    arrays._value = property(wrap(value.fget), doc=value.__doc__)
    for name in ("block_until_ready", "device_get"):  # a module jax typed: setattr
        setattr(api, name, wrap(getattr(api, name)))

    step_class = profiler.StepTraceAnnotation
    enter = step_class.__enter__

    def __enter__(annotation: object) -> object:
        try:
            t = state()
            now = clock()
            if t.leader != ANNOTATION:
                t.leader, t.last, t.waited = ANNOTATION, 0.0, 0.0
            _ended(t, ANNOTATION, now, now)
        except Exception:
            pass
        return enter(annotation)

    step_class.__enter__ = __enter__
    threading.Thread(target=_writer, args=(where,), name="multihost-steps", daemon=True).start()


def _ended(t: _Thread, where: object, start: float, now: float) -> None:
    """A wait at ``where`` from ``start`` to ``now`` (perf_counter) is over: a step ends if
    it is the leading site's (or an annotation began)."""
    if where is None:
        return
    if where == t.prev and start - t.gap < BURST_S and where != ANNOTATION:
        t.gap = now  # the same wait, continued: its time counts, it is no new step
        return
    t.prev, t.gap = where, now
    n = t.sites.get(where, 0) + 1
    t.sites[where] = n
    if where != t.leader:
        if t.leader == ANNOTATION or n <= t.lead:
            return
        t.leader, t.lead, t.last, t.waited = where, n, now, 0.0  # a new leader: starts afresh
        return
    t.lead = n
    if t.last:
        period = now - t.last
        own = max(0.0, period - t.waited)
        boot = _boottime()
        t.count += 1
        if t.count == 1:
            t.first = boot
        t.last_boot = boot
        t.period.append(period)
        t.own.append(own)
        if len(t.period) > RECENT:
            del t.period[0], t.own[0]
        if t.count % t.stride == 0 and len(t.log) < LOG_LINES:
            t.log.append((t.count, boot, period, own))  # the writer's thread formats it
            t.written += 1
            if t.written >= LOG_LINES:
                t.stride, t.written = t.stride * 2, 0
    t.last, t.waited = now, 0.0


def _site_name(where: object) -> str:
    if where == ANNOTATION:
        return "StepTraceAnnotation"
    if isinstance(where, tuple) and len(where) == 2:
        return f"{os.path.basename(where[0].co_filename)}:{where[1]}"
    return ""


def _writer(where: str) -> None:
    """Every second, ``<pid>.watch`` and ``<pid>.steps`` brought up to date; once more at the
    process's exit (never raises; gives up on a hook dir that is gone)."""
    import atexit
    import threading
    import time

    lock = threading.Lock()
    atexit.register(_write, where, lock)
    while True:
        time.sleep(WATCH_EVERY_S)
        if not _write(where, lock):
            return


def _write(where: str, lock: "object") -> bool:
    """``<pid>.watch`` rewritten (atomically), the new ``<pid>.steps`` lines appended; False
    once the hook dir is gone."""
    import json
    import time

    pid = os.getpid()
    out, log = os.path.join(where, f"{pid}.watch"), os.path.join(where, f"{pid}.steps")
    try:
        with lock:  # type: ignore[attr-defined]
            t = max(list(_threads.values()), key=lambda x: x.count, default=None)
            now, boot = time.perf_counter(), _boottime()
            lines: list[tuple[int, float, float, float]] = []
            data: dict[str, object] = {"v": 1, "pid": pid, "at": round(boot, 3), "steps": 0}
            if t is not None:
                n = len(t.log)
                lines = t.log[:n]
                del t.log[:n]  # what the program's thread adds meanwhile stays for the next
                since = t.since
                data.update(
                    steps=t.count,
                    first=round(t.first, 3),
                    last=round(t.last_boot, 3),
                    recent=[round(x, 6) for x in t.period[-RECENT:]],
                    own=[round(x, 6) for x in t.own[-RECENT:]],
                    waiting=round(now - since, 3) if since else 0.0,
                    site=_site_name(t.leader),
                )
            if lines:
                with open(log, "a") as f:
                    f.write("".join(f"{n} {b:.3f} {p:.6f} {o:.6f}\n" for n, b, p, o in lines))
            tmp = f"{out}.tmp"
            with open(tmp, "w") as f:
                f.write(json.dumps(data, separators=(",", ":")) + "\n")
            os.replace(tmp, out)
    except FileNotFoundError:
        return False  # the run's directory was removed
    except Exception:
        pass
    return True

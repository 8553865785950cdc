"""The hook's tracer: serves ``multihost trace`` requests inside a process that imports jax.

A daemon thread polls ``$MULTIHOST_STACK_DIR/trace.request``; each new capture starts at the
requested wall-clock moment, runs ``jax.profiler`` for the requested seconds and leaves a
``.done`` (or ``.error``) marker; ``_Progress`` marks a process's first backend and first
annotated step (what ``run --trace`` waits for). See multihost.diagnose.hook.

Staged as part of the hook's ONE file: ``commands.hook_text()`` puts everything below the marker
line into ``sitecustomize.py``, before its closing block, so a host still needs nothing of
multihost installed. Only the standard library here, imported where used.
"""

import os
import sys

# hook_text: the staged hook gets everything below this line

REQUEST = "trace.request"
POLL_S = 0.25
NAME_PUNCT = str.maketrans("", "", "._-")  # a capture name: letters, digits and these


def _start_tracer() -> None:
    """Start the trace watcher thread once per process (only where a hook dir exists)."""
    where = os.environ.get("MULTIHOST_STACK_DIR")
    if not where or not os.path.isdir(where) or "_tracer" in globals():
        return
    try:
        import threading

        globals()["_tracer"] = thread = threading.Thread(
            target=_trace_loop, args=(where,), name="multihost-trace", daemon=True
        )
        thread.start()
        with open(os.path.join(where, f"{os.getpid()}.trace-ready"), "w") as ready:
            ready.write(" ".join(sys.argv)[:200] or "python")
    except Exception:
        return


def _trace_loop(where: str) -> None:
    """Wait for trace requests and serve each new capture once (never raises)."""
    import time

    request = os.path.join(where, REQUEST)
    seen = ""
    stamp = None
    progress = _Progress(where)
    while True:
        time.sleep(POLL_S)
        if not progress.done:
            progress.look()
        try:
            st = os.stat(request)
        except OSError:
            continue
        if (st.st_mtime_ns, st.st_size) == stamp:
            continue
        stamp = (st.st_mtime_ns, st.st_size)
        try:
            import json

            with open(request) as f:
                asked = json.loads(f.read())
            capture = str(asked["capture"])
            if capture == seen or not capture.translate(NAME_PUNCT).isalnum():
                continue
            seen = capture
            start_at = float(asked["start_at"])
            if time.time() > start_at + POLL_S * 4:  # asked before this process was there
                continue
            _capture(where, capture, start_at, float(asked["seconds"]), progress)
        except Exception:
            continue


class _Progress:
    """Marks how far the process is: ``<pid>.backend`` once JAX has a backend (its first
    computation or device query), ``<pid>.stepping`` when its first annotated step
    (``jax.profiler.StepTraceAnnotation``) begins and ``<pid>.stepped`` when it ends (compiled
    and run once): what ``run --trace`` waits for. The class's ``__enter__``/``__exit__`` are
    wrapped for that, and stay wrapped (two calls per step) to time the steps that end during
    a capture: a trace only shows the steps that both begin and end in it."""

    def __init__(self, where: str) -> None:
        self.mark = os.path.join(where, str(os.getpid()))
        self.backend = self.wrapped = False
        self.seen = [False, False]  # a step began, a step ended
        self.window: list[float] | None = None  # while capturing: durations of steps ended

    @property
    def done(self) -> bool:
        return self.backend and self.wrapped

    def look(self) -> None:
        try:
            if not self.backend:
                bridge = sys.modules.get("jax._src.xla_bridge")
                if bridge is not None and getattr(bridge, "_backends", None):
                    self.backend = self._write("backend")
            profiler = sys.modules.get("jax._src.profiler")
            cls = getattr(profiler, "StepTraceAnnotation", None) if profiler else None
            if not self.wrapped and isinstance(cls, type):
                self.wrapped = True
                self._wrap(cls)
        except Exception:
            self.backend = self.wrapped = True  # give up looking; never disturb the program

    def _wrap(self, cls: type) -> None:
        import time

        enter, leave = getattr(cls, "__enter__"), getattr(cls, "__exit__")  # noqa: B009
        seen, write, starts, clock = self.seen, self._write, [0.0], time.perf_counter

        def __enter__(annotation: object) -> object:
            if not seen[0]:
                seen[0] = write("stepping")
            starts[0] = clock()
            return enter(annotation)

        def __exit__(annotation: object, *args: object) -> object:
            try:
                return leave(annotation, *args)
            finally:
                if not seen[1]:
                    seen[1] = write("stepped")
                window = self.window
                if window is not None:
                    window.append(clock() - starts[0])

        setattr(cls, "__enter__", __enter__)  # noqa: B010 (wrap, once)
        setattr(cls, "__exit__", __exit__)  # noqa: B010

    def _write(self, what: str) -> bool:
        import time

        with open(f"{self.mark}.{what}", "w") as f:
            f.write(f"{time.time()!r}\n")
        return True


def _capture(where: str, capture: str, start_at: float, seconds: float, steps: _Progress) -> None:
    """One capture: wait for the common start, trace, and say how it ended (``.done``: start,
    end, ``full`` or ``exit``, the steps that ended in it and their median). A program that
    exits during the capture keeps what was traced: the trace is stopped at its exit."""
    import atexit
    import threading
    import time

    pid = os.getpid()
    out = os.path.join(os.path.dirname(where), "traces", capture, str(pid))
    mark = os.path.join(where, f"{pid}.{capture}")
    lock, began = threading.Lock(), [0.0]

    def stop(how: str) -> None:
        with lock:
            first, began[0] = began[0], 0.0
            if not first:
                return
            ended, steps.window = sorted(steps.window or ()), None
            median = ended[len(ended) // 2] if ended else 0.0
            try:
                jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
                with open(mark + ".done", "w") as f:
                    f.write(f"{first!r} {time.time()!r} {how} {len(ended)} {median!r}")
            except Exception as e:  # at exit too: never a traceback of the hook's
                with open(mark + ".error", "w") as f:
                    f.write(f"{type(e).__name__}: {e}"[:500])

    try:
        delay = start_at - time.time()
        if delay > 0:
            time.sleep(min(delay, 60.0))
        import jax.profiler

        os.makedirs(out, mode=0o700, exist_ok=True)
        steps.look()  # the step class wrapped, if jax has it by now
        with lock:
            jax.profiler.start_trace(out)
            began[0], steps.window = time.time(), []
        atexit.register(stop, "exit")  # runs before jax's own exit handlers (registered earlier)
        with open(mark + ".started", "w") as f:
            f.write(repr(began[0]))
        time.sleep(seconds)
        stop("full")
        atexit.unregister(stop)
    except BaseException as e:  # a trace already running, jax without profiler, ...
        try:
            with open(mark + ".error", "w") as f:
                f.write(f"{type(e).__name__}: {e}"[:500])
        except OSError:
            pass

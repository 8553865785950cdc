"""multihost's hook, staged as ``sitecustomize.py`` on the job's PYTHONPATH.

Stacks: every Python process the job starts registers ``faulthandler`` on SIGUSR2: the signal
makes it append every thread's stack to ``$MULTIHOST_STACK_DIR/<pid>.txt``, from C, even while
the process is blocked in a collective. No ptrace, no root, no change to the user's program; a
``<pid>.ready`` file says which processes listen (``multihost stack`` signals only those).

JAX: a bare ``jax.distributed.initialize()`` finds the run, as it finds a Slurm or Open MPI
job: when (and only when) the program imports ``jax._src.clusters``, a ``MultihostCluster``
is registered there, first in line, answering from the ``JAX_*`` variables multihost set. A
program that never imports jax pays one string comparison per import and nothing else.

Joining: on a TPU pod the runtime makes one JAX job of all hosts by itself, and programs
written for pods (MaxText's) never call ``jax.distributed.initialize()``. Elsewhere (CPU, GPU)
each process would see only its own devices. So in a run of several processes, just before
the program's first backend use (``xla_bridge.backends()``), the hook calls
``jax.distributed.initialize`` with the run's coordinator, process id and count: unless the
program already did, the platform is TPU, or ``MULTIHOST_JAX_INIT=0`` (``--no-jax-init``). A
later ``jax.distributed.initialize()`` of the program's own is then a no-op.

One place per host: the job has one JAX process per host, so only one Python process of the
run on a host is it. The first one to import jax takes the place (an exclusive ``flock`` on
``jax-place.lock`` in the run's hook dir, held while it lives); any Python that imports jax
while it lives (its subprocesses, multiprocessing workers, a fork of it, a helper started
beside it) is a JAX program of its own: never joined, and a bare
``jax.distributed.initialize()`` there raises instead of taking the host's process id (which
would make the coordination service abort every process). One that passes ids of its own is
left alone. When the holder ends, the place is free again: in ``python a.py; python b.py`` each
joins in turn.

Traces: in a process that imports jax, a daemon thread looks every quarter second for
``$MULTIHOST_STACK_DIR/trace.request`` (one JSON line: capture name, start time, seconds). On a
new capture it waits for the start time (every host the same wall-clock moment), runs
``jax.profiler.start_trace`` into ``<run dir>/traces/<capture>/<pid>/`` for the given seconds,
and writes ``<pid>.<capture>.done`` (or ``.error`` with the reason). The program is not stopped
or changed; ``<pid>.trace-ready`` says which processes can trace (``multihost trace``). The
tracer's code is in hooktrace.py; ``commands.hook_text()`` joins the two into the one staged file.

Start-up and the compile cache: in a process that imports jax, when it got to each phase of
its start (jax imported, joined, devices, compiled, first step), and jax's persistent compile
cache in the host's own directory. That code is in hookstart.py; ``hook_text()`` joins it in.

Steps: in a process that imports jax, the waits for results are counted as steps and timed
(``multihost top``, ``multihost plot``); that code is in hooksteps.py, staged in this same file.

A sitecustomize of the user's own further along ``sys.path`` still runs.
"""

import os
import sys

TYPE_CHECKING = False  # typing itself costs an import: mypy reads this name as True
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

if __name__ != "sitecustomize":  # staged, their code is in this same file (hook_text)
    from multihost.diagnose.hookstart import _watch_startup
    from multihost.diagnose.hooksteps import _watch_steps
    from multihost.diagnose.hooktrace import _start_tracer

CLUSTERS = "jax._src.clusters"  # where jax keeps its ClusterEnv registry
BRIDGE = "jax._src.xla_bridge"  # where jax creates its backends
NEEDED = ("MULTIHOST_RUN", "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_ID", "JAX_PROCESS_COUNT")
JOIN = "MULTIHOST_JAX_INIT"  # "0": never join the program to the run's JAX job
PLACE = "jax-place.lock"  # in the run's hook dir: locked by the Python that is the host's
_place: "dict[str, int | str]" = {}  # "pid": who took the place here (a fork's copy is not it)


def _install() -> None:
    where = os.environ.get("MULTIHOST_STACK_DIR")
    if not where or not os.path.isdir(where):
        return
    try:
        import faulthandler
        import signal

        pid = os.getpid()
        out = open(os.path.join(where, f"{pid}.txt"), "a")  # noqa: SIM115 (open for life)
        faulthandler.register(signal.SIGUSR2, file=out, all_threads=True, chain=False)
        sys.modules[__name__].__dict__["_stack_file"] = out
        with open(os.path.join(where, f"{pid}.ready"), "w") as ready:
            ready.write(" ".join(sys.argv)[:200] or "python")
    except Exception:  # the hook must never break the user's program
        return


class JaxWatcher:
    """A meta path finder that waits for some of jax's modules to be imported, lets the real
    finder load each, then runs its action on it; it removes itself once all were seen."""

    def __init__(self, actions: "dict[str, Callable[[ModuleType], None]]") -> None:
        self.actions = actions

    def find_spec(
        self, name: str, path: "Sequence[str] | None", target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        action = self.actions.pop(name, None)
        if action is None:
            return None
        try:
            if not self.actions:
                sys.meta_path.remove(self)
            import importlib.util

            spec = importlib.util.find_spec(name)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            load = loader.exec_module

            def exec_module(module: "ModuleType") -> None:
                load(module)
                try:
                    action(module)
                except Exception:  # jax changed: the program runs as without the hook
                    return

            loader.exec_module = exec_module
            return spec
        except Exception:
            return None


def _on_clusters(module: "ModuleType") -> None:
    _start_tracer()
    _take_place()
    register(module)


def _take_place() -> None:
    """Take this host's place in the run's JAX job if no other live Python of the run holds
    it: a ``flock`` the kernel lets go of when the process ends (an exec closes it, and the new
    program takes it again). Without the run's hook dir (not launched by multihost) or file
    locks, the process is the host's as it always was."""
    if _place:
        return
    me = os.getpid()
    try:
        import fcntl

        path = os.path.join(os.environ["MULTIHOST_STACK_DIR"], PLACE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except Exception:
        _place["pid"] = me
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _place["holder"] = os.pread(fd, 20, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        return
    except OSError:
        os.close(fd)
        _place["pid"] = me
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(me).encode(), 0)
    _place.update(pid=me, fd=fd)  # kept open: the lock lasts as long as the process


def holds_place() -> bool:
    """Whether this process is the run's JAX process on its host (see ``_take_place``)."""
    _take_place()
    return _place.get("pid") == os.getpid()


def not_the_runs() -> RuntimeError:
    """What a bare ``jax.distributed.initialize()`` raises in a Python that is not the run's
    JAX process on its host."""
    holder = _place.get("holder") or _place.get("pid")
    return RuntimeError(
        f"multihost: this Python (pid {os.getpid()}) is not the run's JAX process on this "
        f"host: pid {holder} of the run holds its place as JAX process "
        f"{os.environ.get('JAX_PROCESS_ID')} of {os.environ.get('JAX_PROCESS_COUNT')}, and a "
        "second process joining as that one would make JAX's coordination service abort "
        "every process. Run it as a JAX program of its own (no jax.distributed.initialize()), "
        "or give initialize() a coordinator_address, num_processes and process_id of its own"
    )


def joins(env: "Mapping[str, str]", platforms: str, tpu_chips: int) -> bool:
    """Whether this process joins the run's JAX job itself: several processes, multihost's
    variables set, not opted out, and not on TPU (``platforms``: jax's ``jax_platforms``,
    empty for its own choice, then TPU chips on the PCI bus decide)."""
    if env.get(JOIN, "1").strip().lower() in ("0", "off", "no", "false"):
        return False
    if not all(env.get(k) for k in NEEDED):
        return False
    try:
        if int(env["JAX_PROCESS_COUNT"]) < 2:
            return False
    except ValueError:
        return False
    chosen = [p.strip().lower() for p in platforms.split(",") if p.strip()]
    return "tpu" not in chosen if chosen else tpu_chips == 0


def _on_bridge(bridge: "ModuleType") -> None:
    """Wrap ``backends()`` so that the first backend is made inside the run's JAX job, and
    ``jax.distributed.initialize`` so that the program's own call after that is a no-op."""
    import functools
    import threading

    distributed = sys.modules["jax._src.distributed"]
    own_init, own_backends = distributed.initialize, bridge.backends
    lock, state = threading.Lock(), {"pending": True, "joined": False}

    @functools.wraps(own_init)
    def initialize(*args: object, **kwargs: object) -> None:
        if state["joined"] and distributed.global_state.client is not None:
            return  # multihost joined this process before its first JAX call
        own_init(*args, **kwargs)

    @functools.wraps(own_backends)
    def backends() -> object:
        if state["pending"]:
            with lock:
                if state["pending"]:
                    state["pending"] = False
                    state["joined"] = _join(distributed, own_init)
        return own_backends()

    setattr(distributed, "initialize", initialize)  # noqa: B010 (a module jax typed)
    setattr(bridge, "backends", backends)  # noqa: B010


def _join(distributed: "ModuleType", own_init: "Callable[..., None]") -> bool:
    if distributed.global_state.client is not None:
        return False  # the program initialized itself
    if not holds_place():
        return False  # a helper of the run's process: a JAX program of its own
    try:
        from jax._src import config, hardware_utils

        platforms = str(config.jax_platforms.value or "")
        tpu = hardware_utils.num_available_tpu_chips_and_device_id
        chips = 0 if platforms else int(tpu()[0])  # type: ignore[no-untyped-call]
    except Exception:
        return False
    if not joins(os.environ, platforms, chips):
        return False
    address, pid = os.environ["JAX_COORDINATOR_ADDRESS"], int(os.environ["JAX_PROCESS_ID"])
    count = int(os.environ["JAX_PROCESS_COUNT"])
    try:
        own_init(coordinator_address=address, num_processes=count, process_id=pid)
    except Exception as e:
        raise RuntimeError(
            f"multihost: process {pid} of {count} could not join the run's JAX job "
            f"(jax.distributed.initialize, coordinator {address}): {e} "
            f"({JOIN}=0 or --no-jax-init leaves initializing to the program)"
        ) from e
    return True


def register(clusters: "ModuleType") -> type:
    """Define ``MultihostCluster`` on ``clusters.ClusterEnv`` (subclassing registers it) and
    move it to the front: the run multihost started is the cluster this process is in, even on
    a TPU VM or inside a Slurm allocation."""
    base = clusters.ClusterEnv

    class MultihostCluster(base):  # type: ignore[misc, valid-type]
        name = "multihost"

        @classmethod
        def is_env_present(cls) -> bool:
            return all(os.environ.get(k) for k in NEEDED)

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: object = None, override_coordinator_port: object = None
        ) -> str:
            address = os.environ["JAX_COORDINATOR_ADDRESS"]
            if override_coordinator_port:
                return f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
            return address

        @classmethod
        def get_process_count(cls) -> int:
            if not holds_place():
                raise not_the_runs()
            return int(os.environ["JAX_PROCESS_COUNT"])

        @classmethod
        def get_process_id(cls) -> int:
            if not holds_place():
                raise not_the_runs()
            return int(os.environ["JAX_PROCESS_ID"])

    known = base._cluster_types
    if MultihostCluster in known:
        known.remove(MultihostCluster)
        known.insert(0, MultihostCluster)
    return MultihostCluster


def _watch_for_jax() -> None:
    if all(os.environ.get(k) for k in NEEDED) and CLUSTERS not in sys.modules:
        actions: dict[str, Callable[[ModuleType], None]] = {CLUSTERS: _on_clusters}
        if joins(os.environ, "", 0) and BRIDGE not in sys.modules:  # the platform: later
            actions[BRIDGE] = _on_bridge
        sys.meta_path.insert(0, JaxWatcher(actions))
    elif os.environ.get("MULTIHOST_STACK_DIR") and CLUSTERS not in sys.modules:
        sys.meta_path.insert(0, TracerWatcher())


class TracerWatcher:
    """Without the JAX_* variables only the tracer is wanted once jax is imported."""

    def find_spec(
        self, name: str, path: "Sequence[str] | None", target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if name == CLUSTERS:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _start_tracer()
        return None


def _chain_user_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        path = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(path):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_user_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


if __name__ == "sitecustomize":  # only as the staged hook, never when imported by multihost
    _install()
    _watch_for_jax()
    _watch_startup(JaxWatcher)
    _watch_steps()
    _chain_user_sitecustomize()

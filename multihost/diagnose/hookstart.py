"""The hook's start-up phases and compile cache, in a process of a run that imports jax.

Phases: the seconds from the process's own start (the kernel's start time, /proc/self/stat) to

- ``import``: ``import jax`` returned;
- ``join``: ``jax.distributed.initialize`` returned (the hook's own join or the program's; none
  in a one-process run, nor on TPU, where the runtime joins the hosts while making its backend);
- ``devices``: the first backend made (the program's first device query or computation);
- ``compile``: the end of the last compile before the first step ended (XLA's compile, or a
  load from the persistent cache in its place);
- ``first_step``: the end of the program's first step, as it marks its steps: its first
  ``jax.profiler.StepTraceAnnotation`` to end (MaxText's, the bundled payloads'); in a program
  that has begun none, the first ``jax.block_until_ready`` or ``jax.device_get`` to return
  (replaced by an annotated step that ends later).

Each is written as it is reached to ``$MULTIHOST_STACK_DIR/<pid>.startup``, one line: how many
phases, then ``name=seconds`` pairs joined by commas (written whole, then renamed into place).
The host's state reader (remote/_read_state.sh) passes on the line of the process that got
furthest.

Compile cache: with ``MULTIHOST_COMPILE_CACHE`` (a directory on this host, set by the runner
unless ``--no-compile-cache``) and no ``JAX_COMPILATION_CACHE_DIR`` of the user's or cache dir
of the program's own, once the first backend is made (its platform known), jax's persistent
cache goes to ``DIR/<jax, jaxlib, libtpu versions, platform, machine>``: every program is cached
(a minimum compile time of 0, unless ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` is set),
every process writes its own entries (jax writes process 0's only, as for a directory all
hosts share; its keys differ per process, and this one is the host's own), and the least
recently used entries beyond ``MULTIHOST_COMPILE_CACHE_MAX`` bytes are removed first.

Staged as part of the hook's ONE file, as hooktrace.py is. Only the standard library here,
imported where used; everything guarded: jax changed, a full disk, the program runs as without.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import ModuleType

# hook_text: the staged hook gets everything below this line

PHASES = ("import", "join", "devices", "compile", "first_step")
CACHE_ENV = "MULTIHOST_COMPILE_CACHE"  # the host's compile cache directory ("": none)
CACHE_MAX_ENV = "MULTIHOST_COMPILE_CACHE_MAX"  # its size cap, bytes
USER_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"  # the user's own: then multihost keeps out
MIN_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax/_src/dispatch.py
_CACHE_WRITE_ARGS = [
    "cache_key",
    "compile_time_secs",
    "module_name",
    "backend",
    "executable",
    "host_callbacks",
]  # jax/_src/compiler.py's _cache_write, as wrapped


def _watch_startup(watcher: "Callable[[dict[str, Callable[[ModuleType], None]]], object]") -> None:
    """In a run (the hook's dir exists): wait for ``import jax`` (``watcher``: hook.py's
    JaxWatcher, a finder that runs an action once a module is loaded)."""
    where = os.environ.get("MULTIHOST_STACK_DIR")
    if not where or "jax" in sys.modules:
        return
    try:
        import time

        sys.meta_path.insert(0, watcher({"jax": _Startup(where, time.monotonic()).on_jax}))  # type: ignore[arg-type]
    except Exception:
        return


def process_start(fallback: float) -> float:
    """When this process started, in ``time.monotonic()`` seconds: the kernel's start time
    (clock ticks since boot, /proc/self/stat field 22), or ``fallback`` where it cannot say."""
    import time

    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        if 0 <= since < 30 * 86400:
            return time.monotonic() - since
    except Exception:
        pass
    return fallback


def startup_line(at: "dict[str, float]") -> str:
    """The ``.startup`` file's line: how many phases, then ``name=seconds`` in PHASES order."""
    reached = [(p, at[p]) for p in PHASES if p in at]
    return f"{len(reached)} " + ",".join(f"{p}={s:.3f}" for p, s in reached) + "\n"


class _Startup:
    """One process's phases (see the module's docstring), and its compile cache."""

    def __init__(self, where: str, loaded: float) -> None:
        self.where = where
        self.loaded = loaded  # when the hook ran: the start where the kernel cannot say
        self.origin = loaded
        self.at: dict[str, float] = {}
        self.latest: float | None = None  # the end of the latest compile
        self.annotated = False  # the program marks its steps
        self.stepped = False  # an annotated step ended: first_step is final

    def now(self) -> float:
        import time

        return time.monotonic() - self.origin

    def write(self) -> None:
        try:
            import _thread

            pid = os.getpid()  # a compile may end on another thread: a temporary file each
            tmp = os.path.join(self.where, f".{pid}.{_thread.get_ident()}.startup")
            with open(tmp, "w") as f:
                f.write(startup_line(self.at))
            os.replace(tmp, os.path.join(self.where, f"{pid}.startup"))
        except Exception:
            return

    def on_jax(self, jax: "ModuleType") -> None:
        self.origin = process_start(self.loaded)
        self.at["import"] = self.now()
        self.write()
        for watch in (self.watch_join, self.watch_devices, self.watch_compiles, self.watch_steps):
            try:
                watch(jax)
            except Exception:  # jax changed: that phase is not seen
                continue

    def watch_join(self, jax: "ModuleType") -> None:
        state = sys.modules["jax._src.distributed"].global_state
        own = state.initialize

        def initialize(*args: object, **kwargs: object) -> object:
            done = own(*args, **kwargs)
            if "join" not in self.at:
                self.at["join"] = self.now()
                self.write()
            return done

        state.initialize = initialize  # the instance's: the hook's join and the program's

    def watch_devices(self, jax: "ModuleType") -> None:
        import functools

        bridge = sys.modules["jax._src.xla_bridge"]
        own = bridge.backends
        first = [True]

        @functools.wraps(own)
        def backends() -> object:
            made = own()
            if not first:
                return made
            try:
                first.pop()  # atomic: one thread goes on
            except IndexError:
                return made
            self.at.setdefault("devices", self.now())
            self.write()
            try:
                use_compile_cache(jax, bridge)
            except Exception:  # no cache: only slower
                return made
            return made

        setattr(bridge, "backends", backends)  # noqa: B010 (a module jax typed)
        if getattr(bridge, "_backends", None):  # made already, during the import
            backends()

    def watch_compiles(self, jax: "ModuleType") -> None:
        from jax._src import monitoring

        wanted = getattr(sys.modules.get("jax._src.dispatch"), "BACKEND_COMPILE_EVENT", None)

        def compiled(event: str, duration_secs: float, **kwargs: "str | int") -> None:
            if event != (wanted or COMPILE_EVENT) or self.stepped:
                return
            self.latest = self.now()
            if "first_step" not in self.at:
                first = "compile" not in self.at
                self.at["compile"] = self.latest
                if first:
                    self.write()

        monitoring.register_event_duration_secs_listener(compiled)

    def watch_steps(self, jax: "ModuleType") -> None:
        cls = sys.modules["jax._src.profiler"].StepTraceAnnotation
        enter, leave = getattr(cls, "__enter__"), getattr(cls, "__exit__")  # noqa: B009

        def __enter__(annotation: object) -> object:
            self.annotated = True
            return enter(annotation)

        def __exit__(annotation: object, *args: object) -> object:
            try:
                return leave(annotation, *args)
            finally:
                self.step(annotated=True)

        setattr(cls, "__enter__", __enter__)  # noqa: B010 (wrap, once)
        setattr(cls, "__exit__", __exit__)  # noqa: B010
        for name in ("block_until_ready", "device_get"):
            setattr(jax, name, self.waits(getattr(jax, name)))

    def waits(self, own: "Callable[..., object]") -> "Callable[..., object]":
        import functools

        @functools.wraps(own)
        def waited(*args: object, **kwargs: object) -> object:
            out = own(*args, **kwargs)
            if not self.annotated and "first_step" not in self.at:
                self.step(annotated=False)
            return out

        return waited

    def step(self, *, annotated: bool) -> None:
        if self.stepped:
            return
        try:
            self.at["first_step"] = self.now()
            if annotated:
                self.stepped = True
                if self.latest is not None:
                    self.at["compile"] = self.latest
            self.write()
        except Exception:
            return


def cache_name(version: str, lib: str, platform: str, platform_version: str) -> str:
    """The compile cache's folder for one software stack: jax's and jaxlib's versions, libtpu's
    on TPU, the platform, the machine, and a digest of the backend's own version text (a TPU
    runtime's build, a GPU plugin's), so that no two stacks ever share an entry."""
    import hashlib
    import platform as host

    libtpu = ""
    if platform == "tpu":
        from importlib import metadata

        for dist in ("libtpu", "libtpu-nightly"):
            try:
                libtpu = f"-libtpu{metadata.version(dist)}"
                break
            except Exception:
                continue
    digest = hashlib.sha256(platform_version.encode()).hexdigest()[:8]
    name = f"jax{version}-jaxlib{lib}{libtpu}-{platform}-{host.machine()}-{digest}"
    return "".join(c if c.isalnum() or c in "._+-" else "_" for c in name)


def private_cache_dir(path: str) -> bool:
    """Create ``path`` (and its parents) 0700, or take it only if it is a directory of this
    user's (not a link), made private: a compile cache is code this process will run."""
    import stat

    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return True


def use_compile_cache(jax: "ModuleType", bridge: "ModuleType") -> str | None:
    """Point jax's persistent cache at this host's (see the module's docstring); the folder, or
    None when the user or the program chose their own, or none was asked for."""
    base = os.environ.get(CACHE_ENV, "")
    if not base or os.environ.get(USER_CACHE_ENV):
        return None
    from jax._src import config

    if config.compilation_cache_dir.value:  # the program's own, set after its import
        return None
    backend = getattr(bridge, "_default_backend", None) or bridge.get_backend()
    lib = str(getattr(sys.modules.get("jaxlib"), "__version__", "unknown"))
    name = cache_name(jax.__version__, lib, backend.platform, str(backend.platform_version))
    base = os.path.expanduser(base)
    path = os.path.join(base, name)
    if not private_cache_dir(base) or not private_cache_dir(path):
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    if MIN_TIME_ENV not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    every_process_writes()
    try:
        cap = int(os.environ.get(CACHE_MAX_ENV, ""))
    except ValueError:
        cap = -1
    if cap >= 0:  # a few stats per entry: milliseconds, before the first compile
        prune_cache(base, cap)
    return path


def every_process_writes() -> None:
    """jax writes cache entries from process 0 only (it assumes one directory that every host
    shares); each host has its own here and the keys differ per process: every process writes
    its own, by jax's own put (the same checks as jax's, but for the process id)."""
    from jax._src import compilation_cache, compiler, config, distributed

    own = compiler._cache_write
    import inspect

    if list(inspect.signature(own).parameters) != _CACHE_WRITE_ARGS:
        return  # another jax: its own rule stands

    def _cache_write(
        cache_key: str,
        compile_time_secs: float,
        module_name: str,
        backend: object,
        executable: object,
        host_callbacks: "Sequence[object]",
    ) -> None:
        try:
            jaxs = (
                distributed.global_state.process_id == 0
                or bool(host_callbacks)
                or compile_time_secs < config.persistent_cache_min_compile_time_secs.value
            )
        except Exception:
            jaxs = True
        if jaxs:
            own(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
            return
        try:
            compilation_cache.put_executable_and_time(
                cache_key, module_name, executable, backend, int(compile_time_secs)
            )
        except Exception:  # as jax's own: a cache that cannot be written is only slower
            return

    setattr(compiler, "_cache_write", _cache_write)  # noqa: B010


def prune_cache(base: str, cap: int) -> int:
    """Remove the least recently used files under ``base``'s folders (the later of their
    access and change times) until they take at most ``cap`` bytes; the bytes removed."""
    found = []
    total = 0
    try:
        for folder in os.scandir(base):
            if not folder.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(folder.path):
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    found.append((max(st.st_atime, st.st_mtime), st.st_size, entry.path))
                    total += st.st_size
    except OSError:
        return 0
    removed = 0
    for _, size, path in sorted(found):
        if total <= cap:
            break
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        removed += size
    return removed

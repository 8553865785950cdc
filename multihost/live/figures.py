"""What one host says about a running run, as typed records: the answer of ``top.sh`` (see
``multihost/remote/top.sh``) read line by line, and the hook's step figures in it (see
``multihost/diagnose/hooksteps.py``). No I/O here.

The host's stream is tagged lines: ``top``/``acc`` once, then per look ``tick`` … ``end``, and
between looks the accelerator's own tool's lines (nvidia-smi's CSV as it prints it, ``tpu``
lines from ``tpu_watch.py``). :class:`Reader` turns
them into one :class:`HostSample` per look; nothing a host sends can make it hold more than
one look's lines (a look is bounded by the run's processes) or raise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from multihost.model import Host

MAX_LINE = 4096  # longer lines from a host are cut (a watch line is a few hundred bytes)
MAX_PROCESSES = 256  # per look: a host's Python processes beyond these are left out
MIB = 1 << 20


@dataclass(frozen=True)
class StepWatch:
    """One process's steps, as its hook last wrote them (times in the host's boot clock)."""

    steps: int
    at: float  # when the hook wrote it
    first: float | None = None  # when its first step ended
    last: float | None = None  # when its last step ended
    recent: tuple[float, ...] = ()  # the last steps' times, s (oldest first)
    own: tuple[float, ...] = ()  # their own times (less the waits for results), s
    waiting: float = 0.0  # s in the wait going on as it wrote (0: not waiting)
    site: str = ""  # where the program waits once a step (file:line) or StepTraceAnnotation


@dataclass(frozen=True)
class ProcessFigures:
    """One live Python process of the run on a host."""

    pid: int
    state: str  # /proc's letter: R running, S sleeping, D disk, T stopped, Z zombie
    cpu_ticks: int  # user + system time so far, in clock ticks
    rss_bytes: int
    watch: StepWatch | None = None  # None: it has not imported jax (or its hook is older)


@dataclass(frozen=True)
class Accelerator:
    """A host's accelerators together: memory summed over its devices, busy averaged."""

    kind: str  # "gpu" or "tpu"
    devices: int
    memory_used: int | None = None  # bytes
    memory_total: int | None = None
    busy_pct: float | None = None
    error: str = ""  # why there are no figures (tpu: no metrics server yet)


@dataclass(frozen=True)
class HostSample:
    """One look at one host: its clock, the run's state there, memory, processes, output."""

    host: Host
    uptime: float  # the host's seconds since boot (what the hook's times are in)
    run_state: str  # "running", "exit CODE", "missing"
    mem_total: int | None  # bytes
    mem_available: int | None
    processes: tuple[ProcessFigures, ...] = ()
    last_line: str = ""
    accelerator_kind: str = "none"  # "gpu", "tpu" or "none": what the host has
    accelerator: Accelerator | None = None
    hz: int = 100  # clock ticks per second
    cpus: int = 0

    @property
    def stepping(self) -> ProcessFigures | None:
        """The process whose steps stand for the host's: the one with the most."""
        watched = [p for p in self.processes if p.watch is not None]
        return max(watched, key=lambda p: p.watch.steps if p.watch else 0, default=None)


def parse_watch(text: str) -> StepWatch | None:
    """A hook's ``<pid>.watch`` line; None when it is not one (missing, cut, another version)."""
    if text in ("", "-"):
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("v") != 1:
            return None
        return StepWatch(
            steps=int(data.get("steps", 0)),
            at=float(data["at"]),
            first=_opt_time(data.get("first")),
            last=_opt_time(data.get("last")),
            recent=_floats(data.get("recent")),
            own=_floats(data.get("own")),
            waiting=float(data.get("waiting") or 0.0),
            site=str(data.get("site", ""))[:200],
        )
    except (ValueError, TypeError, KeyError):
        return None


def _opt_time(value: object) -> float | None:
    if not isinstance(value, int | float) or not value:
        return None
    return float(value)


def _floats(value: object) -> tuple[float, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        float(x) for x in value[:64] if isinstance(x, int | float) and math.isfinite(float(x))
    )


def parse_gpu(text: str) -> tuple[int, float | None, int | None, int | None] | None:
    """One line of ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits``: (index, busy %, used bytes, total bytes); a value the GPU
    does not report (``[N/A]``, ``[Not Supported]``) is None; not such a line: None."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4 or not parts[0].isdigit():
        return None
    busy, used, total = (_number(p) for p in parts[1:])
    return (
        int(parts[0]),
        busy,
        None if used is None else int(used * MIB),
        None if total is None else int(total * MIB),
    )


def parse_tpu(text: str) -> tuple[int, int, int, float] | str | None:
    """One ``tpu`` line of ``tpu_watch.py``: (device, used bytes, total bytes, busy %), or the
    reason there are none (``none WHY``/``nometrics WHY``), or None for anything else."""
    words = text.split()
    if words[:1] in (["none"], ["nometrics"]):
        return " ".join(words)[:200]
    if len(words) != 4 or not all(w.isdigit() for w in words[:3]):
        return None
    busy = _number(words[3])
    if busy is None:
        return None
    return int(words[0]), int(words[1]), int(words[2]), busy


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass
class Reader:
    """Reads one host's ``top.sh`` stream; :meth:`Reader.line` returns a sample at each ``end``."""

    host: Host
    hz: int = 100
    page: int = 4096
    cpus: int = 0
    kind: str = "none"
    gpus: dict[int, tuple[float | None, int | None, int | None]] = field(default_factory=dict)
    tpus: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    tpu_error: str = ""
    _look: dict[str, object] | None = None

    def feed(self, data: bytes, rest: bytearray) -> list[HostSample]:
        """``data`` appended to ``rest`` (the partial line before it), whole lines read; the
        samples they completed. ``rest`` keeps the partial line, bounded by ``MAX_LINE``."""
        rest += data
        samples = []
        *lines, tail = bytes(rest).split(b"\n")
        rest[:] = tail[-MAX_LINE:] if len(tail) > MAX_LINE else tail
        for raw in lines:
            sample = self.line(raw[:MAX_LINE].decode(errors="replace"))
            if sample is not None:
                samples.append(sample)
        return samples

    def line(self, text: str) -> HostSample | None:
        tag, _, rest = text.partition(" ")
        look = self._look
        if tag == "top":
            words = rest.split()
            if len(words) == 3 and all(w.isdigit() for w in words):
                self.hz, self.page, self.cpus = max(1, int(words[0])), int(words[1]), int(words[2])
        elif tag == "acc":
            self.kind = rest.strip() if rest.strip() in ("gpu", "tpu") else "none"
        elif tag == "tpu":
            tpu = parse_tpu(rest)
            if isinstance(tpu, str):
                self.tpu_error, self.tpus = tpu, {}
            elif tpu is not None and len(self.tpus) < 64:
                self.tpu_error = ""
                self.tpus[tpu[0]] = tpu[1:]
        elif tag == "tick":
            uptime = _number(rest.strip())
            self._look = {"uptime": uptime or 0.0, "processes": []}
        elif look is None or tag not in ("run", "mem", "p", "last", "end"):
            got = parse_gpu(text) if self.kind == "gpu" else None
            if got is not None and len(self.gpus) < 64:
                self.gpus[got[0]] = got[1:]
            return None
        elif tag == "run":
            look["run"] = rest.strip()[:40]
        elif tag == "mem":
            words = rest.split()
            if len(words) == 2:
                look["mem"] = tuple(int(w) * 1024 if w.isdigit() else None for w in words)
        elif tag == "p":
            found = self._process(rest)
            procs = look["processes"]
            assert isinstance(procs, list)
            if found is not None and len(procs) < MAX_PROCESSES:
                procs.append(found)
        elif tag == "last":
            look["last"] = rest
        elif tag == "end":
            self._look = None
            return self._sample(look)
        return None

    def _process(self, rest: str) -> ProcessFigures | None:
        words = rest.split(" ", 4)
        if len(words) != 5 or not (words[0].isdigit() and words[2].isdigit()):
            return None
        rss = int(words[3]) * self.page if words[3].isdigit() else 0
        return ProcessFigures(
            int(words[0]), words[1][:1], int(words[2]), rss, parse_watch(words[4].strip())
        )

    def _sample(self, look: dict[str, object]) -> HostSample:
        mem = look.get("mem", (None, None))
        assert isinstance(mem, tuple)
        procs = look["processes"]
        assert isinstance(procs, list)
        uptime = look["uptime"]
        assert isinstance(uptime, float)
        return HostSample(
            host=self.host,
            uptime=uptime,
            run_state=str(look.get("run", "running")),
            mem_total=mem[0],
            mem_available=mem[1],
            processes=tuple(procs),
            last_line=str(look.get("last", "")),
            accelerator_kind=self.kind,
            accelerator=self.accelerator(),
            hz=self.hz,
            cpus=self.cpus,
        )

    def accelerator(self) -> Accelerator | None:
        """The host's accelerators' latest figures (None on a host without any)."""
        if self.kind == "gpu":
            if not self.gpus:
                return Accelerator("gpu", 0, error="no answer from nvidia-smi yet")
            return summed("gpu", list(self.gpus.values()))
        if self.kind == "tpu":
            if self.tpu_error or not self.tpus:
                return Accelerator("tpu", 0, error=self.tpu_error or "no figures yet")
            return summed("tpu", [(b, u, t) for u, t, b in self.tpus.values()])
        return None


def summed(kind: str, devices: list[tuple[float | None, int | None, int | None]]) -> Accelerator:
    """(busy %, used, total) per device → the host's: memory added up, busy averaged (each
    None when no device reports it)."""
    busy = [b for b, _, _ in devices if b is not None]
    used = [u for _, u, _ in devices if u is not None]
    total = [t for _, _, t in devices if t is not None]
    return Accelerator(
        kind,
        len(devices),
        memory_used=sum(used) if used else None,
        memory_total=sum(total) if total else None,
        busy_pct=sum(busy) / len(busy) if busy else None,
    )

"""``multihost.run_sweep``: the sweep command from Python, with its ranked summary as a value."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from multihost.api.keywords import check_options, events_of, on_stderr, planned
from multihost.api.pods import around
from multihost.bridge import Interrupt, blocking, ctrl_c
from multihost.errors import EnvFailed, UsageError
from multihost.events import Event
from multihost.options import default_run_name
from multihost.planner import Plan
from multihost.remote.commands import check_run_name
from multihost.results.faces import aligned
from multihost.results.records import Staging
from multihost.sweep.grid import _check_axis, check_template, expand
from multihost.sweep.results import Record, Row, latest, summarize, sweep_rows, write_chart
from multihost.sweep.run import SWEEP_SETTINGS, Sweep, SweepSpec
from multihost.sweep.where import Where


@dataclass(frozen=True)
class SweepResult:
    """A sweep's points ranked by the metric's median (best first), and where its files are."""

    name: str
    dir: Path
    metric: str
    grid_names: tuple[str, ...]
    summary: tuple[Row, ...]  # one row per point: values, metric, n_ok/n, status, rank, command
    records: tuple[Record, ...]  # this session's runs, one per point and repeat
    interrupted: bool = False
    chart_problem: str | None = None  # why there is no sweep.png (None: it was written)
    staging: Staging | None = None  # how the code reached the hosts (--stage-via)
    env_failure: EnvFailed | None = None  # the locked environment failed: the rest not run

    @property
    def best(self) -> Row | None:
        return self.summary[0] if self.summary and self.summary[0]["best"] else None

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r["status"] == "ok" for r in self.summary)

    def __repr__(self) -> str:
        best = self.best
        top = f"best {best['label']} {self.metric}={best['metric']}" if best else "no best point"
        return f"<SweepResult {self.name}: {len(self.summary)} point(s); {top}>"

    def __str__(self) -> str:
        lines = aligned(sweep_rows(self.summary, self.metric, self.grid_names))
        return "\n".join([f"sweep {self.name} by {self.metric}", *lines, f"results: {self.dir}"])

    def _repr_html_(self) -> str:
        """The ranked points as a table, the best row in bold."""
        head, *rows = sweep_rows(self.summary, self.metric, self.grid_names)
        th = "".join(f"<th style='text-align:left'>{escape(c)}</th>" for c in head)
        body = []
        for row, data in zip(rows, self.summary, strict=True):
            weight = "font-weight:bold;" if data.get("best") else ""
            tds = "".join(f"<td style='text-align:left;{weight}'>{escape(c)}</td>" for c in row)
            body.append(f"<tr>{tds}</tr>")
        return (
            f"<div class='multihost-sweep'><b>sweep {escape(self.name)}</b> by "
            f"{escape(self.metric)}<table><thead><tr>{th}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table><small>results: {escape(str(self.dir))}"
            "</small></div>"
        )


def sweep_spec(
    name: str,
    template: str,
    grid: Mapping[str, Iterable[object]],
    *,
    where: str | None = None,
    metric: str = "tflops_per_device",
    minimize: bool = False,
    repeat: int = 1,
    point_timeout: float | None = None,
    parallel: str = "none",
    resume: bool = False,
    warm: bool = False,
) -> SweepSpec:
    """What :func:`run_sweep` sweeps (its keywords as ``multihost sweep``'s flags make it)."""
    axes: dict[str, tuple[str, ...]] = {}
    for axis, values in grid.items():
        axes[axis] = tuple(str(v) for v in values)
        _check_axis(axis, axes[axis], f"grid {axis!r}")
    check_template(template, axes)
    return SweepSpec(
        name=name,
        template=template,
        points=tuple(expand(axes, Where.compile(where, list(axes)) if where else None)),
        grid_names=tuple(axes),
        metric=metric,
        higher_is_better=not minimize,
        repeat=repeat,
        point_timeout=point_timeout,
        resume=resume,
        parallel=parallel,
        warm=warm,
    )


def plan_sweep(options: Mapping[str, Any]) -> Plan:
    """A sweep's base run, planned from its keywords (checked: ``run_sweep``'s own are not
    among them), as ``multihost sweep`` plans it from its flags."""
    check_options("run_sweep", options)
    return planned("", {**options, **SWEEP_SETTINGS})


def run_sweep(
    template: str,
    grid: Mapping[str, Iterable[object]],
    *,
    where: str | None = None,
    metric: str = "tflops_per_device",
    minimize: bool = False,
    repeat: int = 1,
    point_timeout: float | None = None,
    parallel: str = "none",
    resume: bool = False,
    warm: bool = False,
    on_record: Callable[[Record], None] | None = None,
    **options: Any,
) -> SweepResult:
    """Run ``template`` once per grid point (``{name}`` filled in), rank the points by
    process 0's ``MULTIHOST_RESULT`` ``metric``; keywords otherwise as :func:`multihost.run`
    (``run_name=`` names the sweep; ``stream=`` defaults to "none"); ``warm=True``: every
    point in warm processes, as ``--warm``. Each finished point is printed as one line, or
    handed to ``on_record``."""
    if resume and not options.get("run_name"):
        raise UsageError("resume=True needs the run_name of the sweep to resume")
    name = check_run_name(options.pop("run_name", None) or f"sweep-{default_run_name()}")
    spec = sweep_spec(
        name,
        template,
        grid,
        where=where,
        metric=metric,
        minimize=minimize,
        repeat=repeat,
        point_timeout=point_timeout,
        parallel=parallel,
        resume=resume,
        warm=warm,
    )
    given = {"stream": "none", **options, "run_name": name}
    check_options("run_sweep", given)
    say = given.get("say") or on_stderr

    def said(record: Record) -> None:
        values = " ".join(f"{k}={v}" for k, v in record.values.items())
        value = record.result.get(metric) if record.ok else None
        shown = f"  {metric}={value}" if value is not None else ""
        print(f"[{record.point}] {values} r{record.repeat} {record.status}{shown}", flush=True)

    with around(given, say, what="sweep") as box:
        result = execute(plan_sweep(given), spec, on_record or said, events_of(given))
        if box is not None:
            box.ending = "interrupted" if result.interrupted else "done"
    return result


def execute(
    plan: Plan,
    spec: SweepSpec,
    on_record: Callable[[Record], None],
    on_event: Callable[[Event], None],
    *,
    on_staged: Callable[[Staging], None] | None = None,
    on_start: Callable[[Sweep], None] | None = None,
    interrupt: Callable[[Sweep], Interrupt] | None = None,
) -> SweepResult:
    """The one way a sweep runs (``run_sweep``, ``multihost sweep``): its points on the
    planned fleet, each finished one to ``on_record``, the trials' events to ``on_event``;
    ``on_start`` sees the sweep before its first point (its groups, what is left to run),
    ``interrupt`` says its interrupt policy (default: Ctrl-C stops it). Then the results are
    ranked, their CSV and chart written (when a point finished)."""
    sweep = Sweep(plan.fleet, spec, plan.job, plan.options, on_record, on_event, on_staged)
    if on_start is not None:
        on_start(sweep)
    policy = interrupt(sweep) if interrupt is not None else ctrl_c(sweep.interrupt)
    records = blocking(sweep.execute, policy)
    rows = sweep.store.load()
    summary: list[Row] = []
    problem: str | None = "no point finished"
    if rows:
        sweep.store.write_csv(latest(rows), list(spec.grid_names))
        summary = summarize(rows, spec.metric, spec.grid_names, spec.higher_is_better)
        problem = write_chart(
            sweep.dir / "sweep.png", summary, spec.metric, spec.grid_names, spec.higher_is_better
        )
    return SweepResult(
        name=spec.name,
        dir=sweep.dir,
        metric=spec.metric,
        grid_names=spec.grid_names,
        summary=tuple(summary),
        records=tuple(records),
        interrupted=sweep.interrupted,
        chart_problem=problem,
        staging=sweep.staging,
        env_failure=sweep.env_failure,
    )

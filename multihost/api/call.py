"""The notebook path: send a Python function by value to every host, run it there, bring back
what it returned (or raised).

``call`` cloudpickles ``(fn, args, kwargs)`` into a small staged code dir with a runner script,
runs ``python _multihost_call.py`` on every host through the normal pipeline (same env as
``run``), and each host writes its outcome to ``call.out`` in its run dir, which is fetched
afterwards over the same transport (so memory is one return value per host, not the log).
When the caller's uv project (``uv_project=``, else found from the current directory as
``uv run`` finds it) has a ``uv.lock``, its ``pyproject.toml`` and ``uv.lock`` are staged with
the function and it runs inside that locked environment, as ``run`` does (``no_sync=True``:
not).
"""

from __future__ import annotations

import pickle
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from multihost.api.keywords import check_options, events_of, planned
from multihost.bridge import blocking, ctrl_c
from multihost.core import Run
from multihost.errors import RemoteCallError, SettingError
from multihost.options import default_run_name
from multihost.planner import Plan
from multihost.remote.commands import Paths, shell_path
from multihost.results.records import CallResult, RunResult
from multihost.transport import Connection
from multihost.transport.fanout import on_every_host

SCRIPT = "_multihost_call.py"
PAYLOAD = "_multihost_call.pkl"
OUTCOME = "call.out"  # in the host's run dir
# Runs on each host with the staged dir as its cwd; writes its outcome to ../../runs/$RUN/.
RUNNER = r'''"""multihost call: load the function, run it, write its outcome to the run dir."""
import os, pickle, sys, traceback

out = os.path.join(os.getcwd(), "..", "..", "runs", os.environ["MULTIHOST_RUN"], "call.out")


def finish(outcome, code):
    with open(out + ".tmp", "wb") as f:
        pickle.dump(outcome, f, protocol=4)
    os.replace(out + ".tmp", out)
    sys.exit(code)


with open("_multihost_call.pkl", "rb") as f:
    meta = pickle.load(f)
here = tuple(sys.version_info[:2])
if here != tuple(meta["python"]):
    finish({"error": "Python version mismatch: this host runs %s (%s) but the function was "
            "pickled by Python %d.%d; cloudpickle needs the same minor version (call(..., "
            "python=) picks the interpreter)" % (".".join(map(str, here)), sys.executable,
            *meta["python"]), "traceback": ""}, 3)
try:
    import cloudpickle
except ImportError:
    fix = ("it runs in your project's locked environment: `uv add cloudpickle` there, or "
           "call(..., no_sync=True)") if os.environ.get("MULTIHOST_ENV") else (
           "pip install cloudpickle, or multihost[payloads]")
    finish({"error": "cloudpickle is not installed for %s on this host (%s)"
            % (sys.executable, fix), "traceback": ""}, 3)
try:
    fn, args, kwargs = cloudpickle.loads(meta["call"])
except ImportError as exc:
    finish({"error": "%s: %s (functions from your own modules are pickled by reference: "
            "make the module importable on the hosts, or cloudpickle.register_pickle_by_value"
            "(module) before calling)" % (type(exc).__name__, exc),
            "traceback": traceback.format_exc()}, 1)
try:
    value = cloudpickle.dumps(fn(*args, **kwargs))
except BaseException as exc:
    sys.stdout.flush()
    traceback.print_exc()
    finish({"error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()}, 1)
sys.stdout.flush()
finish({"value": value}, 0)
'''


def call(
    fn: Any,
    *args: Any,
    hosts: Any = None,
    prefix: str | None = None,
    local: int | None = None,
    timeout: float | None = None,
    python: str | None = None,
    kwargs: dict[str, Any] | None = None,
    uv_project: str | Path | None = None,
    **options: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on every host (JAX env set, prints streamed with host
    prefixes) and return each host's value in process order.

    If any host raised, a :class:`RemoteCallError` names the first failing one with its remote
    traceback; its ``.results`` holds every host's :class:`CallResult`. The hosts need
    cloudpickle and the same Python minor version (``python=``, default ``python3``; for
    ``local=`` fleets this interpreter; in a locked environment, its ``python``).
    ``uv_project``: the uv project whose locked environment ``fn`` runs in (default: the
    nearest directory from the current one up with a ``pyproject.toml``; none without a
    ``uv.lock``; ``no_sync=True``: none). Other keywords: as :func:`multihost.run`.
    """
    check_options("call", options)
    import cloudpickle

    payload = {"python": sys.version_info[:2], "call": cloudpickle.dumps((fn, args, kwargs or {}))}
    fleet_kw = {
        k: v for k, v in (("hosts", hosts), ("prefix", prefix), ("local", local)) if v is not None
    }
    with tempfile.TemporaryDirectory(prefix="multihost-call-") as tmp:
        code = Path(tmp)
        (code / SCRIPT).write_text(RUNNER)
        (code / PAYLOAD).write_bytes(pickle.dumps(payload, protocol=4))
        project = _stage_project(code, uv_project, options)
        plan = plan_call(code, {**options, **fleet_kw, "timeout": timeout}, python, project)
        runner = Run(plan.fleet, plan.job, plan.options, events_of(options))

        async def go() -> tuple[RunResult, list[CallResult]]:
            result = await runner.execute()
            return result, [] if result.interrupted else await fetch(result, plan)

        run_result, outcomes = blocking(go, ctrl_c(runner.interrupt))
    if run_result.interrupted:
        raise KeyboardInterrupt(f"multihost.call interrupted; run {run_result.run_name} stopped")
    failed = [o for o in outcomes if not o.ok]
    if failed:
        first = _first_failure(run_result, failed)
        raise RemoteCallError(first.host, _message(first), tuple(outcomes), run_result)
    return [o.value for o in outcomes]


def plan_call(
    code: Path, options: Mapping[str, Any], python: str | None = None, project: Path | None = None
) -> Plan:
    """:func:`call`'s run, planned: ``python SCRIPT`` in the code dir ``code`` (where the
    function and the runner are), with the keywords ``options`` (checked: call's own are not
    among them); ``project``: the uv project whose lock was copied into ``code``."""
    check_options("call", options)
    given = {"run_name": f"call-{default_run_name()}", **options}
    plan = planned("", {**given, "script_dir": code, "lock_dir": project})
    default = sys.executable if plan.fleet.local else "python3"
    interpreter = python or ("python" if plan.options.environment else default)
    return replace(plan, job=replace(plan.job, command=f"{shlex.quote(interpreter)} {SCRIPT}"))


def _stage_project(code: Path, given: str | Path | None, options: dict[str, Any]) -> Path | None:
    """The caller's uv project, its ``pyproject.toml`` and ``uv.lock`` copied into ``code``
    (the hosts build the environment from them); None when there is none to use: no lock,
    ``no_sync=True``, or a ``requirements=`` file and no ``uv_project=``."""
    if options.get("no_sync") or (given is None and options.get("requirements") is not None):
        return None
    if given is not None:
        root = Path(given).expanduser()
        if not (root / "pyproject.toml").is_file() or not (root / "uv.lock").is_file():
            raise SettingError(f"uv_project={str(given)!r}: no pyproject.toml and uv.lock there")
    else:
        here = Path.cwd()
        found = next((d for d in (here, *here.parents) if (d / "pyproject.toml").is_file()), None)
        if found is None or not (found / "uv.lock").is_file():
            return None
        root = found
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copyfile(root / name, code / name)
    return root


async def fetch(result: RunResult, plan: Plan) -> list[CallResult]:
    """Each host's ``call.out``, read over the transport; a missing one says why."""
    code_hash = ""  # only the run dir is read: the code hash does not enter its path
    by_pid = {r.host.process_id: r for r in result.hosts}

    async def one(conn: Connection) -> bytes:
        paths = Paths.for_host(conn.host, plan.job, code_hash)
        res = await conn.run(f"cat {shell_path(paths.run)}/{OUTCOME} 2>/dev/null")
        return res.stdout if res.exit_status == 0 else b""

    fetched = await on_every_host(plan.fleet, plan.options.ssh, one)
    outcomes = []
    for o in fetched:
        host_result = by_pid[o.host.process_id]
        if not o.value:
            why = host_result.reason or (o.error.message if o.error else "")
            outcomes.append(CallResult(o.host, error=f"no outcome came back: {why or 'none'}"))
            continue
        data = pickle.loads(o.value)
        if "value" in data:
            try:
                outcomes.append(CallResult(o.host, value=pickle.loads(data["value"])))
            except Exception as exc:  # e.g. an object of a module only the host has
                why = f"its return value cannot be unpickled here: {type(exc).__name__}: {exc}"
                outcomes.append(CallResult(o.host, error=why))
        else:
            outcomes.append(CallResult(o.host, error=data["error"], traceback=data["traceback"]))
    return outcomes


def _first_failure(result: RunResult, failed: list[CallResult]) -> CallResult:
    """The host that raised (over those stopped because of it); the first to end among them."""
    raised = [o for o in failed if o.traceback] or failed
    ended = {r.host.process_id: r.ended_at or float("inf") for r in result.hosts}
    return min(raised, key=lambda o: (ended[o.host.process_id], o.host.process_id))


def _message(o: CallResult) -> str:
    if not o.traceback:
        return str(o.error)
    return f"{o.error}\n\nremote traceback ({o.host.name}):\n{o.traceback.rstrip()}"

"""Every keyword the API accepts has its flag's effect, in every function that accepts it
(``run``, ``run_async``, ``call``, ``run_sweep``; a pod's ``up``, ``pod``, ``down``,
``pods``, ``gc``, ``autodown``; the job path's ``submit_job``); one a function has no use for
is refused by name. The keywords are enumerated from the functions' own gate
(``keywords.accepted``), so a keyword added later without an effect fails here.

How an effect is shown, for each (function, keyword):

- a setting of the schema: what the function hands the one planner (caught at
  ``keywords.plan``) differs from what it hands without the keyword, and for a flag of the
  function's command (``run``; ``sweep`` for ``run_sweep``) equals what the command's flag
  hands it (``planner.Settings``, the records every setting lands in);
- a keyword acted on after the plan (``dry_run``, ``detach``, ``stream``, ``on_output``,
  ``on_event``): on real ``--local`` runs;
- a function's own keyword (``call``'s ``python=``, ``run_sweep``'s ``metric=``, ...): on what
  the function makes of it (the call's command, the sweep's spec, the CLI's spec for its flag);
- a run's and a sweep's pod keywords (``up=``, ``down=``, ``tpu_type=``...): what reaches the
  pod's life around them (``multihost.pods.ops.around``) is what ``run --prefix NAME`` with the
  flag hands it;
- the functions on a pod and a job: what reaches the library function below them (``ops.up``,
  ``ops.delete``, ``ops.listing``, ``ops.collect``, ``ops.set_autodown``, ``ops.around``,
  ``job.submit.submit``) differs from what reaches it without the keyword, and equals what
  the command's flag hands it (``multihost up``, ``down``, ``pods``, ``gc``, ``autodown``,
  ``job submit``; ``pod``'s are ``up``'s).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

import multihost
from multihost.api import keywords
from multihost.api.call import plan_call
from multihost.api.runs import with_payload
from multihost.api.sweep import plan_sweep, sweep_spec
from multihost.cli import parse
from multihost.cli.sweep import sweep_settings
from multihost.cli.sweep import sweep_spec as cli_sweep_spec
from multihost.events import HostEvent
from multihost.planner import DryRun, Settings
from multihost.settings.checks import env_of
from multihost.settings.flag import Flag
from multihost.settings.fleetflags import SOURCES
from multihost.settings.schema import RUN_COMMAND, flags_of
from multihost.transport import SSHOptions

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "run": multihost.run,
    "run_async": multihost.run_async,
    "call": multihost.call,
    "run_sweep": multihost.run_sweep,
}
ON_A_POD: dict[str, Callable[..., Any]] = {
    "up": multihost.up,
    "pod": multihost.pod,
    "down": multihost.down,
    "pods": multihost.pods,
    "gc": multihost.gc,
    "autodown": multihost.autodown,
    "submit_job": multihost.submit_job,
}
# Acted on after the plan: each has its run-level test below, for every function taking it.
AFTER_THE_PLAN = {"dry_run", "detach", "stream", "on_output", "on_event"}
# A pod's life around a run: walked at the pod (test_a_pod_keyword_of_a_run_is_its_flag).
AROUND = {*keywords.POD_KEYWORDS, "say"}
RUN_FLAGS = {f.dest: f for f in flags_of(RUN_COMMAND)}


def _sweep_flags() -> dict[str, str]:
    """``multihost sweep``'s flags by dest: their option strings."""
    from multihost.cli import build_parser, subparser

    sweep = subparser(build_parser("sweep"), "sweep")
    return {a.dest: a.option_strings[-1] for a in sweep._actions if a.option_strings}


SWEEP_FLAGS = _sweep_flags()


# -- the gate: what each function accepts is what keywords.accepted says ------------------------
@pytest.mark.parametrize("function", [*FUNCTIONS, *ON_A_POD])
def test_each_function_takes_what_the_gate_says(function: str, home: Path) -> None:
    """Its own parameters are the gate's (``OWN``, or the run's keywords it names: ``call``'s
    ``hosts=``); a run keyword it has no use for is refused by name, with why."""
    fn = {**FUNCTIONS, **ON_A_POD}[function]
    params = inspect.signature(fn).parameters.values()
    named = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    named |= {
        p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty
    }
    assert named <= set(keywords.accepted(function)), named - set(keywords.accepted(function))
    if function in ON_A_POD:  # a command's flags by dest: the rest go through **keywords
        takes_more = any(p.kind is p.VAR_KEYWORD for p in params)
        assert takes_more or named == set(keywords.accepted(function))
        with pytest.raises(TypeError, match=rf"{function}\(\) got an unexpected keyword"):
            keywords.check_options(function, {"nope": 1})
        return
    takes_more = any(p.kind is p.VAR_KEYWORD for p in params)
    assert set(keywords.OWN[function]) <= named or takes_more
    calls: dict[str, Callable[..., object]] = {
        "run_async": lambda **kw: asyncio.run(multihost.run_async("true", local=1, **kw)),
        "call": lambda **kw: multihost.call(print, local=1, **kw),
        "run_sweep": lambda **kw: multihost.run_sweep("echo {a}", {"a": [1]}, local=1, **kw),
    }
    for name, why in keywords.NOT_FOR[function].items():
        assert why
        with pytest.raises(TypeError, match=rf"{function}\(\) does not take {name}=: "):
            calls[function](**{name: SAMPLES.get(name, True)})  # refused before anything runs
    with pytest.raises(
        TypeError, match=rf"{function}\(\) got an unexpected keyword argument 'nope'"
    ):
        keywords.check_options(function, {"nope": 1})


# -- the settings: each keyword reaches the planner as its flag does --------------------------
class _Caught(Exception):
    pass


@pytest.fixture
def caught(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], object]], dict[str, Any]]:
    """What a function hands the one planner: its Settings, flattened (nothing planned, nothing
    run)."""

    def catch(call: Callable[[], object]) -> dict[str, Any]:
        seen: list[Mapping[str, Any]] = []

        def fake(given: Mapping[str, Any]) -> None:
            seen.append(given)
            raise _Caught

        monkeypatch.setattr(keywords, "plan", fake)
        with pytest.raises(_Caught):
            call()
        return _flat(Settings.of(seen[0]))

    return catch


def _flat(record: Any, at: str = "") -> dict[str, Any]:
    """Every leaf of the planner's records by its path (``where.spec.local``), each value as
    the planner reads it (a list as a tuple, ``env`` as its pairs; the CLI's ``progress`` as
    "given")."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if is_dataclass(value) and f.name in ("where", "spec", "options"):
            out |= _flat(value, f"{at}{f.name}.")
            continue
        if f.name == "env" and value is not None:
            value = tuple(env_of(value).items())
        elif isinstance(value, list):
            value = tuple(value)
        elif f.name == "progress" and value is not None:
            value = "given"
        out[at + f.name] = value
    return out


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What a keyword (or a flag) changed in what the planner is handed."""
    return {k: v for k, v in after.items() if before.get(k) != v}


def _progress(text: str) -> None:
    pass


BASE: dict[str, Any] = {"local": 2, "run_name": "walk"}
# Values for keywords whose flag's type does not tell one (or that have no flag).
SAMPLES: dict[str, Any] = {
    "env": {"K": "v w"},
    "exclude": ["data/"],
    "excludes": ["data/"],
    "secret": ["TOKEN=my-secret"],
    "pull": ["out/*.json"],
    "extra": ["tpu"],
    "group": ["lint"],
    "setup": "pip install -e .",
    "workers": "0",
    "exclude_workers": "1",
    "hosts": "h0,h1",
    "prefix": "myqr",
    "wait": 30.0,
    "stage_via": "peer",
    "stage_bucket": "gs://bucket",
    "remote_dir": "~/elsewhere",
    "run_name": "other",
    "jax_job": "--payload shardings",
    "ssh": SSHOptions(connect_timeout=3.0),
    "progress": _progress,
    "stale": "kill",
    "device_glob": "/dev/nothing*",
    "lock_dir": Path("/the/project"),
    "stage_timeout": 7.0,
    "launch_timeout": 7.0,
    "zone": "us-east1-d",
    "zones": ("us-east1-d", "us-central2-b"),
    "tpu_type": "v4-16",
    "capacity": "spot",
    "bucket": "gs://other-bucket",
    "autodown": "30m",
    "queue_timeout": "5m",
}
# The flag's words for a sample, where they are not ``--flag str(value)``.
ARGV: dict[str, list[str]] = {
    "zones": ["--zones", "us-east1-d,us-central2-b"],
    "env": ["--env", "K=v w"],
    "exclude": ["--exclude", "data/"],
    "excludes": ["--exclude", "data/"],
    "secret": ["--secret", "TOKEN=my-secret"],
    "pull": ["--pull", "out/*.json"],
    "extra": ["--extra", "tpu"],
    "group": ["--group", "lint"],
}


def _sample(name: str, flag: Flag | None) -> Any:
    """A value of keyword ``name`` other than its default."""
    if name in SAMPLES:
        return SAMPLES[name]
    assert flag is not None, f"{name}=: no sample value (add one to SAMPLES)"
    if flag.kind in ("switch", "bool"):
        return not flag.default
    if flag.choices:
        return next(c for c in flag.choices if c != flag.default)
    for text in ("3", "8477", "1.5", "x"):
        try:
            value = flag.type(text) if flag.type else text
        except Exception:
            continue
        if value != flag.default:
            return value
    raise AssertionError(f"{name}=: no sample value (add one to SAMPLES)")


def _argv(name: str, flag: Flag, value: Any) -> list[str]:
    if name in ARGV:
        return ARGV[name]
    if flag.kind in ("switch", "bool"):
        return [flag.option if value else f"--no-{flag.name}"]
    return [flag.option, str(value)]


def _with(name: str, value: Any) -> dict[str, Any]:
    """The base keywords with ``name`` given (one of --hosts/--local/--prefix replaces the
    others)."""
    base = {k: v for k, v in BASE.items() if not (name in SOURCES and k in SOURCES)}
    return {**base, name: value}


def _planned_by(function: str, given: Mapping[str, Any], code: Path) -> Callable[[], object]:
    """How ``function`` plans from ``given`` (as it does when called)."""
    if function in ("run", "run_async"):
        return lambda: keywords.plan_run("true", given, function)
    if function == "call":
        return lambda: plan_call(code, given)
    return lambda: plan_sweep({"stream": "none", **given})


def _by_the_cli(function: str, name: str, argv: list[str], code: Path) -> dict[str, Any] | None:
    """What the function's command changes in what it hands the planner, for the same flag
    (None: the command has no such flag)."""
    command = "sweep" if function == "run_sweep" else "run"
    if (function == "run_sweep" and name not in SWEEP_FLAGS) or (
        function != "run_sweep" and (name not in RUN_FLAGS or function == "call")
    ):
        return None  # (call's plan is a run's: run shows the flag's)

    def settings(extra: list[str]) -> dict[str, Any]:
        argv = [command, "--run-name", "walk", "--cmd", "true", "--script-dir", str(code), *extra]
        args = parse(argv)
        given = (
            sweep_settings(args, args.run_name)
            if command == "sweep"
            else with_payload(vars(args), None)
        )
        return _flat(Settings.of(given))

    source = [] if name in SOURCES else ["--local", "2"]
    return _delta(settings(["--local", "2"]), settings([*source, *argv]))


def _settings_walk() -> Iterator[tuple[str, str]]:
    for function in FUNCTIONS:
        for name in keywords.accepted(function):
            if name not in AFTER_THE_PLAN | AROUND and name not in keywords.OWN[function]:
                yield function, name


@pytest.mark.parametrize(("function", "name"), list(_settings_walk()))
def test_a_keyword_reaches_the_planner_as_its_flag_does(
    function: str,
    name: str,
    caught: Callable[[Callable[[], object]], dict[str, Any]],
    home: Path,
    code: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    flag = RUN_FLAGS.get(keywords._ALIASES.get(name, name))
    if name == "profile":
        (tmp_path / "pyproject.toml").write_text("[tool.multihost.profiles.p]\ngrace = 9\n")
        value, argv = "p", ["--profile", "p"]
    else:
        value = _sample(name, flag)
        argv = _argv(name, flag, value) if flag is not None else []
    base = {**BASE, "script_dir": code} if function != "call" else dict(BASE)
    given = {**_with(name, value), **({"script_dir": code} if function != "call" else {})}
    if name == "script_dir":
        other = tmp_path / "other"
        other.mkdir()
        given["script_dir"], argv = other, ["--script-dir", str(other)]
    without = caught(_planned_by(function, base, code))
    changed = _delta(without, caught(_planned_by(function, given, code)))
    assert changed, f"{function}({name}=...) reaches the planner as if not given"
    if flag is None or name == "script_dir":
        return
    cli = _by_the_cli(function, name, argv, code)
    if cli is not None:
        assert changed == cli, f"{function}({name}=) is not what {' '.join(argv)} plans"


# -- the function's own keywords -------------------------------------------------------------
def test_call_s_own_keywords(home: Path, tmp_path: Path) -> None:
    """``python=``: the interpreter of the call's runner; ``kwargs=``: the function's keywords
    (``uv_project=``: the locked environment it runs in, on real runs in tests/test_envsync.py)."""
    assert set(keywords.OWN["call"]) == {"kwargs", "python", "uv_project"}
    base = plan_call(tmp_path, {"local": 1, "run_name": "c"})
    other = plan_call(tmp_path, {"local": 1, "run_name": "c"}, python="/opt/py/bin/python3")
    assert base.job.command != other.job.command
    assert other.job.command.startswith("/opt/py/bin/python3 ")
    assert multihost.call(lambda **kw: kw, local=1, stream="none", kwargs={"a": 1}) == [{"a": 1}]


SWEEP_OWN: dict[str, tuple[Any, list[str]]] = {
    "where": ("a != 2", ["--where", "a != 2"]),
    "metric": ("score", ["--metric", "score"]),
    "minimize": (True, ["--minimize"]),
    "repeat": (2, ["--repeat", "2"]),
    "point_timeout": (5.0, ["--point-timeout", "5"]),
    "parallel": ("slice", ["--parallel", "slice"]),
    "resume": (True, ["--resume"]),
    "warm": (True, ["--warm"]),
}


@pytest.mark.parametrize(
    "name", [n for n in keywords.OWN["run_sweep"] if n not in ("on_record", "say")]
)
def test_run_sweep_s_own_keywords_make_the_spec_its_flags_make(name: str, home: Path) -> None:
    """(``say=``: where the pod around it tells, test_a_pod_keyword_of_a_run_is_its_flag.)"""
    assert set(SWEEP_OWN) == set(keywords.OWN["run_sweep"]) - {"on_record", "say"}
    value, argv = SWEEP_OWN[name]
    grid = {"a": [1, 2, 3]}
    base = sweep_spec("s", "echo {a}", grid)
    spec = sweep_spec("s", "echo {a}", grid, **{name: value})
    assert spec != base, f"run_sweep({name}=) made the same sweep"
    flags = ["sweep", "--local", "1", "--run-name", "s", "--grid", "a=1,2,3", "--cmd", "echo {a}"]
    assert cli_sweep_spec(parse([*flags, *argv])) == spec


# -- after the plan: on real --local runs --------------------------------------------------------
def test_dry_run_runs_nothing_and_is_the_cli_s_plan(home: Path, code: Path, tmp_path: Path) -> None:
    """``dry_run=True``: nothing runs anywhere (the command would write a file on each host),
    and the value is what ``run --dry-run`` prints, as data (one shape)."""
    from tests.clitools import cli

    logs = tmp_path / "logs"
    cmd = "echo RAN > f; echo hi"
    kw = {
        "local": 2,
        "script_dir": code,
        "log_dir": logs,
        "run_name": "dry",
        "coordinator_port": 40123,
    }
    plan = multihost.run(cmd, dry_run=True, **kw)
    in_loop = asyncio.run(multihost.run_async(cmd, dry_run=True, **kw))
    assert isinstance(plan, DryRun)
    assert plan == in_loop
    assert not list(home.rglob("f"))
    assert not list(code.rglob("f"))
    assert not logs.exists()  # no run record: nothing started
    assert not (home / ".cache" / "multihost").exists()  # no worker's folder made
    assert [h.host.name for h in plan.hosts] == ["s0/w0", "s0/w1"]
    assert plan.hosts[1].env["JAX_PROCESS_ID"] == "1"
    assert plan.hosts[0].job.endswith(f"exec sh -c '{cmd}'\n")
    assert plan.command == cmd
    printed = cli(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "dry",
            "--coordinator-port",
            "40123",
            "--dry-run",
            "--cmd",
            cmd,
        ],
        cwd=tmp_path,
        HOME=str(home),
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == str(plan)
    with pytest.raises(TypeError, match=r"call\(\) does not take dry_run="):
        multihost.call(print, local=1, dry_run=True)
    with pytest.raises(TypeError, match=r"run_sweep\(\) does not take dry_run="):
        multihost.run_sweep("echo {a}", {"a": [1]}, local=1, dry_run=True)


def test_detach_returns_with_every_host_running(home: Path, code: Path) -> None:
    for function in ("run", "run_async"):
        name = f"bg-{function}"
        go = FUNCTIONS[function]("sleep 30", local=2, detach=True, run_name=name, script_dir=code)
        r = asyncio.run(go) if function == "run_async" else go
        assert [h.state for h in r.hosts] == [multihost.State.RUNNING] * 2
        killed = multihost.kill(name, grace=2)
        assert [h.state for h in killed.hosts] == [multihost.State.KILLED] * 2


def _echo_call() -> str:
    import os

    print("hi", os.environ["JAX_PROCESS_ID"])
    return "ok"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_stream_on_output_on_event(function: str, home: Path, code: Path) -> None:
    """``stream="host0"`` keeps host 1's lines from ``on_output`` (the default, ``all``, would
    not), and ``on_event`` hears the run's events."""
    lines: list[tuple[str, str]] = []
    events: list[object] = []
    kw: dict[str, Any] = {
        "local": 2,
        "stream": "host0",
        "on_output": lambda host, line: lines.append((host, line)),
        "on_event": events.append,
    }
    if function == "call":
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        assert multihost.call(_echo_call, **kw) == ["ok", "ok"]
        want = "hi 0"
    elif function == "run_sweep":
        records: list[object] = []
        template = "echo hi $JAX_PROCESS_ID {a}"
        multihost.run_sweep(template, {"a": [1]}, script_dir=code, on_record=records.append, **kw)
        assert len(records) == 1  # on_record=: each finished point, instead of a printed line
        want = "hi 0 1"
    else:
        done = FUNCTIONS[function]("echo hi $JAX_PROCESS_ID", script_dir=code, **kw)
        assert (asyncio.run(done) if function == "run_async" else done).ok
        want = "hi 0"
    assert lines == [("s0/w0", want)]
    assert any(isinstance(e, HostEvent) for e in events)


def test_session_takes_what_the_gate_says(home: Path) -> None:
    """``session()``'s own parameters are the gate's; a run keyword its warm processes have no
    use for (a run's timeout, hang watch, traces, pulls) is refused by name, with why, before
    anything starts; a pod's keywords and ``say=`` are taken, as ``run()`` takes them (each
    walked to the pod's life in test_a_pod_keyword_of_a_run_is_its_flag)."""
    params = inspect.signature(multihost.session).parameters.values()
    named = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert named <= set(keywords.accepted("session")), named - set(keywords.accepted("session"))
    assert set(keywords.OWN["session"]) <= named
    assert set(keywords.accepted("session")) >= AROUND
    assert not AROUND & set(keywords.NOT_FOR["session"])
    for name, why in keywords.NOT_FOR["session"].items():
        assert why
        with pytest.raises(TypeError, match=rf"session\(\) does not take {name}=: "):
            multihost.session(local=1, **{name: SAMPLES.get(name, True)})
    with pytest.raises(TypeError, match=r"session\(\) got an unexpected keyword argument 'nope'"):
        multihost.session(local=1, nope=1)


# -- a pod's life: around a run, and the functions on a pod and a job -----------------------------
def _catching(
    where: object, name: str
) -> Callable[[Callable[[], object]], tuple[tuple[Any, ...], dict[str, Any]]]:
    """What a function hands ``where.name`` (a library function below the API), nothing run."""

    def catch(call: Callable[[], object]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

        def fake(*args: Any, **kw: Any) -> None:
            seen.append((args, kw))
            raise _Caught

        real = getattr(where, name)
        setattr(where, name, fake)
        try:
            with pytest.raises(_Caught):
                call()
        finally:
            setattr(where, name, real)
        return seen[0]

    return catch


def _cli(argv: list[str]) -> None:
    """A command run as ``multihost ARGV`` runs it (its output to a console of its own)."""
    from rich.console import Console

    from multihost.cli import command

    args = parse(argv)
    command(args.command)(args, Console(stderr=True))


def _profile(tmp_path: Path) -> None:
    """A profile ``p`` that says what a pod and a job are made of, and how workers are reached."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.multihost.profiles.p]\ntpu-type = "v4-32"\nuser = "profiled"\nmax-restarts = 5\n'
    )


# What each function on a pod and a job is called with at least (the CLI's words for the same),
# and its flag's words where the flag's are not ``--flag VALUE``.
POD_BASE: dict[str, tuple[dict[str, Any], list[str]]] = {
    "up": (
        {"tpu_type": "v4-8", "runtime_version": "v", "zone": "us-central2-b"},
        ["up", "pp", "--tpu-type", "v4-8", "--runtime-version", "v", "--zone", "us-central2-b"],
    ),
    "pod": ({"tpu_type": "v4-8", "runtime_version": "v", "zone": "us-central2-b"}, []),
    "down": ({}, ["down", "pp"]),
    "pods": ({}, ["pods"]),
    "gc": ({"dry_run": False}, ["gc"]),
    "autodown": ({}, ["autodown", "pp", "30m"]),
    "submit_job": (
        {"tpu_type": "v4-8", "runtime_version": "v", "bucket": "gs://my-bucket"},
        [
            "job",
            "submit",
            "pp",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--bucket",
            "gs://my-bucket",
            "--cmd",
            "true",
        ],
    ),
}
POD_ARGV: dict[tuple[str, str], list[str]] = {
    ("down", "wait"): ["--no-wait"],
    ("gc", "dry_run"): ["--dry-run"],
}
POD_SAMPLES: dict[tuple[str, str], Any] = {
    ("down", "wait"): False,
    ("gc", "dry_run"): True,
    ("pod", "down"): False,
}


def _pod_call(function: str, given: Mapping[str, Any], code: Path) -> Callable[[], object]:
    fn = ON_A_POD[function]
    if function == "pod":
        return lambda: fn("pp", **given).__enter__()
    if function == "autodown":
        return lambda: fn("pp", "30m", **given)
    if function == "submit_job":
        return lambda: fn("pp", "true", **{"script_dir": code, **given})
    if function in ("up", "down"):
        return lambda: fn("pp", **given)
    return lambda: fn(**given)


def _reached(function: str, seen: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any]:
    """What the library function was handed, as compared: a pod's flags (those of a pod to make:
    given over configured), how its workers are reached, and the rest by name."""
    from dataclasses import asdict

    from multihost.fleetops.reach import ReachSettings
    from multihost.pods.workers import access_of

    def access(given: Mapping[str, Any]) -> dict[str, Any]:  # as the workers are reached
        settings = _flat(ReachSettings.of(access_of(given)), "access.")
        return {k: v for k, v in settings.items() if k != "access.progress"}

    args, kw = seen
    if function in ("up", "pod"):
        flags = args[1] if function == "up" else args[1].over(kw["configured"])
        out = {**asdict(flags), **access(args[2]), "say": args[3]}
        if function == "pod":
            out["down"] = kw["delete_after"]
        return out
    if function == "down":
        return {**kw, "say": args[1]}
    if function == "pods":
        return {**kw, **access(args[0]), "say": args[1]}
    if function == "gc":
        return {**kw, "say": args[0]}
    if function == "autodown":
        return {**access(args[2]), "say": args[3]}
    return {**vars(args[0]), "say": args[2]}  # submit_job: the JobRequest


def _pod_walk() -> Iterator[tuple[str, str]]:
    for function in ON_A_POD:
        for name in keywords.accepted(function):
            yield function, name


@pytest.mark.parametrize(("function", "name"), list(_pod_walk()))
def test_a_keyword_of_a_pod_or_a_job_is_its_flag(
    function: str,
    name: str,
    home: Path,
    code: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from multihost.job import submit as submitting
    from multihost.pods import ops
    from multihost.settings import cloudcommands, schema

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    if function == "autodown":  # a pod recorded here, to arm
        from multihost.pods import records
        from multihost.pods.plan import PodSpec

        records.save(PodSpec("pp", "v4-8", "v", ("us-central2-b",)).record("us-central2-b", 1.0))
    below = {
        "up": "up",
        "pod": "around",
        "down": "delete",
        "pods": "listing",
        "gc": "collect",
        "autodown": "set_autodown",
        "submit_job": "submit",
    }[function]
    catch = _catching(submitting if function == "submit_job" else ops, below)
    base, argv = POD_BASE[function]
    if name == "zones":  # a place: --zones or --zone, not both
        base = {k: v for k, v in base.items() if k != "zone"}
        argv = [w for w in argv if w not in ("--zone", "us-central2-b")]
    flags = {
        f.dest: f
        for f in schema.flags_of(
            (*cloudcommands.UP_COMMAND, *cloudcommands.DOWN_COMMAND, *cloudcommands.LABELLED,
             *cloudcommands.GC_COMMAND, *cloudcommands.PODS_COMMAND, *cloudcommands.JOB_SUBMIT)
        )
    }  # fmt: skip
    flag = flags.get(name)
    if name == "profile":
        _profile(tmp_path)
        value, words = "p", ["--profile", "p"]
    elif name == "say":
        value, words = (lambda _text: None), []
    elif (function, name) in POD_SAMPLES:
        value, words = POD_SAMPLES[function, name], POD_ARGV.get((function, name), [])
    else:
        value = _sample(name, flag)
        words = _argv(name, flag, value) if flag is not None else []
    if name == "script_dir":
        value = tmp_path / "other"
        value.mkdir()
        words = ["--script-dir", str(value)]
    without = _reached(function, catch(_pod_call(function, base, code)))
    given = {**base, name: value}
    with_it = _reached(function, catch(_pod_call(function, given, code)))
    changed = _delta(without, with_it)
    assert changed, f"{function}({name}=...) reaches {below} as if not given"
    if name == "say":
        assert with_it["say"] is value
        return
    if function == "pod":  # no command of its own: up's flag, for the same keyword
        if name == "down":
            return
        function, (base, argv) = "up", POD_BASE["up"]
        if name == "zones":
            argv = [w for w in argv if w not in ("--zone", "us-central2-b")]
        catch = _catching(ops, "up")
        changed = {k: v for k, v in changed.items() if k != "down"}
    if function == "submit_job" and name != "script_dir":
        argv = [*argv, "--script-dir", str(code)]
    cli_without = _reached(function, catch(lambda: _cli(argv)))
    cli_with = _reached(function, catch(lambda: _cli([*argv, *words])))
    cli = _delta(cli_without, cli_with)
    changed.pop("say", None)
    cli.pop("say", None)
    assert changed == cli, f"{function}({name}=) is not what {' '.join(words)} hands {below}"


@pytest.mark.parametrize("function", ["run", "run_sweep", "session"])
@pytest.mark.parametrize("name", sorted(AROUND))
def test_a_pod_keyword_of_a_run_is_its_flag(
    function: str,
    name: str,
    home: Path,
    code: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run(prefix=NAME, up=True, ...)`` hands the pod's life around the run what ``run
    --prefix NAME --up`` does (as ``run_sweep`` and ``sweep``; ``session``, which has no
    command, as ``run``); ``say=`` is where it tells."""
    from dataclasses import asdict

    from multihost.pods import ops
    from multihost.settings.schema import POD_AROUND

    monkeypatch.chdir(tmp_path)
    catch = _catching(ops, "around")
    flag = {f.dest: f for f in flags_of(POD_AROUND)}.get(name)
    heard: list[str] = []
    value = heard.append if name == "say" else _sample(name, flag)
    base: dict[str, Any] = {"prefix": "pp", "script_dir": code, "up": True}
    if function == "run":
        call = lambda kw: lambda: multihost.run("true", **kw)  # noqa: E731
        argv = ["run", "--prefix", "pp", "--script-dir", str(code), "--cmd", "true", "--up"]
    elif function == "session":
        call = lambda kw: lambda: multihost.session(**kw)  # noqa: E731
        argv = ["run", "--prefix", "pp", "--script-dir", str(code), "--cmd", "true", "--up"]
    else:
        call = lambda kw: lambda: multihost.run_sweep("echo {a}", {"a": [1]}, **kw)  # noqa: E731
        argv = ["sweep", "--prefix", "pp", "--script-dir", str(code), "--cmd", "echo {a}",
                "--grid", "a=1", "--up"]  # fmt: skip

    def reached(seen: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any]:
        args, kw = seen
        return {"name": args[0], "flags": asdict(args[1]), "say": args[3], **kw}

    with_it = reached(catch(call({**base, name: value})))
    if name == "say":
        assert with_it["say"] is value
        return
    words = _argv(name, flag, value) if flag is not None else []
    cli = reached(catch(lambda: _cli([*argv, *words])))
    for got in (with_it, cli):
        got.pop("say")
        got.pop("what", None)
        got.pop("strict")
    assert with_it == cli, f"{function}({name}=) is not what {' '.join(words)} hands around"
    without = reached(catch(call(base)))
    without.pop("say")
    without.pop("what", None)
    without.pop("strict")
    if name != "up":
        assert _delta(without, with_it), f"{function}({name}=...) as if not given"


def test_run_async_and_call_refuse_a_pod() -> None:
    for name in keywords.POD_KEYWORDS:
        with pytest.raises(TypeError, match=rf"run_async\(\) does not take {name}=: "):
            keywords.check_options("run_async", {name: True})
        with pytest.raises(TypeError, match=rf"call\(\) does not take {name}=: "):
            keywords.check_options("call", {name: True})

"""A run's command passes the CLI glue (``multihost/cli/wiring.py``) once: as the run handed to
the core under the terminal's display (``execute_run``); the library plans it
(``multihost.api.runs.execute``, as for ``multihost.run``). A sweep's base run is planned
through ``plan_args``. Counted two ways: the functions whose parameters can carry it, and the
calls a real run makes."""

from __future__ import annotations

import ast
import dataclasses
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import multihost.cli.wiring as wiring
from multihost.cli import main

# The shapes the command travels in from the flags to the host: the parsed flags, the settings
# (a mapping, or the planner's Settings), the plan, its job, the run.
CARRIERS = {"Namespace", "Mapping", "Settings", "Plan", "Job", "Run"}
GLUE = {"plan_args", "execute_run"}  # what can carry it: a sweep's plan, and a run
RUN_GLUE = {"execute_run"}  # what a run's command passes


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return set()
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Name | ast.Attribute)
    }


def test_two_functions_of_the_glue_take_what_carries_the_command() -> None:
    tree = ast.parse(Path(wiring.__file__).read_text())
    taking = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
            if any(_names(p.annotation) & CARRIERS for p in params):
                taking.add(fn.name)
    assert taking == GLUE


def _holds(obj: object, mark: str, depth: int = 0, seen: set[int] | None = None) -> bool:
    """``mark`` is somewhere in ``obj``: a string, a container, a dataclass, or one of our
    objects' attributes (a few levels down)."""
    seen = set() if seen is None else seen
    if depth > 6 or id(obj) in seen:
        return False
    seen.add(id(obj))
    if isinstance(obj, str):
        return mark in obj
    if isinstance(obj, dict):
        return any(_holds(v, mark, depth + 1, seen) for v in obj.values())
    if isinstance(obj, list | tuple | set | frozenset):
        return any(_holds(v, mark, depth + 1, seen) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return any(
            _holds(getattr(obj, f.name, None), mark, depth + 1, seen)
            for f in dataclasses.fields(obj)
        )
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict) and type(obj).__module__.startswith(("multihost", "argparse")):
        return any(_holds(v, mark, depth + 1, seen) for v in attrs.values())
    return False


@pytest.mark.usefixtures("home")
def test_a_local_run_hands_its_command_to_one_function_of_the_glue(
    code: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mark = "echo wiring-count-mark"
    hit: set[str] = set()

    def tracer(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_code.co_filename != wiring.__file__:
            return
        if any(_holds(v, mark) for v in frame.f_locals.values()):
            # a function nested in one of the glue's (a closure) is that function's pass
            hit.add(frame.f_code.co_qualname.split(".<locals>")[0])

    args = [
        "run",
        "--local",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        "--script-dir",
        str(code),
        "--cmd",
        mark,
    ]
    sys.settrace(tracer)  # type: ignore[arg-type]
    threading.settrace(tracer)  # type: ignore[arg-type]
    try:
        with pytest.raises(SystemExit) as done:
            main(args)
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    assert done.value.code == 0, capsys.readouterr()
    assert hit == RUN_GLUE

"""The work after a run, for the CLI and the API alike: the traces' summaries (``trace=``), a
failed run's TPU runtime logs, and the files ``pull=`` asks for; each lands on the run's
result (``RunResult.traces``, ``.tpu_logs``, ``.pulled``) for the caller to present."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from multihost.defaults import DEFAULTS
from multihost.errors import UsageError
from multihost.events import Event, Note
from multihost.options import RunOptions
from multihost.results.records import RunResult


def check_pull(options: RunOptions, run_name: str) -> None:
    """``pull=``: its paths and its destination (made here) checked before anything starts."""
    if not options.pull:
        return
    if options.detach:
        raise UsageError(
            "--pull copies files back after the run ends; with --detach it does "
            "not end here (use multihost pull RUN PATH later)"
        )
    from multihost.runs.pull import check_dest, check_patterns

    check_patterns(options.pull)
    check_dest(pull_dest(options, run_name))


def pull_dest(options: RunOptions, run_name: str) -> Path:
    """Where ``pull=`` copies to: ``pull_to``, else ``./multihost-pull/RUN``."""
    from multihost.runs.pull import default_dest

    return options.pull_to if options.pull_to is not None else default_dest(run_name)


def saved_traces(log_dir: Path, emit: Callable[[Event], None]) -> tuple[dict[str, Any], ...]:
    """The summaries of the run's captures (``traces/*/summary.json``), oldest first."""
    found = []
    for path in sorted((log_dir / "traces").glob("*/summary.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            emit(Note(f"trace: {path} is unreadable: {e}", "warning"))
            continue
        found.append(data)
    return tuple(found)


async def after_run(
    result: RunResult, options: RunOptions, emit: Callable[[Event], None]
) -> RunResult:
    """The result with the traces read, a failed run's TPU logs fetched and ``pull=`` done,
    in that order; a host that cannot be asked is said on its own row, never raised."""
    log_dir = result.log_dir
    if log_dir is None:
        return result
    if options.trace:
        result = replace(result, traces=saved_traces(log_dir, emit))
    if not result.ok:
        from multihost.diagnose.tpu_logs import failing, fetch_tpu_logs

        if which := failing(result.hosts):
            got = await fetch_tpu_logs(which, options.ssh, log_dir, limit=DEFAULTS.pull_limit)
            result = replace(result, tpu_logs=tuple(got))
    if options.pull:
        from multihost.runs.past import find_run
        from multihost.runs.pull import pull_run

        _, record = find_run(options.log_dir, result.run_name)
        dest = pull_dest(options, result.run_name)
        pulled = await pull_run(
            record, options.pull, dest, options.ssh, limit=DEFAULTS.pull_limit, on_event=emit
        )
        result = replace(result, pulled=tuple(pulled))
    return result

"""The work after a run happens in the run core, so the API and sweeps get what the CLI gets:
``pull=`` copies files back, ``trace=`` leaves each capture's table data on the result."""

from __future__ import annotations

from pathlib import Path

import pytest

import multihost
from multihost.api.sweep import run_sweep
from multihost.errors import UsageError
from tests.clitools import no_processes
from tests.helpers import wait_for
from tests.test_diagnose_traces import STEPPER

WRITE = "mkdir -p out && echo from-$JAX_PROCESS_ID > out/id.txt && echo skip > other.txt"


def _pulled(dest: Path) -> dict[str, str]:
    """What each host's folder (``DEST/s0/w1``) got, by host name."""
    found = dest.glob("*/*/out/id.txt")
    return {str(p.parents[1].relative_to(dest)): p.read_text().strip() for p in found}


@pytest.mark.usefixtures("home")
def test_api_run_pulls_files_back_from_every_local_host(code: Path, tmp_path: Path) -> None:
    dest = tmp_path / "back"
    result = multihost.run(
        WRITE,
        local=2,
        script_dir=code,
        log_dir=tmp_path / "logs",
        run_name="pl",
        stream="none",
        pull="out/*.txt",
        pull_to=dest,
    )
    assert result.ok, result
    assert [r.ok for r in result.pulled] == [True, True]
    assert [r.files for r in result.pulled] == [1, 1]
    assert [r.local_dir for r in result.pulled] == [dest / "s0" / f"w{i}" for i in range(2)]
    assert sorted(_pulled(dest).values()) == ["from-0", "from-1"]
    assert not list(dest.glob("*/other.txt"))
    assert result.traces == ()
    assert result.tpu_logs == ()


@pytest.mark.usefixtures("home")
def test_api_run_pull_problems_are_on_the_result_and_the_run_stays_ok(
    code: Path, tmp_path: Path
) -> None:
    result = multihost.run(
        "true",
        local=1,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stream="none",
        pull=["nothing-here.txt"],
        pull_to=tmp_path / "b",
    )
    assert result.ok
    assert result.exit_code == 0
    (only,) = result.pulled
    assert not only.ok
    assert "nothing-here.txt" in " ".join(only.errors)


@pytest.mark.usefixtures("home")
def test_api_run_bad_pull_is_refused_before_anything_starts(code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with pytest.raises(UsageError, match=r"\.\."):
        multihost.run("true", local=1, script_dir=code, log_dir=logs, pull="../up.txt")
    with pytest.raises(UsageError, match="--detach"):
        multihost.run("true", local=1, script_dir=code, log_dir=logs, pull="x", detach=True)
    assert not list(logs.glob("*/run.json"))


@pytest.mark.usefixtures("home")
def test_sweep_points_pull_into_folders_of_their_own(code: Path, tmp_path: Path) -> None:
    dest = tmp_path / "back"
    result = run_sweep(
        "mkdir -p out && echo {n} > out/n.txt",
        {"n": [1, 2]},
        local=1,
        script_dir=code,
        log_dir=tmp_path / "logs",
        run_name="sw",
        pull="out/n.txt",
        pull_to=dest,
        on_record=lambda _r: None,
    )
    assert len(result.records) == 2
    got = sorted(p.read_text().strip() for p in dest.glob("*/s0/w0/out/n.txt"))
    assert got == ["1", "2"]  # each point's files in a folder of their own, then the host's
    assert len({p.parents[3] for p in dest.glob("*/s0/w0/out/n.txt")}) == 2


@pytest.mark.ssh
@pytest.mark.usefixtures("fresh_runs")
def test_api_run_pulls_over_ssh(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dest = tmp_path / "back"
    result = multihost.run(
        WRITE,
        hosts=",".join(ssh_fleet.aliases[:3]),
        ssh_config=ssh_fleet.ssh_config,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stream="none",
        pull="out/id.txt",
        pull_to=dest,
    )
    assert result.ok, result
    assert [r.ok for r in result.pulled] == [True, True, True]
    assert sorted(_pulled(dest).values()) == ["from-0", "from-1", "from-2"]
    assert sum(r.bytes for r in result.pulled) == sum(len(f"from-{i}\n") for i in range(3))
    wait_for(lambda: no_processes(ssh_fleet, 3), 20, "no process left")


@pytest.mark.jax
@pytest.mark.slow
def test_api_run_trace_leaves_the_table_data_on_the_result(
    code: Path, tmp_path: Path, home: Path
) -> None:
    (code / "stepper.py").write_text(STEPPER)
    logs, stop = tmp_path / "logs", tmp_path / "stop"
    stop.mkdir()
    # the hosts stop by themselves once the capture is in: the stop file is the trace's summary
    cmd = (
        f"(while ! ls {logs}/at/traces/*/summary.json >/dev/null 2>&1; do sleep 0.2; done; "
        f"touch {stop}/stop) & python stepper.py"
    )
    result = multihost.run(
        cmd,
        local=2,
        run_name="at",
        log_dir=logs,
        script_dir=code,
        env={"STOP_DIR": str(stop), "JAX_PLATFORMS": "cpu"},
        trace=1,
        trace_after=1,
        stream="none",
    )
    assert result.ok, result
    (data,) = result.traces
    assert [h["host"] for h in data["hosts"] if h["ok"] and h["steps"] > 0] == ["s0/w0", "s0/w1"]
    assert Path(data["folder"]).parent == logs / "at" / "traces"

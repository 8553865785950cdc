"""``--workers``/``--exclude-workers``: which hosts a spec names (pure), what a subset run's
hosts are told, and the CLI's refusals (one line, exit 2, nothing made) on ``--local``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multihost.defaults import DEFAULTS
from multihost.errors import UsageError
from multihost.model import Fleet, Host, Job, host_ranges
from multihost.remote.commands import host_env
from multihost.sources.workers import parse, select
from tests.clitools import cli

FLEET = Fleet.from_slices([[Host(f"a{i}") for i in range(4)], [Host(f"b{i}") for i in range(4)]])


def names(workers: str | None, exclude: str | None = None) -> list[str]:
    return [h.name for h in select(FLEET, workers, exclude)[0]]


@pytest.mark.parametrize(
    ("spec", "chosen"),
    [
        ("0,2", ["s0/w0", "s0/w2"]),
        ("4-5", ["s1/w0", "s1/w1"]),
        ("s0/w[0-3]", ["s0/w0", "s0/w1", "s0/w2", "s0/w3"]),
        ("s1/w[0,2]", ["s1/w0", "s1/w2"]),
        ("s1/w0-1", ["s1/w0", "s1/w1"]),
        ("s1", ["s1/w0", "s1/w1", "s1/w2", "s1/w3"]),
        ("s*/w3", ["s0/w3", "s1/w3"]),
        ("s[0,1]/w0", ["s0/w0", "s1/w0"]),
        ("7, s0/w0", ["s0/w0", "s1/w3"]),  # the fleet's order, whatever the spec's
        ("2,2,s0/w2", ["s0/w2"]),
    ],
)
def test_a_spec_names_hosts_in_the_fleets_order(spec: str, chosen: list[str]) -> None:
    assert names(spec) == chosen


def test_what_multihost_prints_reads_back() -> None:
    """The folded labels multihost prints (summaries, stacks, gather) are a spec themselves."""
    some = [FLEET.hosts[i] for i in (0, 1, 2, 4, 7)]
    printed = host_ranges(some)
    assert printed == "s0/w0-2,s1/w0,s1/w3"
    fleet, subset = select(FLEET, printed)
    assert list(fleet) == some
    assert subset == printed


def test_exclusion_and_the_whole_fleet() -> None:
    assert names(None, "s0") == [f"s1/w{w}" for w in range(4)]
    assert names("s0", "1-2") == ["s0/w0", "s0/w3"]
    for whole in ("all", "0-7", "s0,s1", "s*/w*"):  # every host: no subset, a plain run
        fleet, subset = select(FLEET, whole)
        assert fleet is FLEET
        assert subset == ""
    assert select(FLEET) == (FLEET, "")


def test_hosts_keep_their_numbers() -> None:
    fleet, _ = select(FLEET, "s1/w2")
    (host,) = fleet
    assert (host.slice_id, host.worker_id, host.process_id) == (1, 2, 6)


@pytest.mark.parametrize(
    ("workers", "exclude", "said"),
    [
        ("9", None, "--workers 9: no process 9 (the fleet: s0/w0-3,s1/w0-3, processes 0-7)"),
        ("6-12", None, "--workers 6-12: no process 8-12"),
        ("s0/w7", None, "--workers s0/w7: no host s0/w7 (the fleet: s0/w0-3,s1/w0-3"),
        ("s1/w[2-5]", None, "--workers s1/w[2-5]: no host s1/w4-5"),
        ("s2", None, "--workers s2: no slice 2"),
        ("s*/w9", None, "--workers s*/w9: no host s0/w9,s1/w9"),
        ("w0", None, "--workers 'w0': not a process index (2, 0-3), a host label"),
        ("s0/w[0,a]", None, "not a process index"),
        ("3-1", None, "--workers '3-1': the range 3-1 runs backwards"),
        ("", None, "--workers '': empty (e.g. 0,2 or s0/w[0-3] or all)"),
        (" , ", None, "empty"),
        ("0-999999999", None, "more than 100000 numbers"),
        (None, "8", "--exclude-workers 8: no process 8"),
        ("all", "all", "--workers all --exclude-workers all: no host left"),
        ("s0", "0-3", "no host left"),
    ],
)
def test_a_bad_spec_is_one_line_naming_it(
    workers: str | None, exclude: str | None, said: str
) -> None:
    with pytest.raises(UsageError) as err:
        select(FLEET, workers, exclude)
    assert said in str(err.value)
    assert "\n" not in str(err.value)


def test_a_spec_is_parsed_before_any_fleet() -> None:
    with pytest.raises(UsageError, match="not a process index"):
        parse("s0/x1")
    assert [p.text for p in parse("s0/w[0,2],3")] == ["s0/w[0,2]", "3"]


def test_a_subset_gets_no_jax_wiring_and_keeps_its_numbers() -> None:
    job = Job(command="true", run_name="r", env={"A": "1"}, workers="s0/w2,s1/w1")
    host = FLEET.hosts[5]
    fleet = Fleet((FLEET.hosts[2], host))
    assert host_env(host, fleet, job, {}) == {
        "MULTIHOST_RUN": "r",
        "MULTIHOST_SLICE_ID": "1",
        "MULTIHOST_WORKER_ID": "1",
        "MULTIHOST_PROCESS_ID": "5",
        "MULTIHOST_WORKERS": "s0/w2,s1/w1",
        # no JAX job, but a program of its own may still use JAX: the compile cache is on
        "MULTIHOST_COMPILE_CACHE": "~/.multihost/compile-cache",
        "MULTIHOST_COMPILE_CACHE_MAX": str(DEFAULTS.compile_cache_max),
        "A": "1",
    }
    whole = host_env(host, FLEET, Job(command="true", run_name="r"), {})
    assert whole["JAX_PROCESS_ID"] == "5"
    assert whole["JAX_PROCESS_COUNT"] == "8"


# -- the CLI on --local (no SSH): refusals, and a subset run -----------------------------------
@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--workers", "4"], "--workers 4: no process 4 (the fleet: s0/w0-3, processes 0-3)"),
        (["--workers", "s0/w[2-5]"], "no host s0/w4-5"),
        (["--workers", "s1"], "--workers s1: no slice 1"),
        (["--workers", "x"], "--workers 'x': not a process index"),
        (["--workers", "0", "--exclude-workers", "0"], "no host left"),
        (
            ["--workers", "0,1", "--payload", "shardings"],
            "--payload shardings needs a JAX job on every process",
        ),
        (["--workers", "1", "--trace", "2", "--cmd", "true"], "--trace needs a JAX job"),
    ],
)
def test_run_refuses_before_anything_starts(tmp_path: Path, extra: list[str], said: str) -> None:
    logs = tmp_path / "logs"
    cmd = [] if "--cmd" in extra or "--payload" in extra else ["--cmd", "true"]
    code = [] if "--payload" in extra else ["--script-dir", str(tmp_path)]
    res = cli(["run", "--local", "4", "--log-dir", str(logs), *code, *extra, *cmd])
    assert res.returncode == 2, res.stderr
    assert said in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert not logs.exists()


def test_a_payload_on_every_host_named_is_no_subset(tmp_path: Path) -> None:
    """``--workers all`` (or every index) is the whole fleet: a JAX launch may go."""
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--workers",
            "0-1",
            "--payload",
            "shardings",
            "--dry-run",
            "--",
            "-d",
            "64",
            "-b",
            "8",
        ]
    )
    assert res.returncode == 0, res.stderr
    assert "# JAX_PROCESS_COUNT=2" in res.stdout


@pytest.mark.usefixtures("home")  # local workers keep their runs under $HOME
def test_a_local_subset_runs_only_there(code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = 'echo "pid=$MULTIHOST_PROCESS_ID of=$MULTIHOST_WORKERS jax=${JAX_PROCESS_ID-unset}"'
    res = cli(
        [
            "run",
            "--local",
            "4",
            "--workers",
            "1,3",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "some",
            "--cmd",
            cmd,
        ]
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["pid=1 of=s0/w1,s0/w3 jax=unset"]  # host0: its first
    run = json.loads((logs / "some" / "run.json").read_text())
    assert [h["host"]["process_id"] for h in run["hosts"]] == [1, 3]
    assert run["job"]["workers"] == "s0/w1,s0/w3"
    assert sorted(p.name for p in (logs / "some").glob("*.log")) == [
        "slice_0000_worker_0001.log",
        "slice_0000_worker_0003.log",
    ]
    status = cli(["status", "some", "--log-dir", str(logs), "--json"])
    assert [r["host"] for r in json.loads(status.stdout)] == ["s0/w1", "s0/w3"]
    one = cli(["logs", "some", "--log-dir", str(logs), "--all", "--workers", "3"])
    assert one.stdout == "[s0/w3] pid=3 of=s0/w1,s0/w3 jax=unset\n", one.stderr
    gone = cli(["logs", "some", "--log-dir", str(logs), "--all", "--workers", "s0/w0"])
    assert gone.returncode == 2
    assert "--workers s0/w0: no host s0/w0 (run some: s0/w1,s0/w3, processes 1,3)" in gone.stderr


def test_hosts_shows_the_chosen_ones() -> None:
    res = cli(["hosts", "--local", "4", "--exclude-workers", "0,2", "--json"])
    assert res.returncode == 0, res.stderr
    assert [row["process"] for row in json.loads(res.stdout)] == [1, 3]


@pytest.mark.usefixtures("home")
def test_the_api_takes_the_same_keywords(tmp_path: Path) -> None:
    import multihost

    logs = tmp_path / "logs"
    lines: list[tuple[str, str]] = []
    result = multihost.run(
        "echo $MULTIHOST_PROCESS_ID",
        local=3,
        workers="s0/w[1-2]",
        script_dir=tmp_path,
        log_dir=logs,
        stream="host0",  # the first chosen host
        on_output=lambda host, line: lines.append((host, line)),
    )
    assert [(h.host.name, h.ok) for h in result.hosts] == [("s0/w1", True), ("s0/w2", True)]
    assert lines == [("s0/w1", "1")]
    with pytest.raises(UsageError, match="my trainer needs a JAX job on every process"):
        multihost.run(
            "true",
            local=3,
            exclude_workers="0",
            jax_job="my trainer",
            script_dir=tmp_path,
            log_dir=logs,
        )


def test_a_big_fleet_is_described_in_one_short_line() -> None:
    pod = Fleet.from_slices([[Host(f"h{s}-{w}") for w in range(64)] for s in range(16)])
    with pytest.raises(UsageError) as err:
        select(pod, "s3/w64")
    assert str(err.value) == (
        "--workers s3/w64: no host s3/w64 (the fleet: slices 0-15, workers 0-63 (1024 hosts), "
        "processes 0-1023)"
    )
    assert len(select(pod, "0-1023", "s[1-15]")[0]) == 64

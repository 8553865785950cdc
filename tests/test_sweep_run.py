"""``multihost sweep`` end to end: shardings.py over --local 2, failures and --resume, some
workers and their files pulled, --parallel slice over two SSH slices, and usage errors."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from tests.clitools import REPO, cli

SCRIPT = """\
import json, os, sys
a, b = int(sys.argv[1]), int(sys.argv[2])
if a == 3:
    sys.exit(4)
if a == 2 and b == 2:
    print("no result here")
elif os.environ["JAX_PROCESS_ID"] == "0":
    print("MULTIHOST_RESULT " + json.dumps({"score": a * 10 + b}))
"""


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.jax
@pytest.mark.slow
def test_sharding_sweep_local(tmp_path: Path) -> None:
    """Every 8-device layout, each point two JAX processes of 4 devices (two, not more: each
    process is a JAX start and a compile, and two make it multi-process all the same)."""
    cmd = (
        f"{sys.executable} payloads/shardings.py --ici_fsdp_parallelism {{fsdp}} "
        "--ici_tensor_parallelism {tp} -d 128 -b 8 -n 1 --tries 1"
    )
    res = cli(
        [
            "sweep",
            "--local",
            "2",
            "--script-dir",
            str(REPO),
            "--log-dir",
            str(tmp_path),
            "--run-name",
            "shs",
            "--env",
            "JAX_NUM_CPU_DEVICES=4",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--cmd",
            cmd,
            "--grid",
            "fsdp=1,2,4,8",
            "--grid",
            "tp=1,2,4,8",
            "--where",
            "fsdp*tp == 8",
            "--point-timeout",
            "200",
        ],
        timeout=900,
        HOME=str(tmp_path / "home"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _rows(tmp_path / "shs" / "results.jsonl")
    assert sorted((r["fsdp"], r["tp"]) for r in rows) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert {r["status"] for r in rows} == {"ok"}
    # the float64 fingerprint of the updated weights: the same step on every layout
    prints = [float(r["fingerprint"]) for r in rows]  # type: ignore[arg-type]
    assert max(prints) == pytest.approx(min(prints), rel=1e-9)
    with (tmp_path / "shs" / "results.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4
    assert list(table[0])[:3] == ["fsdp", "tp", "point"]
    png = (tmp_path / "shs" / "sweep.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert "best: fsdp=" in res.stdout
    assert "reproduce: multihost run --local 2" in res.stdout


def test_failures_recorded_then_resume(code: Path, tmp_path: Path) -> None:
    (code / "sq.py").write_text(SCRIPT)
    base = [
        "sweep",
        "--local",
        "2",
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path),
        "--run-name",
        "sq",
        "--cmd",
        f"{sys.executable} sq.py {{a}} {{b}}",
        "--grid",
        "a=1,2,3",
        "--grid",
        "b=1,2",
        "--where",
        "a + b < 5",
        "--metric",
        "score",
    ]
    first = cli(base, HOME=str(tmp_path / "home"))
    assert first.returncode == 1  # some points failed
    rows = _rows(tmp_path / "sq" / "results.jsonl")
    status = {(r["a"], r["b"]): r["status"] for r in rows}
    assert status[(1, 1)] == status[(1, 2)] == status[(2, 1)] == "ok"
    assert status[(2, 2)] == "no MULTIHOST_RESULT line from process 0"
    assert "exited with code 4" in str(status[(3, 1)])
    assert "best: a=2 b=1  score=21" in first.stdout
    again = cli([*base, "--resume"], HOME=str(tmp_path / "home"))
    rows = _rows(tmp_path / "sq" / "results.jsonl")
    assert len(rows) == 7  # only the two points that were not ok ran again
    assert sorted((r["a"], r["b"]) for r in rows[5:]) == [(2, 2), (3, 1)]
    assert "2 to run" in again.stderr


def test_some_workers_and_their_files_pulled_per_point(code: Path, tmp_path: Path) -> None:
    """``--workers`` and ``--pull``/``--pull-to`` as ``run_sweep(workers=, pull=, pull_to=)``
    take them: each point on those hosts only, its files in a folder of its own; the
    reproduce line names the same hosts."""
    (code / "w.py").write_text(
        "import json, os, sys\n"
        "open('out.txt', 'w').write(os.environ['MULTIHOST_WORKERS'] + ' ' + sys.argv[1])\n"
        "print('MULTIHOST_RESULT ' + json.dumps({'score': int(sys.argv[1])}))\n"
    )
    pulled = tmp_path / "pulled"
    res = cli(
        [
            "sweep",
            "--local",
            "4",
            "--workers",
            "s0/w1,s0/w3",
            "--script-dir",
            str(code),
            "--log-dir",
            str(tmp_path / "logs"),
            "--run-name",
            "ws",
            "--cmd",
            f"{sys.executable} w.py {{a}}",
            "--grid",
            "a=1,2",
            "--metric",
            "score",
            "--pull",
            "out.txt",
            "--pull-to",
            str(pulled),
        ],
        HOME=str(tmp_path / "home"),
    )
    assert res.returncode == 0, res.stderr
    found = sorted(str(f.relative_to(pulled)) for f in pulled.rglob("out.txt"))
    assert found == [f"a{a}/s0/w{w}/out.txt" for a in (1, 2) for w in (1, 3)]
    assert (pulled / "a2" / "s0" / "w3" / "out.txt").read_text() == "s0/w1,s0/w3 2"
    assert "reproduce: multihost run --local 4 --workers s0/w1,s0/w3" in res.stdout


def test_the_reproduce_line_keeps_the_hosts_and_the_secrets() -> None:
    import argparse

    from multihost.cli.sweep import reproduce

    args = argparse.Namespace(
        script_dir=Path("."), local=4, exclude_workers="s0/w0", secret=["TOKEN=tok"]
    )
    line = reproduce(args, "true")
    assert line == ("multihost run --local 4 --exclude-workers s0/w0 --secret TOKEN=tok --cmd true")


@pytest.mark.usefixtures("fresh_runs")  # the sweep name is fixed, the hosts are shared
def test_parallel_slices_over_ssh(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    inventory = tmp_path / "fleet.toml"
    aliases = ssh_fleet.aliases
    inventory.write_text(
        f'[[slices]]\nhosts = ["{aliases[0]}", "{aliases[1]}"]\n'
        f'[[slices]]\nhosts = ["{aliases[2]}", "{aliases[3]}"]\n'
    )
    (code / "p.sh").write_text(
        "start=$(date +%s.%N); sleep 2\n"
        'if [ "$JAX_PROCESS_ID" = 0 ]; then\n'
        '  echo "MULTIHOST_RESULT {\\"start\\": $start, \\"end\\": $(date +%s.%N), '
        '\\"count\\": $JAX_PROCESS_COUNT, \\"host\\": \\"$MULTIHOST_TEST_HOST\\", \\"x\\": $1}"\n'
        "fi\n"
    )
    res = cli(
        [
            "sweep",
            "--hosts",
            str(inventory),
            "--ssh-config",
            str(ssh_fleet.ssh_config),
            "--script-dir",
            str(code),
            "--log-dir",
            str(tmp_path / "logs"),
            "--run-name",
            "par",
            "--cmd",
            "sh p.sh {x}",
            "--grid",
            "x=1,2",
            "--metric",
            "x",
            "--parallel",
            "slice",
        ],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    rows = _rows(tmp_path / "logs" / "par" / "results.jsonl")
    assert len(rows) == 2
    assert {r["host"] for r in rows} == {"h0", "h2"}  # process 0 of each slice
    assert all(r["count"] == 2 for r in rows)
    a, b = rows
    assert a["start"] < b["end"]  # type: ignore[operator]
    assert b["start"] < a["end"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cmd", "x {a} {c}", "--grid", "a=1"], "{c}"),
        (["--cmd", "x {a}", "--grid", "a=1", "--grid", "b=2"], "--grid b not used"),
        (["--cmd", "x {a}", "--grid", "a=1", "--where", "a ==="], "invalid syntax"),
        (
            ["--cmd", "x {a}", "--grid", "a=1", "--where", "__import__('os').system('x')"],
            "not allowed",
        ),
        (["--cmd", "x {a}", "--grid", "a=1", "--where", "a.real > 0"], "not allowed"),
        (["--cmd", "x {a}", "--grid", "a=1", "--resume"], "--run-name"),
        (["--cmd", "x {a}", "--grid", "a=1", "--parallel", "hosts:3"], "divide"),
    ],
)
def test_sweep_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    res = cli(["sweep", "--local", "2", "--log-dir", str(tmp_path), *args], timeout=30)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()

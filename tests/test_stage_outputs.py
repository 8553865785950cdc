"""The run's own output dirs inside the code dir (the log dir, a pull destination, sweep results
and traces, which live in the log dir) are never staged: the code hash stays the same from run
to run and no host gets an earlier run's logs."""

from __future__ import annotations

from pathlib import Path

from multihost.staging.archive import list_files, outputs_excluded
from tests.clitools import cli, manifest


def test_a_log_dir_inside_the_code_dir_is_left_out(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "logs" / "old-run").mkdir(parents=True)
    (code / "logs" / "old-run" / "run.json").write_text("{}")
    (code / "train.py").write_text("")
    excludes = outputs_excluded(code, [code / "logs", tmp_path / "elsewhere", code / "out/p"])
    assert excludes == ("/logs/", "/out/p/")
    assert list_files(code, excludes) == ["train.py"]


def test_a_log_dir_that_is_the_code_dir_leaves_out_each_run(tmp_path: Path) -> None:
    code = tmp_path / "code"
    for run, marker in (("r1", "run.json"), ("sweep-a", "sweep.json"), ("[odd]", "run.json")):
        (code / run).mkdir(parents=True)
        (code / run / marker).write_text("{}")
    (code / "src").mkdir()
    (code / "src" / "run.py").write_text("")
    excludes = outputs_excluded(code, [code], "r2")
    assert set(excludes) == {"/r1/", "/sweep-a/", "/[[]odd]/", "/r2/"}  # a name, not a glob
    assert list_files(code, excludes) == ["src/run.py"]


def test_runs_with_logs_and_pulls_in_the_code_dir_stage_the_same_code(
    home: Path, code: Path, tmp_path: Path
) -> None:
    """Three runs from the code dir, logging and pulling into it: one code hash, and the code
    each host has holds neither logs nor pulled files."""
    hashes = []
    for run in ("a", "b", "c"):
        res = cli(
            [
                "run",
                "--local",
                "2",
                "--log-dir",
                "logs",
                "--run-name",
                run,
                "--pull",
                "out.txt",
                "--pull-to",
                "pulled",
                "--cmd",
                "echo $RANDOM > out.txt",
            ],
            cwd=code,
        )
        assert res.returncode == 0, res.stderr
        hashes.append(manifest(code / "logs", run)["code_hash"])
    assert (code / "pulled" / "s0" / "w1" / "out.txt").is_file()
    assert len(set(hashes)) == 1, hashes
    staged = home / ".cache" / "multihost" / "local" / "w1" / "code" / hashes[0]
    shown = {p.name for p in staged.iterdir() if not p.name.startswith(".")}
    assert shown == {"x.txt", "out.txt"}  # the code and the job's own file: no logs, no pulls

"""Jobs that vanish, leave no exit code, escape their process group, or collide by name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.clitools import cli, manifest, spawn
from tests.faults.conftest import Where
from tests.faults.harness import run_measured
from tests.helpers import wait_for

DAEMON = "setsid sleep 300 </dev/null >/dev/null 2>&1 &"


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def _pgid(where: Where, i: int, run: str) -> int:
    pid = where.run_dir(i, run) / "pid"
    wait_for(lambda: pid.is_file() and pid.read_text().strip() != "", 30, "the job's pid")
    return int(pid.read_text())


def test_vanished_job_is_named_within_15_s(where: Where, code: Path, tmp_path: Path) -> None:
    """The whole process group SIGKILLed (wrapper included: OOM, reboot, kill -9 -PGID)."""
    logs = tmp_path / "logs"
    proc = spawn(where.args(code, logs, "van", "echo up; sleep 60"))
    try:
        group = _pgid(where, 1, "van")
        wait_for(lambda: "up" in (where.run_dir(1, "van") / "log").read_text(), 30, "the job")
        os.killpg(group, signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        _reap(proc)
    print(f"vanished job noticed and the run ended {took:.1f} s after the kill")
    assert proc.returncode == 1, err
    assert took < 15
    hosts = manifest(logs, "van")["hosts"]
    assert [h["state"] for h in hosts] == ["killed", "vanished"]
    assert "vanished" in hosts[1]["error"]
    assert "stopped by multihost" not in hosts[1]["error"]
    assert "s0/w1 failed first: vanished" in err
    wait_for(lambda: not where.leftovers("van"), 15, "every process of the run to be gone")


def test_empty_exit_file_is_a_clear_error(where: Where, code: Path, tmp_path: Path) -> None:
    """An exit file the host could not fill (a full disk: /dev/full stands in for it)."""
    logs = tmp_path / "logs"
    cmd = (
        '[ "$JAX_PROCESS_ID" = 1 ] || exec sleep 60; d=$MULTIHOST_RUN_DIR; '
        ': > "$d/exit"; ln -s /dev/full "$d/exit.tmp"; exit 3'
    )
    res = run_measured(where.args(code, logs, "empty", cmd), timeout=60)
    assert res.returncode == 1, res.stderr
    assert res.wall < 15
    host = manifest(logs, "empty")["hosts"][1]
    assert host["state"] == "failed"
    assert "exit file is empty" in host["error"]
    assert "s0/w1" in res.stderr
    wait_for(lambda: not where.leftovers("empty"), 15, "every process of the run to be gone")


def test_escaped_daemon_stopped_on_fail_fast(where: Where, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = f'{DAEMON} [ "$JAX_PROCESS_ID" = 1 ] && exit 3; sleep 60'
    res = run_measured(where.args(code, logs, "esc", cmd), timeout=60)
    assert res.returncode == 1, res.stderr
    assert "process(es) that had left the job's process group" in res.stderr
    assert not where.leftovers("esc")


def test_escaped_daemon_stopped_by_kill(where: Where, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = f"{DAEMON} echo up; sleep 60"
    res = cli(where.args(code, logs, "esck", cmd, "--detach"))
    assert res.returncode == 0, res.stderr
    wait_for(lambda: len(where.leftovers("esck")) >= 4, 30, "jobs and daemons to run")
    killed = cli(["kill", "esck", "--log-dir", str(logs), "--grace", "2"])
    assert killed.returncode == 0, killed.stderr
    assert not where.leftovers("esck")
    assert [h["state"] for h in manifest(logs, "esck")["hosts"]] == ["killed"] * 2


def test_escaped_daemon_stopped_on_ctrl_c(where: Where, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = spawn(where.args(code, logs, "escc", f"{DAEMON} echo up; sleep 60"))
    try:
        wait_for(lambda: len(where.leftovers("escc")) >= 4, 30, "jobs and daemons to run")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        _reap(proc)
    assert proc.returncode == 130, err
    assert not where.leftovers("escc")


# A double-forked daemon with an empty environment: no marker a search could find. Only the
# wrapper's ancestry (a child subreaper) contains it.
UNMARKED = "sh -c 'env -i setsid sleep {n} </dev/null >/dev/null 2>&1 &'"
# the same daemon, and the job goes on only once it has left the job's session (it touches
# ``escaped`` after setsid): a job that ends at once would otherwise take a daemon not yet
# escaped down with its process group, and there would be nothing escaped to report
ESCAPED = (
    "sh -c 'env -i setsid sh -c \"touch escaped; exec sleep {n}\" </dev/null >/dev/null 2>&1 &'"
    "; until [ -e escaped ]; do sleep 0.05; done"
)


def _sleeping(n: int) -> list[int]:
    """Live ``sleep N`` processes, found by their command line in /proc."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if cmd == f"sleep\0{n}\0".encode() and state != "Z":
            found.append(int(entry))
    return found


def test_unmarked_double_forked_daemon_stopped_at_the_end(
    where: Where, code: Path, tmp_path: Path
) -> None:
    n = 3000 + os.getpid() % 997  # unique to this test process
    logs = tmp_path / "logs"
    cmd = f'{ESCAPED.format(n=n)}; echo up; [ "$JAX_PROCESS_ID" = 1 ] && exit 3; sleep 60'
    res = run_measured(where.args(code, logs, "unm", cmd), timeout=60)
    assert res.returncode == 1, res.stderr
    assert "process(es) that had left the job's process group" in res.stderr
    assert not _sleeping(n)
    assert not where.leftovers("unm")


def test_unmarked_double_forked_daemon_stopped_by_kill(
    where: Where, code: Path, tmp_path: Path
) -> None:
    n = 4000 + os.getpid() % 997
    logs = tmp_path / "logs"
    res = cli(where.args(code, logs, "unmk", f"{UNMARKED.format(n=n)}; sleep 60", "--detach"))
    assert res.returncode == 0, res.stderr
    try:
        wait_for(lambda: len(_sleeping(n)) == 2, 30, "both daemons to run")
        # re-parented to their host's wrapper (the run's pid file names it), not to init
        wrappers = {int((where.run_dir(i, "unmk") / "pid").read_text()) for i in range(2)}
        parents = {
            int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            for p in _sleeping(n)
        }
        assert parents == wrappers
    finally:
        killed = cli(["kill", "unmk", "--log-dir", str(logs), "--grace", "2"])
    assert killed.returncode == 0, killed.stderr
    assert not _sleeping(n)
    assert not where.leftovers("unmk")


def test_run_name_taken_on_one_host_starts_nothing(
    where: Where, code: Path, tmp_path: Path
) -> None:
    taken = where.run_dir(1, "dup")
    taken.mkdir(parents=True)
    if where.kind == "ssh":
        owner = where.fleet.hosts[1].user
        subprocess.run(["chown", "-R", owner, str(taken.parent.parent)], check=True)
    logs = tmp_path / "logs"
    res = cli(where.args(code, logs, "dup", "echo started > started-marker; sleep 30", n=2))
    assert res.returncode == 2, res.stderr
    assert "already exists on s0/w1" in res.stderr
    assert "nothing was started" in res.stderr
    assert "Traceback" not in res.stderr
    assert not where.run_dir(0, "dup").exists()  # claimed, then released
    assert not where.leftovers("dup")
    states = [h["state"] for h in json.loads((logs / "dup" / "run.json").read_text())["hosts"]]
    assert states == ["error", "error"]


def test_the_job_inherits_no_trace_of_the_subreaper_start(
    where: Where, code: Path, tmp_path: Path
) -> None:
    """The wrapper starts through python3; the job still gets SIGPIPE and SIGXFSZ at their
    defaults, no LC_CTYPE from Python's locale coercion (a C locale: nothing of LANG, LC_*),
    and no helper variable."""
    logs = tmp_path / "logs"
    cmd = "grep SigIgn /proc/self/status; echo LC_CTYPE=${LC_CTYPE-unset}; env | grep -c SUBREAP"
    c_locale = {k: v for k, v in os.environ.items() if k != "LANG" and not k.startswith("LC_")}
    res = run_measured(
        where.args(code, logs, "inh", cmd, "--no-fail-fast"), timeout=60, env=c_locale
    )
    assert res.returncode == 1, res.stderr  # grep -c counts 0 lines: exit 1 on every host
    for i in range(2):
        text = (logs / "inh" / f"slice_0000_worker_{i:04d}.log").read_text()
        ignored = int(text.split("SigIgn:")[1].split()[0], 16)
        assert not ignored & (1 << (signal.SIGPIPE - 1)), text
        assert not ignored & (1 << (signal.SIGXFSZ - 1)), text
        assert "LC_CTYPE=unset" in text, text
        assert text.strip().endswith("0"), text


def test_kill_finds_the_run_by_its_marker_when_its_directory_is_gone(
    where: Where, code: Path, tmp_path: Path
) -> None:
    """The run's directory removed on every host under a live job (an over-eager clean-up):
    ``kill`` still stops every process of the run, found by the marker in their environment."""
    logs = tmp_path / "logs"
    res = cli(where.args(code, logs, "gone", f"{DAEMON} echo up; sleep 60", "--detach"))
    assert res.returncode == 0, res.stderr
    wait_for(lambda: len(where.leftovers("gone")) >= 4, 30, "jobs and daemons to run")
    for i in range(2):
        shutil.rmtree(where.run_dir(i, "gone"))
    assert len(where.leftovers("gone")) >= 4
    killed = cli(["kill", "gone", "--log-dir", str(logs), "--grace", "2"])
    print(killed.stderr)
    assert killed.returncode == 0, killed.stderr
    assert "Traceback" not in killed.stderr
    wait_for(lambda: not where.leftovers("gone"), 10, "every process of the run to be gone")
    assert [h["state"] for h in manifest(logs, "gone")["hosts"]] == ["killed"] * 2

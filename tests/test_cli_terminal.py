"""The CLI on a real terminal (a pseudo-terminal at 80 columns): host output above a live status
line, an elapsed time that moves, and no escape sequence from a host reaching the screen."""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path

import pexpect
import pytest

REPO = Path(__file__).resolve().parent.parent
_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def screen(raw: str, width: int = 80) -> list[str]:
    """What a terminal shows for ``raw``: the few controls rich's Live uses (CR, LF, erase line,
    cursor up), colours dropped. Any other escape is kept as text, so a test can see it."""
    rows: list[str] = [""]
    row = col = 0
    i = 0
    while i < len(raw):
        m = _CSI.match(raw, i)
        if m:
            arg, op = m.groups()
            if op == "K":
                rows[row] = rows[row][:col] if arg in ("", "0") else ""
            elif op == "A":
                row = max(0, row - int(arg or 1))
            elif op not in ("m", "h", "l"):
                rows[row] += m.group(0)
            i = m.end()
            continue
        ch = raw[i]
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            if row == len(rows):
                rows.append("")
        else:
            line = rows[row].ljust(col)
            rows[row] = line[:col] + ch + line[col + 1 :]
            col += 1
        i += 1
    return [r.rstrip() for r in rows]


def spawn(args: list[str], home: Path, cwd: Path) -> pexpect.spawn:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "80",
        "LINES": "24",
        "TERM": "xterm-256color",
        "HOME": str(home),
    }
    for name in ("NO_COLOR", "FORCE_COLOR", "XDG_CACHE_HOME"):
        env.pop(name, None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "multihost", *args],
        env=env,
        cwd=str(cwd),
        dimensions=(24, 80),
        timeout=40,
        encoding="utf-8",
    )


@pytest.fixture
def workdir(tmp_path: Path, code: Path) -> Path:
    """The test's dir, with ``code`` and a private ``home``."""
    (tmp_path / "home").mkdir()
    return tmp_path


def test_host_lines_print_above_a_live_status_line(workdir: Path) -> None:
    cmd = 'for i in 1 2 3; do echo "line $i of $JAX_PROCESS_ID"; sleep 1.2; done'
    child = spawn(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            "code",
            "--log-dir",
            "logs",
            "--run-name",
            "tty",
            "--cmd",
            cmd,
        ],
        workdir / "home",
        workdir,
    )
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    shown = screen(raw)
    for i in (1, 2, 3):  # each host line alone on its own row, never glued to the status
        assert f"line {i} of 0" in shown, shown
    assert not any("line" in r and "running" in r for r in shown), shown
    assert all(len(r) <= 80 for r in shown)
    # The status line is redrawn with a moving clock while the host is silent (3.6 s of sleeps).
    seen = sorted({float(s) for s in re.findall(r"tty\s+(\d+\.\d)s", raw)})
    assert seen[-1] >= 3.0, seen
    gaps = [b - a for a, b in itertools.pairwise(seen) if a >= 0.5]
    assert gaps, seen
    assert max(gaps) <= 1.0 + 0.1, seen  # at least once a second (values are rounded to 0.1)


def test_escape_sequences_from_a_host_never_reach_the_terminal(workdir: Path) -> None:
    cmd = r'printf "\033]0;pwned\007\033[2J\033[31mred\033[0m\033[5;5Hdone\n"'
    child = spawn(
        [
            "run",
            "--local",
            "1",
            "--script-dir",
            "code",
            "--log-dir",
            "logs",
            "--run-name",
            "esc",
            "--cmd",
            cmd,
        ],
        workdir / "home",
        workdir,
    )
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    assert "pwned" not in raw
    assert "\x1b[2J" not in raw
    assert "\x1b[5;5H" not in raw
    assert "\x1b[31mred" in raw  # colour is kept
    assert "reddone" in screen(raw)
    # The log file keeps the raw bytes.
    log = (workdir / "logs/esc/slice_0000_worker_0000.log").read_bytes()
    assert b"\x1b]0;pwned\x07\x1b[2J" in log


def test_stdout_to_a_file_gets_plain_host_lines_while_status_is_live(workdir: Path) -> None:
    cmd = r'echo "one $JAX_PROCESS_ID"; sleep 1.2; printf "\033[32mtwo\033[0m\033[1K\n"'
    args = [
        "run",
        "--local",
        "2",
        "--script-dir",
        "code",
        "--log-dir",
        "logs",
        "--run-name",
        "pipe",
        "--stream",
        "all",
        "--cmd",
        cmd,
    ]
    line = " ".join(f"'{a}'" if " " in a or "$" in a else a for a in args)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", "HOME": str(workdir / "home")}
    env.pop("XDG_CACHE_HOME", None)
    shell = pexpect.spawn(
        "/bin/sh",
        ["-c", f"{sys.executable} -m multihost {line} > out.txt"],
        env=env,
        cwd=str(workdir),
        dimensions=(24, 80),
        timeout=40,
        encoding="utf-8",
    )
    shell.expect(pexpect.EOF)
    terminal = shell.before
    shell.close()
    assert shell.exitstatus == 0, terminal
    out = (workdir / "out.txt").read_text()
    assert sorted(out.splitlines()) == sorted(
        [
            "[s0/w0] one 0",
            "[s0/w1] one 1",
            "[s0/w0] \x1b[32mtwo\x1b[0m",
            "[s0/w1] \x1b[32mtwo\x1b[0m",
        ]
    )
    assert "pipe" in terminal  # the status line (and the summary) went to the terminal
    assert "one 0" not in terminal


def test_ctrl_c_on_attach_at_a_terminal_detaches(workdir: Path) -> None:
    cmd = 'while :; do echo "tick $JAX_PROCESS_ID"; sleep 0.2; done'
    run = ["--script-dir", "code", "--log-dir", "logs", "--run-name", "cc", "--grace", "2"]
    start = spawn(
        ["run", "--local", "2", *run, "--detach", "--cmd", cmd], workdir / "home", workdir
    )
    start.expect(pexpect.EOF)
    start.close()
    assert start.exitstatus == 0, start.before
    child = spawn(["attach", "cc", "--log-dir", "logs"], workdir / "home", workdir)
    child.expect("tick 0")
    child.sendintr()  # the terminal's Ctrl-C
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, child.before
    assert "multihost kill cc" in child.before.replace("\r\n", " ")
    status = spawn(
        ["status", "cc", "--log-dir", "logs", "--refresh", "--json"], workdir / "home", workdir
    )
    status.expect(pexpect.EOF)
    assert status.before.count('"running"') == 2, status.before
    kill = spawn(["kill", "cc", "--log-dir", "logs", "--grace", "2"], workdir / "home", workdir)
    kill.expect(pexpect.EOF)


def test_gathered_lines_print_above_the_live_status_line(workdir: Path) -> None:
    cmd = 'for i in 1 2 3; do echo "line $i"; sleep 1.2; done; echo "rank $JAX_PROCESS_ID"'
    run = ["--script-dir", "code", "--log-dir", "logs", "--run-name", "gt", "--gather"]
    child = spawn(["run", "--local", "2", *run, "--cmd", cmd], *_at(workdir))
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    shown = screen(raw)
    for i in (1, 2, 3):  # each once for both hosts, alone on its row
        assert f"[s0/w0-1] line {i}" in shown, shown
    assert "[s0/w0] rank 0" in shown
    assert "[s0/w1] rank 1" in shown
    assert not any("line" in r and "running" in r for r in shown), shown


def test_top_is_full_screen_and_q_or_ctrl_c_leave_the_run_alone(workdir: Path) -> None:
    """A run with no JAX in it: top still shows every host (its rows say why there are no
    steps); ``q`` and Ctrl-C each leave the full screen, exit 0, and the run goes on."""
    cmd = 'while :; do echo "tick $JAX_PROCESS_ID"; sleep 0.2; done'
    run = ["--script-dir", "code", "--log-dir", "logs", "--run-name", "tp", "--grace", "2"]
    start = spawn(
        ["run", "--local", "2", *run, "--detach", "--cmd", cmd], workdir / "home", workdir
    )
    start.expect(pexpect.EOF)
    start.close()
    assert start.exitstatus == 0, start.before
    try:
        for leave in ("q", "ctrl-c"):
            child = spawn(["top", "tp", "--log-dir", "logs", "--interval", "0.5"], *_at(workdir))
            child.expect("\x1b\\[\\?1049h")  # the alternate screen: top's own
            child.expect("s0/w1")
            child.expect("tick 1")  # each host's last line
            child.expect("q: quit")
            if leave == "q":
                child.send("q")
            else:
                child.sendintr()
            child.expect(pexpect.EOF)
            child.close()
            assert child.exitstatus == 0, (leave, child.before)
            assert "\x1b[?1049l" in child.before  # the terminal's own screen back
            assert "Traceback" not in child.before
        status = spawn(["status", "tp", "--log-dir", "logs", "--refresh", "--json"], *_at(workdir))
        status.expect(pexpect.EOF)
        assert status.before.count('"running"') == 2, status.before
    finally:
        kill = spawn(["kill", "tp", "--log-dir", "logs", "--grace", "2"], *_at(workdir))
        kill.expect(pexpect.EOF)


def _at(workdir: Path) -> tuple[Path, Path]:
    return workdir / "home", workdir


RESULT = (
    'MULTIHOST_RESULT {"step_time_s": STEP, "timings_s": [1, 1, 1, 1, 1], '
    '"tflops_per_device": 0.0081, "utilization": 0.0123, "device_kind": "cpu"}'
)


def test_a_payload_result_is_said_in_words_on_a_terminal(workdir: Path) -> None:
    """The raw MULTIHOST_RESULT line is not echoed at 80 columns; the summary gives each
    host's step time, the slowest host and the headline; the log keeps the line."""
    cmd = (
        'echo step done; S=0.79; [ "$JAX_PROCESS_ID" = 1 ] && S=0.91; '
        f"echo '{RESULT}' | sed \"s/STEP/$S/\""
    )
    child = spawn(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            "code",
            "--log-dir",
            "logs",
            "--run-name",
            "words",
            "--stream",
            "all",
            "--cmd",
            cmd,
        ],
        workdir / "home",
        workdir,
    )
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    shown = screen(raw)
    assert "MULTIHOST_RESULT" not in raw
    assert any("step done" in r for r in shown), shown
    assert any("0.79 s/step" in r and "s0/w0" in r for r in shown), shown
    assert any("0.91 s/step" in r and "s0/w1" in r for r in shown), shown
    assert "0.79 s/step (mean of 5 steps), 0.0081 TFLOP/s per device, utilization 1.2%" in shown
    assert any(r.startswith("slowest: s0/w1 at 0.91 s/step") for r in shown), shown
    assert all(len(r) <= 80 for r in shown), shown
    log = (workdir / "logs" / "words" / "slice_0000_worker_0000.log").read_text()
    assert 'MULTIHOST_RESULT {"step_time_s": 0.79' in log


def test_a_one_host_run_says_so_in_words(workdir: Path) -> None:
    """One host: no "all 1 hosts", no "0 hosts × 0.0 MiB" for a 7-byte code dir."""
    child = spawn(
        ["run", "--local", "1", "--script-dir", "code", "--log-dir", "logs", "--cmd", "true"],
        workdir / "home",
        workdir,
    )
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    shown = " ".join(screen(raw))
    assert "the host succeeded" in shown, shown
    assert "auto: no slice has a second host to share it" in shown, shown
    for wrong in ("1 hosts", "0 hosts", "0.0 MiB"):
        assert wrong not in shown, shown


def test_a_second_ctrl_c_at_a_terminal_names_the_kill_command(workdir: Path) -> None:
    cmd = "trap '' TERM; echo up; sleep 60"  # ignores the stop's TERM: the runner waits
    child = spawn(
        [
            "run",
            "--local",
            "1",
            "--script-dir",
            "code",
            "--log-dir",
            "logs",
            "--run-name",
            "tw",
            "--grace",
            "60",
            "--cmd",
            cmd,
        ],
        workdir / "home",
        workdir,
    )
    child.expect("up")
    child.sendintr()
    child.expect("stopping every host")
    child.sendintr()
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 130, raw
    shown = " ".join(screen(raw))
    assert "stop them with: multihost kill tw --log-dir logs)" in shown, shown
    kill = spawn(["kill", "tw", "--log-dir", "logs", "--grace", "1"], workdir / "home", workdir)
    kill.expect(pexpect.EOF)
    kill.close()
    assert kill.exitstatus == 0, kill.before


def test_gloo_lines_stay_in_the_logs_and_host_lines_are_never_spliced(workdir: Path) -> None:
    """Three hosts printing at once, lines longer than the terminal, each also printing what
    JAX's CPU collectives print: a Gloo connection line per group, two of them spliced by the
    threads that wrote them. At 80 columns every host line is whole on its own row with one
    prefix; Gloo's lines are not shown (said once), and every one is in the host's log."""
    gloo = "is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"
    long = "x" * 100
    cmd = (
        f'p=$JAX_PROCESS_ID; for i in 1 2 3 4 5 6; do echo "h$p line $i {long}"; done; '
        f'echo "[Gloo] Rank $p {gloo}"; echo "[Gloo] Rank [Gloo] Rank 1 {gloo}"; '
        f'echo "0 {gloo}"; echo "h$p done"'
    )
    child = spawn(
        [
            "run",
            "--local",
            "3",
            "--script-dir",
            "code",
            "--log-dir",
            "logs",
            "--run-name",
            "noise",
            "--stream",
            "all",
            "--cmd",
            cmd,
        ],
        workdir / "home",
        workdir,
    )
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    shown = screen(raw)
    for p in range(3):
        for i in range(1, 7):
            assert f"[s0/w{p}] h{p} line {i} {long}" in shown, shown
        assert f"[s0/w{p}] h{p} done" in shown, shown
    for row in shown:  # a host's prefix only at the start of a row, once
        assert row.count("[s0/w") <= 1, row
        assert "[s0/w" not in row or row.startswith("[s0/w"), row
    assert not any("[Gloo]" in r or "peer ranks" in r for r in shown), shown
    said = [r for r in shown if "Gloo's connection lines" in r]
    assert said == [
        "multihost: Gloo's connection lines are kept in the hosts' logs, not shown here"
    ]
    for p in range(3):
        log = (workdir / "logs" / "noise" / f"slice_0000_worker_000{p}.log").read_text()
        assert f"[Gloo] Rank {p} {gloo}\n[Gloo] Rank [Gloo] Rank 1 {gloo}\n0 {gloo}\n" in log

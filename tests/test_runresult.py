"""How a run ended: one host row and one verdict that every face shows; the result line, noticed
as the log streams in and read once when the run's results are collected."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from rich.console import Console

from multihost.cli import report
from multihost.core.livehost import LiveHost
from multihost.model import Host, State
from multihost.results.faces import COLUMNS, host_row, verdict
from multihost.results.records import HostResult, RunResult, read_result
from multihost.runs.past import parse_status
from multihost.runs.stream import Exit, LogSink

HOST = Host("10.0.0.1", user="me", port=2222)


def _run() -> RunResult:
    ok = HostResult(HOST, State.DONE, exit_code=0, started_at=1.0, ended_at=3.5, last_line="ok")
    bad = HostResult(
        Host("b", worker_id=1), State.FAILED, exit_code=3, bytes_sent=2048, last_line="[red]boom"
    )
    return RunResult("r", (ok, bad), first_failure="s0/w1 exited with code 3")


def test_every_face_shows_the_one_row_and_verdict() -> None:
    result = _run()
    rows = [host_row(r) for r in result.hosts]
    assert rows[0] == ("s0/w0", "me@10.0.0.1:2222", "done", "0", "2.5s", "0 B", "ok")
    assert rows[1][-2:] == ("2.0 KiB", "exited with code 3: [red]boom")
    said = verdict(result)
    assert not said.ok
    assert said.text == "1/2 hosts succeeded; first failure: s0/w1 exited with code 3"
    out = io.StringIO()
    console = Console(file=out, width=200)
    console.print(report.summary_table(result))
    console.print(report.verdict(result))
    terminal = out.getvalue()
    for face in (str(result), result._repr_html_(), terminal):
        assert said.text in face
        assert all(column in face for column in COLUMNS)
        assert "me@10.0.0.1:2222" in face
        assert "[red]boom" in face  # a host's words are never markup


def test_the_result_line_is_noticed_across_chunks_and_read_once(tmp_path: Path) -> None:
    log = tmp_path / "w0.log"
    sink = LogSink(HOST, log, lambda line: None)
    sink.feed(b"step 1\nMULTIHOST_RES")
    assert not sink.may_have_result
    sink.feed(b'ULT {"x": 1}\nbye\n')
    assert sink.may_have_result  # the marker straddled the two chunks
    sink.close()
    assert read_result(log) == {"x": 1}
    quiet = LogSink(HOST, tmp_path / "w1.log", lambda line: None)
    quiet.feed(b"no result here\n" * 1000)
    assert not quiet.may_have_result
    quiet.close()
    again = LogSink(HOST, log, lambda line: None)  # attach: the log so far may hold one
    assert again.may_have_result
    again.close()


def _payload_run(*steps: float, **first: object) -> RunResult:
    hosts = tuple(
        HostResult(
            Host(f"h{i}", worker_id=i),
            State.DONE,
            exit_code=0,
            reported={"step_time_s": t, **(first if i == 0 else {})},
        )
        for i, t in enumerate(steps)
    )
    return RunResult("p", hosts)


def test_a_payload_run_in_words() -> None:
    from multihost.results.faces import payload_lines

    run = _payload_run(
        0.5, 0.51, 0.5, timings_s=[1, 1, 1], tflops_per_device=2.0, device_kind="cpu"
    )
    assert payload_lines(run) == (
        "0.5 s/step (mean of 3 steps), 2 TFLOP/s per device (no peak known for cpu: no "
        "utilization)",
        "step time within 2.0% across 3 hosts (median 0.5 s)",
    )
    assert host_row(run.hosts[1])[-1] == "0.51 s/step"
    slow = _payload_run(1.0, 1.0, 1.2, utilization=0.25)
    assert payload_lines(slow) == (
        "1 s/step, utilization 25.0%",
        "slowest: s0/w2 at 1.2 s/step, 20.0% over the median 1 s of 3 hosts",
    )
    assert payload_lines(_run()) == ()  # no payload: nothing more said
    # what the mean covers, in the payload's words: its timed steps after its warm-up
    train = _payload_run(0.5, step_times_s=[3, 1, 1, 1], timed_steps=3, warmup_steps=1)
    assert payload_lines(train) == ("0.5 s/step (mean of 3 steps after 1 warm-up)",)
    assert "slowest: s0/w2" in str(slow)


def test_the_verdict_counts_one_host_as_one() -> None:
    one = HostResult(HOST, State.DONE, exit_code=0)
    assert verdict(RunResult("r", (one,))).text == "the host succeeded"
    assert verdict(RunResult("r", (one, one))).text == "all 2 hosts succeeded"
    bad = HostResult(HOST, State.FAILED, exit_code=3)
    assert verdict(RunResult("r", (bad,), first_failure="x")).text.startswith("0/1 host succeeded")


def test_pull_totals_count_the_hosts_that_gave_files(tmp_path: Path) -> None:
    """A host that gave files but missed a pattern is counted as giving them (and said to
    have had problems): never "pulled 6 file(s) from 0 of 3 host(s)"."""
    from multihost.runs.pull import PullResult

    results = [
        PullResult(
            Host(f"h{i}", worker_id=i),
            tmp_path,
            files=2,
            bytes=6,
            errors=("no match for '*.json'",),
        )
        for i in range(3)
    ]
    last = report.pull_lines(results, tmp_path)[-1]
    assert last == (
        f"pulled 6 file(s), 18 B from 3 of 3 host(s) into {tmp_path}; "
        "3 host(s) had problems (above)"
    )


def test_a_host_asked_later_is_the_same_outcome_as_one_watched() -> None:
    """``multihost status`` reads the host's state files into a HostResult by the rule a watched
    run uses (a killed host's signal: the one it was stopped with, else N of 128+N), with the
    log's size and age that only the host knows."""
    stopped = parse_status(HOST, "143 10.0 12.5 TERM 77 no 2048 12.0 0\nTerminated\n")
    watched = LiveHost(HOST, State.KILLED, exit=Exit(143, 10.0, 12.5, "TERM")).result()
    assert stopped == dataclasses.replace(watched, last_line="Terminated")
    assert (stopped.signal, stopped.log_bytes, stopped.log_mtime) == (15, 2048, 12.0)
    assert parse_status(HOST, "137 1.0 2.0 - 77 no 0 2.0 0\n\n").signal == 9
    assert parse_status(HOST, "0 1.0 2.0 TERM 77 no 0 2.0 0\n\n").signal is None  # it ended well
    running = parse_status(HOST, "- 5.0 - - 77 yes 10 6.0 0\nstep 3\n")
    assert (running.state, running.started_at, running.last_line) == (State.RUNNING, 5.0, "step 3")
    assert parse_status(HOST, "missing\n").state is State.MISSING
    row = report.status_row(HOST, stopped, None)
    assert (row["state"], row["exit"], row["runtime"]) == ("killed", "143 (SIGTERM)", "2.5s")
    assert report.status_row(HOST, None, "connection refused")["state"] == "unreachable"

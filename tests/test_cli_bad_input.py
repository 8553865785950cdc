"""Bad invocations of every subcommand: each ends in one line that names the problem, exit 2
(usage or configuration) or 1, and never a traceback; nothing is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.clitools import cli

R = "--log-dir"
CASES: list[tuple[str, list[str], int, str]] = [
    # (id, argv, exit code, the message's first line starts with)
    ("run-no-fleet", ["run", "--cmd", "true"], 2,
     "multihost: error: one of the arguments --hosts --local --prefix is required"),
    ("run-no-cmd", ["run", "--local", "2"], 2,
     "multihost: error: one of the arguments --cmd --payload is required"),
    ("run-empty-cmd", ["run", "--local", "2", "--cmd", " "], 2,
     "multihost: error: argument --cmd: the command is empty"),
    ("run-local-0", ["run", "--local", "0", "--cmd", "true"], 2,
     "multihost: error: argument --local: must be positive: '0'"),
    ("run-two-fleets", ["run", "--local", "2", "--hosts", "h0", "--cmd", "true"], 2,
     "multihost: error: argument --hosts: not allowed with argument --local"),
    ("run-empty-hosts", ["run", "--hosts", "", "--cmd", "true"], 2,
     "multihost: error: the host list is empty"),
    ("run-unbalanced", ["run", "--hosts", "h[0-3],h[4-7", "--cmd", "true"], 2,
     "multihost: error: unbalanced bracket in the host list: 'h[4-7'"),
    ("run-open-range", ["run", "--hosts", "h[0-", "--cmd", "true"], 2,
     "multihost: error: unbalanced bracket in the host list: 'h[0-'"),
    ("run-huge-range", ["run", "--hosts", "h[0-99999999]", "--cmd", "true"], 2,
     "multihost: error: 'h[0-99999999]' expands to 100000000 hosts"),
    ("run-twice", ["run", "--hosts", "h0,h0", "--cmd", "true"], 2,
     "multihost: error: host h0 appears twice"),
    ("run-no-inventory", ["run", "--hosts", "/nonexistent.toml", "--cmd", "true"], 2,
     "multihost: error: cannot read inventory /nonexistent.toml"),
    ("run-timeout", ["run", "--local", "2", "--timeout", "-5", "--cmd", "true"], 2,
     "multihost: error: argument --timeout: must be positive"),
    ("run-grace", ["run", "--local", "2", "--grace", "abc", "--cmd", "true"], 2,
     "multihost: error: argument --grace: not a number: 'abc'"),
    ("run-port-0", ["run", "--local", "2", "--coordinator-port", "0", "--cmd", "true"], 2,
     "multihost: error: argument --coordinator-port: not a port (1-65535): '0'"),
    ("run-port-big", ["run", "--local", "2", "--megascale-port", "99999", "--cmd", "true"], 2,
     "multihost: error: argument --megascale-port: not a port (1-65535): '99999'"),
    ("run-name-slash", ["run", "--local", "2", "--run-name", "../x", "--cmd", "true"], 2,
     "multihost: error: bad run name '../x'"),
    ("run-env", ["run", "--local", "2", "--env", "NOEQUALS", "--cmd", "true"], 2,
     "multihost: error: --env expects NAME=VALUE"),
    ("run-script-dir", ["run", "--local", "2", "--script-dir", "afile", "--cmd", "true"], 2,
     "multihost: error: script dir afile does not exist or is not a directory"),
    ("run-log-dir", ["run", "--local", "2", R, "afile/sub", "--cmd", "true"], 2,
     "multihost: error: log dir afile/sub: afile is not a directory"),
    ("run-stage-via", ["run", "--local", "2", "--stage-via", "ftp://x", "--cmd", "true"], 2,
     "multihost: error: bad --stage-via 'ftp://x'"),
    ("run-stream", ["run", "--local", "2", "--stream", "loud", "--cmd", "true"], 2,
     "multihost: error: argument --stream: invalid choice: 'loud'"),
    ("run-ssh-config", ["run", "--local", "2", "--ssh-config", "/nope", "--cmd", "true"], 2,
     "multihost: error: ssh config /nope does not exist"),
    ("run-include-loop", ["run", "--hosts", "h0", "--ssh-config", "loop.conf", "--cmd", "true"],
     2, "multihost: error: ssh config: an Include loop:"),
    ("run-payload", ["run", "--local", "2", "--payload", "nope"], 2,
     "multihost: error: argument --payload: invalid choice: 'nope'"),
    ("run-pull-detach", ["run", "--local", "2", "--pull", "x", "--detach", "--cmd", "true"], 2,
     "multihost: error: --pull copies files back after the run ends"),
    ("run-pull-to-file", ["run", "--local", "2", "--pull", "x", "--pull-to", "afile", R, "logs",
                          "--cmd", "true"], 2,
     "multihost: error: pull destination afile: exists and is not a directory"),
    ("run-trace", ["run", "--local", "2", "--trace", "99999", "--cmd", "true"], 2,
     "multihost: error: --trace 99999: at most 3600 seconds"),
    ("run-remote-dir", ["run", "--local", "2", "--remote-dir", "/", "--cmd", "true"], 2,
     "multihost: error: argument --remote-dir: must name a directory"),
    ("run-empty-prefix", ["run", "--prefix", "", "--cmd", "true"], 2,
     "multihost: error: --prefix is empty"),
    ("run-profile", ["run", "--local", "2", "--profile", "nope", "--cmd", "true"], 2,
     "multihost: error: no profile 'nope'"),
    ("config-profile", ["config", "--profile", "nope"], 2, "multihost: error: no profile 'nope'"),
    ("hosts-no-fleet", ["hosts"], 2,
     "multihost: error: one of the arguments --hosts --local --prefix is required"),
    ("hosts-huge", ["hosts", "--hosts", "h[0-9][0-9][0-9][0-9][0-9][0-9]"], 2,
     "multihost: error: 'h[0-9][0-9][0-9][0-9][0-9][0-9]' expands to 1000000 hosts"),
    ("kill-stale", ["kill-stale"], 2,
     "multihost: error: one of the arguments --hosts --local --prefix is required"),
    ("forget", ["forget"], 2,
     "multihost: error: one of the arguments --hosts --local --prefix is required"),
    ("envs", ["envs"], 2,
     "multihost: error: one of the arguments --hosts --local --prefix is required"),
    ("envs-remote-dir", ["envs", "--local", "1", "--remote-dir", ""], 2,
     "multihost: error: argument --remote-dir"),
    ("attach-none", ["attach", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("attach-corrupt", ["attach", "corrupt", R, "logs"], 2,
     "multihost: error: logs/corrupt/run.json is unreadable: not JSON"),
    ("status-dir", ["status", "dirrec", R, "logs"], 2,
     "multihost: error: logs/dirrec/run.json is unreadable: a directory, not a file"),
    ("status-binary", ["status", "binary", R, "logs"], 2,
     "multihost: error: logs/binary/run.json is unreadable: not text (UTF-8)"),
    ("status-list", ["status", "alist", R, "logs"], 2,
     "multihost: error: logs/alist/run.json is unreadable: not a multihost run record"),
    ("logs-tail", ["logs", "nope", R, "logs", "--tail", "-3"], 2,
     "multihost: error: argument --tail: must be positive: '-3'"),
    ("logs-follow-tail", ["logs", "nope", R, "logs", "--follow", "--tail", "3"], 2,
     "multihost: error: --follow shows every host's new lines"),
    ("pull-none", ["pull", "nope", "x", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("pull-no-path", ["pull", "nope", R, "logs"], 2,
     "multihost: error: the following arguments are required: REMOTE_PATH"),
    ("stack-none", ["stack", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("trace-none", ["trace", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("trace-seconds", ["trace", "nope", R, "logs", "--seconds", "-1"], 2,
     "multihost: error: argument --seconds: must be positive: '-1'"),
    ("kill-none", ["kill", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("kill-signal", ["kill", "nope", R, "logs", "--signal", "FOO"], 2,
     "multihost: error: argument --signal: invalid choice: 'FOO'"),
    ("ls-file", ["ls", R, "afile"], 2, "multihost: error: log dir afile is not a directory"),
    ("ls-unreadable", ["ls", R, "logs"], 1, ""),
    ("clean-age", ["clean", "--older-than", "banana", R, "logs"], 2,
     "multihost: error: not an age: 'banana'"),
    ("sweep-no-fleet", ["sweep", "--cmd", "echo {x}", "--grid", "x=1"], 2,
     "multihost: error: one of the arguments --hosts --local --prefix is required"),
    ("sweep-grid", ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid", "bogus"], 2,
     "multihost: error: --grid 'bogus': expected NAME=V1,V2,..."),
    ("sweep-unused", ["sweep", "--local", "2", "--cmd", "echo", "--grid", "x=1,2"], 2,
     "multihost: error: --grid x not used by --cmd"),
    ("job-none", ["job"], 2, "multihost: error: the following arguments are required"),
    ("job-submit-bucket", ["job", "submit", "x", "--tpu-type", "v4-8", "--runtime-version", "v",
                           "--bucket", "notabucket", "--cmd", "true"], 2,
     "multihost: error: bad bucket 'notabucket'"),
    ("job-submit-port", ["job", "submit", "x", "--tpu-type", "v4-8", "--runtime-version", "v",
                         "--bucket", "gs://b", "--coordinator-port", "99999", "--cmd", "true"], 2,
     "multihost: error: argument --coordinator-port: not a port (1-65535): '99999'"),
    ("job-submit-restarts", ["job", "submit", "x", "--tpu-type", "v4-8", "--runtime-version",
                             "v", "--bucket", "gs://b", "--max-restarts", "-1", "--cmd", "true"],
     2, "multihost: error: argument --max-restarts: not a whole number"),
    ("job-status-none", ["job", "status", "nope"], 2, "multihost: error: no job 'nope' here"),
    ("job-watch-none", ["job", "watch", "nope"], 2, "multihost: error: no job 'nope' here"),
    ("job-logs-attempt", ["job", "logs", "nope", "--attempt", "-1"], 2,
     "multihost: error: argument --attempt: not a whole number"),
    ("job-stop-none", ["job", "stop", "nope"], 2, "multihost: error: no job 'nope' here"),
    ("up-type", ["up", "x", "--tpu-type", "v9-1", "--runtime-version", "v", "--zone",
                 "us-central2-b"], 2, "multihost: error: unknown TPU type 'v9-1'"),
    ("up-zone", ["up", "x", "--tpu-type", "v4-8", "--runtime-version", "v"], 2,
     "multihost: error: up needs --zone ZONE or --zones A,B,C"),
    ("up-timeout", ["up", "x", "--tpu-type", "v4-8", "--runtime-version", "v", "--zone",
                    "us-central2-b", "--queue-timeout", "0"], 2,
     "multihost: error: bad duration '0'"),
    ("down-none", ["down", "nope"], 2, "multihost: error: no pod 'nope'"),
    ("pods-flag", ["pods", "--jsn"], 2, "multihost: error: unknown option --jsn"),
    ("gc-flag", ["gc", "--dryrun"], 2, "multihost: error: unknown option --dryrun"),
    ("autodown-none", ["autodown", "nope", "30"], 2, "multihost: error: no pod 'nope'"),
    ("run-down-no-prefix", ["run", "--local", "2", "--down", "--cmd", "true"], 2,
     "multihost: error: --up and --down need --prefix NAME"),
    ("unknown-command", ["frobnicate"], 2, "multihost: error: argument command: invalid choice"),
]  # fmt: skip


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with odd things in it: a file where a directory belongs, run records
    that are corrupt, binary, a list or a directory, and an ssh config that includes itself."""
    d = tmp_path_factory.mktemp("bad")
    (d / "home").mkdir()
    (d / "afile").write_text("x\n")
    for name, content in (("corrupt", b"{"), ("binary", b"\xff\xfe\x00"), ("alist", b"[]")):
        (d / "logs" / name).mkdir(parents=True)
        (d / "logs" / name / "run.json").write_bytes(content)
    (d / "logs" / "dirrec" / "run.json").mkdir(parents=True)
    (d / "loop.conf").write_text(f"Include {d / 'loop.conf'}\nHost h0\n  Port 1\n")
    return d


@pytest.mark.parametrize(("argv", "code", "first"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_invocation(place: Path, argv: list[str], code: int, first: str) -> None:
    res = cli(argv, cwd=place, HOME=str(place / "home"), XDG_CONFIG_HOME=str(place / "home"),
              PYTHONPATH=os.pathsep.join(filter(None, [str(Path.cwd()),
                                                       os.environ.get("PYTHONPATH")])))  # fmt: skip
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines, "no message"
    assert lines[0].startswith(first), lines[0]
    assert len([ln for ln in lines if ln.startswith("multihost: error")]) <= 1
    assert not (place / "home" / ".cache" / "multihost" / "local").exists()  # nothing started


def test_the_corpus_covers_every_subcommand() -> None:
    from multihost.cli import COMMANDS

    covered = {c[1][0] for c in CASES}
    assert set(COMMANDS) <= covered, set(COMMANDS) - covered
    assert len(CASES) >= 40

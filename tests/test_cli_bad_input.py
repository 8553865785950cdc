"""Bad invocations of every subcommand (the table found by trying ~95 malformed ones): each
ends in one or two lines that name the problem, the right exit code (2: usage or
configuration), never a traceback, and nothing started or left behind: no log dir, no file,
no process here, and on the SSH fleet no run directory and no process. In this process (fast);
the fleet's rows connect to nothing either."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from multihost.cli import main
from tests import fleet as loopback
from tests.clitools import cli, no_processes

R = "--log-dir"
Check = Callable[[list[str], int, str, str], str]
X = "\udcff"  # a byte that is not UTF-8 (0xff) as Python keeps it in sys.argv
UP = ["up", "x", "--tpu-type", "v4-8", "--runtime-version", "v", "--zone", "us-central2-b"]
CASES: list[tuple[str, list[str], int, str]] = [
    # (id, argv, exit code, the message's first line starts with)
    # (id, argv, exit code, the message's first line starts with)
    (
        "run-no-fleet",
        ["run", "--cmd", "true"],
        2,
        "multihost: error: one of the arguments --hosts --local --prefix is required",
    ),
    (
        "run-no-cmd",
        ["run", "--local", "2"],
        2,
        "multihost: error: one of the arguments --cmd --payload is required",
    ),
    (
        "run-empty-cmd",
        ["run", "--local", "2", "--cmd", " "],
        2,
        "multihost: error: argument --cmd: the command is empty",
    ),
    (
        "run-local-0",
        ["run", "--local", "0", "--cmd", "true"],
        2,
        "multihost: error: argument --local: must be positive: '0'",
    ),
    (
        "run-two-fleets",
        ["run", "--local", "2", "--hosts", "h0", "--cmd", "true"],
        2,
        "multihost: error: argument --hosts: not allowed with argument --local",
    ),
    (
        "run-empty-hosts",
        ["run", "--hosts", "", "--cmd", "true"],
        2,
        "multihost: error: the host list is empty",
    ),
    (
        "run-unbalanced",
        ["run", "--hosts", "h[0-3],h[4-7", "--cmd", "true"],
        2,
        "multihost: error: unbalanced bracket in the host list: 'h[4-7'",
    ),
    (
        "run-open-range",
        ["run", "--hosts", "h[0-", "--cmd", "true"],
        2,
        "multihost: error: unbalanced bracket in the host list: 'h[0-'",
    ),
    (
        "run-huge-range",
        ["run", "--hosts", "h[0-99999999]", "--cmd", "true"],
        2,
        "multihost: error: 'h[0-99999999]' expands to 100000000 hosts",
    ),
    (
        "run-twice",
        ["run", "--hosts", "h0,h0", "--cmd", "true"],
        2,
        "multihost: error: host h0 appears twice",
    ),
    (
        "run-no-inventory",
        ["run", "--hosts", "/nonexistent.toml", "--cmd", "true"],
        2,
        "multihost: error: cannot read inventory /nonexistent.toml",
    ),
    (
        "run-timeout",
        ["run", "--local", "2", "--timeout", "-5", "--cmd", "true"],
        2,
        "multihost: error: argument --timeout: must be positive",
    ),
    (
        "run-grace",
        ["run", "--local", "2", "--grace", "abc", "--cmd", "true"],
        2,
        "multihost: error: argument --grace: not a number: 'abc'",
    ),
    (
        "run-port-0",
        ["run", "--local", "2", "--coordinator-port", "0", "--cmd", "true"],
        2,
        "multihost: error: argument --coordinator-port: not a port (1-65535): '0'",
    ),
    (
        "run-port-big",
        ["run", "--local", "2", "--megascale-port", "99999", "--cmd", "true"],
        2,
        "multihost: error: argument --megascale-port: not a port (1-65535): '99999'",
    ),
    (
        "run-name-slash",
        ["run", "--local", "2", "--run-name", "../x", "--cmd", "true"],
        2,
        "multihost: error: bad run name '../x'",
    ),
    (
        "run-env",
        ["run", "--local", "2", "--env", "NOEQUALS", "--cmd", "true"],
        2,
        "multihost: error: --env expects NAME=VALUE",
    ),
    (
        "run-script-dir",
        ["run", "--local", "2", "--script-dir", "afile", "--cmd", "true"],
        2,
        "multihost: error: script dir afile does not exist or is not a directory",
    ),
    (
        "run-log-dir",
        ["run", "--local", "2", R, "afile/sub", "--cmd", "true"],
        2,
        "multihost: error: log dir afile/sub: afile is not a directory",
    ),
    (
        "run-stage-via",
        ["run", "--local", "2", "--stage-via", "ftp://x", "--cmd", "true"],
        2,
        "multihost: error: bad --stage-via 'ftp://x'",
    ),
    (
        "run-stream",
        ["run", "--local", "2", "--stream", "loud", "--cmd", "true"],
        2,
        "multihost: error: argument --stream: invalid choice: 'loud'",
    ),
    (
        "run-ssh-config",
        ["run", "--local", "2", "--ssh-config", "/nope", "--cmd", "true"],
        2,
        "multihost: error: ssh config /nope does not exist",
    ),
    (
        "run-include-loop",
        ["run", "--hosts", "h0", "--ssh-config", "loop.conf", "--cmd", "true"],
        2,
        "multihost: error: ssh config: an Include loop:",
    ),
    (
        "run-payload",
        ["run", "--local", "2", "--payload", "nope"],
        2,
        "multihost: error: argument --payload: invalid choice: 'nope'",
    ),
    (
        "run-pull-detach",
        ["run", "--local", "2", "--pull", "x", "--detach", "--cmd", "true"],
        2,
        "multihost: error: --pull copies files back after the run ends",
    ),
    (
        "run-pull-to-file",
        ["run", "--local", "2", "--pull", "x", "--pull-to", "afile", R, "logs", "--cmd", "true"],
        2,
        "multihost: error: pull destination afile: exists and is not a directory",
    ),
    (
        "run-trace",
        ["run", "--local", "2", "--trace", "99999", "--cmd", "true"],
        2,
        "multihost: error: --trace 99999: at most 3600 seconds",
    ),
    (
        "run-remote-dir",
        ["run", "--local", "2", "--remote-dir", "/", "--cmd", "true"],
        2,
        "multihost: error: argument --remote-dir: must name a directory",
    ),
    (
        "run-remote-dir-user",
        ["run", "--local", "2", "--remote-dir", "~root/x", "--cmd", "true"],
        2,
        "multihost: error: argument --remote-dir: ~USER is not expanded on hosts",
    ),
    (
        "run-empty-prefix",
        ["run", "--prefix", "", "--cmd", "true"],
        2,
        "multihost: error: --prefix is empty",
    ),
    (
        "run-profile",
        ["run", "--local", "2", "--profile", "nope", "--cmd", "true"],
        2,
        "multihost: error: no profile 'nope'",
    ),
    ("config-profile", ["config", "--profile", "nope"], 2, "multihost: error: no profile 'nope'"),
    (
        "hosts-no-fleet",
        ["hosts"],
        2,
        "multihost: error: one of the arguments --hosts --local --prefix is required",
    ),
    (
        "hosts-huge",
        ["hosts", "--hosts", "h[0-9][0-9][0-9][0-9][0-9][0-9]"],
        2,
        "multihost: error: 'h[0-9][0-9][0-9][0-9][0-9][0-9]' expands to 1000000 hosts",
    ),
    (
        "kill-stale",
        ["kill-stale"],
        2,
        "multihost: error: one of the arguments --hosts --local --prefix is required",
    ),
    (
        "forget",
        ["forget"],
        2,
        "multihost: error: one of the arguments --hosts --local --prefix is required",
    ),
    (
        "envs",
        ["envs"],
        2,
        "multihost: error: one of the arguments --hosts --local --prefix is required",
    ),
    (
        "envs-remote-dir",
        ["envs", "--local", "1", "--remote-dir", ""],
        2,
        "multihost: error: argument --remote-dir",
    ),
    ("attach-none", ["attach", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    (
        "attach-corrupt",
        ["attach", "corrupt", R, "logs"],
        2,
        "multihost: error: logs/corrupt/run.json is unreadable: not JSON",
    ),
    (
        "status-dir",
        ["status", "dirrec", R, "logs"],
        2,
        "multihost: error: logs/dirrec/run.json is unreadable: a directory, not a file",
    ),
    (
        "status-binary",
        ["status", "binary", R, "logs"],
        2,
        "multihost: error: logs/binary/run.json is unreadable: not text (UTF-8)",
    ),
    (
        "status-list",
        ["status", "alist", R, "logs"],
        2,
        "multihost: error: logs/alist/run.json is unreadable: not a multihost run record",
    ),
    (
        "logs-tail",
        ["logs", "nope", R, "logs", "--tail", "-3"],
        2,
        "multihost: error: argument --tail: must be positive: '-3'",
    ),
    (
        "logs-follow-tail",
        ["logs", "nope", R, "logs", "--follow", "--tail", "3"],
        2,
        "multihost: error: --follow shows every host's new lines",
    ),
    ("pull-none", ["pull", "nope", "x", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    (
        "pull-no-path",
        ["pull", "nope", R, "logs"],
        2,
        "multihost: error: the following arguments are required: REMOTE_PATH",
    ),
    ("stack-none", ["stack", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("trace-none", ["trace", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("top-none", ["top", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    ("plot-none", ["plot", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    (
        "top-interval",
        ["top", "nope", R, "logs", "--interval", "0.1"],
        2,
        "multihost: error: argument --interval: must be at least 0.5: '0.1'",
    ),
    (
        "trace-seconds",
        ["trace", "nope", R, "logs", "--seconds", "-1"],
        2,
        "multihost: error: argument --seconds: must be positive: '-1'",
    ),
    ("kill-none", ["kill", "nope", R, "logs"], 2, "multihost: error: no run 'nope' in logs"),
    (
        "kill-signal",
        ["kill", "nope", R, "logs", "--signal", "FOO"],
        2,
        "multihost: error: argument --signal: invalid choice: 'FOO'",
    ),
    ("ls-file", ["ls", R, "afile"], 2, "multihost: error: log dir afile is not a directory"),
    ("ls-unreadable", ["ls", R, "logs"], 1, ""),
    (
        "clean-age",
        ["clean", "--older-than", "banana", R, "logs"],
        2,
        "multihost: error: not an age: 'banana'",
    ),
    (
        "sweep-no-fleet",
        ["sweep", "--cmd", "echo {x}", "--grid", "x=1"],
        2,
        "multihost: error: one of the arguments --hosts --local --prefix is required",
    ),
    (
        "sweep-grid",
        ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid", "bogus"],
        2,
        "multihost: error: --grid 'bogus': expected NAME=V1,V2,...",
    ),
    (
        "sweep-unused",
        ["sweep", "--local", "2", "--cmd", "echo", "--grid", "x=1,2"],
        2,
        "multihost: error: --grid x not used by --cmd",
    ),
    ("job-none", ["job"], 2, "multihost: error: job needs a command: submit, watch, status"),
    (
        "job-submit-bucket",
        [
            "job",
            "submit",
            "x",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--bucket",
            "notabucket",
            "--cmd",
            "true",
        ],
        2,
        "multihost: error: argument --bucket: bad bucket 'notabucket'",
    ),
    (
        "job-submit-port",
        [
            "job",
            "submit",
            "x",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--bucket",
            "gs://bkt",
            "--coordinator-port",
            "99999",
            "--cmd",
            "true",
        ],
        2,
        "multihost: error: argument --coordinator-port: not a port (1-65535): '99999'",
    ),
    (
        "job-submit-type-size",  # the one check up makes too
        [
            "job",
            "submit",
            "x",
            "--tpu-type",
            "v4-61",
            "--runtime-version",
            "v",
            "--bucket",
            "gs://bkt",
            "--cmd",
            "true",
        ],
        2,
        "multihost: error: argument --tpu-type: unknown TPU type 'v4-61': v4 slices (cores) are "
        "v4-8, v4-16, v4-32,",
    ),
    (
        "job-submit-slices",
        [
            "job",
            "submit",
            "x",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--bucket",
            "gs://bkt",
            "--num-slices",
            "1000000",
            "--cmd",
            "true",
        ],
        2,
        "multihost: error: argument --num-slices: the number of slices must be 1 to 1024, not "
        "1000000",
    ),
    (
        "job-submit-zone",
        [
            "job",
            "submit",
            "x",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--bucket",
            "gs://bkt",
            "--zone",
            "nowhere",
            "--cmd",
            "true",
        ],
        2,
        "multihost: error: bad zone 'nowhere': expected e.g. us-central2-b",
    ),
    (
        "job-submit-restarts",
        [
            "job",
            "submit",
            "x",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--bucket",
            "gs://bkt",
            "--max-restarts",
            "-1",
            "--cmd",
            "true",
        ],
        2,
        "multihost: error: argument --max-restarts: not a whole number",
    ),
    ("job-status-none", ["job", "status", "nope"], 2, "multihost: error: no job 'nope' here"),
    ("job-watch-none", ["job", "watch", "nope"], 2, "multihost: error: no job 'nope' here"),
    (
        "job-logs-attempt",
        ["job", "logs", "nope", "--attempt", "-1"],
        2,
        "multihost: error: argument --attempt: not a whole number",
    ),
    ("job-stop-none", ["job", "stop", "nope"], 2, "multihost: error: no job 'nope' here"),
    (
        "up-type",
        ["up", "x", "--tpu-type", "v9-1", "--runtime-version", "v", "--zone", "us-central2-b"],
        2,
        "multihost: error: argument --tpu-type: unknown TPU type 'v9-1'",
    ),
    (
        "up-zone",  # no --zone, and gcloud has no default zone (ENVS)
        ["up", "x", "--tpu-type", "v4-8", "--runtime-version", "v"],
        2,
        "multihost: error: no zone: give --zone ZONE or --zones A,B,C (gcloud has no default",
    ),
    (
        "up-type-size",
        ["up", "x", "--tpu-type", "v4-61", "--runtime-version", "v", "--zone", "us-central2-b"],
        2,
        "multihost: error: argument --tpu-type: unknown TPU type 'v4-61': v4 slices (cores) are "
        "v4-8, v4-16, v4-32,",
    ),
    (
        "up-type-small",
        ["up", "x", "--tpu-type", "v4-7", "--runtime-version", "v", "--zone", "us-central2-b"],
        2,
        "multihost: error: argument --tpu-type: unknown TPU type 'v4-7'",
    ),
    (
        "up-slices",
        [*UP, "--num-slices", "1000000"],
        2,
        "multihost: error: argument --num-slices: the number of slices must be 1 to 1024, not "
        "1000000",
    ),
    (
        "up-gcloud-missing",  # $MULTIHOST_GCLOUD names no program (ENVS): said first, exit 2
        UP,
        2,
        "multihost: error: '/nonexistent/gcloud' not found: install the Google Cloud CLI",
    ),
    (
        "down-gcloud-missing",
        ["down", "exist1"],
        2,
        "multihost: error: '/nonexistent/gcloud' not found",
    ),
    ("pods-gcloud-missing", ["pods"], 2, "multihost: error: '/nonexistent/gcloud' not found"),
    ("gc-gcloud-missing", ["gc"], 2, "multihost: error: '/nonexistent/gcloud' not found"),
    (
        "run-up-gcloud-missing",
        [
            "run",
            "--prefix",
            "x",
            "--up",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--zone",
            "us-central2-b",
            "--cmd",
            "true",
        ],
        2,
        "multihost: error: '/nonexistent/gcloud' not found",
    ),
    (
        "up-autodown-space",
        [*UP, "--autodown", "30", "m"],
        2,
        "multihost: error: unrecognized arguments: m (see multihost up --help)",
    ),
    (
        "pods-name",
        ["pods", "exist1"],
        2,
        "multihost: error: unrecognized arguments: exist1 (see multihost pods --help)",
    ),
    (
        "autodown-of",
        ["autodown", "nope", "of"],
        2,
        "multihost: error: bad duration 'of': expected e.g. 600, 90s, 15m, 2h, or off",
    ),
    (
        "run-autodown-no-pod",
        ["run", "--prefix", "nope", "--autodown", "30m", "--cmd", "true"],
        2,
        "multihost: error: --autodown sets a pod multihost made, and there is no pod 'nope'",
    ),
    (
        "sweep-autodown-no-pod",
        ["sweep", "--prefix", "nope", "--autodown", "30m", "--cmd", "echo {x}", "--grid", "x=1"],
        2,
        "multihost: error: --autodown sets a pod multihost made, and there is no pod 'nope'",
    ),
    (
        "run-autodown-no-prefix",
        ["run", "--local", "2", "--autodown", "30m", "--cmd", "true"],
        2,
        "multihost: error: --autodown needs --prefix NAME (the pod)",
    ),
    (
        "run-type-no-up",
        ["run", "--prefix", "nope", "--tpu-type", "v4-8", "--cmd", "true"],
        2,
        "multihost: error: --tpu-type says what pod to make, and there is no pod 'nope' made "
        "from here: add --up to make it",
    ),
    (
        "run-type-disagrees",  # exist1 is recorded here (the place): 1 x v4-8 in us-east1-d
        ["run", "--prefix", "exist1", "--tpu-type", "v4-16", "--cmd", "true"],
        2,
        "multihost: error: pod exist1 exists as 1 x v4-8 (on-demand, tpu-ubuntu2204-base) in "
        "us-east1-d, not --tpu-type v4-16",
    ),
    (
        "run-up-runtime-disagrees",
        ["run", "--prefix", "exist1", "--up", "--runtime-version", "other", "--cmd", "true"],
        2,
        "multihost: error: pod exist1 exists as 1 x v4-8 (on-demand, tpu-ubuntu2204-base) in "
        "us-east1-d, not --runtime-version other",
    ),
    (
        "run-up-slices-disagree",
        ["run", "--prefix", "exist1", "--up", "--num-slices", "2", "--cmd", "true"],
        2,
        "multihost: error: pod exist1 exists as 1 x v4-8",
    ),
    (
        "up-timeout",
        [
            "up",
            "x",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--zone",
            "us-central2-b",
            "--queue-timeout",
            "0",
        ],
        2,
        "multihost: error: argument --queue-timeout: bad duration '0'",
    ),
    ("down-none", ["down", "nope"], 2, "multihost: error: no pod 'nope'"),
    ("pods-flag", ["pods", "--jsn"], 2, "multihost: error: unknown option --jsn"),
    ("gc-flag", ["gc", "--dryrun"], 2, "multihost: error: unknown option --dryrun"),
    ("autodown-none", ["autodown", "nope", "30"], 2, "multihost: error: no pod 'nope'"),
    (
        "run-down-no-prefix",
        ["run", "--local", "2", "--down", "--cmd", "true"],
        2,
        "multihost: error: --up and --down need --prefix NAME",
    ),
    ("unknown-command", ["frobnicate"], 2, "multihost: error: argument command: invalid choice"),
    # -- found by trying malformed invocations -----------------------------------------------
    (
        "run-local-huge",
        ["run", "--local", "100000000", "--cmd", "true"],
        2,
        "multihost: error: argument --local: at most 1024 workers on this machine",
    ),
    (
        "run-local-huge-dry",
        ["run", "--local", "100000", "--dry-run", "--cmd", "true"],
        2,
        "multihost: error: argument --local: at most 1024 workers",
    ),
    (
        "run-local-word",
        ["run", "--local", "two", "--cmd", "true"],
        2,
        "multihost: error: argument --local: not a number: 'two'",
    ),
    (
        "run-cmd-bytes",
        ["run", "--local", "2", "--cmd", f"echo {X}"],
        2,
        "multihost: error: argument --cmd: not UTF-8 text: 'echo \\xff'",
    ),
    (
        "run-hosts-bytes",
        ["run", "--hosts", f"h{X}", "--cmd", "true"],
        2,
        "multihost: error: argument --hosts: not UTF-8 text: 'h\\xff'",
    ),
    (
        "run-hosts-bytes-eq",
        ["run", f"--hosts=h{X}", "--cmd", "true"],
        2,
        "multihost: error: argument --hosts: not UTF-8 text",
    ),
    (
        "run-env-bytes",
        ["run", "--local", "2", "--env", f"A={X}", "--cmd", "true"],
        2,
        "multihost: error: argument --env: not UTF-8 text",
    ),
    (
        "run-arg-bytes",
        ["run", "--local", "2", "--cmd", "true", f"{X}"],
        2,
        "multihost: error: not UTF-8 text",
    ),
    (
        "run-log-dir-bytes",
        ["run", "--local", "2", R, f"l{X}", "--cmd", "true"],
        2,
        "multihost: error: argument --log-dir: not UTF-8 text",
    ),
    (
        "run-pull-leaves",
        ["run", "--local", "2", "--pull", "../x", R, "logs", "--cmd", "true"],
        2,
        "multihost: error: '../x' leaves the run's work dir",
    ),
    (
        "run-pull-leaves-glob",
        ["run", "--local", "2", "--pull", "a/../../*", R, "logs", "--cmd", "true"],
        2,
        "multihost: error: 'a/../../*' leaves the run's",
    ),
    (
        "run-config-dir",
        ["run", "--local", "2", "--cmd", "true"],
        2,
        "multihost: error: confdir/multihost/config.toml: cannot be read: a directory, not a file",
    ),
    (
        "config-loop",
        ["config"],
        2,
        "multihost: error: confloop/multihost/config.toml: cannot be read: a loop of symbolic",
    ),
    (  # a FIFO would wait for a writer for ever: refused at once
        "run-config-fifo",
        ["run", "--local", "2", "--cmd", "true"],
        2,
        "multihost: error: conffifo/multihost/config.toml: cannot be read: a FIFO (named pipe), "
        "not a file",
    ),
    (
        "run-config-bad-key",
        ["run", "--local", "2", "--cmd", "true"],
        2,
        "multihost: error: confkey/multihost/config.toml nmae: unknown key",
    ),
    (
        "run-config-bad-value",
        ["run", "--local", "2", "--cmd", "true"],
        2,
        "multihost: error: confvalue/multihost/config.toml grace: must be positive",
    ),
    (
        "run-hosts-empty-file",
        ["run", "--hosts", "empty.txt", "--cmd", "true"],
        2,
        "multihost: error: empty.txt: no hosts in the file",
    ),
    (
        "run-hosts-comments",
        ["run", "--hosts", "comments.txt", "--cmd", "true"],
        2,
        "multihost: error: comments.txt: no hosts in the file",
    ),
    (
        "run-hosts-empty-toml",
        ["run", "--hosts", "empty.toml", "--cmd", "true"],
        2,
        "multihost: error: empty.toml: needs at least one [[slices]] entry",
    ),
    (
        "run-hosts-bad-toml",
        ["run", "--hosts", "bad.toml", "--cmd", "true"],
        2,
        "multihost: error: bad.toml: not valid TOML",
    ),
    (
        "run-hosts-binary",
        ["run", "--hosts", "binary.txt", "--cmd", "true"],
        2,
        "multihost: error: binary.txt: not a text file",
    ),
    (
        "run-hosts-bad-port",
        ["run", "--hosts", "h0:99999", "--cmd", "true"],
        2,
        "multihost: error: bad port in 'h0:99999'",
    ),
    (
        "run-hosts-reversed",
        ["run", "--hosts", "h[5-2]", "--cmd", "true"],
        2,
        "multihost: error: bad range [5-2] in 'h[5-2]': 2 < 5",
    ),
    (
        "run-hosts-two-commas",
        ["run", "--hosts", "a,,b", "--cmd", "true"],
        2,
        "multihost: error: empty entry in the host list",
    ),
    (
        "run-hosts-stray-bracket",
        ["run", "--hosts", "h0]", "--cmd", "true"],
        2,
        "multihost: error: unbalanced bracket in the host list",
    ),
    (
        "run-timeout-nan",
        ["run", "--local", "2", "--timeout", "nan", "--cmd", "true"],
        2,
        "multihost: error: argument --timeout: must be positive: 'nan'",
    ),
    (
        "run-timeout-inf",
        ["run", "--local", "2", "--timeout", "inf", "--cmd", "true"],
        2,
        "multihost: error: argument --timeout: must be positive: 'inf'",
    ),
    (
        "run-connect-limit",
        ["run", "--local", "2", "--connect-limit", "0", "--cmd", "true"],
        2,
        "multihost: error: argument --connect-limit: must be positive: '0'",
    ),
    (
        "run-max-stage",
        ["run", "--local", "2", "--max-stage-bytes", "0", "--cmd", "true"],
        2,
        "multihost: error: argument --max-stage-bytes: not a size in bytes",
    ),
    (
        "run-on-hang",
        ["run", "--local", "2", "--on-hang", "x", "--cmd", "true"],
        2,
        "multihost: error: argument --on-hang: invalid choice: 'x'",
    ),
    (
        "run-trace-neg",
        ["run", "--local", "2", "--trace", "-1", "--cmd", "true"],
        2,
        "multihost: error: argument --trace: must be positive: '-1'",
    ),
    (
        "run-typo",
        ["run", "--lcoal", "2", "--cmd", "true"],
        2,
        "multihost: error: unknown option --lcoal (did you mean --local?)",
    ),
    (
        "run-args",
        ["run", "--local", "2", "--cmd", "true", "--", "x"],
        2,
        "multihost: error: unexpected arguments x: only --payload takes arguments after --",
    ),
    (
        "run-payload-cmd",
        ["run", "--local", "2", "--payload", "shardings", "--cmd", "true"],
        2,
        "multihost: error: argument --cmd: not allowed with argument --payload",
    ),
    (
        "run-secret",
        ["run", "--local", "2", "--secret", "NOEQ", "--cmd", "true"],
        2,
        "multihost: error: --secret expects KEY=NAME",
    ),
    (
        "run-ssh-config-dir",
        ["run", "--hosts", "h0", "--ssh-config", "adir", "--cmd", "true"],
        2,
        "multihost: error: ssh config adir is a directory, not a file",
    ),
    (
        "run-stage-bucket",
        ["run", "--local", "2", "--stage-bucket", "s3://x", "--cmd", "true"],
        2,
        "multihost: error: bad --stage-bucket 's3://x'",
    ),
    (
        "run-name-long",
        ["run", "--local", "2", "--run-name", "x" * 300, "--cmd", "true"],
        2,
        "multihost: error: run name too long (300 characters, at most 100)",
    ),
    (
        "run-env-name",
        ["run", "--local", "2", "--env", "1A=x", "--cmd", "true"],
        2,
        "multihost: error: --env",
    ),
    (
        "hosts-local-huge",
        ["hosts", "--local", "5000"],
        2,
        "multihost: error: argument --local: at most 1024 workers",
    ),
    (
        "hosts-bytes",
        ["hosts", "--hosts", f"h{X}"],
        2,
        "multihost: error: argument --hosts: not UTF-8 text",
    ),
    (
        "envs-local-huge",
        ["envs", "--local", "2000"],
        2,
        "multihost: error: argument --local: at most 1024 workers",
    ),
    (
        "kill-stale-local-huge",
        ["kill-stale", "--local", "1025"],
        2,
        "multihost: error: argument --local: at most 1024 workers",
    ),
    (
        "forget-bytes",
        ["forget", "--hosts", f"{X}"],
        2,
        "multihost: error: argument --hosts: not UTF-8 text",
    ),
    (
        "pull-leaves",
        ["pull", "done", "../*", R, "logs"],
        2,
        "multihost: error: '../*' leaves the run's work dir",
    ),
    (
        "pull-leaves-file",
        ["pull", "done", "../x", R, "logs"],
        2,
        "multihost: error: '../x' leaves the run's work dir",
    ),
    (
        "pull-dotdot",
        ["pull", "done", "..", R, "logs"],
        2,
        "multihost: error: '..' leaves the run's work dir",
    ),
    (
        "pull-nested",
        ["pull", "done", "out/../../../x", R, "logs"],
        2,
        "multihost: error: 'out/../../../x' leaves the run's work dir",
    ),
    ("pull-empty", ["pull", "done", " ", R, "logs"], 2, "multihost: error: not a remote path"),
    ("pull-bytes", ["pull", "done", f"{X}", R, "logs"], 2, "multihost: error: not UTF-8 text"),
    (
        "pull-limit",
        ["pull", "done", "x", R, "logs", "--limit", "0"],
        2,
        "multihost: error: argument --limit: must be positive: '0'",
    ),
    (
        "pull-corrupt",
        ["pull", "corrupt", "x", R, "logs"],
        2,
        "multihost: error: logs/corrupt/run.json is unreadable: not JSON",
    ),
    (
        "kill-ended",
        ["kill", "done", R, "logs"],
        0,
        "multihost: run done had already ended (done): nothing to stop",
    ),
    (
        "kill-grace",
        ["kill", "done", R, "logs", "--grace", "-1"],
        2,
        "multihost: error: argument --grace: must be positive: '-1'",
    ),
    (
        "kill-binary",
        ["kill", "binary", R, "logs"],
        2,
        "multihost: error: logs/binary/run.json is unreadable: not text (UTF-8)",
    ),
    ("attach-bytes", ["attach", f"r{X}", R, "logs"], 2, "multihost: error: not UTF-8 text"),
    (
        "attach-stream",
        ["attach", "done", R, "logs", "--stream", "loud"],
        2,
        "multihost: error: argument --stream: invalid choice: 'loud'",
    ),
    ("status-escape", ["status", "../x", R, "logs"], 2, "multihost: error: no run '../x' in logs"),
    (
        "status-list-json",
        ["status", "alist", R, "logs", "--json"],
        2,
        "multihost: error: logs/alist/run.json is unreadable: not a multihost run record",
    ),
    (
        "logs-json",
        ["logs", "done", R, "logs", "--json"],
        2,
        "multihost: error: --json goes with --gather",
    ),
    (
        "logs-grep",
        ["logs", "done", R, "logs", "--grep", "("],
        2,
        "multihost: error: --grep '(': not a regular expression",
    ),
    (
        "logs-gather-all",
        ["logs", "done", R, "logs", "--gather", "--all"],
        2,
        "multihost: error: --gather compares every host's log: it takes no --host or --all",
    ),
    (
        "logs-host-all",
        ["logs", "done", R, "logs", "--host", "s0/w0", "--all"],
        2,
        "multihost: error: argument --all: not allowed with argument --host",
    ),
    (
        "logs-corrupt",
        ["logs", "corrupt", R, "logs"],
        2,
        "multihost: error: logs/corrupt/run.json is unreadable: not JSON",
    ),
    (
        "stack-ended",
        ["stack", "done", R, "logs"],
        2,
        "multihost: error: run done is done: there are no stacks to take",
    ),
    (
        "stack-dir",
        ["stack", "dirrec", R, "logs"],
        2,
        "multihost: error: logs/dirrec/run.json is unreadable: a directory, not a file",
    ),
    (
        "trace-ended",
        ["trace", "done", R, "logs"],
        2,
        "multihost: error: run done is done: there is nothing to trace",
    ),
    (
        "trace-name-bytes",
        ["trace", "done", R, "logs", "--name", f"t{X}"],
        2,
        "multihost: error: argument --name: not UTF-8 text",
    ),
    (
        "trace-corrupt",
        ["trace", "binary", R, "logs"],
        2,
        "multihost: error: logs/binary/run.json is unreadable: not text (UTF-8)",
    ),
    ("ls-bytes", ["ls", R, f"l{X}"], 2, "multihost: error: argument --log-dir: not UTF-8 text"),
    (
        "clean-no-age",
        ["clean", R, "logs"],
        2,
        "multihost: error: clean needs --older-than AGE (old runs), --compile-caches, or both",
    ),
    (
        "sweep-local-huge",
        ["sweep", "--local", "9999", "--cmd", "echo {x}", "--grid", "x=1"],
        2,
        "multihost: error: argument --local: at most 1024 workers",
    ),
    (
        "sweep-grid-file",
        ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid-file", "nope.toml"],
        2,
        "multihost: error: cannot read grid file nope.toml",
    ),
    (
        "sweep-parallel",
        ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid", "x=1", "--parallel", "bogus"],
        2,
        "multihost: error: --parallel expects",
    ),
    (
        "sweep-where",
        ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid", "x=1", "--where", "import"],
        2,
        "multihost: error: --where 'import'",
    ),
    (
        "sweep-repeat",
        ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid", "x=1", "--repeat", "0"],
        2,
        "multihost: error: argument --repeat: must be positive",
    ),
    (
        "sweep-resume",
        ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid", "x=1", "--resume"],
        2,
        "multihost: error: --resume needs the --run-name",
    ),
    (
        "sweep-grid-bytes",
        ["sweep", "--local", "2", "--cmd", "echo {x}", "--grid", f"x={X}"],
        2,
        "multihost: error: argument --grid: not UTF-8 text",
    ),
    (
        "job-submit-missing",
        ["job", "submit", "x", "--cmd", "true"],
        2,
        "multihost: error: --tpu-type is required to submit a job (e.g. --tpu-type v4-16; a "
        "profile's tpu-type does too)",
    ),
    (
        "job-submit-bytes",
        [
            "job",
            "submit",
            "x",
            "--tpu-type",
            "v4-8",
            "--runtime-version",
            "v",
            "--bucket",
            "gs://bkt",
            "--cmd",
            f"echo {X}",
        ],
        2,
        "multihost: error: argument --cmd: not UTF-8 text",
    ),
    ("config-typo", ["config", "--bogus"], 2, "multihost: error: unknown option --bogus"),
    (
        "sandbox-none",
        ["sandbox"],
        2,
        "multihost: error: sandbox needs a command: up, env, down (see multihost sandbox --help)",
    ),
    (
        "sandbox-hosts-0",
        ["sandbox", "up", "--hosts", "0"],
        2,
        "multihost: error: argument --hosts: must be positive: '0'",
    ),
    (
        "sandbox-hosts-65",
        ["sandbox", "up", "--hosts", "65"],
        2,
        "multihost: error: --hosts must be 1..64, not 65",
    ),
    (
        "sandbox-no-sshd",
        ["sandbox", "up", "--sshd", "/nonexistent/sshd"],
        2,
        "multihost: error: no sshd at /nonexistent/sshd: install OpenSSH's server",
    ),
    ("sandbox-env-not-up", ["sandbox", "env"], 2, "multihost: error: the sandbox is not up"),
    ("sandbox-down-not-up", ["sandbox", "down"], 2, "multihost: error: the sandbox is not up"),
    ("sandbox-typo", ["sandbox", "down", "--all"], 2, "multihost: error: unknown option --all"),
]

FLEET_CASES: list[tuple[str, list[str], int, str]] = [
    # the same kind of input against the real SSH fleet: nothing may reach a host
    ("fleet-cmd-bytes", ["--cmd", f"echo {X}"], 2, "multihost: error: argument --cmd: not UTF-8"),
    (
        "fleet-pull-leaves",
        ["--pull", "../*", "--cmd", "true"],
        2,
        "multihost: error: '../*' leaves the run's work dir",
    ),
    ("fleet-env", ["--env", "1A=x", "--cmd", "true"], 2, "multihost: error: --env"),
    (
        "fleet-timeout",
        ["--timeout", "0", "--cmd", "true"],
        2,
        "multihost: error: argument --timeout: must be positive",
    ),
    (
        "fleet-pull-detach",
        ["--pull", "x", "--detach", "--cmd", "true"],
        2,
        "multihost: error: --pull copies files back after the run ends",
    ),
    (
        "fleet-secret-detach",
        ["--secret", "K=n", "--detach", "--cmd", "true"],
        2,
        "multihost: error: --secret is handed over at the gated start",
    ),
]

MISSING = {"MULTIHOST_GCLOUD": "/nonexistent/gcloud"}
ENVS: dict[str, dict[str, str | None]] = {  # the environment per case (None: unset)
    "up-zone": {"CLOUDSDK_CONFIG": "{gcloud}", "CLOUDSDK_COMPUTE_ZONE": None},
    "up-gcloud-missing": MISSING,
    "down-gcloud-missing": MISSING,
    "pods-gcloud-missing": MISSING,
    "gc-gcloud-missing": MISSING,
    "run-up-gcloud-missing": MISSING,
}

CONFIGS = {  # XDG_CONFIG_HOME per case: a config file that is broken in one way each
    "run-config-dir": "confdir",
    "config-loop": "confloop",
    "run-config-fifo": "conffifo",
    "run-config-bad-key": "confkey",
    "run-config-bad-value": "confvalue",
}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with odd things in it: a file where a directory belongs, run records
    that are corrupt, binary, a list or a directory, one of a finished run, an ssh config that
    includes itself, hosts files with no hosts, and config files broken in several ways."""
    d = tmp_path_factory.mktemp("bad")
    (d / "afile").write_text("x\n")
    (d / "adir").mkdir()
    (d / "code").mkdir()
    for name, content in (("corrupt", b"{"), ("binary", b"\xff\xfe\x00"), ("alist", b"[]")):
        (d / "logs" / name).mkdir(parents=True)
        (d / "logs" / name / "run.json").write_bytes(content)
    (d / "logs" / "dirrec" / "run.json").mkdir(parents=True)
    pod = '{"schema": 1, "name": "exist1", "tpu_type": "v4-8", "num_slices": 1, "zone": '
    pod += '"us-east1-d", "runtime_version": "tpu-ubuntu2204-base", "capacity": "on-demand"}'
    (d / "home" / "multihost-logs" / "pods" / "exist1").mkdir(parents=True)
    (d / "home" / "multihost-logs" / "pods" / "exist1" / "pod.json").write_text(pod)
    (d / "loop.conf").write_text(f"Include {d / 'loop.conf'}\nHost h0\n  Port 1\n")
    (d / "empty.txt").write_text("")
    (d / "comments.txt").write_text("# no hosts yet\n\n")
    (d / "empty.toml").write_text("")
    (d / "bad.toml").write_text("[[slices]\n")
    (d / "binary.txt").write_bytes(b"\xff\xfe\n")
    (d / "confdir" / "multihost" / "config.toml").mkdir(parents=True)
    (d / "confloop" / "multihost").mkdir(parents=True)
    (d / "confloop" / "multihost" / "config.toml").symlink_to("config.toml")
    (d / "conffifo" / "multihost").mkdir(parents=True)
    os.mkfifo(d / "conffifo" / "multihost" / "config.toml")
    for name, text in (("confkey", "nmae = 'x'\n"), ("confvalue", "grace = -1\n")):
        (d / name / "multihost").mkdir(parents=True)
        (d / name / "multihost" / "config.toml").write_text(text)
    done = cli(
        [
            "run",
            "--local",
            "1",
            "--script-dir",
            "code",
            R,
            "logs",
            "--run-name",
            "done",
            "--cmd",
            "true",
        ],
        cwd=d,
        HOME=str(d / "runner"),
        XDG_CACHE_HOME=str(d / "cache"),
        XDG_CONFIG_HOME=str(d / "home"),
    )
    assert done.returncode == 0, done.stderr
    return d


def _children() -> set[int]:
    """This process's children (a refused command starts none)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found |= {int(p) for p in (task / "children").read_text().split()}
    return found


@pytest.fixture
def refused(
    place: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> Check:
    """``check(argv, code, first, config)``: ``main(argv)`` in this process; the exit code,
    one or two lines, no traceback, and nothing made, changed or started."""
    monkeypatch.chdir(place)
    monkeypatch.setenv("HOME", str(place / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    for name in ("XDG_CACHE_HOME", "MULTIHOST_LOG_DIR"):
        monkeypatch.delenv(name, raising=False)
    case = getattr(getattr(request.node, "callspec", None), "id", "")
    for name, value in ENVS.get(case, {}).items():  # gcloud's own files outside the place
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value.format(gcloud=tmp_path / "gcloud"))

    def check(argv: list[str], code: int, first: str, config: str = "home") -> str:
        monkeypatch.setenv("XDG_CONFIG_HOME", config)
        before, children = sorted(place.rglob("*")), _children()
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        assert info.value.code == code, err
        lines = err.strip().splitlines()
        assert lines, "no message"
        assert len(lines) <= 2 or code == 1, err  # `ls` names each unreadable record
        assert lines[0].startswith(first), lines[0]
        assert len([ln for ln in lines if ln.startswith("multihost: error")]) <= 1
        assert sorted(place.rglob("*")) == before  # no log dir, no pull dir, nothing staged
        assert _children() <= children  # nothing started
        return lines[0]

    return check


@pytest.mark.parametrize(
    ("argv", "code", "first"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_invocation(
    refused: Check, request: pytest.FixtureRequest, argv: list[str], code: int, first: str
) -> None:
    refused(argv, code, first, CONFIGS.get(request.node.callspec.id, "home"))


@pytest.mark.parametrize(
    ("argv", "code", "first"), [c[1:] for c in FLEET_CASES], ids=[c[0] for c in FLEET_CASES]
)
def test_bad_invocation_on_the_fleet(
    refused: Check,
    ssh_fleet: loopback.Fleet,
    fresh_runs: None,
    argv: list[str],
    code: int,
    first: str,
) -> None:
    fleet = ssh_fleet
    hosts = ["--hosts", ",".join(fleet.aliases[:2]), "--ssh-config", str(fleet.ssh_config)]
    refused(["run", *hosts, "--run-name", "bad", R, "logs", *argv], code, first, "home")
    for host in fleet.hosts[:2]:
        assert not (host.home / ".multihost" / "runs" / "bad").exists()
    assert no_processes(fleet, 2)


def test_the_corpus_covers_every_subcommand() -> None:
    from multihost.cli import COMMANDS

    covered = {c[1][0] for c in CASES}
    assert set(COMMANDS) <= covered, set(COMMANDS) - covered
    assert len(CASES) + len(FLEET_CASES) >= 95
    assert len({c[0] for c in CASES + FLEET_CASES}) == len(CASES) + len(FLEET_CASES)

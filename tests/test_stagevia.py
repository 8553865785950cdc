"""``--stage-via``: its values, its templates run for real with plain sh and python3 (a seed's
server, a host's fetch, a corrupted archive), and the whole pipeline over ``--local``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import multihost
from multihost.errors import UsageError
from multihost.model import Host
from multihost.remote import script
from multihost.remote.commands import COMPLETE, Paths, stage_command
from multihost.remote.staging import FETCH, SEED, SEED_STOP, python_source
from multihost.runs.record import read_record
from multihost.staging.archive import pack
from multihost.staging.via import StageVia, choose, choose_environment, parse
from multihost.sweep.results import NO_RESULT
from tests.clitools import cli
from tests.helpers import wait_for

TOKEN = "s3cret-token"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("direct", StageVia("direct")),
        ("peer", StageVia("peer")),
        ("gs://my-bucket", StageVia("gs", "gs://my-bucket")),
        ("gs://my-bucket/team/x/", StageVia("gs", "gs://my-bucket/team/x")),
    ],
)
def test_parse(text: str, want: StageVia) -> None:
    assert parse(text) == want


def _hosts(*slices: int) -> list[Host]:
    """Hosts h0.. with these slice sizes, one slice after another."""
    ids = [(s, w) for s, n in enumerate(slices) for w in range(n)]
    return [
        Host(address=f"h{i}", process_id=i, slice_id=s, worker_id=w) for i, (s, w) in enumerate(ids)
    ]


MIB = 2**20


@pytest.mark.parametrize(
    ("requested", "slices", "size", "seeds", "want", "why"),
    [
        ("direct", (64,), 20 * MIB, None, "direct", ""),  # forced: no reason given
        ("peer", (2,), 1, None, "peer", ""),
        ("gs://my-b", (64,), 20 * MIB, None, "gs://my-b", ""),
        ("auto", (8,), MIB // 5, None, "direct", "auto: 8 hosts × 0.2 MiB under the 256.0 MiB"),
        ("auto", (64,), 20 * MIB, None, "peer", "auto: 64 hosts × 20.0 MiB over the 256.0 MiB"),
        # one-host slices: nothing for a peer to share (never "0 hosts × ...")
        ("auto", (1,) * 64, 20 * MIB, None, "direct", "auto: no slice has a second host"),
        ("auto", (1,), 45, None, "direct", "auto: no slice has a second host to share it"),
        ("auto", (3,), 45, None, "direct", "auto: 3 hosts × 45 B under the 256.0 MiB"),
        ("auto", (3,), 50 * 1024, None, "direct", "auto: 3 hosts × 50.0 KiB under"),
        ("auto", (32, 32), 20 * MIB, {0: "10.1.2.3", 32: "127.0.0.1"}, "peer", "over"),
        ("auto", (32, 32), 20 * MIB, {0: "10.1.2.3", 32: "34.1.2.3"}, "direct", "s1/w0's"),
        ("auto", (64,), 20 * MIB, {0: "seed.example"}, "direct", "not private"),  # a hostname
        ("auto", (64,), 20 * MIB, {}, "direct", "address ? is not private"),
        ("auto", (64,), 20 * MIB, {0: "fd00::1"}, "peer", "over"),
    ],
)
def test_choose(
    requested: str,
    slices: tuple[int, ...],
    size: int,
    seeds: dict[int, str] | None,
    want: str,
    why: str,
) -> None:
    via, said = choose(
        parse(requested), _hosts(*slices), size, threshold=256 * MIB, seed_addresses=seeds
    )
    assert str(via) == want
    assert why in said if why else said == ""


@pytest.mark.parametrize(
    ("slices", "size", "want", "why"),
    [
        (
            (64,),
            20 * MIB,
            "gs://bkt/p",
            "64 hosts × 20.0 MiB over the 256.0 MiB threshold, --stage-",
        ),
        ((1,) * 64, 20 * MIB, "gs://bkt/p", "64 hosts"),  # one-host slices gain from a bucket too
        ((8,), MIB, "direct", "auto: 8 hosts × 1.0 MiB under"),
    ],
)
def test_choose_a_configured_bucket(
    slices: tuple[int, ...], size: int, want: str, why: str
) -> None:
    """``--stage-bucket``: auto uses it over the threshold, in place of peer staging."""
    via, said = choose(
        parse("auto"), _hosts(*slices), size, threshold=256 * MIB, bucket="gs://bkt/p"
    )
    assert (str(via), why in said) == (want, True)
    forced, said = choose(parse("peer"), _hosts(*slices), size, threshold=1, bucket="gs://bkt/p")
    assert (str(forced), said) == ("peer", "")  # --stage-via given: the bucket is not asked


@pytest.mark.parametrize(
    ("requested", "bucket", "receivers", "want", "why"),
    [
        ("auto", "gs://bkt/p", 63, "gs://bkt/p", "auto: 64 hosts × 20.0 MiB over the 256.0 MiB"),
        ("auto", "gs://bkt/p", 7, "direct", "auto: 8 hosts × 20.0 MiB under"),
        ("auto", "", 63, "peer", "auto: 64 hosts × 20.0 MiB over"),
        ("gs://bkt", "", 1, "gs://bkt", ""),  # asked for: whatever the size
        ("direct", "gs://bkt/p", 63, "direct", ""),
    ],
)
def test_choose_environment_bucket(
    requested: str, bucket: str, receivers: int, want: str, why: str
) -> None:
    """The environment's pack takes a bucket the way the code does: forced, or auto over the
    threshold with ``--stage-bucket``."""
    via, said = choose_environment(
        parse(requested),
        receivers,
        20 * MIB,
        threshold=256 * MIB,
        source=Host("h0"),
        address="10.0.0.2",
        bucket=bucket,
    )
    assert str(via) == want
    assert why in said if why else said == ""


@pytest.mark.parametrize("text", ["ftp://x", "gs://", "gs:///x", "gs://B", "gs://b/../x", "Peer"])
def test_parse_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="bad"):
        parse(text)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--stage-via", "ftp://x"),
        ("--stage-via", "gs://"),
        ("--stage-bucket", "peer"),
        ("--stage-bucket", "gs://B"),
    ],
)
def test_cli_bad_value_is_one_line_exit_2(flag: str, value: str, tmp_path: Path) -> None:
    res = cli(["run", "--local", "2", "--log-dir", str(tmp_path), flag, value, "--cmd", "true"])
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1
    assert flag in res.stderr
    assert not list(tmp_path.iterdir())  # nothing started


@pytest.fixture
def code(code: Path) -> Path:
    """The shared code dir plus a package and a blob (a new content hash every test)."""
    (code / "pkg").mkdir()
    (code / "pkg" / "m.py").write_text("X = 1\n")
    (code / "blob").write_bytes(os.urandom(50_000))
    return code


Sh = Callable[[str, bytes], "subprocess.CompletedProcess[bytes]"]


def local_sh(command: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``sh -c command`` here (a host reached over SSH runs the same text)."""
    return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, timeout=60)


def serving(
    sh: Sh, base: str, data: bytes, fetches: int = 1, addr: str = "127.0.0.1"
) -> tuple[str, str, str]:
    """A seed's server started by the real SEED template: (url, pid, its dir)."""
    paths = Paths(base, f"{base}/code/seed-{time.time_ns()}", f"{base}/runs/r")
    command = script(
        SEED,
        paths={"b": paths.base, "c": paths.code},
        done=COMPLETE,
        stage=stage_command(paths),
        serve=python_source("seed_serve"),
        addr=addr,
        lifetime="30",
        fetches=fetches,
        stale=5,
        name="/x.tar.gz",
    )
    done = sh(command, TOKEN.encode() + b"\n" + data)
    assert done.returncode == 0, done.stderr
    first, said = done.stdout.decode().splitlines()
    assert first == "absent"
    word, port, pid, folder = said.split(" ", 3)
    assert word == "serving", said
    return f"http://{addr}:{port}/x.tar.gz", pid, folder


def fetch(
    sh: Sh, code: str, url: str, digest: str, token: str = TOKEN
) -> subprocess.CompletedProcess[bytes]:
    """The real FETCH template, into the code dir ``code`` (its parent's parent is the base)."""
    base = code.rsplit("/", 2)[0]
    paths = Paths(base, code, f"{base}/runs/r")
    command = script(
        FETCH,
        paths={"b": paths.base, "c": paths.code},
        done=COMPLETE,
        stage=stage_command(paths),
        how="peer",
        url=url,
        digest=digest,
        fetch=python_source("seed_fetch"),
        timeout=5,
    )
    return sh(command, token.encode() + b"\n")


def stop(sh: Sh, pid: str, folder: str) -> bytes:
    return sh(script(SEED_STOP, p=pid, s=folder), b"").stdout


def alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_seed_serves_token_holders_and_a_wrong_sha256_is_refused(
    code: Path, tmp_path: Path
) -> None:
    archive = pack(code)
    url, pid, folder = serving(local_sh, str(tmp_path / "seed"), archive.data, fetches=2)
    seed_code = next((tmp_path / "seed" / "code").glob("seed-*"))
    assert (seed_code / "blob").read_bytes() == (code / "blob").read_bytes()
    assert not (Path(folder) / "token").exists()  # read by the server, then gone
    assert TOKEN not in Path(f"/proc/{pid}/cmdline").read_text()

    wrong = fetch(local_sh, f"{tmp_path}/h1/code/x", url, archive.digest, token="guess")
    assert wrong.returncode != 0
    assert b"403" in wrong.stderr
    other = fetch(
        local_sh, f"{tmp_path}/h1/code/x", url.replace("/x.tar.gz", "/etc/passwd"), archive.digest
    )
    assert other.returncode != 0  # the token is right, the path is not its one archive
    assert b"404" in other.stderr

    # the bytes served are not the archive the runner packed: refused, never unpacked
    (Path(folder) / "archive").write_bytes(archive.data[:-10] + b"corrupted!")
    bad = fetch(local_sh, f"{tmp_path}/h2/code/x", url, archive.digest)
    assert bad.returncode == 3, bad.stderr
    assert b"sha256 mismatch" in bad.stderr
    assert not list((tmp_path / "h2" / "code").iterdir())  # nothing unpacked, nothing left

    # the right bytes: fetched, checked, unpacked; the second complete transfer ends the server
    (Path(folder) / "archive").write_bytes(archive.data)
    good = fetch(local_sh, f"{tmp_path}/h3/code/x", url, archive.digest)
    assert good.returncode == 0, good.stderr
    assert good.stdout == b"fetched\n"
    assert (tmp_path / "h3" / "code" / "x" / "pkg" / "m.py").read_text() == "X = 1\n"
    assert fetch(local_sh, f"{tmp_path}/h3/code/x", url, archive.digest).stdout == b"present\n"
    assert stop(local_sh, pid, folder) in (b"gone\n", b"stopped\n")
    wait_for(lambda: not alive(pid), 5, "the server to end")
    assert not Path(folder).exists()


def test_seed_stop_ends_a_server_still_waiting(code: Path, tmp_path: Path) -> None:
    url, pid, folder = serving(local_sh, str(tmp_path / "seed"), pack(code).data, fetches=5)
    assert alive(pid)
    assert stop(local_sh, pid, folder) == b"stopped\n"
    wait_for(lambda: not alive(pid), 5, "the server to end")
    assert not Path(folder).exists()
    refused = fetch(local_sh, f"{tmp_path}/h/code/x", url, "0" * 64)
    assert b"refused" in refused.stderr.lower()


@pytest.mark.usefixtures("home")  # --local workers under a private HOME, not ~/.cache
def test_local_pipeline_peer(code: Path, tmp_path: Path) -> None:
    """Three local workers: the runner sends the archive (and the token line) once."""
    res = multihost.run(
        "find . -type f ! -name .multihost-complete | sort | xargs sha256sum",
        local=3,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stage_via="peer",
        stream="none",
    )
    assert res.ok, res
    archive = pack(code)
    assert res.staging is not None
    assert res.staging.via == "peer"
    assert res.staging.runner_bytes == len(archive.data) + 3 * 44  # and a token line each
    assert (res.staging.uploads, res.staging.fetched, res.staging.fallbacks) == (1, 2, ())
    assert [h.bytes_sent for h in res.hosts] == [len(archive.data), 0, 0]
    record = json.loads((tmp_path / "logs" / res.run_name / "run.json").read_text())
    assert record["staging"]["runner_bytes"] == res.staging.runner_bytes  # kept in run.json
    assert read_record(tmp_path / "logs" / res.run_name).staging == res.staging
    logs = [h.log.read_text() for h in res.hosts if h.log]
    assert len(set(logs)) == 1
    assert hashlib.sha256((code / "blob").read_bytes()).hexdigest() in logs[0]


@pytest.mark.usefixtures("home")
def test_local_auto_picks_peer_over_the_threshold(
    code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` (the default): direct under the threshold; peer over it, and the summary says
    why."""
    small = multihost.run(
        "true", local=3, script_dir=code, log_dir=tmp_path / "logs", stream="none"
    )
    assert small.ok
    assert small.staging is not None
    assert small.staging.via == "direct"
    assert small.staging.why.startswith("auto: 3 hosts × ")
    monkeypatch.setenv("MULTIHOST_STAGE_AUTO_THRESHOLD", "1000")
    code.joinpath("blob").write_bytes(os.urandom(50_000))  # a new hash: staged again
    res = multihost.run("true", local=3, script_dir=code, log_dir=tmp_path / "logs", stream="none")
    assert res.ok
    assert res.staging is not None
    assert res.staging.via == "peer"
    assert "over the 1000 B threshold" in res.staging.why
    assert (res.staging.uploads, res.staging.fetched, res.staging.fallbacks) == (1, 2, ())


@pytest.mark.usefixtures("home")
def test_local_auto_takes_the_stage_bucket_over_the_threshold(
    code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stage_bucket`` reaches the run: over the threshold auto goes through it (here a bucket
    the runner's gcloud cannot reach: every host then gets the code directly, said)."""
    monkeypatch.setenv("MULTIHOST_GCLOUD", "false")
    monkeypatch.setenv("MULTIHOST_STAGE_AUTO_THRESHOLD", "1000")
    res = multihost.run(
        "true",
        local=2,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stage_bucket="gs://my-bucket/code",
        stream="none",
    )
    assert res.ok, res
    assert res.staging is not None
    assert res.staging.via == "gs://my-bucket/code"
    assert "--stage-bucket" in res.staging.why
    assert len(res.staging.fallbacks) == 2


@pytest.mark.usefixtures("home")
def test_local_pipeline_bucket_unusable_falls_back(
    code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner cannot reach the bucket (its gcloud fails): every host gets the code
    directly, and the result says why."""
    monkeypatch.setenv("MULTIHOST_GCLOUD", "false")
    res = multihost.run(
        "cat pkg/m.py",
        local=2,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stage_via="gs://no-such-bucket",
        stream="none",
    )
    assert res.ok, res
    assert res.staging is not None
    assert res.staging.via == "gs://no-such-bucket"
    assert res.staging.uploads == 2
    assert len(res.staging.fallbacks) == 2
    assert "no upload to gs://no-such-bucket" in res.staging.fallbacks[0]


# -- a sweep stages its code once, by the same rule ---------------------------------------------
@pytest.mark.usefixtures("home")
def test_local_sweep_stages_via_peer(code: Path, tmp_path: Path) -> None:
    """``run_sweep(stage_via="peer")``: the session's code goes through the seed (the runner
    sends the archive once), every trial runs on it, and no trial stages again."""
    res = multihost.run_sweep(
        "sha256sum blob pkg/m.py #{n}",
        {"n": [1, 2]},
        local=3,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stage_via="peer",
        on_record=lambda _r: None,
    )
    assert [r.status for r in res.records] == [NO_RESULT] * 2  # ran, printed no result line
    archive = pack(code)
    assert res.staging is not None
    assert (res.staging.via, res.staging.why) == ("peer", "")
    assert res.staging.runner_bytes == len(archive.data) + 3 * 44  # and a token line each
    assert (res.staging.uploads, res.staging.fetched, res.staging.fallbacks) == (1, 2, ())
    blob = hashlib.sha256((code / "blob").read_bytes()).hexdigest()
    for n in ("n1", "n2"):
        record = read_record(tmp_path / "logs" / res.name / n)
        assert record.staging is None  # the trial staged nothing
        logs = sorted((tmp_path / "logs" / res.name / n).glob("*.log"))
        assert len(logs) == 3
        assert all(blob in p.read_text() for p in logs)


@pytest.mark.usefixtures("home")
def test_cli_sweep_says_how_its_code_went(code: Path, tmp_path: Path) -> None:
    """The sweep's header says the way its code went, as ``run`` says it; a bad value is one
    line, exit 2."""
    base = [
        "sweep",
        "--local",
        "2",
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path),
        "--cmd",
        "true {n}",
        "--grid",
        "n=1",
    ]
    res = cli([*base, "--run-name", "s1"])
    assert res.returncode == 1, res.stderr  # true prints no result line
    lines = res.stderr.splitlines()
    said = [i for i, ln in enumerate(lines) if ln.startswith("code via direct (auto: 2 hosts × ")]
    assert len(said) == 1, res.stderr
    assert "the runner sent" in lines[said[0]]
    assert lines[said[0] - 1].startswith("multihost: sweep s1: 1 point(s)")  # under the header
    (code / "blob").write_bytes(os.urandom(50_000))  # a new hash: staged again
    res = cli([*base, "--run-name", "s2", "--stage-via", "peer"])
    assert "code via peer: the runner sent " in res.stderr
    assert "; 1 host(s) fetched it" in res.stderr
    bad = cli([*base, "--run-name", "s3", "--stage-via", "nowhere"])
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert not (tmp_path / "s3").exists()


def test_a_sweeps_reproduce_line_keeps_the_staging_choice() -> None:
    import argparse

    from multihost.cli.sweep import reproduce

    base = {"script_dir": Path("."), "local": 2}
    plain = reproduce(argparse.Namespace(**base, stage_via="auto", stage_bucket=""), "true")
    assert "--stage-via" not in plain
    assert "--stage-bucket" not in plain
    forced = reproduce(
        argparse.Namespace(**base, stage_via="peer", stage_bucket="gs://b/p"), "true"
    )
    assert "--stage-via peer --stage-bucket gs://b/p" in forced


def test_env_failed_is_public() -> None:
    import multihost
    from multihost.errors import EnvFailed, RemoteError

    assert multihost.EnvFailed is EnvFailed
    assert issubclass(EnvFailed, RemoteError)

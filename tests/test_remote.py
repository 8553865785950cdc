"""Every script multihost runs on a host: a constant template that sh parses and shellcheck
passes, and that does the right thing with awkward paths — run here with plain sh, no SSH."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import time
from importlib import resources
from pathlib import Path

import pytest

from multihost import remote
from multihost.fleetops.preflight import check_command
from multihost.fleetops.stale import stale_command
from multihost.model import Job
from multihost.remote.commands import (
    Paths,
    claim_command,
    clean_command,
    finish_command,
    hook_text,
    kill_command,
    kit,
    launch_script,
    release_command,
    stage_command,
    status_command,
    watch_command,
)
from multihost.runs.stream import parse_exit, parse_watch_end
from tests.helpers import wait_for

SCRIPTS = sorted(resources.files(remote).joinpath(".").iterdir(), key=lambda p: p.name)
SCRIPTS = [p for p in SCRIPTS if p.name.endswith(".sh")]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_file_passes_shellcheck(path: Path) -> None:
    """Each ``.sh`` file itself, the fragments it sources followed (shellcheck reports only on
    the file it is given: a fragment is checked alone here, and in place below)."""
    lint = subprocess.run(
        ["shellcheck", "--external-sources", str(path)],
        capture_output=True,
        text=True,
        cwd=path.parent,
    )
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize(
    "path", [p for p in SCRIPTS if not p.name.startswith("_")], ids=lambda p: p.name
)
def test_script_as_sent_parses(path: Path) -> None:
    """What a host gets (arguments, then the text with its fragments in place) is one
    self-contained script that sh parses; its arguments are named at its top."""
    name = path.name.removesuffix(".sh")
    loaded = remote.load(name)
    assert ". ./_" not in loaded.text
    assert not loaded.text.startswith("#")  # the header stays here
    sent = remote.script(loaded, **{a: "x y" for a in loaded.args}) if loaded.args else loaded.text
    subprocess.run(["sh", "-n", "-c", sent], check=True)
    lint = subprocess.run(
        ["shellcheck", "--shell=sh", "-"], input=sent, text=True, capture_output=True
    )
    assert lint.returncode == 0, lint.stdout  # the fragments, checked in place
    header = path.read_text().split("\n", 12)
    if loaded.args:
        assert any(line.startswith("# Arguments: ") for line in header), path.name


def test_script_refuses_missing_or_unknown_arguments() -> None:
    with pytest.raises(ValueError, match="takes"):
        remote.script(remote.STATUS)
    with pytest.raises(ValueError, match="takes"):
        remote.script(remote.STATUS, paths={"r": "x"}, extra=1)
    assert remote.script(remote.STATUS, paths={"r": "~/a b"}).startswith(
        "set -- \"$HOME\"/'a b'\nr=$1\n"
    )


@pytest.mark.parametrize(
    ("given", "based"),
    [
        ("/srv/mh", "/srv/mh"),
        ("~", "~"),
        ("~/.multihost", "~/.multihost"),
        ("work", "~/work"),
        ("./work/mh", "~/work/mh"),
        (".", "~"),
        ("dir with 'quotes' $x", "~/dir with 'quotes' $x"),
    ],
)
def test_a_relative_base_dir_is_under_the_remote_users_home(given: str, based: str) -> None:
    """As scp takes a relative path; the wrapper and the job run in other directories."""
    assert remote.home_based(given) == based


def test_a_base_dir_from_another_users_home_is_refused() -> None:
    with pytest.raises(ValueError, match="~USER is not expanded"):
        remote.home_based("~alice/mh")


@pytest.mark.parametrize(
    "command",
    [check_command("~/x", 8476), stale_command(kill=True), stale_command(kill=False)],
)
def test_preflight_and_stale_scripts_parse_and_pass_shellcheck(command: str) -> None:
    """These two as sent, their values as arguments (the stale script's body is one of them:
    code for the shell that runs it, in single quotes on purpose, so SC2016 does not apply)."""
    subprocess.run(["sh", "-n", "-c", command], check=True)
    lint = subprocess.run(
        ["shellcheck", "--shell=sh", "--exclude=SC2016", "-"],
        input=command,
        text=True,
        capture_output=True,
    )
    assert lint.returncode == 0, lint.stdout


def _sh(command: str, home: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["sh", "-c", command],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


def _python_said() -> list[bytes]:
    """What a launch adds to its process group under ``_sh``'s PATH: where python3 is, when
    there is no python there (the run's python is then that python3)."""
    if shutil.which("python", path="/usr/bin:/bin"):
        return []
    return [b"python=" + str(shutil.which("python3", path="/usr/bin:/bin")).encode()]


def _archive() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("x.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def test_a_whole_run_with_an_awkward_home_relative_path(tmp_path: Path) -> None:
    """Stage, claim, launch, watch, status, kill and clean, under ``~/dir with 'quotes' $x``."""
    home = tmp_path / "home"
    home.mkdir()
    base = "~/dir with 'quotes' $x"
    job = Job("echo $JAX_PROCESS_ID; sleep 30", "r1", remote_dir=base)
    paths = Paths(base, f"{base}/code/h4sh", f"{base}/runs/r1")
    real = home / "dir with 'quotes' $x"
    # staging: absent, then present
    first = _sh(stage_command(paths), home, _archive())
    assert first.stdout.splitlines()[0] == b"absent", first.stderr
    assert (real / "code" / "h4sh" / "x.py").read_text() == "print('hi')\n"
    assert _sh(stage_command(paths), home).stdout.strip() == b"present"
    # the name is claimed once; a second claim says so
    assert _sh(claim_command(paths), home, kit().offer[1]).returncode == 0
    taken = _sh(claim_command(paths), home, kit().offer[1])
    assert taken.returncode == 3
    assert b"exists on this host" in taken.stderr
    launched = _sh(launch_script(paths, {"JAX_PROCESS_ID": "7"}, job.command), home)
    assert launched.returncode == 0, launched.stderr
    pgid, *python = launched.stdout.split()
    assert pgid.isdigit()
    assert python == _python_said()
    wait_for(lambda: (real / "runs" / "r1" / "log").read_text() == "7\n", 10, "the job's output")
    status = _sh(status_command(paths), home).stdout.decode()
    assert status.split()[5] == "yes"  # alive
    assert "missing" not in status
    # stopping: TERM, and the wrapper writes the exit file; the watch then ends
    stopped = _sh(kill_command(paths, "TERM", 2), home).stdout.decode().split()
    assert stopped[0] == "stopped", stopped
    watched = _sh(watch_command(paths, 0), home)
    log = (real / "runs" / "r1" / "log").read_bytes()
    assert log.startswith(watched.stdout)  # tail may be stopped before it caught up
    end = parse_watch_end(watched.stderr)
    assert end is not None
    assert end[0].stopped_by == "TERM"
    assert end[1] == (real / "runs" / "r1" / "log").stat().st_size
    header = _sh(finish_command(paths, 0), home).stdout.decode().splitlines()[0]
    exit_info = parse_exit(header)
    assert exit_info is not None
    assert exit_info.stopped_by == "TERM"
    # clean removes the finished run (and keeps code a run still uses: none left here)
    cleaned = _sh(clean_command(paths, 0), home)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (real / "runs" / "r1").exists()
    # a claim on a name that is gone works again, and release undoes it
    assert _sh(claim_command(paths), home, kit().offer[1]).returncode == 0
    assert _sh(release_command(paths), home).returncode == 0
    assert not (real / "runs" / "r1").exists()


def test_kill_of_a_vanished_job_says_so(tmp_path: Path) -> None:
    home = tmp_path
    paths = Paths("~/b", "~/b/code/h", "~/b/runs/v")
    run = home / "b" / "runs" / "v"
    run.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "0.1"], start_new_session=True)
    sleeper.wait()
    (run / "pid").write_text(f"{sleeper.pid}\n")  # a group that is gone
    started = time.monotonic()
    said = _sh(kill_command(paths, "TERM", 2), home).stdout.decode().split()
    assert said == ["vanished", "0"]
    assert not (run / "exit").exists()  # never "stopped by multihost"
    assert not (run / "stopped").exists()
    assert time.monotonic() - started < 5


def _gated(home: Path, name: str, word: bytes | None) -> subprocess.CompletedProcess[bytes]:
    """A launch-and-watch script fed to ``sh -s`` (as a held shell gets it), then ``word``
    (None: stdin just ends, as when the runner is gone)."""
    paths = Paths("~/b", "~/b/code/h", f"~/b/runs/{name}")
    job = Job(f'echo started > "$HOME"/{name}.started', name)
    script = launch_script(paths, {"JAX_PROCESS_ID": "0"}, job.command, watch=True)
    assert _sh(claim_command(paths), home, kit().offer[1]).returncode == 0
    (home / "b" / "code" / "h").mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    pipe = subprocess.PIPE
    with subprocess.Popen(["sh", "-s"], stdin=pipe, stdout=pipe, stderr=pipe, env=env) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdin.write(script.encode())
        proc.stdin.flush()
        ready = proc.stdout.readline()  # the word goes only once the host said so, as the runner's
        proc.stdin.write(word or b"")
        proc.stdin.close()
        out, err = proc.stdout.read(), proc.stderr.read()  # small: no pipe fills up
        return subprocess.CompletedProcess(proc.args, proc.wait(timeout=60), ready + out, err)


@pytest.mark.parametrize("word", [b"stop\n", None])
def test_launch_gate_held_starts_nothing_and_leaves_no_run(
    tmp_path: Path, word: bytes | None
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    held = _gated(home, "held", word)
    word, pgid, *python = held.stdout.split()  # "ready PGID", and nothing else
    assert python == _python_said()
    assert (word, pgid.isdigit()) == (b"ready", True), held.stderr
    assert held.returncode == 5
    assert not (home / "b" / "runs" / "held").exists()
    assert _processes_under(home) == []  # the wrapper (up before the word) and tail ended
    # a job, had one been started, would have written by the time nothing started is alive
    wait_for(lambda: _started_with(home) == [], 10, "every process the launch started to end")
    assert not (home / "held.started").exists()


def _started_with(home: Path) -> list[int]:
    """Live processes whose environment says ``HOME=home``: whatever the launch started."""
    want = b"HOME=" + str(home).encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            names = environ.read_bytes().split(b"\0")
            state = (environ.parent / "stat").read_text().rsplit(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and want in names:
            found.append(int(environ.parent.name))
    return found


def _processes_under(home: Path) -> list[str]:
    """Command lines of live processes that name a path in ``home`` (read from /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(str(home).encode() in a for a in args):
            found.append(b" ".join(args).decode(errors="replace"))
    return found


def test_launch_gate_shell_killed_before_the_word_leaves_nothing_running(tmp_path: Path) -> None:
    """The launch shell gone at its gate (SIGKILL: no word, no cleanup of its own): the
    wrapper waiting behind it and the log's tail end too, and the job never starts."""
    home = tmp_path / "home"
    home.mkdir()
    paths = Paths("~/b", "~/b/code/h", "~/b/runs/gone")
    job = Job('echo started > "$HOME"/gone.started', "gone")
    script = launch_script(paths, {"JAX_PROCESS_ID": "0"}, job.command, watch=True)
    assert _sh(claim_command(paths), home, kit().offer[1]).returncode == 0
    (home / "b" / "code" / "h").mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    pipe = subprocess.PIPE
    with subprocess.Popen(["sh", "-s"], stdin=pipe, stdout=pipe, env=env) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(script.encode())
        proc.stdin.flush()
        assert proc.stdout.readline().split()[0] == b"ready"
        # up before the word (its exec through python3, the subreaper's start, may lag "ready")
        wait_for(
            lambda: any("run.sh gate" in c for c in _processes_under(home)),
            10,
            "the wrapper, before any word",
        )
        proc.kill()
        proc.wait(timeout=10)
    wait_for(lambda: _processes_under(home) == [], 10, "the wrapper and the tail to end")
    assert not (home / "gone.started").exists()


def test_launch_gate_go_starts_the_job_and_watches(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ran = _gated(home, "go", b"go\n")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    word, pgid, *python = lines[0].split()
    assert python == _python_said()
    assert word == b"ready"
    assert pgid.isdigit()  # the job's process group, said before the word
    assert lines[1:] == []  # nothing written back after the word (the job's log: empty)
    assert (home / "go.started").read_text() == "started\n"
    end = parse_watch_end(ran.stderr)
    assert end is not None
    assert end[0].code == 0
    # the start time: the empty started file's mtime (no fork between the word and the job)
    assert end[0].started_at is not None
    assert abs(end[0].started_at - time.time()) < 60
    assert end[0].ended_at is not None
    assert end[0].started_at <= end[0].ended_at


def test_clean_keeps_code_a_sweep_point_uses(tmp_path: Path) -> None:
    """A sweep's points are runs one level down (runs/SWEEP/POINT): their job.sh counts."""
    home = tmp_path
    base = home / "b"
    for h in ("used1", "free1"):
        (base / "code" / h).mkdir(parents=True)
    point = base / "runs" / "sw" / "p0"
    point.mkdir(parents=True)
    (point / "job.sh").write_text(f"cd {base}/code/used1 || exit 126\n")
    gone = _sh(clean_command(Paths("~/b", "~/b/code/x", "~/b/runs/old"), 0), home)
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.split() == [b"free1"]
    assert (base / "code" / "used1").is_dir()


# -- the kit: the hook and the run's scripts, staged by content ------------------------------
def test_kit_goes_once_is_checked_by_content_every_time(tmp_path: Path) -> None:
    """A fresh host asks for the kit (``kit``) and gets it; then it has it (no word); a file
    of it altered, or one missing, makes it ask again and get the right one; an older kit
    beside it is left alone; the run's hook and wrapper are the kit's files, as sent."""
    home = tmp_path / "home"
    home.mkdir()
    the_kit = kit()
    paths = Paths("~/b", "~/b/code/h", "~/b/runs/r1")
    folder = home / "b" / "kit" / the_kit.short
    (home / "b" / "kit" / "0123456789abcdef").mkdir(parents=True)  # another version's
    first = _sh(claim_command(paths), home, the_kit.offer[1])
    assert (first.returncode, first.stdout) == (0, b"kit\n"), first.stderr
    assert {p.name for p in folder.iterdir()} == {"SHA256SUMS", *(n for n, _ in the_kit.files)}
    for name, text in the_kit.files:
        assert (folder / name).read_text() == text
    assert _sh(release_command(paths), home).returncode == 0
    warm = _sh(claim_command(paths), home)  # nothing on stdin: none is needed
    assert (warm.returncode, warm.stdout) == (0, b""), warm.stderr
    assert _sh(release_command(paths), home).returncode == 0
    (folder / "sitecustomize.py").write_text("import os; os.system('evil')\n")
    (folder / "launch.sh").unlink()
    again = _sh(claim_command(paths), home, the_kit.offer[1])
    assert (again.returncode, again.stdout) == (0, b"kit\n"), again.stderr
    assert (folder / "sitecustomize.py").read_text() == hook_text()
    assert (folder / "launch.sh").exists()
    assert (home / "b" / "kit" / "0123456789abcdef").is_dir()
    assert not [p for p in (home / "b" / "kit").iterdir() if "." in p.name]  # no temp dirs
    # a launch takes the hook and the wrapper from the kit
    (home / "b" / "code" / "h").mkdir(parents=True)
    launched = _sh(launch_script(paths, {"JAX_PROCESS_ID": "0"}, "true"), home)
    assert launched.returncode == 0, launched.stderr
    run = home / "b" / "runs" / "r1"
    assert (run / "hook" / "sitecustomize.py").read_text() == hook_text()
    assert (run / "run.sh").read_text() == remote.WRAPPER
    wait_for(lambda: (run / "exit").exists(), 10, "the job's end")


def test_runs_that_bring_the_kit_at_once_all_get_it(tmp_path: Path) -> None:
    """Several runs starting together on a host without the kit (two sweeps, two users'
    runs): each unpacks its own copy, one goes in, every run gets it, no temp dir stays.
    (The race that made one in six pairs of --local runs fail "does not match what was
    sent", a kit removed from under another run, is too narrow to show in sh alone:
    test_cli_runs.py's two --local runs at once is the test that met it.)"""
    home = tmp_path / "home"
    home.mkdir()
    the_kit = kit()
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    for round_ in range(3):
        procs = [
            subprocess.Popen(
                ["sh", "-c", claim_command(Paths("~/b", "~/b/code/h", f"~/b/runs/r{round_}{i}"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
            for i in range(6)
        ]
        done = [p.communicate(the_kit.offer[1], timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0] * 6, [e for _, e in done]
        folder = home / "b" / "kit" / the_kit.short
        assert (folder / "sitecustomize.py").read_text() == hook_text()
        assert not [p for p in (home / "b" / "kit").iterdir() if "." in p.name]  # no temp dirs
        shutil.rmtree(home / "b" / "kit")  # the next round's runs find none again


def test_kit_that_does_not_come_whole_is_refused(tmp_path: Path) -> None:
    """Bytes that are not the kit (altered on the way) are refused, named, and nothing is
    claimed; a stream that ends early likewise."""
    home = tmp_path / "home"
    home.mkdir()
    word, data = kit().offer
    head, _, archive = data.partition(b"\n")
    paths = Paths("~/b", "~/b/code/h", "~/b/runs/r1")
    other = io.BytesIO()
    with tarfile.open(fileobj=other, mode="w:gz") as tar:
        info = tarfile.TarInfo("SHA256SUMS")
        tar.addfile(info, io.BytesIO(b""))
    assert int(head) == len(archive)
    cases = (
        (f"{len(other.getvalue())}\n".encode() + other.getvalue(), "does not match what was sent"),
        (data[:-100], "could not be unpacked"),
        (b"", "the kit did not come (said: nothing)"),
    )
    for stdin, why in cases:
        res = _sh(claim_command(paths), home, stdin)
        assert (res.returncode, res.stdout) == (1, word + b"\n")
        assert why in res.stderr.decode()
        assert not (home / "b" / "runs" / "r1").exists()

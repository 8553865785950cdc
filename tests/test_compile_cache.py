"""A compile cache on every host, by default: each run's JAX processes get jax's persistent
cache in ``REMOTE_DIR/compile-cache`` on their host, one folder per software stack, every
process writing its own entries, the least recently used going past the cap; a user's
``JAX_COMPILATION_CACHE_DIR`` wins, ``--no-compile-cache`` turns it off, ``multihost clean
--compile-caches`` removes it; a job keeps its workers' caches in its bucket across attempts.
Real multi-process JAX on CPU, over ``--local``, the sshd fleet and the cloud stand-in."""

from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multihost.defaults import DEFAULTS
from multihost.diagnose import hookstart
from multihost.job.record import JobRecord
from multihost.job.submit import startup_script
from multihost.model import Fleet, Host, Job
from multihost.planner import Settings, plan
from multihost.remote.commands import CACHE_ENV, CACHE_MAX_ENV, cache_env, hook_text, host_env
from tests.clitools import REPO, cli, fleet_run_args, host_logs, no_processes
from tests.helpers import free_port, wait_for

MISS = "PERSISTENT COMPILATION CACHE MISS"  # jax's words with JAX_EXPLAIN_CACHE_MISSES=1
SHARDINGS = ["--payload", "shardings", "--", "-d", "128", "-b", "16", "-n", "2", "-if", "-1"]


def test_every_host_gets_its_own_cache_unless_told_otherwise(tmp_path: Path) -> None:
    fleet = Fleet.from_slices([[Host(address="a"), Host(address="b", remote_dir="/data/mh")]])
    job = Job("true", "r")
    env = [host_env(h, fleet, job, {}) for h in fleet]
    assert env[0][CACHE_ENV] == "~/.multihost/compile-cache"
    assert env[1][CACHE_ENV] == "/data/mh/compile-cache"  # the host's own base
    assert env[0][CACHE_MAX_ENV] == str(DEFAULTS.compile_cache_max)
    assert cache_env(fleet.hosts[0], Job("true", "r", compile_cache=0)) == {}
    mine = Job("true", "r", env={CACHE_ENV: "/mine"})
    assert host_env(fleet.hosts[0], fleet, mine, {})[CACHE_ENV] == "/mine"  # --env wins
    assert CACHE_ENV == hookstart.CACHE_ENV  # the hook is staged alone: its own copy
    assert CACHE_MAX_ENV == hookstart.CACHE_MAX_ENV
    base = {"cmd": "true", "local": 2, "log_dir": tmp_path, "script_dir": tmp_path}
    assert plan(Settings.of(base)).job.compile_cache == DEFAULTS.compile_cache_max
    assert plan(Settings.of({**base, "compile_cache": False})).job.compile_cache == 0
    assert plan(Settings.of({**base, "compile_cache_max": 1 << 20})).job.compile_cache == 1 << 20
    dry = cli(
        [
            *("run", "--local", "1", "--dry-run", "--compile-cache-max", "2M"),
            *("--script-dir", str(tmp_path), "--log-dir", str(tmp_path), "--cmd", "true"),
        ]
    )
    assert dry.returncode == 0, dry.stderr
    assert f"{CACHE_MAX_ENV}={2 << 20}" in dry.stdout
    off = cli(
        [
            *("run", "--local", "1", "--dry-run", "--no-compile-cache"),
            *("--script-dir", str(tmp_path), "--log-dir", str(tmp_path), "--cmd", "true"),
        ]
    )
    assert off.returncode == 0, off.stderr
    assert f"export {CACHE_ENV}=" in dry.stdout
    assert f"export {CACHE_ENV}=" not in off.stdout


def test_the_record_keeps_a_cap_that_is_not_the_default() -> None:
    from multihost.model import State
    from multihost.results.records import HostResult
    from multihost.runs.record import RunRecord, from_json, to_json

    hosts = (HostResult(Host(address="a"), State.DONE),)
    default = to_json(RunRecord("r", Job("true", "r"), hosts))
    assert "compile_cache" not in default["job"]  # as records were before it was a field
    off = to_json(RunRecord("r", Job("true", "r", compile_cache=0), hosts))
    assert off["job"]["compile_cache"] == 0
    assert from_json(off).job.compile_cache == 0
    assert from_json(default).job.compile_cache == DEFAULTS.compile_cache_max


def test_stacks_never_share_a_folder() -> None:
    names = {
        hookstart.cache_name("0.10.2", "0.10.2", "cpu", "cpu"),
        hookstart.cache_name("0.10.3", "0.10.2", "cpu", "cpu"),
        hookstart.cache_name("0.10.2", "0.10.1", "cpu", "cpu"),
        hookstart.cache_name("0.10.2", "0.10.2", "tpu", "TFRT TPU v4 built 1"),
        hookstart.cache_name("0.10.2", "0.10.2", "tpu", "TFRT TPU v4 built 2"),
    }
    assert len(names) == 5
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9._+-]+", name), name
    assert hookstart.cache_name("0.10.2", "0.10.2", "cpu", "cpu").startswith(
        "jax0.10.2-jaxlib0.10.2-cpu-"
    )


def test_the_least_recently_used_go_first(tmp_path: Path) -> None:
    now = time.time()
    ages = {"old/a-cache": 300, "old/b-cache": 200, "new/c-cache": 100, "new/d-cache": 0}
    for name, age in ages.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x" * 1000)
        os.utime(path, (now - age, now - age))
    (tmp_path / "loose").write_bytes(b"x" * 5000)  # not in a stack's folder: not the cache's
    assert hookstart.prune_cache(str(tmp_path), 4000) == 0
    assert hookstart.prune_cache(str(tmp_path), 2500) == 2000
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*-cache"))
    assert left == ["new/c-cache", "new/d-cache"]
    assert hookstart.prune_cache(str(tmp_path / "absent"), 0) == 0


def test_a_cache_dir_is_private_and_never_a_link(tmp_path: Path) -> None:
    made = tmp_path / "a" / "cache"
    assert hookstart.private_cache_dir(str(made))
    assert made.stat().st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert hookstart.private_cache_dir(str(loose))
    assert loose.stat().st_mode & 0o777 == 0o700
    link = tmp_path / "link"
    link.symlink_to(made)
    assert not hookstart.private_cache_dir(str(link))


def test_a_job_keeps_its_caches_in_its_bucket() -> None:
    rec = JobRecord(
        name="cc",
        bucket="gs://bkt",
        tpu_type="v4-16",
        num_slices=1,
        runtime_version="tpu-ubuntu2204-base",
        command="true",
        code_hash="ab" * 32,
    )
    assert rec.compile_cache_url == "gs://bkt/multihost/jobs/cc/compile-cache"
    assert JobRecord.from_json(rec.to_json()) == rec
    script = startup_script(rec)
    assert "gs://bkt/multihost/jobs/cc/compile-cache" in script
    off = rec.evolve(compile_cache=0)
    assert off.compile_cache_url == ""
    assert "gs://bkt/multihost/jobs/cc/compile-cache" not in startup_script(off)


def test_clean_removes_the_caches_its_runs_used(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    fill = 'd=$MULTIHOST_COMPILE_CACHE/jaxX; mkdir -p "$d" && head -c 300000 /dev/zero > "$d/e"'
    res = cli(
        [
            *("run", "--local", "2", "--script-dir", str(code), "--log-dir", str(logs)),
            *("--run-name", "filled", "--cmd", fill),
        ]
    )
    assert res.returncode == 0, res.stderr
    caches = sorted(home.glob(".cache/multihost/local/w*/compile-cache"))
    assert len(caches) == 2
    dry = cli(["clean", "--compile-caches", "--dry-run", "--log-dir", str(logs)])
    assert dry.returncode == 0, dry.stderr
    assert "would remove the compile cache of 2 of 2 host(s)" in dry.stdout
    assert all(c.is_dir() for c in caches)
    done = cli(["clean", "--compile-caches", "--log-dir", str(logs)])
    assert done.returncode == 0, done.stderr
    assert "removed the compile cache of 2 of 2 host(s)" in done.stdout
    assert not any(c.exists() for c in caches)
    assert (logs / "filled" / "run.json").is_file()  # the runs themselves are kept
    again = cli(["clean", "--compile-caches", "--log-dir", str(logs)])
    assert "removed the compile cache of 0 of 2 host(s): 0 B" in again.stdout


# -- real JAX ---------------------------------------------------------------------------------
PROGRAM = """\
import jax, jax.numpy as jnp
from jax._src import config
f = jax.jit(lambda a: (jnp.tanh(a) @ a).sum())
print("result", float(f(jnp.ones((64, 64)))), flush=True)
print("dir", config.compilation_cache_dir.value, flush=True)
"""


def _python(tmp_path: Path, program: str, **env: str) -> list[str]:
    """``program`` with the staged hook as sitecustomize, in a run's hook dir; its lines."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(hook_text())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MULTIHOST_"))}
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={**base, "PYTHONPATH": str(hook), "MULTIHOST_STACK_DIR": str(hook), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _entries(base: Path) -> list[str]:
    return sorted(p.name for p in base.rglob("*-cache") if p.is_file())


@pytest.mark.jax
def test_the_hook_points_jax_at_the_hosts_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    given = {CACHE_ENV: str(cache), CACHE_MAX_ENV: "100000000", "JAX_PLATFORMS": "cpu"}
    stale = cache / "jax0.0.1-old" / "x-cache"  # another stack's entry, long unused
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x" * 2000)
    os.utime(stale, (1, 1))
    first = _python(tmp_path, PROGRAM, **given)
    folder = Path(first[1].removeprefix("dir "))
    assert folder.parent == cache
    assert folder.name.startswith("jax")
    assert "-cpu-" in folder.name
    written = _entries(folder)
    assert any(e.startswith("jit__lambda") for e in written)  # cached on CPU: threshold 0
    assert _python(tmp_path, PROGRAM, **given)[0] == first[0]
    assert _entries(folder) == written  # the second run hit every entry: nothing new
    # the cap: the least recently used (the old stack's entry) goes first
    held = sum(p.stat().st_size for p in folder.iterdir())
    _python(tmp_path, PROGRAM, **{**given, CACHE_MAX_ENV: str(held)})
    assert not stale.exists()
    assert _entries(folder) == written
    # the user's own directory wins; the program's own wins
    mine = tmp_path / "mine"
    users = _python(tmp_path, PROGRAM, **given, JAX_COMPILATION_CACHE_DIR=str(mine))
    assert users[1] == f"dir {mine}"
    own = PROGRAM.replace(
        "f = ", f"jax.config.update('jax_compilation_cache_dir', {str(mine)!r})\nf = "
    )
    assert _python(tmp_path, own, **given)[1] == f"dir {mine}"
    assert _python(tmp_path, PROGRAM, JAX_PLATFORMS="cpu")[1] == "dir None"  # not asked: none


@pytest.mark.jax
@pytest.mark.usefixtures("code")
def test_a_second_local_run_compiles_nothing(home: Path, tmp_path: Path) -> None:
    """The shardings payload twice over ``--local 2``: every process wrote its own entries
    (jax alone would write process 0's only), the second run misses none; with
    ``--no-compile-cache`` nothing is kept."""
    logs = tmp_path / "logs"
    common = ["--local", "2", "--log-dir", str(logs), "--env", "JAX_EXPLAIN_CACHE_MISSES=1"]
    first = cli(["run", *common, "--run-name", "one", *SHARDINGS], timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert all(MISS in text for text in host_logs(logs, "one").values())
    caches = sorted(home.glob(".cache/multihost/local/w*/compile-cache"))
    entries = [_entries(c) for c in caches]
    assert len(entries) == 2
    assert all(entries)
    assert set(entries[0]) != set(entries[1])  # keys differ per process: each its own
    second = cli(["run", *common, "--run-name", "two", *SHARDINGS], timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert not any(MISS in text for text in host_logs(logs, "two").values())
    assert [_entries(c) for c in caches] == entries
    for c in caches:
        for folder in c.iterdir():
            assert folder.stat().st_mode & 0o777 == 0o700
    cli(["clean", "--compile-caches", "--log-dir", str(logs)])
    off = cli(["run", *common, "--run-name", "off", "--no-compile-cache", *SHARDINGS], timeout=300)
    assert off.returncode == 0, off.stderr[-3000:]
    assert not any(c.exists() for c in caches)


@pytest.mark.jax
@pytest.mark.usefixtures("fresh_runs")
def test_each_fleet_host_keeps_its_own_cache(  # type: ignore[no-untyped-def]
    ssh_fleet, remote_jax, tmp_path: Path
) -> None:
    payloads = REPO / "payloads"
    logs = tmp_path / "logs"
    for host in ssh_fleet.hosts[:2]:
        subprocess.run(["rm", "-rf", str(host.home / ".multihost" / "compile-cache")], check=True)
    env = [
        *("--env", "JAX_PLATFORMS=cpu", "--env", f"PYTHONPATH={remote_jax['PYTHONPATH']}"),
        *("--env", "JAX_EXPLAIN_CACHE_MISSES=1", "--coordinator-port", str(free_port())),
    ]
    cmd = f"{remote_jax['PYTHON']} shardings.py {' '.join(SHARDINGS[3:])}"
    for run in ("one", "two"):
        res = cli(fleet_run_args(ssh_fleet, payloads, logs, run, cmd, 2, *env), timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
    assert all(MISS in text for text in host_logs(logs, "one").values())
    assert not any(MISS in text for text in host_logs(logs, "two").values())
    for host in ssh_fleet.hosts[:2]:
        assert _entries(host.home / ".multihost" / "compile-cache")
    assert no_processes(ssh_fleet, 2)


@pytest.mark.jax
@pytest.mark.slow
def test_an_attempt_after_a_preemption_compiles_nothing_the_first_did(  # type: ignore[no-untyped-def]
    cloud, remote_jax, ssh_fleet
) -> None:
    """A job's workers put their caches in the job's bucket as they go: attempt 1, whose
    caches start empty (the startup script fills them from the bucket alone, as on new VMs),
    takes them and misses nothing."""
    from tests.test_job_cloud import submit_args, watch_proc

    py = f"{remote_jax['PYTHON']} shardings.py {' '.join(SHARDINGS[3:])}"
    cmd = f'{py}; rc=$?; [ "$MULTIHOST_ATTEMPT" != 0 ] || sleep 600; exit $rc'
    watch = watch_proc(
        cloud,
        *submit_args(
            "cc",
            REPO / "payloads",
            cmd,
            *("--env", "JAX_NUM_CPU_DEVICES=2", "--env", "JAX_PLATFORMS=cpu"),
            *("--env", f"PYTHONPATH={remote_jax['PYTHONPATH']}"),
            *("--env", "JAX_EXPLAIN_CACHE_MISSES=1"),
            *("--coordinator-port", str(free_port()), "--max-restarts", "1", "--watch"),
        ),
    )
    try:
        logs = [f"multihost/jobs/cc/attempt-0/slice-0-worker-{w}.log" for w in (0, 1)]

        def read(name: str) -> str:
            return cloud.read(name) if name in cloud.objects("multihost/jobs/cc/") else ""

        wait_for(lambda: all("MULTIHOST_RESULT" in read(n) for n in logs), 240, "attempt 0")
        for n in logs:
            assert MISS in read(n), read(n)[-3000:]
        prefix = "multihost/jobs/cc/compile-cache/slice-0-worker-"
        uids = [pwd.getpwnam(h.user).pw_uid for h in ssh_fleet.hosts]

        def kept() -> bool:  # every file of each worker's cache is in the bucket
            put = set(cloud.objects(prefix))
            for w in (0, 1):
                (disk,) = (  # this fleet's workers' only: other fleets may share /var/tmp
                    p
                    for uid in uids
                    for p in Path(f"/var/tmp/multihost-{uid}").glob(
                        f"jobs/cc/attempt-0/*-worker-{w}"
                    )
                )
                cache = disk.parent.parent / "compile-cache"  # the job's, on that worker
                files = [p for p in cache.rglob("*") if p.is_file()]
                names = {f"{prefix}{w}/{p.relative_to(cache)}" for p in files}
                if len(names) < 3 or not names <= put:
                    return False
            return True

        wait_for(kept, 120, "the caches in the bucket")
        cloud.preempt("cc-a0")
        _, err = watch.communicate(timeout=300)
    finally:
        if watch.poll() is None:
            watch.send_signal(signal.SIGKILL)
    assert watch.returncode == 0, err[-3000:]
    for w in (0, 1):
        log = cloud.read(f"multihost/jobs/cc/attempt-1/slice-0-worker-{w}.log")
        got = re.search(r"compile cache: (\d+) file\(s\) from gs://", log)
        assert got, log[-2000:]
        assert int(got[1]) >= 3
        assert MISS not in log, log[-3000:]
        assert "MULTIHOST_RESULT" in log

"""A pod's life, the pure parts: checked input, each gcloud command line, zone order and
quota skipping, the price table and its rebuild script, the records, the autodown status."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.errors import UsageError
from multihost.pods import autodown, plan, prices, records
from multihost.pods.plan import PodSpec

ROOT = Path(__file__).resolve().parents[1]


def spec(**kw: object) -> PodSpec:
    base: dict[str, object] = {
        "name": "exp",
        "tpu_type": "v4-16",
        "runtime_version": "v",
        "zones": ("us-central2-b",),
    }
    return PodSpec(**(base | kw))  # type: ignore[arg-type]


def test_create_argv_single_and_multislice() -> None:
    assert plan.create_argv(spec(), "us-central2-b") == [
        "compute",
        "tpus",
        "queued-resources",
        "create",
        "exp",
        "--accelerator-type",
        "v4-16",
        "--runtime-version",
        "v",
        "--node-id",
        "exp",
        "--labels",
        "multihost=exp",
        "--valid-until-duration",
        "900s",
        "--async",
        "--zone",
        "us-central2-b",
    ]
    multi = plan.create_argv(
        spec(num_slices=2, capacity="spot", project="pr", queue_timeout=90.4), "z-a1-b"
    )
    assert multi[9:13] == ["--node-count", "2", "--node-prefix", "exp"]
    assert "--spot" in multi
    assert multi[-7:] == [
        "--valid-until-duration",
        "90s",
        "--async",
        "--project",
        "pr",
        "--zone",
        "z-a1-b",
    ]
    assert plan.delete_argv("exp", "z") == [
        "compute",
        "tpus",
        "queued-resources",
        "delete",
        "exp",
        "--force",
        "--async",
        "--quiet",
        "--zone",
        "z",
    ]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tpu_type": "v9-8"}, "unknown TPU type 'v9-8'"),
        ({"tpu_type": "v4"}, "unknown TPU type 'v4'"),
        ({"name": "Bad"}, "bad pod name 'Bad'"),
        ({"capacity": "cheap"}, "unknown capacity 'cheap'"),
        ({"num_slices": 0}, "the number of slices must be 1 to 1024, not 0"),
        ({"num_slices": 1000000}, "the number of slices must be 1 to 1024, not 1000000"),
        ({"tpu_type": "v4-61"}, r"unknown TPU type 'v4-61': v4 slices \(cores\) are v4-8, "),
        ({"tpu_type": "v4-7"}, "unknown TPU type 'v4-7'"),
        ({"tpu_type": "v5litepod-12"}, "unknown TPU type 'v5litepod-12'"),
        ({"zones": ("us-central2-b", "nowhere")}, "bad zone 'nowhere'"),
        ({"zones": ()}, "a pod needs a zone"),
    ],
)
def test_bad_specs(kw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        spec(**kw)


def test_zones_durations_and_quota_skip() -> None:
    assert plan.zones_of(None, "us-east1-d, us-central2-b") == ("us-east1-d", "us-central2-b")
    assert plan.zones_of("us-central2-b", None) == ("us-central2-b",)
    assert plan.zones_of(None, None) == ()  # then gcloud's default zone is asked
    bad = [
        ("a-b1-c", "a-b1-c", "not both"),
        (None, "a-b1-c,a-b1-c", "twice"),
        (None, "nowhere", "bad zone"),
    ]
    for zone, zones, message in bad:
        with pytest.raises(UsageError, match=message):
            plan.zones_of(zone, zones)
    assert [plan.parse_duration(t) for t in ("5", "90s", "15m", "2h", "1d", "0.5")] == [
        5,
        90,
        900,
        7200,
        86400,
        0.5,
    ]
    for bad in ("0", "-1", "soon", "5 m", ""):
        with pytest.raises(UsageError, match="bad duration"):
            plan.parse_duration(bad)
    assert plan.parse_autodown("off") is None
    assert plan.parse_autodown("30m") == 1800
    with pytest.raises(UsageError, match=r"bad duration 'of': expected e\.g\. .*, or off"):
        plan.parse_autodown("of")
    assert plan.gcloud_duration(0.2) == "1s"
    zones = ["us-east1-b", "us-east1-d", "us-central2-b"]
    assert plan.skip_after_quota(zones, {"us-east1"}) == ["us-central2-b"]


def test_classify_and_read_the_service() -> None:
    quota = (
        "ERROR: (gcloud.compute.tpus.queued-resources.create) RESOURCE_EXHAUSTED: Quota "
        "limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded."
    )
    assert plan.classify(quota) == "quota"
    assert plan.classify('There is no more capacity in the zone "z"') == "capacity"
    assert plan.classify("ALREADY_EXISTS: x") == "exists"
    assert plan.classify("PERMISSION_DENIED: Location z not found") == "error"
    failed = {"state": "FAILED", "failedData": {"error": {"code": 8, "message": "no"}}}
    qr = {"tpu": {"nodeSpec": [{"node": {"labels": {"multihost": "exp"}}}]}, "state": failed}
    assert plan.ours(qr) == "exp"
    assert plan.ours({"tpu": {"nodeSpec": [{"node": {}}]}}) is None
    assert plan.failure(qr) == "no (code 8)"
    suspended = {"state": {"state": "SUSPENDED", "stateInitiator": "SERVICE"}}
    assert plan.failure(suspended) == "SUSPENDED by service"


def test_price_table_says_its_source_and_unknown_is_none() -> None:
    assert "skypilot-catalog" in prices.source()
    assert "2c3d7ea7d76bf84cf80d382e946c1609571485fd" in prices.source()
    assert "date: read 2026-11-28" in prices.source()
    assert prices.hourly("v4-16", "us-central2-b", "on-demand") == 25.76
    assert prices.hourly("v4-16", "us-central2-b", "spot", num_slices=2) == pytest.approx(14.744)
    assert prices.hourly("v3-8", "us-east1-d", "spot") is None  # the catalog has no spot price
    assert prices.hourly("v4-16", "europe-west4-a", "on-demand") is None  # not in the table
    assert prices.hourly("v4-16", "us-central2-b", "reserved") is None
    assert prices.money(None) == "unknown"
    assert prices.money(25.76, "/h") == "$25.76/h"
    assert prices.cost(36.0, 1800) == 18.0
    assert prices.cost(None, 1800) is None
    for (tpu, region), price in prices.table().items():
        assert price.on_demand is None or price.on_demand > 0, (tpu, region)
        assert price.spot is None or price.spot > 0, (tpu, region)


def test_rebuild_script_reads_a_vms_csv(tmp_path: Path) -> None:
    csv = tmp_path / "vms.csv"
    csv.write_text(
        "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,"
        "AvailabilityZone,Price,SpotPrice\n"
        "a2-highgpu-1g,12.0,85.0,,,,us-central1,us-central1-a,0.73948,0.38812\n"
        ",,,tpu-v4-16,1,tpu-v4-16,us-central2,us-central2-b,25.76,7.372\n"
        ",,,tpu-v4-16,1,tpu-v4-16,us-central2,us-central2-b,25.76,7.372\n"
        ",,,tpu-v3-8,1,tpu-v3-8,us-east1,us-east1-d,8.0,\n"
        ",,,tpu-v6e-8,1,tpu-v6e-8,us-central2,us-central2-b,700.0,700.0\n"
    )
    script = str(ROOT / "scripts" / "tpu_prices.py")
    out = subprocess.run(
        [sys.executable, script, str(csv), "--commit", "abc"],
        capture_output=True,
        text=True,
        check=True,
    )
    table = prices.parse(out.stdout)
    assert table == {
        ("v3-8", "us-east1"): prices.Price(8.0, None),
        ("v4-16", "us-central2"): prices.Price(25.76, 7.372),
        ("v6e-8", "us-central2"): prices.Price(None, None),
    }
    assert "at commit\n#   abc" in out.stdout
    shipped = (ROOT / "multihost" / "pods" / "prices.csv").read_text()
    assert shipped.splitlines()[7] == out.stdout.splitlines()[7]  # the same header row


def test_records_are_private_and_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    record = spec(zones=("us-east1-d", "us-central2-b")).record("us-central2-b", 1000.0)
    path = records.save(record.evolve(state="active", active_at=1010.0, autodown=60.0))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    back = records.load("exp")
    assert back.zones == ("us-east1-d", "us-central2-b")
    assert (back.active_at, back.autodown, back.valid_until) == (1010.0, 60.0, 1900.0)
    assert [r.name for r in records.all_records()] == ["exp"]
    path.write_text('{"schema": 1, "name": 3}')
    with pytest.raises(records.PodRecordError, match="malformed pod record"):
        records.load("exp")
    records.forget("exp")
    with pytest.raises(UsageError, match="no pod 'exp' made from here"):
        records.load("exp")
    assert not os.path.exists(path)


def test_autodown_commands_and_status() -> None:
    assert autodown.tick(3) == 1
    assert autodown.tick(1800) == 10
    who = autodown.owner("exp", 1000.5)
    assert who == "exp@1000"
    armed = autodown.arm_command(2.5, who)
    assert armed.endswith(" sh '~/.multihost' 3 1 exp@1000")
    assert autodown.arm_command(None, who).endswith(" off 2 exp@1000")
    assert autodown.status_command(who).endswith(" sh '~/.multihost' exp@1000")
    st = autodown.parse_status("60\nidle 1000 since 990\nrunning\n")
    assert st.fires_in(1010) == 40
    assert st.describe(1010) == "60s idle, fires in 40s"
    busy = autodown.parse_status("60\nbusy 1000 multihost run long\nrunning\n")
    assert busy.describe(1010) == "60s idle; busy: multihost run long"
    failed = autodown.parse_status("60\nfailed 1000 gcloud could not delete x: denied\nrunning\n")
    assert failed.describe(0) == "60s idle; failed: gcloud could not delete x: denied"
    assert autodown.parse_status("off\noff 1000\nstopped\n").describe(0) == "off"
    # state armed for another queued resource (a reused host), or none: not this pod's
    assert autodown.parse_status("off\nnone\nstopped\n").describe(0) == "not armed on the pod"
    # its daemon gone (its state left behind): never "fires in" from a stale timer
    stale = autodown.parse_status("1800\nidle 1000 since 990\nstopped\n")
    assert stale.describe(1010) == "1800s idle; its daemon is not running (it last said: idle)"


@pytest.mark.parametrize("text", [autodown.script(), autodown.ARM, autodown.STATUS])
def test_autodown_scripts_parse_and_pass_shellcheck(text: str) -> None:
    subprocess.run(["sh", "-n", "-c", text], check=True)
    lint = subprocess.run(
        ["shellcheck", "--shell=sh", "-"], input=text, text=True, capture_output=True
    )
    assert lint.returncode == 0, lint.stdout


def test_a_listed_request_without_a_record_here() -> None:
    """What ``pods --zones`` builds from a listed request made on another machine, and when
    ``gc`` takes it: dead, or still waiting past its valid-until; never an unlabelled one."""
    from multihost.pods import lifecycle

    qr = {
        "name": "projects/p/locations/us-east1-d/queuedResources/other",
        "createTime": "2026-01-02T03:04:05Z",
        "spot": {},
        "queueingPolicy": {"validUntilDuration": "900s"},
        "state": {"state": "ACCEPTED"},
        "tpu": {
            "nodeSpec": [
                {
                    "multisliceParams": {"nodeCount": 2, "nodeIdPrefix": "other"},
                    "node": {
                        "acceleratorType": "v4-16",
                        "runtimeVersion": "v",
                        "labels": {"multihost": "other"},
                    },
                }
            ]
        },
    }
    record = plan.record_of(qr, "us-east1-d", None)
    assert record is not None
    assert (record.name, record.zone, record.tpu_type, record.num_slices, record.capacity) == (
        "other",
        "us-east1-d",
        "v4-16",
        2,
        "spot",
    )
    assert record.created_at == 1767323045.0
    assert record.valid_until == 1767323045.0 + 900
    waiting = lifecycle.Standing(record, "ACCEPTED", recorded=False)
    assert lifecycle.dead_reason(waiting, record.valid_until - 1) is None
    assert (
        lifecycle.dead_reason(waiting, record.valid_until + 1) == "ACCEPTED past its queue deadline"
    )
    unlabelled = qr | {"tpu": {"nodeSpec": [{"node": {"acceleratorType": "v4-8"}}]}}
    assert plan.record_of(unlabelled, "us-east1-d", None) is None
    assert plan.list_argv("us-east1-d", "p") == [
        "compute",
        "tpus",
        "queued-resources",
        "list",
        "--format",
        "json",
        "--project",
        "p",
        "--zone",
        "us-east1-d",
    ]


# every name a test below tries: real types, sizes a generation does not have, made-up ones
TYPES = [
    "v2-8", "v2-32", "v3-64", "v4-8", "v4-16", "v4-384", "v4-4096", "v5p-8", "v5p-640",
    "v5litepod-1", "v5litepod-16", "v6e-8", "v6e-256",
    "v4-61", "v4-7", "v4-4", "v4-8192", "v2-16", "v5litepod-12", "v6e-2", "v5e-16", "v9-8",
    "tpu-v4-8", "v4", "V4-8", "v4-016",
]  # fmt: skip


@pytest.mark.parametrize("tpu_type", TYPES)
def test_up_and_job_submit_take_the_same_tpu_types(tpu_type: str, tmp_path: Path) -> None:
    """One check for both: a type ``job submit`` takes, ``up`` takes (and the other way)."""
    from multihost.job.submit import JobRequest, check

    def refusal(make: object) -> str | None:
        try:
            make()  # type: ignore[operator]
        except UsageError as exc:
            return str(exc)
        return None

    pod = refusal(lambda: spec(tpu_type=tpu_type))
    job = JobRequest("j", "gs://bkt", tpu_type, "v", "true", script_dir=tmp_path)
    assert refusal(lambda: check(job)) == pod


def test_the_type_table_agrees_with_the_price_table_and_the_standin() -> None:
    """Every priced type exists; the stand-in's own list of what the service offers is taken,
    and its workers per slice are multihost's."""
    from multihost.cloud import checks
    from multihost.sandbox.standin.zones import ACCELERATOR_TYPES, workers_of

    for tpu, _region in prices.table():
        checks.check_tpu_type(tpu)
    for tpu in ACCELERATOR_TYPES:
        assert checks.workers_per_slice(tpu) == workers_of(tpu), tpu
    assert (checks.workers_per_slice("v4-16"), checks.workers_per_slice("v5litepod-16")) == (2, 4)
    # a priced type is priced; a valid one the table lacks is unknown, and why is said
    assert prices.hourly("v4-4096", "us-central2-b", "on-demand") is None
    assert prices.why_unknown("v4-4096", "us-central2-b", "on-demand") == (
        "the price table has no v4-4096 in us-central2"
    )
    assert prices.why_unknown("v4-16", "us-central2-b", "reserved") == (
        "reserved capacity is billed by its own terms"
    )


def test_pod_flags_given_to_a_run_are_checked_against_the_pod() -> None:
    """``run --prefix NAME`` with up's flags: what describes a pod to make, and whether the
    flags agree with the pod that exists (refused when not, never ignored)."""
    record = spec(num_slices=2, capacity="spot").record("us-east1-d", 1000.0)
    assert plan.PodFlags().for_making() == []
    assert plan.PodFlags(autodown="30m", zone="us-east1-d").for_making() == []
    given = plan.PodFlags(tpu_type="v4-16", capacity="spot", zones="a-b1-c", queue_timeout="5m")
    assert given.for_making() == ["--tpu-type", "--spot", "--zones", "--queue-timeout"]
    assert (
        plan.PodFlags(tpu_type="v4-16", runtime_version="v", num_slices=2).disagreement(record)
        is None
    )
    assert plan.PodFlags(capacity="spot").disagreement(record) is None
    why = plan.PodFlags(tpu_type="v4-32").disagreement(record)
    assert why == (
        "pod exp exists as 2 x v4-16 (spot, v) in us-east1-d, not --tpu-type v4-32: use it "
        "without that flag, or multihost down exp first"
    )
    assert "not --runtime-version w" in str(plan.PodFlags(runtime_version="w").disagreement(record))
    assert "not --num-slices 1" in str(plan.PodFlags(num_slices=1).disagreement(record))
    assert "not --reserved" in str(plan.PodFlags(capacity="reserved").disagreement(record))
    assert plan.PodFlags(autodown="off").autodown_seconds is None
    assert plan.PodFlags(autodown="2m").autodown_seconds == 120
    for bad, message in (
        ({"tpu_type": "v4-61"}, "unknown TPU type 'v4-61'"),
        ({"num_slices": 1000000}, "the number of slices must be 1 to 1024"),
        ({"autodown": "30 m"}, "bad duration '30 m'"),
        ({"zones": "us-central2-z,nowhere"}, "bad zone 'nowhere'"),
    ):
        with pytest.raises(UsageError, match=message):
            plan.PodFlags.of(bad)


def test_a_prefix_is_found_where_its_record_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one rule: --zone when given; else the record's zone (failover put it there); else
    neither (gcloud's default)."""
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    records.save(spec(project="pr").record("us-east1-d", 1000.0))
    assert records.located("exp", None, None) == ("us-east1-d", "pr")
    assert records.located("exp", None, "other") == ("us-east1-d", "other")
    assert records.located("exp", "us-central2-b", None) == ("us-central2-b", None)
    assert records.located("nope", None, None) == (None, None)
    assert records.located("../exp", None, None) == (None, None)
    assert records.located(None, None, None) == (None, None)
    from multihost.fleetops.reach import ReachSettings
    from multihost.planner import _located

    found = _located(ReachSettings.of({"prefix": "exp"})).spec
    assert (found.zone, found.project) == ("us-east1-d", "pr")


HUNG = """#!/bin/sh
# a gcloud that hangs, having started a child of its own; both write their pids
echo $$ >> {pids}
sh -c 'echo $$ >> {pids}; exec sleep 300' &
exec sleep 301
"""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@pytest.mark.parametrize("command", ["up", "pods"])
def test_a_hung_gcloud_is_said_timed_out_and_killed_with_its_children(
    tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a command waits for is said while it waits; at gcloud's timeout the whole process
    group is killed (checked in /proc), and ``up`` does not wait again to delete: it says the
    request may exist and keeps it recorded."""
    pids = tmp_path / "pids"
    fake = tmp_path / "gcloud"
    fake.write_text(HUNG.format(pids=pids))
    fake.chmod(0o755)
    env = os.environ | {
        "MULTIHOST_GCLOUD": str(fake),
        "MULTIHOST_GCLOUD_TIMEOUT": "2",
        "MULTIHOST_LOG_DIR": str(tmp_path / "logs"),
        "COLUMNS": "200",
    }
    if command == "pods":  # a recorded pod: `pods` asks the API where it stands
        monkeypatch.setenv("MULTIHOST_LOG_DIR", env["MULTIHOST_LOG_DIR"])
        records.save(spec(name="held").record("us-central2-b", 1000.0))
        argv = ["pods"]
        what = "compute tpus queued-resources describe held"
    else:
        argv = ["up", "hang1", "--tpu-type", "v4-8", "--runtime-version", "v", "--zone",
                "us-central2-b", "--no-add-key"]  # fmt: skip
        what = "compute tpus queued-resources create hang1"
    res = subprocess.run(
        [sys.executable, "-m", "multihost", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    assert f"multihost: waiting for gcloud ({what}): 1 s so far, at most 2 s" in res.stderr
    assert "gcloud took over 2s" in res.stderr
    assert "Traceback" not in res.stderr
    assert "interrupted" not in res.stderr
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2 * res.stderr.count("gcloud took over")  # the hung one and its child
    assert [p for p in started if _running(p)] == []
    if command == "up":
        assert res.stderr.count("waiting for gcloud") == 1  # no second wait to delete
        assert "the request in us-central2-b may exist: it stays recorded" in res.stderr
        record = records.PodRecord.from_json((tmp_path / "logs/pods/hang1/pod.json").read_text())
        assert (record.zone, record.state) == ("us-central2-b", "requesting")


def test_what_down_and_pods_say_when_there_is_nothing_to_price_or_list(tmp_path: Path) -> None:
    """``down`` of a pod with no price says why it has none (never "cost about unknown");
    ``pods`` with no pods says so in a line (never an empty table)."""
    from multihost.pods import ops

    record = spec(tpu_type="v4-4096").record("us-central2-b", 1000.0).evolve(active_at=1000.0)
    line = ops.Deleted("exp", "us-central2-b", record, sent=True, waited=True).line
    assert line.startswith("deleted pod exp in us-central2-b (1 x v4-4096, up ")
    assert line.endswith(", cost unknown: the price table has no v4-4096 in us-central2)")
    assert "cost about" not in line
    fake = tmp_path / "gcloud"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = os.environ | {
        "MULTIHOST_GCLOUD": str(fake),
        "MULTIHOST_LOG_DIR": str(tmp_path / "logs"),
    }
    res = subprocess.run(
        [sys.executable, "-m", "multihost", "pods"], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert res.stderr == (
        "multihost: no pods: none recorded here and none labelled (--zones A,B also looks in "
        "those zones)\n"
    )

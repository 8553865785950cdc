"""``multihost up``, ``down``, ``pods``, ``gc``, ``autodown`` and ``run/sweep --up/--down``:
a pod's whole life (argument checking and printing; the logic is ``multihost.pods``)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Callable
from types import FrameType

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from multihost.defaults import DEFAULTS as D
from multihost.errors import UsageError
from multihost.fleetops.reach import Reach
from multihost.pods import lifecycle, plan, prices, records
from multihost.pods.plan import PodSpec
from multihost.pods.records import PodRecord


def wait_poll() -> float:
    """Seconds between gcloud polls (each call costs ~1 s of CPU); tests shorten it."""
    return float(os.environ.get("MULTIHOST_WAIT_POLL", D.wait_poll))


def _gcloud() -> lifecycle.Runner:
    from multihost.cloud.gcloud import Gcloud

    return Gcloud.from_env()


def _say(err: Console) -> Callable[[str], None]:
    return lambda text: err.print(f"multihost: {escape(text)}", highlight=False)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _signals() -> None:
    """SIGTERM and SIGHUP end ``up`` (and a ``--down`` run) like Ctrl-C: nothing left."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


def spec_of(args: argparse.Namespace, name: str) -> PodSpec:
    """The pod ``up`` (or ``run --up``) asks for; bad input is a UsageError (exit 2)."""
    if not args.tpu_type:
        raise UsageError("--tpu-type is required to create a pod (e.g. --tpu-type v4-16)")
    if not args.runtime_version:
        raise UsageError("--runtime-version is required to create a pod")
    if args.autodown is not None and args.autodown != "off":
        plan.parse_duration(args.autodown)
    return PodSpec(
        name=name,
        tpu_type=args.tpu_type,
        runtime_version=args.runtime_version,
        zones=plan.zones_of(args.zone, args.zones),
        num_slices=args.num_slices,
        capacity=args.capacity or "on-demand",
        project=args.project,
        queue_timeout=plan.parse_duration(args.queue_timeout),
    )


def _where(record: PodRecord) -> str:
    per_hour = prices.hourly(record.tpu_type, record.zone, record.capacity, record.num_slices)
    return (
        f"{record.num_slices} x {record.tpu_type} in {record.zone} ({record.capacity}), "
        f"{prices.money(per_hour, '/h')}"
    )


def create(args: argparse.Namespace, name: str, err: Console) -> PodRecord:
    """``up``'s request loop: the pod ACTIVE and recorded, or a PodError naming each zone."""
    spec = spec_of(args, name)
    record, _ = lifecycle.up(spec, _gcloud(), _say(err), poll=wait_poll())
    err.print(f"multihost: pod {escape(name)} is ACTIVE: {escape(_where(record))}", highlight=False)
    if args.autodown not in (None, "off"):
        record = record.evolve(autodown=plan.parse_duration(args.autodown))
        records.save(record)
    return record


def cmd_up(args: argparse.Namespace, err: Console) -> int:
    _signals()
    record = create(args, args.name, err)
    code = _first_contact(args, record, err)
    if code == 0 and record.autodown is not None:
        code = _arm_autodown(args, record, record.autodown, err)
    return code


def _reach(args: argparse.Namespace, record: PodRecord, err: Console, add_key: bool) -> Reach:
    """The pod's workers, reached as ``run --prefix`` reaches them (the key added to the
    nodes where missing, host keys pinned from the guest attributes); ``args``' own reach
    flags (--ssh-config, --no-add-key...) taken over."""
    from multihost.cli.parser import parse
    from multihost.cli.reaching import reach_args

    base = parse(
        [
            "hosts",
            "--prefix",
            record.name,
            "--zone",
            record.zone,
            *(["--project", record.project] if record.project else []),
        ]
    )
    for key, value in vars(args).items():
        if hasattr(base, key) and key not in ("command", "zone", "project", "config"):
            setattr(base, key, value)
    return reach_args(base, err, add_key=add_key)


def _first_contact(args: argparse.Namespace, record: PodRecord, err: Console) -> int:
    """Every worker accepts SSH (first contact as ``run`` makes it)."""
    from multihost import fleetops
    from multihost.bridge import blocking

    where = _reach(args, record, err, add_key=True)
    outcomes = blocking(lambda: fleetops.check(where.fleet, where.ssh, D.remote_dir, 1))
    bad = [(h, o) for h, o in zip(where.fleet, outcomes, strict=True) if not o.ok]
    for h, o in bad:
        err.print(
            f"multihost: {escape(h.name)}: {escape(o.error.message if o.error else '?')}",
            style="red",
            highlight=False,
        )
    n = len(outcomes)
    if bad:
        err.print(
            f"multihost: pod {escape(record.name)} is up but {len(bad)}/{n} workers do not "
            f"accept SSH; it keeps costing: multihost down {escape(record.name)}",
            style="bold red",
            highlight=False,
        )
        return 1
    err.print(
        f"multihost: pod {escape(record.name)} is up: {n}/{n} workers accept SSH", highlight=False
    )
    return 0


def _on_worker0(where: Reach, command: str, stdin: bytes | None = None) -> str:
    """Run ``command`` on worker 0 of slice 0; its stdout, or a MultihostError naming it."""
    from multihost.bridge import blocking
    from multihost.errors import MultihostError
    from multihost.fanout import on_every_host
    from multihost.model import Fleet
    from multihost.transport import Connection

    host = where.fleet.hosts[0]

    async def one(conn: Connection) -> str:
        res = await conn.run(command, stdin)
        if res.exit_status != 0:
            why = res.stderr.decode(errors="replace").strip()[-300:]
            raise MultihostError(f"{host.name}: exit {res.exit_status}: {why}")
        return res.stdout.decode(errors="replace")

    (out,) = blocking(lambda: on_every_host(Fleet((host,)), where.ssh, one, limit=1))
    if not out.ok or out.value is None:
        raise MultihostError(f"{host.name}: {out.error.message if out.error else 'failed'}")
    return out.value


def _arm_autodown(
    args: argparse.Namespace, record: PodRecord, seconds: float | None, err: Console
) -> int:
    """Start (or change, or stop with None) the daemon on worker 0 that deletes the idle pod."""
    from multihost.pods import autodown

    where = _reach(args, record, err, add_key=False)
    said = _on_worker0(where, autodown.arm_command(seconds), autodown.script().encode())
    records.save(record.evolve(autodown=seconds))
    host = where.fleet.hosts[0].name
    if seconds is None:
        err.print(f"multihost: autodown of pod {escape(record.name)} is off", highlight=False)
        return 0
    err.print(
        f"multihost: pod {escape(record.name)} deletes itself once idle for "
        f"{seconds:g} s (watched on {escape(host)})",
        highlight=False,
    )
    if "nocron" in said:
        err.print(
            f"multihost: {escape(host)} has no crontab: after a reboot the pod is not "
            "watched until autodown is armed again",
            style="yellow",
            highlight=False,
        )
    return 0


def _autodown_status(args: argparse.Namespace, record: PodRecord, err: Console) -> str:
    """What the daemon on the pod says (one SSH command), or why it could not be asked."""
    from multihost.errors import MultihostError
    from multihost.pods import autodown

    try:
        where = _reach(args, record, err, add_key=False)
        text = _on_worker0(where, autodown.status_command())
    except MultihostError as exc:
        return f"{record.autodown:g}s idle (not asked: {exc})"
    return autodown.parse_status(text).describe(time.time())


def _ran(record: PodRecord, now: float) -> tuple[str, float | None]:
    if record.active_at is None:
        return "", None
    seconds = now - record.active_at
    per_hour = prices.hourly(record.tpu_type, record.zone, record.capacity, record.num_slices)
    whole = int(max(0.0, seconds))
    ran = f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"
    return ran, prices.cost(per_hour, seconds)


def cmd_down(args: argparse.Namespace, err: Console) -> int:
    _signals()
    zones = (plan.check_zone(args.zone),) if args.zone else ()
    record, zone, sent = lifecycle.down(
        _gcloud(),
        args.name,
        _say(err),
        wait=not args.no_wait,
        poll=wait_poll(),
        zones=zones,
        project=args.project,
    )
    err.print(
        f"multihost: {down_line(args.name, zone, record, sent, not args.no_wait)}", highlight=False
    )
    return 0


def down_line(name: str, zone: str, record: PodRecord | None, sent: bool, waited: bool) -> str:
    if not sent:
        return f"pod {name} in {zone} was already gone; its record is removed"
    what = f"deleted pod {name} in {zone}" if waited else f"delete of pod {name} in {zone} sent"
    if record is not None:
        ran, cost = _ran(record, time.time())
        what += f" ({record.num_slices} x {record.tpu_type}"
        what += f", up {ran}, cost about {prices.money(cost)})" if ran else ", never ACTIVE)"
    return what


def _row(
    args: argparse.Namespace, s: lifecycle.Standing, now: float, err: Console
) -> dict[str, object]:
    r = s.record
    per_hour = prices.hourly(r.tpu_type, r.zone, r.capacity, r.num_slices)
    ran, cost = _ran(r, now)
    auto = None
    if r.autodown is not None:
        auto = _autodown_status(args, r, err) if s.state == "ACTIVE" else f"{r.autodown:g}s idle"
    return {
        "name": r.name,
        "zone": r.zone,
        "tpu_type": r.tpu_type,
        "num_slices": r.num_slices,
        "capacity": r.capacity,
        "state": s.state,
        "reason": s.reason,
        "age_s": round(now - r.created_at),
        "up_for": ran,
        "price_per_hour": per_hour,
        "cost_so_far": None if cost is None else round(cost, 2),
        "autodown": auto,
        "recorded": s.recorded,
    }


def _listed_zones(args: argparse.Namespace) -> tuple[str, ...]:
    """``--zones A,B``: where ``pods`` and ``gc`` also look for labelled requests."""
    listed = [z.strip() for z in (args.zones or "").split(",") if z.strip()]
    return tuple(dict.fromkeys(plan.check_zone(z) for z in listed))


def cmd_pods(args: argparse.Namespace, err: Console) -> int:
    zones = _listed_zones(args)
    gcloud = _gcloud()
    now = time.time()
    rows = [_row(args, s, now, err) for s in lifecycle.standings(gcloud, zones, args.project)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = Table(
        "pod", "zone", "type", "capacity", "state", "age", "$/h", "cost so far", "autodown"
    )
    for row in rows:
        state = str(row["state"]) + (f" ({row['reason']})" if row["reason"] else "")
        state += "" if row["recorded"] else " (no record here)"
        table.add_row(
            str(row["name"]),
            str(row["zone"]),
            f"{row['num_slices']} x {row['tpu_type']}",
            str(row["capacity"]),
            escape(state),
            f"{row['age_s']} s",
            prices.money(row["price_per_hour"]),  # type: ignore[arg-type]
            prices.money(row["cost_so_far"]),  # type: ignore[arg-type]
            str(row["autodown"] or "off"),
        )
    Console(highlight=False, width=200).print(table)
    return 0


def cmd_gc(args: argparse.Namespace, err: Console) -> int:
    zones = _listed_zones(args)
    found = lifecycle.gc(
        _gcloud(), _say(err), dry_run=args.dry_run, zones=zones, project=args.project
    )
    verb = "would delete" if args.dry_run else "deleted"
    for s, why in found:
        err.print(
            f"multihost: {verb} {escape(s.record.name)} in {escape(s.record.zone)}: {escape(why)}",
            highlight=False,
        )
    if not found:
        err.print("multihost: nothing to collect", highlight=False)
    return 0


def cmd_autodown(args: argparse.Namespace, err: Console) -> int:
    record = records.load(args.name)
    seconds = None if args.duration == "off" else plan.parse_duration(args.duration)
    return _arm_autodown(args, record, seconds, err)


def with_pod(args: argparse.Namespace, err: Console, inner: Callable[[], int]) -> int:
    """``run``/``sweep --prefix NAME --up/--down``: the pod created first when missing
    (``--up``), deleted when the run ends however it ends (``--down``), and said so."""
    name = args.prefix
    if not name:
        raise UsageError("--up and --down need --prefix NAME (the pod)")
    plan.check_name(name)
    say = _say(err)
    _signals()
    record = records.find(name)
    if args.up and record is None:
        record = create(args, name, err)
        # autodown armed before the run (its first contact made here first)
        if record.autodown is not None and _first_contact(args, record, err) == 0:
            _arm_autodown(args, record, record.autodown, err)
    elif args.up and record is not None:
        say(f"pod {name} exists ({record.state} in {record.zone}): using it")
    code = 130
    try:
        code = inner()
    finally:
        if args.down and not _down_after(args, name, code, err):
            code = code or 1  # the run went well but the pod may still be up: say it in the exit
    return code


def _down_after(args: argparse.Namespace, name: str, code: int, err: Console) -> bool:
    """``--down`` once the run has ended: the pod deleted and said so; a failure to delete is
    said too (never hiding the run's own error) and returns False."""
    from multihost.errors import MultihostError

    zones = (args.zone,) if args.zone else ()
    try:
        rec, zone, sent = lifecycle.down(
            _gcloud(),
            name,
            _say(err),
            wait=True,
            poll=wait_poll(),
            zones=zones,
            project=args.project,
        )
    except MultihostError as exc:
        text = f"run ended (exit {code}) but --down could not delete pod {name}: {exc}"
        err.print(f"multihost: {escape(text)}", style="bold red", highlight=False)
        return False
    err.print(
        f"multihost: run ended (exit {code}): {down_line(name, zone, rec, sent, True)}",
        highlight=False,
    )
    return True

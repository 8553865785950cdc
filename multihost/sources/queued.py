"""A queued resource that is not ACTIVE yet: its own state named, and waiting until it is.

Discovery lists nodes; while a queued resource is ACCEPTED or WAITING_FOR_RESOURCES it has
none, while PROVISIONING they are CREATING. Then the resource itself says where it stands
(``queued-resources describe``, one gcloud call, made only when discovery failed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from multihost.cloud import gcloud as runner
from multihost.cloud import queued
from multihost.errors import CloudError, DiscoveryError

# States the resource may still leave towards ACTIVE (worth waiting for), the rest are final.
WAITABLE = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE")


@dataclass(frozen=True)
class QueuedState:
    """Where a queued resource stands, and how many of its slices are READY."""

    name: str
    state: str
    reason: str | None
    ready: int
    slices: int
    nodes: tuple[tuple[str, str], ...] = ()  # (node, its state) of the nodes that exist

    @property
    def waitable(self) -> bool:
        return self.state in WAITABLE

    def describe(self) -> str:
        """``queued resource myqr is PROVISIONING: 0/2 slices ready (myqr-0 CREATING, ...)``."""
        text = f"queued resource {self.name} is {self.state}"
        if self.reason:
            text += f" ({self.reason})"
        text += f": {self.ready}/{self.slices} slices ready"
        if self.nodes and self.ready < len(self.nodes):
            text += " (" + ", ".join(f"{n} {s}" for n, s in self.nodes) + ")"
        return text


class NotReady(DiscoveryError):
    """The prefix names a queued resource whose slices are not all READY (exit 2)."""

    def __init__(self, state: QueuedState, hint: str = "") -> None:
        super().__init__(state.describe() + hint)
        self.state = state


def describe(
    name: str,
    project: str | None,
    zone: str | None,
    gcloud: str | None = None,
    timeout: float = 60,
) -> dict[str, Any] | None:
    """The queued resource's JSON; None when gcloud cannot describe it (not found, or any
    other failure: the caller's own error then stands)."""
    argv = queued.describe_argv(name, project, zone)
    try:
        proc = runner.run(argv, gcloud=gcloud, timeout=timeout)
    except CloudError:
        return None
    if proc.returncode != 0:
        return None
    try:
        found = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def reason_of(state: Mapping[str, Any]) -> str | None:
    """The state's reason, where the v2 API gives one: ``failedData.error`` and who started a
    suspension (``stateInitiator``)."""
    error = (state.get("failedData") or {}).get("error") or {}
    if isinstance(error, Mapping) and error.get("message"):
        return str(error["message"])
    initiator = state.get("stateInitiator")
    if initiator in ("USER", "SERVICE"):
        return "by the user" if initiator == "USER" else "by the service"
    return None


def slice_count(qr: Mapping[str, Any]) -> int:
    """Slices the resource asks for: each node spec's ``multisliceParams.nodeCount`` or 1."""
    specs = (qr.get("tpu") or {}).get("nodeSpec") or []
    return sum(int((s.get("multisliceParams") or {}).get("nodeCount", 1)) for s in specs) or 1


def state_of(qr: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> QueuedState:
    """Where ``qr`` stands, its ``nodes`` (those listed as its own) counted."""
    state = qr.get("state") or {}
    name = str(qr.get("name", "?")).rsplit("/", 1)[-1]
    shown = tuple(
        (str(n.get("name", "")).rsplit("/", 1)[-1], str(n.get("state", "?"))) for n in nodes
    )
    return QueuedState(
        name=name,
        state=str(state.get("state", "STATE_UNSPECIFIED")),
        reason=reason_of(state),
        ready=sum(s == "READY" for _, s in shown),
        slices=slice_count(qr),
        nodes=tuple(sorted(shown)),
    )


def not_ready(
    nodes: Sequence[Mapping[str, Any]],
    prefix: str,
    project: str | None,
    zone: str | None,
    gcloud: str | None = None,
    timeout: float = 60,
) -> NotReady | None:
    """Why PREFIX has no READY slices, if a queued resource explains it: named by the
    matching nodes' ``queuedResource``, else PREFIX itself. None when none does."""

    def ours(n: Mapping[str, Any]) -> bool:
        short = str(n.get("name", "")).rsplit("/", 1)[-1]
        return short == prefix or (
            short.startswith(prefix + "-") and short[len(prefix) + 1 :].isdigit()
        )

    matching = [n for n in nodes if ours(n)]
    paths = {str(n["queuedResource"]) for n in matching if n.get("queuedResource")}
    name = next(iter(paths)).rsplit("/", 1)[-1] if len(paths) == 1 else prefix
    qr = describe(name, project, zone, gcloud, timeout)
    if qr is None:
        return None
    path = str(qr.get("name", ""))
    own = [n for n in nodes if str(n.get("queuedResource", "")) == path] or matching
    found = state_of(qr, own)
    if found.state == "ACTIVE" and found.ready >= found.slices:
        return None  # the resource is fine: discovery's own error says what is wrong
    hint = "; wait for it with --wait [SECONDS]" if found.waitable else ""
    return NotReady(found, hint)


def wait_until_ready(
    find: Callable[[], Any],
    seconds: float,
    say: Callable[[str], None],
    poll: float = 10.0,
) -> Any:
    """``find()`` again every ``poll`` s while it raises a waitable :class:`NotReady`,
    for at most ``seconds``; says each new state. Returns what ``find`` returns."""
    start = time.monotonic()
    last, said = "", 0.0
    while True:
        try:
            return find()
        except NotReady as exc:
            waited = time.monotonic() - start
            if not exc.state.waitable:
                raise
            if waited + poll > seconds:
                raise NotReady(exc.state, f"; gave up waiting after {waited:.0f} s") from None
            text = exc.state.describe()
            if text != last or waited - said >= 60:
                say(f"waiting ({waited:.0f} s): {text}")
                last, said = text, waited
            time.sleep(poll)

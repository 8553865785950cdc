"""``--workers``: some of the fleet's hosts, as gcloud's ``--worker=0,2`` and clush's ``-w``.

A spec is a comma list of items, each one of: ``all``; a process index ``2`` or a range
``0-3`` (the host's place in the whole fleet, slice-major); a host label as multihost prints
it, ``s0/w3``, whose slice and worker numbers may be ranges (``s0/w0-3``), bracket sets
(``s0/w[0-3,6]``, ``s[0,1]/w0``) or ``*``; a bare ``s1`` is every worker of slice 1. Commas
inside brackets belong to the set, so the labels multihost prints (``s0/w0-2,s1/w0``) read back
as they are. ``--exclude-workers`` takes the same notation and removes its hosts, as clush's
``-x`` does. A number the fleet does not have is refused, naming it. No I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from multihost.errors import UsageError
from multihost.model import Fleet, Host, fold, spans
from multihost.sources.inventory import MAX_HOSTS

_SET = r"\d+|\d+-\d+|\[[0-9,\s-]*\]|\*"
_LABEL = re.compile(rf"^s(?P<s>{_SET})(?:/w(?P<w>{_SET}))?$")
_INDEX = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class Pick:
    """One item of a spec: process indices, or slices × workers (None: every one)."""

    text: str
    indices: frozenset[int] | None = None
    slices: frozenset[int] | None = None
    workers: frozenset[int] | None = None

    def matches(self, host: Host) -> bool:
        if self.indices is not None:
            return host.process_id in self.indices
        return (self.slices is None or host.slice_id in self.slices) and (
            self.workers is None or host.worker_id in self.workers
        )


def parse(spec: str, flag: str = "--workers") -> tuple[Pick, ...]:
    """The items of ``spec``; a UsageError naming the first one that is not one."""
    items = _split(spec)
    if not items:
        raise UsageError(f"{flag} {spec!r}: empty (e.g. 0,2 or s0/w[0-3] or all)")
    return tuple(_pick(item, flag) for item in items)


def _split(spec: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, current = [], 0, ""
    for ch in spec:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    items.append(current.strip())
    return [item for item in items if item]


def _pick(item: str, flag: str) -> Pick:
    if item == "all":
        return Pick(item)
    if m := _INDEX.match(item):
        return Pick(item, indices=_range(int(m[1]), int(m[2] or m[1]), item, flag))
    if m := _LABEL.match(item):
        return Pick(
            item,
            slices=_numbers(m["s"], item, flag),
            workers=None if m["w"] is None else _numbers(m["w"], item, flag),
        )
    raise UsageError(
        f"{flag} {item!r}: not a process index (2, 0-3), a host label (s0/w3, s0/w[0-3], s1) or all"
    )


def _numbers(text: str, item: str, flag: str) -> frozenset[int] | None:
    if text == "*":
        return None
    found: set[int] = set()
    for part in text.strip("[]").split(","):
        m = _INDEX.match(part.strip())
        if m is None:
            raise UsageError(f"{flag} {item!r}: bad number set [{text.strip('[]')}]")
        found |= _range(int(m[1]), int(m[2] or m[1]), item, flag)
    return frozenset(found)


def _range(lo: int, hi: int, item: str, flag: str) -> frozenset[int]:
    if hi < lo:
        raise UsageError(f"{flag} {item!r}: the range {lo}-{hi} runs backwards")
    if hi - lo >= MAX_HOSTS:
        raise UsageError(f"{flag} {item!r}: more than {MAX_HOSTS} numbers")
    return frozenset(range(lo, hi + 1))


def _check(picks: tuple[Pick, ...], fleet: Fleet, flag: str, whose: str) -> None:
    """Every number a pick names is one the fleet has."""
    pids = {h.process_id for h in fleet}
    labels = {(h.slice_id, h.worker_id) for h in fleet}
    have = f"({whose}: {_describe(labels)}, processes {_span(pids)})"
    for pick in picks:
        if pick.indices is not None:
            missing = pick.indices - pids
            if missing:
                raise UsageError(f"{flag} {pick.text}: no process {_span(missing)} {have}")
            continue
        have_slices = {s for s, _ in labels}
        slices = sorted(pick.slices if pick.slices is not None else have_slices)
        gone = [s for s in slices if s not in have_slices]
        if gone:
            raise UsageError(f"{flag} {pick.text}: no slice {_span(gone)} {have}")
        if pick.workers is None:
            continue
        absent = [(s, w) for s in slices for w in sorted(pick.workers) if (s, w) not in labels]
        if pick.slices is None:  # s*/wN: a worker some slice has is enough
            have_workers = {w for _, w in labels}
            absent = [(s, w) for s, w in absent if w not in have_workers]
        if absent:
            raise UsageError(f"{flag} {pick.text}: no host {fold(absent)} {have}")


def _describe(labels: Iterable[tuple[int, int]]) -> str:
    """The fleet's hosts folded; a big fleet as its slices and workers, to stay one line."""
    labels = list(labels)
    text = fold(labels)
    if len(text) <= 120:
        return text
    return (
        f"slices {_span(s for s, _ in labels)}, workers {_span(w for _, w in labels)}"
        f" ({len(labels)} hosts)"
    )


def _span(numbers: Iterable[int]) -> str:
    return ",".join(spans(numbers))


def select(
    fleet: Fleet,
    workers: str | None = None,
    exclude: str | None = None,
    *,
    whose: str = "the fleet",
) -> tuple[Fleet, str]:
    """The hosts ``workers`` names (default: all) less those ``exclude`` names, in the fleet's
    order and keeping each host's slice, worker and process numbers; and, when that is not the
    whole fleet, the chosen hosts folded (``s0/w0,s0/w2``), else ``""``. ``whose``: what an
    error calls the fleet."""
    if workers is None and exclude is None:
        return fleet, ""
    chosen = list(fleet)
    if workers is not None:
        picks = parse(workers)
        _check(picks, fleet, "--workers", whose)
        chosen = [h for h in chosen if any(p.matches(h) for p in picks)]
    if exclude is not None:
        drop = parse(exclude, "--exclude-workers")
        _check(drop, fleet, "--exclude-workers", whose)
        chosen = [h for h in chosen if not any(p.matches(h) for p in drop)]
    if not chosen:
        given = " ".join(
            f"{f} {v}" for f, v in (("--workers", workers), ("--exclude-workers", exclude)) if v
        )
        raise UsageError(f"{given}: no host left ({whose}: {_describe(_labels(fleet))})")
    if len(chosen) == len(fleet):
        return fleet, ""
    return Fleet(tuple(chosen)), fold(_labels(chosen))


def _labels(hosts: Fleet | list[Host]) -> list[tuple[int, int]]:
    return [(h.slice_id, h.worker_id) for h in hosts]


def refusal(what: str, subset: str) -> str:
    """Why a JAX launch cannot go to some of the hosts: it waits for every process."""
    return (
        f"{what} needs a JAX job on every process (it waits at its coordinator for all of "
        f"them): not with --workers {subset}. On some hosts run a plain --cmd (it gets no "
        "JAX_* variables), or leave out --workers"
    )

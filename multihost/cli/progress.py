"""Transfer events drawn as rich progress bars: bytes, bytes/s and hosts done (terminal only)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)

from multihost.events import Transfer


class TransferView:
    """Keeps a rich Progress in step with :class:`Transfer` events: one bar for every host
    together (bytes, bytes/s, hosts done) and, with ``per_host``, one per host in flight."""

    def __init__(self, label: str, hosts: int, *, per_host: bool = False) -> None:
        self.hosts, self.per_host = hosts, per_host
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TextColumn("{task.fields[hosts]}"),
            auto_refresh=False,
        )
        self._all = self.progress.add_task(label, total=None, hosts=f"0/{hosts} hosts")
        self._done: dict[int, int] = {}
        self._total: dict[int, int] = {}
        self._finished: set[int] = set()
        self._rows: dict[int, TaskID] = {}

    @property
    def started(self) -> bool:
        """Some host has begun (or finished) a transfer."""
        return bool(self._done)

    def update(self, event: Transfer) -> None:
        pid = event.host.process_id
        self._done[pid], self._total[pid] = event.done, max(event.total, event.done)
        if event.finished:
            self._finished.add(pid)
        total = sum(self._total.values())
        self.progress.update(
            self._all,
            completed=sum(self._done.values()),
            total=total or None,
            hosts=f"{len(self._finished)}/{self.hosts} hosts",
        )
        if not self.per_host:
            return
        row = self._rows.get(pid)
        if event.finished:
            if row is not None:
                self.progress.remove_task(self._rows.pop(pid))
        elif row is None:
            self._rows[pid] = self.progress.add_task(
                f"  {event.host.name}", total=event.total or None, completed=event.done, hosts=""
            )
        else:
            self.progress.update(row, completed=event.done, total=event.total or None)

    def renderable(self) -> RenderableType:
        return self.progress.get_renderable()

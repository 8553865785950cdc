"""Grouped stacks as rich renderables (pure functions of a StackReport)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from multihost.diagnose.stacks import StackReport
from multihost.gather import host_ranges


def stack_report(report: StackReport, *, title: str = "", max_frames: int = 40) -> Group:
    """Odd ones out first, each group headed ``[hosts] ×N``, frames most recent first."""
    parts: list[RenderableType] = []
    if title:
        parts.append(Text(title, style="bold"))
    stragglers = report.stragglers
    if stragglers:
        parts.append(Text(f"straggler(s): {host_ranges(stragglers)}", style="bold red"))
    for group in report.groups:
        odd = bool(stragglers) and group is not report.groups[-1]
        head = Text(
            f"[{host_ranges(group.hosts)}] ×{group.size}", style="bold red" if odd else "bold"
        )
        if group.label:
            head.append(f"  {group.label}", style="dim")
        parts.append(head)
        frames = group.frames[:max_frames]
        for frame in frames:
            parts.append(Text(f"  {frame}"))
        if len(group.frames) > max_frames:
            parts.append(Text(f"  … {len(group.frames) - max_frames} more frames", style="dim"))
        if not group.frames:
            parts.append(Text("  (no Python frames)", style="dim"))
    for item in report.errors:
        parts.append(Text(f"{item.host.name}: {item.error}", style="yellow"))
    return Group(*parts)

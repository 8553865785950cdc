"""What reaches the user's terminal from a host: its lines made safe (colour kept, every other
control sequence dropped), prefixed with the host's name in its own colour."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from multihost.model import Host

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

COLORS = (
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "bright_red",
    "bright_cyan",
    "bright_magenta",
    "bright_green",
    "bright_yellow",
    "bright_blue",
    "red",
)


# What a host's line may carry to the user's terminal: colour (SGR, ``ESC[...m``) and tabs.
# Everything else that a terminal acts on — cursor moves, screen clears, titles and other OSC
# strings, C1 codes, carriage returns, bells — is dropped (the log files keep the raw bytes).
# Only what is dropped matches (a plain replacement: no Python call per match), and nothing
# across a newline: one pass cleans a block of lines as it would each line.
_ESCAPES = re.compile(
    r"\x1b(?!\[[0-9;]*m)(?:"  # an escape that is not a colour (SGR, kept as it is):
    r"\][^\x07\x1b\n]*(?:\x07|\x1b\\)?"  # OSC ... BEL/ST (titles, hyperlinks)
    r"|[P^_X][^\x1b\n]*(?:\x1b\\)?"  # DCS, PM, APC, SOS strings
    r"|\[[0-?]*[ -/]*[@-~]?"  # any other CSI
    r"|[ -/]*[0-~]?)"  # any other escape
    r"|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f\x80-\x9f]"  # other C0 and C1 controls (tab, newline kept)
)


# What a terminal is spared, each kept whole in the host's log: JAX's CPU collectives (Gloo)
# print a connection line per rank and group, several at once from several threads, which
# come out spliced ("[Gloo] Rank [Gloo] Rank 1 is connected ...", then "0 is connected ...").
_GLOO = re.compile(
    r"^(?:\[Gloo\] Rank (?:\d+ )?)*(?:\d+ )?is connected to \d+ peer ranks\. "
    r"Expected number of connected peer ranks is : \d+\s*$"
)


def noise(line: str) -> bool:
    """Whether a host's line is one a terminal is spared (Gloo's connection lines, whole or
    spliced); the logs keep every one."""
    return "is connected to" in line and _GLOO.match(line) is not None


def safe_text(line: str) -> str:
    """A host's output line with every control sequence but colour (SGR) removed; of a line
    redrawn with carriage returns (a progress bar), the last drawing, as a terminal shows it."""
    return _ESCAPES.sub("", _last_drawing(line).replace("\n", ""))


def _last_drawing(line: str) -> str:
    """Of a line redrawn with carriage returns, what a terminal ends up showing."""
    if "\r" not in line:
        return line
    return next((part for part in reversed(line.split("\r")) if part), "")


# Any character ``safe_text`` could change (tab aside): most output has none, and a batch of
# lines without any is passed on as it is.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe_block(texts: Sequence[str], prefix: str = "") -> str:
    """``prefix + safe_text(t) + newline`` for every line, as one string; the checks run once
    over the whole batch (in C), not once per line, and only lines redrawn with carriage
    returns are looked at one by one."""
    joined = "\n".join(texts)
    if _UNSAFE.search(joined) is not None:
        if "\r" in joined:
            joined = "\n".join(map(_last_drawing, texts))
        joined = _ESCAPES.sub("", joined)
    if prefix:
        joined = prefix + joined.replace("\n", "\n" + prefix)
    return joined + "\n"


class Raw:
    """Text that rich writes as it is (no markup, wrapping or re-styling): a batch of host
    lines already made safe (``safe_block``), printed through a console so that a live status
    line stays below it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Segment(self.text)


def ansi_prefix(host: Host, console: Console) -> str:
    """``host_prefix`` rendered once to escape codes for ``console`` (then reset)."""
    from rich.console import COLOR_SYSTEMS

    system = COLOR_SYSTEMS.get(console.color_system or "")
    return Style.parse(COLORS[host.process_id % len(COLORS)]).render(
        f"[{host.name}] ", color_system=system
    )


def host_line(line: str, host: Host | None = None) -> Text:
    """A host's line for the terminal: its colours kept, nothing else a terminal would act
    on; with ``host``, prefixed ``[s0/w3]``."""
    text = Text.from_ansi(safe_text(line), end="")
    return text if host is None else host_prefix(host).append_text(text)


def warning(text: str) -> Text:
    """``multihost: TEXT`` in yellow; a Text, so brackets in it (``multihost[plot]``) are kept."""
    return Text(f"multihost: {text}", style="yellow")


def host_prefix(host: Host) -> Text:
    """``[s0/w3] `` in the host's own colour."""
    return Text(f"[{host.name}] ", style=COLORS[host.process_id % len(COLORS)])

"""``multihost sandbox up|env|down``: the arguments read and what the library did printed; the
sandbox itself is ``multihost.sandbox``."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console


def cmd_sandbox(args: argparse.Namespace, err: Console) -> int:
    from multihost.sandbox import control

    def say(text: str) -> None:
        err.print(f"multihost: {text}", markup=False, highlight=False)

    if args.sandbox_command == "up":
        started = control.up(args.hosts, args.sshd)
        say(
            f"sandbox up in {started.seconds:.1f} s: {started.hosts} loopback hosts and the "
            f"stand-in cloud (its dir: {started.state}); in your shell:"
        )
        err.print('  eval "$(multihost sandbox env)"', markup=False, highlight=False)
        return 0
    if args.sandbox_command == "env":
        sys.stdout.write(control.env())
        return 0
    stopped = control.down()
    if stopped.was_up:
        say(f"sandbox down: every process it started stopped, {stopped.state} removed")
    else:
        say(
            f"the sandbox was not running: removed what it left ({stopped.killed} processes, "
            f"{stopped.state})"
        )
    return 0

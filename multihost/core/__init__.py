"""The run core: a run drives per-host workers through its steps and hands every event to
the caller's handler (``on_event``).

- :mod:`.supervisor` — ``Supervisor``: a slot per host (a :class:`.livehost.LiveHost`),
  events, the stop policy, stopping, closing, ``run.json`` and the result. Every step acts
  through it.
- :mod:`.prepare` — connect, port check, stage, stale check, claim, extra ``HostStep``\\ s.
- :mod:`.steps` — the port and stale checks, ``HostStep`` and the steps a run takes.
- :mod:`.start` — each host's launch: gated (all start together) or detached.
- :mod:`.watch` — one worker per launched host to its exit, the hang watchdog, the police.
- :mod:`.run` — ``Run``: a new run (prepare → start → watch → the work after it).
- :mod:`.postrun` — the work after a run (traces read, TPU logs, ``pull=``), on its result.
- :mod:`.attach` — ``Attach`` / ``Stop``: an existing run from its record (watch, or stop).
"""

from multihost.core.attach import Attach, Stop
from multihost.core.run import Run
from multihost.core.steps import HostStep

__all__ = ["Attach", "HostStep", "Run", "Stop"]

"""Warm processes: one long-lived Python per host, JAX imported and the job joined once, then
many pieces of work run in it (a sweep's points with ``--warm``, a session's calls and scripts).

- :mod:`.pieces` — what a piece is, and the layout (interpreter, variables) it needs; a sweep
  point's command read as one.
- :mod:`.frames` — the frames the runner and a warm process exchange.
- :mod:`.channel` — one host's channel to its warm process.
- :mod:`.outcome` — what a piece gave back, each host's and as a run's result.
- :mod:`.warmset` — ``WarmSet``: the processes as a run, pieces on every host, breaking and
  stopping.

``multihost.session`` (a warm set for a ``with`` block) is the API's: ``multihost.api.session``.
The process on each host is ``multihost/remote/warm_server.py``; its channel
``multihost/remote/warm_channel.sh``.
"""

"""Watching a submitted job: the cloud's and the bucket's view of it, polled from this machine.

verdict   what one poll saw (``Snapshot``, ``HostView``) and what it means (``decide``; pure)
follow    the ``Watcher``: polls, streams the followed host's log, acts on the verdict (delete,
          resubmit after a preemption, record the outcome in the bucket)
watchers  who watches a job from this machine (a locked marker each), and a detached watch

A job's workers are reached through no SSH: what they did is read from the queued resource's
state and the objects their startup script writes to the bucket. A run's live SSH watch (a
follower per host over its connection, the hang watchdog, the stop policy) is another thing,
:mod:`multihost.core.watch`; the two share no code.
"""

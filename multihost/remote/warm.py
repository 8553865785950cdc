"""The scripts of warm processes (``multihost.warm``): the server each host runs, its
channel, and the step that puts the server in place.

``.sh`` files of this package (see :mod:`multihost.remote`), each header saying its arguments;
the server is ``warm_server.py`` (standard library, and jax when the job has it), sent by its
text.
"""

from __future__ import annotations

from multihost.remote import load
from multihost.remote.staging import python_source

CHANNEL = load("warm_channel")  # r t
PUT = load("warm_put")  # r: the server's text on stdin
SERVER = "warm_server.py"  # its name in the run's directory


def server_source() -> bytes:
    """The server's text, as the hosts get it."""
    return python_source("warm_server").encode()

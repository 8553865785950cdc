"""The scripts of the locked environment (``multihost.envsync``): probe, build, install.

``.sh`` files of this package (see :mod:`multihost.remote`), each header saying its arguments.
An environment lives in ``<base>/envs/<key>`` with a manifest (``SIZE PATH`` per file, ``l
PATH`` per link) and a completion marker written last; its packed archive stays beside it so
that the host can hand it on: ``<key>.tar.zst`` when every host of its transfer has zstd, else
``<key>.tar.gz`` (one or the other: packing or taking one format removes the other). Each
script that packs or unpacks takes ``fmt`` (``zst`` or ``gz``: the suffix).
"""

from __future__ import annotations

from multihost.remote import load

PROBE = load("env_probe")  # b r lock ruv k: the warm path starts no Python (kept in the kit)
STORE = load("env_store")  # b mode age gone store probe
BUILD = load("env_build")  # b key fmt code exe sel req ship uvv unwheel
PACK = load("env_pack")  # b key fmt
LOCK_CHECK = load("env_lock_check")  # b code exe
INSTALL = load("env_install")  # b key fmt digest how url fetch timeout
UPLOAD = load("env_upload")  # b key url
SERVE = load("env_serve")  # b key fmt serve addr lifetime fetches name
SETUP = load("setup")  # b c key cmd

"""One environment on every host, from the project's ``uv.lock`` (or a fully pinned
``--requirements FILE``): built once with uv, packed, shipped, and repaired where damaged.

The planner asks :func:`.request.request` (pure, before anything starts): a staged code dir with
``pyproject.toml`` and ``uv.lock`` gets an :class:`~.request.EnvRequest` unless ``--no-sync``.
The run's preparation then calls :func:`.phase.sync_environment` once the code is on every host:
each host reports its key (lock, selection, Python, platform, uv), one host per missing key
builds it with uv, and the others get the packed environment from there.

- :mod:`.request`: what a run asks for (the lock or the requirements file, checked)
- :mod:`.requirements`: ``--requirements FILE``, every line pinned
- :mod:`.uvbin`: the runner's uv binary, and whether it runs on a host
- :mod:`.run`: what the phase uses of the run it prepares (the core's ``Supervisor`` is one)
- :mod:`.probe`: what each host says it has, the runner's uv, the pack's format
- :mod:`.phase`: the environment phase: check, build, pack, install
- :mod:`.transfer`: the pack via a peer or a bucket instead of the runner
- :mod:`.store`: what each host holds (``multihost envs``) and pruning (``multihost clean``)

The scripts the hosts run for it are in :mod:`multihost.remote` with every other script sent to
a host (``env_*.sh``, ``env_probe.py``, ``env_store.py``; :mod:`multihost.remote.envsync`).
"""

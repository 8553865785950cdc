"""multihost's stack hook, staged as ``sitecustomize.py`` on the job's PYTHONPATH.

Every Python process the job starts registers ``faulthandler`` on SIGUSR2: the signal makes it
append every thread's stack to ``$MULTIHOST_STACK_DIR/<pid>.txt``, from C, even while the
process is blocked in a collective. No ptrace, no root, no change to the user's program; a
``<pid>.ready`` file says which processes listen (``multihost stack`` signals only those). A
sitecustomize of the user's own further along ``sys.path`` still runs.
"""

import os
import sys


def _install() -> None:
    where = os.environ.get("MULTIHOST_STACK_DIR")
    if not where or not os.path.isdir(where):
        return
    try:
        import faulthandler
        import signal

        pid = os.getpid()
        out = open(os.path.join(where, f"{pid}.txt"), "a")  # noqa: SIM115 (open for life)
        faulthandler.register(signal.SIGUSR2, file=out, all_threads=True, chain=False)
        sys.modules[__name__].__dict__["_stack_file"] = out
        with open(os.path.join(where, f"{pid}.ready"), "w") as ready:
            ready.write(" ".join(sys.argv)[:200] or "python")
    except Exception:  # the hook must never break the user's program
        return


def _chain_user_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        path = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(path):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_user_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


if __name__ == "sitecustomize":  # only as the staged hook, never when imported by multihost
    _install()
    _chain_user_sitecustomize()

"""The notebook path, as a user meets it: a real notebook executed on a real ipykernel.

The kernel runs its own event loop, so this is where ``run`` must not call ``asyncio.run``,
where prints from the hosts must reach the cell, and where results render as HTML.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("cloudpickle")

CELLS = [
    "import os\nimport multihost",
    'r = multihost.run("echo hi $JAX_PROCESS_ID", local=2, script_dir=CODE)\n'
    'print("exit", r.exit_code)\nr',
    'multihost.call(lambda x: x * 2 + int(os.environ["JAX_PROCESS_ID"]), 10, local=2)',
    "def boom():\n"
    '    if os.environ["JAX_PROCESS_ID"] == "1":\n'
    '        raise KeyError("no such shard")\n'
    "    return 0\n"
    "multihost.call(boom, local=2, fail_fast=False)",
]


def _text(outputs: list[Any]) -> str:
    parts = []
    for o in outputs:
        if o["output_type"] == "stream":
            parts.append(o["text"])
        elif o["output_type"] in ("execute_result", "display_data"):
            parts.append(o["data"].get("text/plain", ""))
    return "".join(parts)


def test_notebook(code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # the kernel and its local workers inherit these
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    # "python3" is this interpreter, whatever kernels the machine has installed
    spec = tmp_path / "jupyter" / "kernels" / "python3" / "kernel.json"
    spec.parent.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    nb = nbformat.v4.new_notebook()
    setup = f"CODE = {str(tmp_path / 'code')!r}\n"
    nb.cells = [nbformat.v4.new_code_cell(setup + CELLS[0])]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in CELLS[1:]]
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=60,
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    ran, called, raised = nb.cells[1], nb.cells[2], nb.cells[3]

    assert not [o for c in nb.cells[:3] for o in c.outputs if o["output_type"] == "error"]
    everything = "".join(_text(c.outputs) for c in nb.cells)
    assert "never awaited" not in everything
    assert "cannot be called from a running event loop" not in everything
    out = _text(ran.outputs)
    assert "[s0/w0] hi 0" in out
    assert "[s0/w1] hi 1" in out
    assert "exit 0" in out
    html = next(o for o in ran.outputs if o["output_type"] == "execute_result")["data"]
    assert "<table>" in html["text/html"]
    assert "s0/w1" in html["text/html"]

    assert "[20, 21]" in _text(called.outputs)

    errors = [o for o in raised.outputs if o["output_type"] == "error"]
    assert len(errors) == 1
    assert errors[0]["ename"] == "RemoteCallError"
    assert errors[0]["evalue"].startswith("s0/w1 (local1): KeyError: 'no such shard'")
    assert "remote traceback (s0/w1)" in errors[0]["evalue"]
    assert "in boom" in errors[0]["evalue"]


SESSION_CELLS = [
    "import os, time\nimport multihost\n"
    "s = multihost.session(local=2, script_dir=CODE, env={'JAX_PLATFORMS': 'cpu'}, grace=2)\n"
    "pids = s.call(os.getpid)\npids",
    "s.call(os.getpid) == pids",
    "s.run_script('hang.py')",  # interrupted from outside, once it hangs
    "fresh = s.call(os.getpid)\nprint('fresh', not set(fresh) & set(pids))",
    "with multihost.session(local=2, script_dir=CODE, env={'JAX_PLATFORMS': 'cpu'}) as t:\n"
    "    print('inner', t.call(lambda: 1))\nprint('inner closed', t.closed)",
]


def _interrupt(ready: Callable[[], bool], pid: int) -> None:
    from tests.helpers import wait_for

    wait_for(ready, 120, "the piece to hang")
    os.kill(pid, signal.SIGINT)


@pytest.mark.jax
def test_a_session_in_a_kernel_ends_with_its_block_an_interrupt_and_the_kernel(
    code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warm processes across cells: the same processes for each call; the kernel's interrupt
    stops a hung piece (KeyboardInterrupt in the cell) and the next call starts new ones; a
    ``with`` block ends its own; the kernel's shutdown ends what is left."""
    import threading

    from tests.helpers import wait_for
    from tests.test_warm_local import leftovers

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    spec = tmp_path / "jupyter" / "kernels" / "python3" / "kernel.json"
    spec.parent.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    (code / "hang.py").write_text("import time\nprint('hanging', flush=True)\ntime.sleep(600)\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"CODE = {str(code)!r}\n" + SESSION_CELLS[0])]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in SESSION_CELLS[1:]]
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=300,
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )

    def hanging() -> bool:
        return any("hanging" in p.read_text() for p in (tmp_path / "logs").rglob("*.log"))

    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if index == 2:  # the kernel's interrupt (SIGINT, as Jupyter sends it) once it hangs
                assert client.km is not None
                kernel = client.km.provisioner.process.pid  # type: ignore[union-attr]
                threading.Thread(target=_interrupt, args=(hanging, kernel), daemon=True).start()
            client.execute_cell(cell, index)
        assert leftovers(home)  # the session's processes, across cells until the kernel ends
    pids, same, hung, fresh, inner = nb.cells
    assert "[" in _text(pids.outputs)
    assert "True" in _text(same.outputs)
    errors = [o for o in hung.outputs if o["output_type"] == "error"]
    assert [e["ename"] for e in errors] == ["KeyboardInterrupt"]
    assert "fresh True" in _text(fresh.outputs)
    assert "inner [1, 1]" in _text(inner.outputs)
    assert "inner closed True" in _text(inner.outputs)
    wait_for(lambda: not leftovers(home), 60, "the kernel's shutdown to end the processes")

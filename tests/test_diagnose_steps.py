"""The hook's step watch (``multihost/diagnose/hooksteps.py``) in real JAX programs that know
nothing of it: steps counted where the program waits for its results, its own time told
apart from the waits, StepTraceAnnotation preferred when the program marks its steps, the
files ``top`` and ``plot`` read; and never a change to what the program computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from multihost.diagnose.hooksteps import _AfterImport
from multihost.remote.commands import hook_text

LOOP = """\
import time
import jax, jax.numpy as jnp
import numpy as np

@jax.jit
def step(x):
    for _ in range(8):
        x = jnp.tanh(x @ x) / 64.0
    return x, x.sum()

x = jnp.ones((256, 256))
total = 0.0
for i in range(STEPS):
    time.sleep(SLEEP)  # the program's own time
    x, loss = step(x)
    total += float(loss)  # waits for the step: line 16
    parts = [float(v) for v in (loss, loss, loss)]  # three waits, one place: the same wait
tree = jax.block_until_ready({"a": x, "b": [loss]})
assert set(tree) == {"a", "b"} and tree["b"][0] is loss
got = jax.device_get({"x": x[:2, :2]})
assert isinstance(got["x"], np.ndarray)
print("total", round(total, 3), flush=True)
"""


def _run(code: str, hook: Path | None, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MULTIHOST_", "JAX_"))}
    base.pop("PYTHONPATH", None)
    extra = {"PYTHONPATH": str(hook), "MULTIHOST_STACK_DIR": str(hook)} if hook else {}
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "JAX_PLATFORMS": "cpu", **extra, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    d = tmp_path / "hook"
    d.mkdir()
    (d / "sitecustomize.py").write_text(hook_text())
    return d


def _files(hook: Path, suffix: str) -> list[Path]:
    return sorted(hook.glob(f"*.{suffix}"))


@pytest.mark.jax
def test_steps_are_counted_where_the_program_waits(hook: Path) -> None:
    code = LOOP.replace("STEPS", "12").replace("SLEEP", "0.05")
    plain = _run(code, None)
    hooked = _run(code, hook)
    assert hooked == plain  # the same results, the hook or not
    (watch,) = _files(hook, "watch")  # written once more at the exit
    data = json.loads(watch.read_text())
    # the first wait picks the place; each wait there after it ends a step
    assert data["steps"] == 11
    assert data["site"] == "<string>:16"
    assert len(data["recent"]) == len(data["own"]) == 11
    assert data["first"] <= data["last"] <= data["at"]
    assert data["waiting"] == 0.0
    for step, own in zip(data["recent"][1:], data["own"][1:], strict=True):
        # the sleep is its own; the wait for the step's results is not (on CPU, XLA may run a
        # small step inside its dispatch: then that wait is near nothing, not negative)
        assert 0.05 <= own <= step
    (log,) = _files(hook, "steps")
    rows = [line.split() for line in log.read_text().splitlines()]
    assert [int(r[0]) for r in rows] == list(range(1, 12))
    assert all(float(r[2]) >= float(r[3]) for r in rows)


@pytest.mark.jax
def test_an_annotated_program_is_counted_by_its_annotations(hook: Path) -> None:
    code = textwrap.dedent(
        """\
        import jax, jax.numpy as jnp
        f = jax.jit(lambda x: x * 2)
        x = jnp.ones(4)
        for i in range(7):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = f(x)
                float(x[0]); float(x[1])
                x.block_until_ready()
        print("ok")
        """
    )
    assert _run(code, hook) == "ok\n"
    data = json.loads(_files(hook, "watch")[0].read_text())
    assert (data["steps"], data["site"]) == (6, "StepTraceAnnotation")


@pytest.mark.jax
def test_no_step_watch_when_asked_not_to(hook: Path) -> None:
    code = LOOP.replace("STEPS", "3").replace("SLEEP", "0")
    _run(code, hook, MULTIHOST_STEPS="0")
    assert _files(hook, "watch") == []
    assert _files(hook, "steps") == []


def test_a_failing_action_leaves_the_module_as_it_loads(tmp_path: Path) -> None:
    """jax changed under the hook: the module is imported as if the hook were not there."""
    (tmp_path / "somemod.py").write_text("VALUE = 42\n")
    sys.path.insert(0, str(tmp_path))
    seen = []

    def broken(module: object) -> None:
        seen.append(module)
        raise AttributeError("no such thing in this jax")

    finder = _AfterImport("somemod", broken)
    sys.meta_path.insert(0, finder)
    try:
        import somemod  # type: ignore[import-not-found]

        assert somemod.VALUE == 42
        assert seen == [somemod]
        assert finder not in sys.meta_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("somemod", None)
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

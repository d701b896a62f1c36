"""docs/agent.md's code runs as written: the notebook quick start (on a fresh machine, with a
simulator of its own and a private segment) and the bandit example."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional, Tuple

import pytest

import mpib_agent

DOC = Path(__file__).resolve().parents[3] / "docs" / "agent.md"
ENV = dict(os.environ, PYTHONPATH=str(Path(mpib_agent.__file__).parents[1]))


def snippet(heading: str) -> str:
    """The first ```python block after ``heading`` in docs/agent.md."""
    text = DOC.read_text()
    start = text.index(heading)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None, f"no python block after {heading!r}"
    return m.group(1)


def _state(path: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def test_quick_start_runs(tmp_path: Path) -> None:
    """The cell needs nothing but the package: it starts its simulator, finds connections,
    and touches neither MPIB_SHM_PATH (set here to a file that must not appear) nor the
    user's default segment."""
    guard = str(tmp_path / "must-not-exist")
    real = f"/dev/shm/mpib-hints-{os.geteuid()}"
    before = _state(real)
    r = subprocess.run(
        [sys.executable, "-c", snippet("## Quick start (Python, from a notebook)")],
        env=dict(ENV, MPIB_SHM_PATH=guard),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "of the optimum" in r.stdout and "10.0.2.2" in r.stdout, r.stdout
    assert not os.path.exists(guard)
    assert _state(real) == before


def test_bandit_example() -> None:
    if importlib.util.find_spec("gymnasium") is None or importlib.util.find_spec("numpy") is None:
        pytest.skip("gymnasium or numpy not installed (pip install mpib-agent[gym])")
    r = subprocess.run(
        [sys.executable, "-c", snippet("### A bandit against the registered env")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    m = re.search(r"bandit: best split ([0-9.]+) \(optimum ([0-9.]+)\), oracle_ratio ([0-9.]+)", r.stdout)
    assert m is not None, r.stdout
    best, opt, oracle = (float(x) for x in m.groups())
    assert abs(best - opt) <= 0.1 and oracle > 0.85, r.stdout

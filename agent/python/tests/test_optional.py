"""The core package stays standard-library only; the gym extra says how to install it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mpib_agent

ENV = dict(os.environ, PYTHONPATH=str(Path(mpib_agent.__file__).parents[1]))


def _py(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)


def test_core_imports_no_gym() -> None:
    r = _py(
        "import sys, mpib_agent, mpib_agent.sim, mpib_agent._cli\n"
        "bad = sorted(m for m in ('gymnasium', 'numpy') if m in sys.modules)\n"
        "assert not bad, bad"
    )
    assert r.returncode == 0, r.stderr


def test_gym_without_gymnasium() -> None:
    r = _py(
        "import sys\n"
        "sys.modules['gymnasium'] = None  # as if not installed\n"
        "try:\n"
        "    import mpib_agent.gym\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    sys.exit('imported')"
    )
    assert r.returncode == 0, r.stderr
    assert "pip install mpib-agent[gym]" in r.stdout

"""The package's version: what ``--version`` prints and what an installed copy's metadata says."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import mpib_agent
from mpib_agent._cli import main

# PEP 440's canonical form (its appendix B), plus a local version: what pip and a wheel's
# metadata show, and what the release build writes (internal/dist's PythonVersion).
CANONICAL = re.compile(
    r"([1-9][0-9]*!)?(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*((a|b|rc)(0|[1-9][0-9]*))?"
    r"(\.post(0|[1-9][0-9]*))?(\.dev(0|[1-9][0-9]*))?(\+[a-z0-9]+(\.[a-z0-9]+)*)?"
)


def test_version_is_canonical_pep440() -> None:
    assert CANONICAL.fullmatch(mpib_agent.__version__), mpib_agent.__version__
    assert "__version__" in mpib_agent.__all__


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"mpib-agent-py {mpib_agent.__version__}\n"


def test_installed_metadata_names_the_version() -> None:
    try:
        dist = importlib.metadata.distribution("mpib-agent")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("mpib-agent is not installed (the tests import the sources): no metadata to compare")
    installed = Path(str(dist.locate_file("mpib_agent/__init__.py"))).resolve()
    if installed != Path(mpib_agent.__file__).resolve():
        pytest.skip(f"the installed mpib-agent ({installed}) is not the one imported ({mpib_agent.__file__})")
    assert dist.version == mpib_agent.__version__

"""The settings the agents read from the environment, read as the plugin reads them
(plugin/internal/config: white space trimmed with Go's strings.TrimSpace, then strconv.Atoi).
The Go agent's agent/go/shm/env_test.go has the same table."""

from __future__ import annotations

import os
from typing import Optional

import pytest

import mpib_agent
from mpib_agent._layout import DEFAULT_PATH_PREFIX

# MPIB_AGENT_STALE_MS -> ms; the agents fall back to 500 where the plugin refuses the value.
STALE_CASES = [
    ("", 500),
    ("100", 100),
    ("100 ", 100),
    (" 100 ", 100),
    ("\t100\n", 100),
    ("+100", 100),
    ("007", 7),
    ("\u00a0100\u3000", 100),  # no-break and ideographic spaces: Go's unicode.IsSpace
    ("1", 1),
    ("3600000", 3600000),
    ("3600001", 500),
    ("0", 500),
    ("-5", 500),
    ("+", 500),
    ("1_000", 500),  # int() takes it, Atoi does not
    ("0x10", 500),
    ("1e3", 500),
    ("10 0", 500),
    ("\uff11\uff10\uff10", 500),  # fullwidth digits: int() takes them, Atoi does not
    ("\x1c100", 500),  # a file separator is white space to str.strip(), not to Go
    ("99999999999999999999", 500),
    ("fast", 500),
]


@pytest.mark.parametrize("env,ms", STALE_CASES)
def test_stale_from_env(monkeypatch: pytest.MonkeyPatch, env: str, ms: int) -> None:
    monkeypatch.setenv("MPIB_AGENT_STALE_MS", env)
    assert mpib_agent.stale_ns_from_env() == ms * 1_000_000


@pytest.mark.parametrize(
    "env,want",
    [(" /dev/shm/x\n", "/dev/shm/x"), ("/dev/shm/x", "/dev/shm/x"), (" \t ", None), ("", None)],
)
def test_default_path_trimmed(monkeypatch: pytest.MonkeyPatch, env: str, want: Optional[str]) -> None:
    """MPIB_SHM_PATH is trimmed as the plugin trims it; only white space means unset."""
    monkeypatch.setenv("MPIB_SHM_PATH", env)
    assert mpib_agent.default_path() == (want or f"{DEFAULT_PATH_PREFIX}{os.geteuid()}")

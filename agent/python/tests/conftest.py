from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

import mpib_agent
from mpib_agent._codec import encode_slot
from mpib_agent._layout import STATE_ACTIVE
from mpib_agent._segment import _lock_byte, slot_lock_off
from mpib_agent._types import Slot

VECTORS = Path(__file__).resolve().parents[3] / "testdata" / "shm"

# Lines for the end of the run (shown with -q too, captured or not), e.g. the gym tests'
# "gym: env=ID check_env=pass steps_per_s=N".
REPORT: List[str] = []


def report(line: str) -> None:
    """Shows ``line`` in the terminal summary of the run."""
    REPORT.append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if importlib.util.find_spec("gymnasium") is None or importlib.util.find_spec("numpy") is None:
        REPORT.append("gym: skipped: gymnasium or numpy not installed (pip install mpib-agent[gym])")
    if importlib.util.find_spec("matplotlib") is None:
        REPORT.append("plot: skipped: matplotlib not installed (pip install mpib-agent[plot])")
    for line in REPORT:
        terminalreporter.write_line(line)


# Leases held by fake plugin registrations: (path, slot) -> the descriptor holding the lock.
_LEASES: Dict[Tuple[str, int], int] = {}


@pytest.fixture(autouse=True)
def _drop_leases() -> Iterator[None]:
    yield
    for fd in _LEASES.values():
        os.close(fd)
    _LEASES.clear()


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[mpib_agent.Segment]:
    s = mpib_agent.create(str(tmp_path / "hints"), nslots=8, npeers=4)
    yield s
    s.close()


def fake_register(
    seg: mpib_agent.Segment, index: int, peer: str, path_class: int, gen: int = 1, pid: int = 0, lease: bool = True
) -> Slot:
    """Writes an ACTIVE slot the way a plugin would (tests only): with ``lease``, a lock on the
    slot's byte held through another open file description, as a live plugin process does."""
    if lease and (seg.path, index) not in _LEASES:
        fd = os.open(seg.path, os.O_RDWR | os.O_CLOEXEC)
        assert _lock_byte(fd, slot_lock_off(index), fcntl.F_WRLCK)
        _LEASES[(seg.path, index)] = fd
    s = Slot(
        index=index,
        state=STATE_ACTIVE,
        owner_pid=pid or os.getpid(),
        gen=gen,
        conn_id=index,
        local_sout_ip="10.0.1.1",
        peer_sout_ip=peer,
        path_class=path_class,
        is_send=1,
        nqps_sout=2,
        nqps_sup=4,
        pid=pid or os.getpid(),
    )
    encode_slot(seg._v, s)
    return s


def fake_die(seg: mpib_agent.Segment, index: int) -> None:
    """The plugin holding slot index's lease dies (its locks go with it)."""
    os.close(_LEASES.pop((seg.path, index)))


def fake_release(seg: mpib_agent.Segment, index: int) -> None:
    """The plugin closes the connection: owner word to 0, then the lease."""
    seg._v.put64(mpib_agent._layout.slot_off(index), 0)
    fake_die(seg, index)

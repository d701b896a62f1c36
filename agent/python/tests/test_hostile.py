"""Hostile segment files: a file someone holds a lease on, and a header
whose geometry changes under an open segment. The agent must answer with an error at once,
never block, crash or raise anything but SegmentError/OSError."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

import mpib_agent
from conftest import fake_register, report
from mpib_agent._layout import OFF_NPEERS, OFF_NSLOTS, OFF_SLOT_SIZE, OFF_TOTAL, OFF_VERSION, VERSION, total_size

GEOMETRY: List[Tuple[str, List[Tuple[int, int, int]]]] = [
    ("nslots", [(OFF_NSLOTS, 65536, 4)]),
    ("nslots-and-total", [(OFF_NSLOTS, 20, 4), (OFF_TOTAL, total_size(20, 2), 8)]),
    ("npeers", [(OFF_NPEERS, 4096, 4)]),
    ("total_size", [(OFF_TOTAL, 1 << 40, 8)]),
    ("slot_size", [(OFF_SLOT_SIZE, 256, 4)]),
    ("version", [(OFF_VERSION, VERSION + 1, 4)]),
]


def _write_header(path: str, writes: List[Tuple[int, int, int]]) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for off, val, size in writes:
            os.pwrite(fd, val.to_bytes(size, "little"), off)
    finally:
        os.close(fd)


@pytest.mark.parametrize("name,writes", GEOMETRY, ids=[g[0] for g in GEOMETRY])
def test_geometry_changed_since_open(tmp_path: Path, name: str, writes: List[Tuple[int, int, int]]) -> None:
    """snapshot() and connections() refuse a header that changed since open (bad_geometry, a
    message saying so); the validated geometry stays in use and works again once restored."""
    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=4, npeers=2)
    fake_register(seg, 1, "10.0.2.7", 1)
    orig = Path(seg.path).read_bytes()[:256]
    _write_header(seg.path, writes)
    for read in (seg.snapshot, seg.connections):
        with pytest.raises(mpib_agent.SegmentError) as ei:
            read()
        assert ei.value.code == "bad_geometry" and "changed since open" in str(ei.value), name
    _write_header(seg.path, [(0, int.from_bytes(orig, "little"), 256)])
    snap = seg.snapshot()
    assert snap.header.nslots == 4 and [s.index for s in snap.slots] == [1]
    seg.close()


@pytest.fixture
def lease_dir() -> Iterator[str]:
    """A directory on tmpfs (where segments live) when there is one."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="mpib-lease-", dir=base) as d:
        yield d


def test_open_leased_file(lease_dir: str) -> None:
    """A file someone holds a write lease on is refused at once (O_NONBLOCK: EWOULDBLOCK), not
    after the lease break time (45 s)."""
    path = os.path.join(lease_dir, "hints")
    mpib_agent.create(path, nslots=2, npeers=0).close()
    old = signal.signal(signal.SIGIO, signal.SIG_IGN)  # the break notice would end this process
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError as e:
            pytest.skip(f"no write lease here: {e}")
        t0 = time.monotonic()
        with pytest.raises(OSError) as ei:
            mpib_agent.open_segment(path)
        took = time.monotonic() - t0
        assert ei.value.errno == errno.EWOULDBLOCK and "lease" in str(ei.value)
        assert took < 0.1, f"the open waited {took:.3f} s"
        report(f"hostile-py: case=agent-open-lease open_ms={took * 1e3:.3f}")
    finally:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        signal.signal(signal.SIGIO, old)


# Runs the CLI with the header's nslots changed between the open (which validates it) and the
# read, as a process writing garbage into the file would.
_CLI_WITH_CHANGE = f"""
import os, sys
import mpib_agent._segment as seg
validated = seg.Segment.connections
def changed(self):
    fd = os.open(self.path, os.O_WRONLY)
    os.pwrite(fd, (65536).to_bytes(4, "little"), {OFF_NSLOTS})
    os.close(fd)
    return validated(self)
seg.Segment.connections = changed
from mpib_agent._cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_geometry_changed(tmp_path: Path) -> None:
    """``mpib-agent-py list`` on a segment whose header changes after the open: exit 1 and a
    message (bad_geometry), no traceback."""
    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=4, npeers=2)
    fake_register(seg, 1, "10.0.2.7", 1)
    src = Path(mpib_agent.__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, "-c", _CLI_WITH_CHANGE, "list", "--path", seg.path],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        timeout=60,
    )
    assert p.returncode == 1 and "bad_geometry" in p.stderr and "changed since open" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    seg.close()

"""The heartbeat of a Python agent never waits for the writer lock (spec 5.2, 5.5): neither a
reclaim pass that walks thousands of held leases nor another process holding the lock (a
``set`` from another shell) lets it age past the stale limit."""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

import mpib_agent
from mpib_agent._layout import OFF_HEARTBEAT


def test_beat_never_waits_for_a_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer of this Segment waits for the writer lock that another process (a ``set`` from
    another shell) holds: the heartbeat goes on meanwhile. Judged by whether beat() returns
    while the writer still waits, not by a time bound."""
    monkeypatch.delenv("MPIB_AGENT_STALE_MS", raising=False)
    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=4, npeers=4)
    other = os.open(seg.path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        writer = threading.Thread(target=seg.set_class_hint, args=(0, 100))
        writer.start()
        for _ in range(1000):  # until the writer holds the Segment's lock, waiting for flock
            if not seg._io.acquire(blocking=False):
                break
            seg._io.release()
            time.sleep(0.01)
        else:
            pytest.fail("the writer never took the Segment's lock")
        beat = threading.Thread(target=seg.beat, args=(12345,))
        beat.start()
        beat.join(timeout=30)
        waiting = writer.is_alive()
        fcntl.flock(other, fcntl.LOCK_UN)
        writer.join(timeout=30)
        assert not beat.is_alive(), "beat() waited for a writer that waits for another process's writer lock"
        assert waiting, "the writer did not wait for the other process's lock: the test proves nothing"
        assert struct.unpack("<Q", os.pread(other, 8, OFF_HEARTBEAT))[0] == 12345
    finally:
        os.close(other)
        seg.close()


def test_gc_takes_the_writer_lock_per_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc() holds the writer lock for a chunk of slots at a time, so that a reclaim pass over a
    large segment (each lease check walks the kernel's lock list: ~n^2) keeps other writers
    waiting for a chunk, not for the pass."""
    monkeypatch.delenv("MPIB_AGENT_STALE_MS", raising=False)
    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=1000, npeers=4)
    holds: List[int] = []
    lock = seg._lock

    @contextlib.contextmanager
    def counted() -> Iterator[None]:
        holds.append(1)
        with lock():
            yield

    try:
        monkeypatch.setattr(seg, "_lock", counted)
        assert seg.gc() == []
        assert len(holds) >= 1 + 1000 // 256, f"gc held the writer lock {len(holds)} time(s) for 1000 slots"
    finally:
        seg.close()

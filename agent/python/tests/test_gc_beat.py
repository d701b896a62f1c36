"""The heartbeat of a Python agent never waits for the writer lock (spec 5.2, 5.5): neither a
reclaim pass that walks thousands of held leases nor another process holding the lock (a
``set`` from another shell) lets it age past the stale limit."""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

import mpib_agent
from mpib_agent._layout import HEADER_SIZE, OFF_HEARTBEAT, S_OWNER, STATE_ACTIVE, slot_off
from mpib_agent._policy import agent_loop
from mpib_agent._segfile import _lock_byte, now_ns, slot_lock_off, stale_ns_from_env

NSLOTS = 10000  # leased: one lease check walks the kernel's list of them, gc() ~n^2


@pytest.fixture
def leased(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[mpib_agent.Segment]:
    """A segment whose every slot is ACTIVE and leased through another open file description
    (a live plugin): gc() checks every lease and frees none."""
    monkeypatch.delenv("MPIB_AGENT_STALE_MS", raising=False)
    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=NSLOTS, npeers=4)
    fd = os.open(seg.path, os.O_RDWR | os.O_CLOEXEC)
    try:
        img = bytearray(os.pread(fd, slot_off(NSLOTS), 0))
        for i in range(NSLOTS):
            struct.pack_into("<Q", img, slot_off(i) + S_OWNER, STATE_ACTIVE | (4321 << 32))
            assert _lock_byte(fd, slot_lock_off(i), fcntl.F_WRLCK)
        os.pwrite(fd, bytes(img[HEADER_SIZE:]), HEADER_SIZE)
        yield seg
    finally:
        os.close(fd)
        seg.close()


def _worst_age(seg: mpib_agent.Segment, run: "threading.Thread") -> int:
    """Samples the heartbeat as a plugin reads it while ``run`` runs; the oldest age seen."""
    fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
    worst: List[int] = [0]
    try:
        run.start()
        while run.is_alive():
            hb = struct.unpack("<Q", os.pread(fd, 8, OFF_HEARTBEAT))[0]
            if hb:
                worst[0] = max(worst[0], now_ns() - hb)
            time.sleep(0.005)
        run.join()
    finally:
        os.close(fd)
    return worst[0]


def test_heartbeat_fresh_during_gc(leased: mpib_agent.Segment) -> None:
    seg = leased
    passes: List[float] = []

    def tick() -> None:
        t = time.monotonic()
        assert seg.gc() == []
        passes.append(time.monotonic() - t)

    run = threading.Thread(target=agent_loop, args=(seg, tick, 0.05), kwargs={"duration": 2.0, "note": print})
    worst = _worst_age(seg, run)
    assert passes, "no gc pass ran"
    assert worst <= stale_ns_from_env(), (
        f"heartbeat aged {worst / 1e6:.0f} ms during gc passes of {max(passes) * 1e3:.0f} ms "
        f"(stale limit {stale_ns_from_env() / 1e6:.0f} ms)"
    )


def test_heartbeat_fresh_while_another_process_holds_the_writer_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MPIB_AGENT_STALE_MS", raising=False)
    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=4, npeers=4)
    other = os.open(seg.path, os.O_RDWR | os.O_CLOEXEC)  # a `set` from another shell
    try:

        def tick() -> None:
            seg.set_class_hint(0, 100)  # waits for the other writer

        fcntl.flock(other, fcntl.LOCK_EX)
        threading.Timer(1.2, fcntl.flock, (other, fcntl.LOCK_UN)).start()
        run = threading.Thread(target=agent_loop, args=(seg, tick, 0.05), kwargs={"duration": 1.5, "note": print})
        worst = _worst_age(seg, run)
        assert worst <= stale_ns_from_env(), f"heartbeat aged {worst / 1e6:.0f} ms behind another writer's lock"
    finally:
        os.close(other)
        seg.close()
